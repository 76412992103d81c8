import json
from dataclasses import replace

import pytest

from workbench.timeline import Counter, Span, Timeline, barrier_offsets, round_trip_offset


def make_timeline():
    return Timeline([
        Span("io", "io", 0.0, 0.010, "layer 0", {"bytes": 1000}),
        Span("compute", "stall", 0.0, 0.010, "wait"),
        Span("compute", "compute", 0.010, 0.025, "layer 0"),
        Span("link", "comm", 0.002, 0.004, "all-gather", device="edge-1"),
    ], "measured", [Counter("AIB layer 1 (ms)", 0.01, 3.5)], name="demo")


def test_chrome_trace_has_a_process_per_device_and_a_thread_per_lane():
    trace = make_timeline().to_chrome_trace()
    json.dumps(trace)
    events = trace["traceEvents"]
    procs = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    assert procs == {"host (measured)": 1, "edge-1 (measured)": 2}
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert threads == {(1, "io"), (1, "compute"), (2, "link")}
    spans = [e for e in events if e["ph"] == "X"]
    assert [(e["name"], e["cat"], e["ts"], e["dur"]) for e in spans][2] == ("layer 0", "compute", 10000.0, 15000.0)
    assert spans[0]["args"]["bytes"] == 1000
    counters = [e for e in events if e["ph"] == "C"]
    assert counters == [{"ph": "C", "name": "AIB layer 1 (ms)", "pid": 1, "tid": 0, "ts": 10000.0,
                         "args": {"value": 3.5}}]


def test_summaries():
    t = make_timeline()
    assert t.end == pytest.approx(0.025)
    assert t.busy("stall") == pytest.approx(0.010)
    assert t.lanes == ["io", "compute", "link"]


def test_save_chrome_trace(tmp_path):
    path = make_timeline().save_chrome_trace(tmp_path / "trace.json")
    assert json.loads(path.read_text())["otherData"] == {"source": "measured", "name": "demo"}


def test_invalid_spans_are_refused():
    with pytest.raises(ValueError, match="span kind 'think' is not one of io, compute"):
        Span("cpu", "think", 0, 1)
    with pytest.raises(ValueError, match="ends .* before it starts"):
        Span("cpu", "compute", 2, 1, "layer 3")
    with pytest.raises(ValueError, match="timeline source 'guess'"):
        Timeline([], "guess")
    with pytest.raises(ValueError, match=r"span event 'switch' is not one of decision, report, fault \(or None\)"):
        Span("cpu", "stall", 0, 0, "mode switch", event="switch")


def test_typed_fields_default_to_nothing_and_survive_json():
    old = Span("io", "io", 0.0, 0.01, "layer 0", {"shards": 2}, "edge-1")
    assert (old.device, old.nbytes, old.layer, old.rank, old.flow, old.event) == ("edge-1", 0, None, None, None, None)
    typed = Span("link", "comm", 0.0, 0.01, "send", device="edge-1", nbytes=4096, layer=3, rank=1, flow="x",
                 event="report")
    tl = Timeline([old, typed], "measured", [Counter("buffer", 0.0, 1.0, rank=1)], name="run")
    back = Timeline.from_dict(json.loads(json.dumps(tl.to_dict())))
    assert back == tl and back.spans[1].flow == "x" and back.spans[1].nbytes == 4096 and back.counters[0].rank == 1
    assert back.spans[1].event == "report" and back.spans[0].event is None
    (slice_,) = [e for e in tl.to_chrome_trace()["traceEvents"] if e["ph"] == "X" and e["name"] == "send"]
    assert slice_["args"]["event"] == "report"
    written_before = {"source": "measured", "spans": [{"lane": "io", "kind": "io", "start": 0, "end": 1,
                                                       "label": "", "meta": {}, "device": "host"}]}
    assert Timeline.from_dict(written_before).spans[0].nbytes == 0
    with pytest.raises(ValueError, match="moves -1 bytes"):
        Span("io", "io", 0, 1, nbytes=-1)


def process(rank_clock_start_s, spans):
    """One process's measured timeline, its times read on a clock that started ``rank_clock_start_s`` late."""
    return Timeline([Span(lane, kind, a - rank_clock_start_s, b - rank_clock_start_s, label, device=device,
                          flow=flow) for lane, kind, a, b, label, device, flow in spans], "measured")


def test_merged_processes_with_a_measured_offset_put_the_send_before_its_receive():
    sender = process(0.0, [("compute", "compute", 0.000, 0.010, "layer 0", "edge-a", None),
                           ("link", "comm", 0.010, 0.012, "send x", "edge-a", "x")])
    receiver = process(0.505, [("link", "comm", 0.5125, 0.513, "recv x", "edge-b", "x"),
                               ("compute", "compute", 0.513, 0.520, "layer 1", "edge-b", None)])
    assert receiver.spans[0].start < sender.spans[1].start                  # on their own clocks: backwards
    offsets = barrier_offsets([0.600, 0.600 - 0.505])                   # both read the barrier's release
    assert offsets == pytest.approx([0.0, 0.505])
    merged = Timeline.merge([sender, receiver], offsets)
    (send, recv), = merged.flows().values()
    assert (send.label, send.rank, recv.label, recv.rank) == ("send x", 0, "recv x", 1)
    assert send.end <= recv.start == pytest.approx(0.5125)
    assert [s.label for s in merged.spans] == ["layer 0", "send x", "recv x", "layer 1"]
    events = merged.to_chrome_trace()["traceEvents"]
    start, finish = [e for e in events if e["ph"] == "s"][0], [e for e in events if e["ph"] == "f"][0]
    assert start["ts"] < finish["ts"]
    with pytest.raises(ValueError, match="1 offsets for 2 timelines"):
        Timeline.merge([sender, receiver], [0.0])
    with pytest.raises(ValueError, match="different sources"):
        Timeline.merge([sender, Timeline([], "predicted")])


def test_merge_keeps_each_processes_order_and_ranks():
    first = Timeline([Span("compute", "compute", 0.2, 0.3, "a0"), Span("io", "io", 0.0, 0.1, "a1"),
                      Span("compute", "compute", 0.3, 0.4, "a2")], "measured", [Counter("c", 0.1, 1.0)])
    second = Timeline([Span("compute", "compute", 0.0, 0.1, "b0", rank=7), Span("io", "io", 0.05, 0.2, "b1")],
                      "measured")
    merged = Timeline.merge([first, second], [0.0, 0.1])
    assert [s.label for s in merged.spans] == ["b0", "b1", "a0", "a1", "a2"]
    assert [s.label for s in merged.spans if s.label.startswith("a")] == ["a0", "a1", "a2"]
    assert [(s.label, s.rank, s.start) for s in merged.spans if s.label.startswith("b")] == [
        ("b0", 7, pytest.approx(0.1)), ("b1", 1, pytest.approx(0.15))]
    assert merged.counters == (Counter("c", 0.1, 1.0, rank=0),)
    assert Timeline.merge([first]).spans == tuple(replace(s, rank=0) for s in first.spans)


def test_clock_offset_from_round_trips_uses_the_shortest():
    assert round_trip_offset([(0.0, 10.05, 0.1), (1.0, 11.0, 1.02)]) == pytest.approx(11.0 - 1.01)
    assert barrier_offsets([1.0, 3.0, 0.5], reference=1) == pytest.approx([2.0, 0.0, 2.5])
    with pytest.raises(ValueError, match="no round trips"):
        round_trip_offset([])


def test_chrome_trace_draws_flows_and_a_track_per_device_and_lane():
    tl = Timeline([Span("compute", "compute", 0.0, 0.01, "layer 0", device="a"),
                   Span("link", "comm", 0.01, 0.02, "send", device="a", flow=7, nbytes=64),
                   Span("compute", "compute", 0.0, 0.02, "layer 0", device="b"),
                   Span("link", "comm", 0.025, 0.03, "recv", device="b", flow=7),
                   Span("link", "comm", 0.03, 0.04, "send, never received", device="b", flow=8)], "measured")
    events = tl.to_chrome_trace()["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    threads = {(procs[e["pid"]], e["args"]["name"]): (e["pid"], e["tid"]) for e in events
               if e["name"] == "thread_name"}
    assert set(threads) == {("a (measured)", "compute"), ("a (measured)", "link"), ("b (measured)", "compute"),
                            ("b (measured)", "link")}
    slices = [e for e in events if e["ph"] == "X"]
    assert {(e["pid"], e["tid"]) for e in slices} == set(threads.values())
    send, recv = slices[1], slices[3]
    assert send["args"]["nbytes"] == 64 and send["args"]["flow"] == 7 and recv["name"] == "recv"
    flows = [e for e in events if e["ph"] in "stf"]
    assert [(e["ph"], e["id"]) for e in flows] == [("s", 7), ("f", 7)]
    assert flows[0]["name"] == flows[1]["name"] and flows[0]["cat"] == flows[1]["cat"] and flows[1]["bp"] == "e"
    for event, bound in zip(flows, (send, recv)):
        assert (event["pid"], event["tid"]) == (bound["pid"], bound["tid"])
        assert bound["ts"] <= event["ts"] <= bound["ts"] + bound["dur"]


def test_ranks_sharing_a_device_get_tracks_of_their_own():
    merged = Timeline.merge([Timeline([Span("compute", "compute", 0, 1, "x", device="vm")], "measured")] * 2)
    events = merged.to_chrome_trace()["traceEvents"]
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == {
        "vm · rank 0 (measured)", "vm · rank 1 (measured)"}
    assert len({(e["pid"], e["tid"]) for e in events if e["ph"] == "X"}) == 2
