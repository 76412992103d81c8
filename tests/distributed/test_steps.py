"""The shared schedule's timeline: stalls only on the devices that wait for a collective; a dropped device idle."""
from workbench.distributed.steps import Step, steps_timeline
from workbench.network import Traffic


def test_a_device_that_takes_no_part_draws_no_stall():
    """Catches: a device the partitioner dropped (no work, no bytes) drawn waiting for the others' All-Gather,
    as Hepti's timeline drew rpi3 while its latency chart said it took no part."""
    none, some = Traffic(sent=0, received=0), Traffic(sent=10, received=20)
    steps = [Step("compute", 0, "rows 0", (0.001, 0.002, 0.0)),
             Step("all_gather", 0, "All-Gather rows 0", (0.003,) * 3, (some, some, none))]
    tl = steps_timeline(steps, ["a", "b", "dropped"])
    (idle,) = [s for s in tl.spans if s.device == "dropped"]
    assert (idle.kind, idle.start, idle.end, idle.label) == ("idle", 0.0, 0.005, "takes no part in rows 0")
    (stall,) = [s for s in tl.spans if s.kind == "stall"]
    assert (stall.device, stall.start, stall.end) == ("a", 0.001, 0.002)
    assert [s.device for s in tl.spans if s.kind == "comm"] == ["a", "b"]
    assert tl.end == 0.005
