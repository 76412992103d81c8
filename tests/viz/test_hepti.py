"""Hepti's figures read back against the engine's own numbers (cost model only, no torch, no processes).

Each test says the wrong code it catches. The per-layer decisions are made here from ``hepti_partition`` directly
(not the page's schedule), and the latencies checked against Eq. (5) from ``mode_blocks``, not the breakdown."""
import math
from dataclasses import replace

import pytest

from workbench.devices import get_cluster
from workbench.models.shapes import SHAPES
from workbench.hepti.plan import hepti_partition, mode_blocks
from workbench.hepti.run import Decision, predicted_steps, shape_of
from workbench.distributed.steps import steps_timeline
from workbench.timeline import Span, Timeline
from workbench.viz.hepti import (MARK_NAMES, SEGMENT_COLORS, LayerDecision, breakdown_figure, compare_figure, decision_figure,
                                 device_segments, measured_marks, measured_shift, on_devices, predicted_marks,
                                 predicted_s, timeline_figure)

ENCODER = SHAPES["encoder"]
L = ENCODER.num_layers
SHAPE = shape_of(ENCODER, 128)
DEVICES = tuple(get_cluster("hepti").devices)
NAMES = [d.name for d in DEVICES]


def fallen(mb: float = 20.0):
    """The devices once rpi3's free memory fell to ``mb`` MB (WS no longer fits it)."""
    return tuple(replace(d, memory_bytes=mb * 1e6) if d.name == "rpi3" else d for d in DEVICES)


def with_fall(at: int = 2):
    """WS on every device for the first ``at`` layers, then the engine's partition after rpi3's fall."""
    ws = hepti_partition(DEVICES, SHAPE, num_layers=L)
    tiled = hepti_partition(fallen(), SHAPE, num_layers=L)
    assert (ws.mode, tiled.mode) == ("ws", "1d")
    return [LayerDecision(ws, "first" if n == 0 else "") if n < at else
            LayerDecision(tiled, "rpi3's free memory fell" if n == at else "") for n in range(L)], ws, tiled


def eq5_compute_s(p, i: int) -> float:
    """Device i's compute over the partition's layers from Eq. (5): 2 x work x its share / its FLOP/s."""
    total = {"ws": SHAPE.seq_len, "1d": SHAPE.ffn, "2d": SHAPE.ffn, "serial": SHAPE.seq_len}[p.mode]
    share = p.sizes[i] / total
    work = sum(b.work for b in mode_blocks(p.mode, SHAPE, len(p.devices), p.grid))
    return p.num_layers * 2 * work * share / p.devices[i].flops_per_s


def test_decision_bars_are_each_layers_shares_stacked_in_device_order():
    """Catches: every layer drawn with the first partition's shares (the fall ignored), a device's bar starting
    where another's ends in the wrong order, the mode ticks of the wrong layer, the re-decision note on the wrong
    layer or missing."""
    layers, ws, tiled = with_fall()
    fig = decision_figure(layers, "encoder", 128)
    assert len(fig.data) == len(DEVICES)
    for i, trace in enumerate(fig.data):
        want = [ws.shares[i]] * 2 + [tiled.shares[i]] * 4
        assert list(trace.x) == want and list(trace.y) == list(range(L))
        assert list(trace.base) == pytest.approx([sum(p.shares[:i]) for p in [ws] * 2 + [tiled] * 4])
        assert [c[0] for c in trace.customdata] == [ws.sizes[i]] * 2 + [tiled.sizes[i]] * 4
        said = f"{ws.shares[i]:.1%}" if any(want) else "dropped"      # a device computing in no layer
        assert trace.name == f"device {i} ({NAMES[i]}): {said}"
    assert list(fig.layout.yaxis.ticktext) == ["0 · WS", "1 · WS", "2 · 1D", "3 · 1D", "4 · 1D", "5 · 1D"]
    (note,) = fig.layout.annotations
    assert note.y == 2 and "1D from here" in note.text and note.hovertext == "rpi3's free memory fell"
    assert "weight-stationary (WS) then 1D-tiled WS" in fig.layout.title.text
    assert "T = 128, 4 devices" in fig.layout.title.text


def test_breakdown_per_device_is_eq5_compute_plus_waiting_plus_communication_to_the_latency():
    """Catches: one layer's compute drawn for all layers (x L missing), a device's compute read from another's
    column, the communication counted once per device on top of the shared medium, the wait for the slowest
    device left out (the bars would stop short of the latency), seconds drawn as ms, the deadline line elsewhere."""
    p = hepti_partition(DEVICES, SHAPE, num_layers=L)
    layers = [LayerDecision(p, "first")] + [LayerDecision(p, "")] * (L - 1)
    seg = device_segments(layers)
    part = p.participants
    assert len(part) >= 2
    comm = L * sum(b["comm_s"] for b in p.breakdown)
    for i in range(len(DEVICES)):
        assert seg["compute"][i] == pytest.approx(eq5_compute_s(p, i))
        if i in part:
            assert seg["compute"][i] + seg["waiting"][i] + seg["comm"][i] == pytest.approx(p.predicted_latency_s)
            assert seg["comm"][i] == pytest.approx(comm) and seg["no part"][i] == 0.0
        else:
            assert seg["no part"][i] == pytest.approx(p.predicted_latency_s) and seg["comm"][i] == 0.0
    assert comm > 0 and predicted_s(layers) == pytest.approx(p.predicted_latency_s)
    deadline = round(1.2 * p.predicted_latency_s, 3)
    fig = breakdown_figure(layers, deadline_s=deadline)
    bars = {t.name: list(t.y) for t in fig.data}
    assert bars["compute (its own share)"] == pytest.approx([1e3 * c for c in seg["compute"]])
    assert bars["communication (Eq. 6)"] == pytest.approx([1e3 * c for c in seg["comm"]])
    assert ("takes no part (dropped)" in bars) == (len(part) < len(DEVICES))
    assert fig.layout.shapes[0].y0 == pytest.approx(1e3 * deadline)
    assert (f"predicted {1e3 * p.predicted_latency_s:.1f} ms, meets the deadline of {1e3 * deadline:g} ms"
            in fig.layout.title.text)
    short = round(0.8 * p.predicted_latency_s, 3)
    assert f"misses the deadline of {1e3 * short:g} ms" in breakdown_figure(layers, short).layout.title.text


def test_a_fall_sums_each_layers_own_partition_and_a_dropped_device_takes_no_part():
    """Catches: the latency of a schedule with a fall taken from the first partition alone, a device with no
    memory drawn as computing (Hepti drops it) or as waiting."""
    layers, ws, tiled = with_fall()
    total = 2 * ws.predicted_latency_s / L + 4 * tiled.predicted_latency_s / L
    assert predicted_s(layers) == pytest.approx(total)
    seg = device_segments(layers)
    assert seg["compute"][0] == pytest.approx(eq5_compute_s(ws, 0) * 2 / L + eq5_compute_s(tiled, 0) * 4 / L)
    dropped = tuple(replace(d, memory_bytes=0.0) if d.name == "rpi3" else d for d in DEVICES)
    p = hepti_partition(dropped, SHAPE, num_layers=L)
    assert p.shares[3] == 0 and "rpi3 dropped: no free memory" in p.reasons
    seg = device_segments([LayerDecision(p, "first")] + [LayerDecision(p, "")] * (L - 1))
    assert seg["compute"][3] == seg["waiting"][3] == seg["comm"][3] == 0.0
    assert seg["no part"][3] == pytest.approx(p.predicted_latency_s)
    names = [t.name for t in breakdown_figure([LayerDecision(p, "first")] * L).data]
    assert "takes no part (dropped)" in names
    bars = decision_figure([LayerDecision(p, "first")] * L, "encoder", 128).data
    assert [(t.name.endswith(": dropped"), t.marker.color == SEGMENT_COLORS["no part"]) for t in bars] == \
        [(False, False)] * 3 + [(True, True)]          # greyed in the decision as in the latency bars


def test_compare_stacks_each_partitions_critical_path_and_communication_and_says_refusals():
    """Catches: a baseline drawn from the LP's partition, compute summed over devices instead of the slowest per
    block, a refused entry silently dropped or drawn as 0 ms, the deadline verdict on the wrong bars, the
    outline on an entry not selected."""
    K = len(DEVICES)
    hepti = hepti_partition(DEVICES, SHAPE, num_layers=L)
    even = hepti_partition(DEVICES, SHAPE, num_layers=L, mode="ws", fixed_shares=[1 / K] * K)
    entries = {"Hepti's MILP": hepti, "even shares": even, "serial forced": "the primary holds too little"}
    assert even.predicted_latency_s > hepti.predicted_latency_s
    deadline = round((even.predicted_latency_s + hepti.predicted_latency_s) / 2, 3)       # even shares miss it
    fig = compare_figure(entries, deadline_s=deadline, selected="even shares")
    compute, comm = fig.data
    assert list(compute.x) == list(entries)
    for k, p in enumerate((hepti, even)):
        assert compute.y[k] == pytest.approx(1e3 * L * sum(max(b["compute_s"]) for b in p.breakdown))
        assert compute.y[k] + comm.y[k] == pytest.approx(1e3 * p.predicted_latency_s)
    assert comm.text[1] == f"{1e3 * even.predicted_latency_s:.1f} ms (misses)"
    assert comm.text[0] == f"{1e3 * hepti.predicted_latency_s:.1f} ms"
    assert compute.y[2] is None and comm.text[2] == ""
    note = next(a for a in fig.layout.annotations if a.text == "not possible")
    assert note.x == "serial forced" and note.hovertext == "the primary holds too little"
    assert list(compute.marker.line.width) == [0.5, 2.5, 0.5]
    assert fig.layout.shapes[0].y0 == pytest.approx(1e3 * deadline)
    assert "the first three in weight-stationary (WS)" in fig.layout.title.text
    assert "outlined: even shares" in fig.layout.title.text


def test_the_predicted_timeline_and_its_marks_follow_the_engines_schedule():
    """Catches: rows keyed by rank so the predicted and measured lanes of one device part, the switch marked at
    the wrong layer's start, a re-partition mistaken for a mode switch."""
    p = hepti_partition(DEVICES, SHAPE, num_layers=L)
    tl = steps_timeline(predicted_steps(p, SHAPE, L), NAMES)
    layers = [LayerDecision(p, "first")] + [LayerDecision(p, "")] * (L - 1)
    layers[3] = LayerDecision(p, "rpi4-a's measured speed moved")
    marks = predicted_marks(layers, tl)
    assert [(m.kind, m.layer) for m in marks] == [("first", 0), ("repartition", 3)]
    assert marks[1].at_s == min(s.start for s in tl.spans if s.layer == 3) > 0
    fig = timeline_figure(tl, NAMES, marks=[("predicted", marks)], title="t")
    traces = {t.name: t for t in fig.data}
    assert list(traces["re-partition (predicted)"].x) == [1e3 * marks[1].at_s]
    assert list(traces["first decision (predicted)"].text) == ["L0: WS"]
    lines = [s for s in fig.layout.shapes if s.yref == "paper"]
    assert sorted(s.x0 for s in lines) == sorted(1e3 * m.at_s for m in marks)
    assert set(fig.layout.yaxis.categoryarray) == {f"{n} · device {i}" for i, n in enumerate(NAMES)}


def _span(device, rank, kind, start, end, label, layer, lane=None, event=None):
    return Span(lane or f"device {device}", kind, start, end, label, device=device, rank=rank, layer=layer,
                event=event)


def test_measured_marks_sit_at_the_ranks_first_decision_span_and_a_fault_before_the_resumed_layers():
    """A run resumed after a fault: its ranks renumbered (rpi4-b is rank 1 now) and its lanes named by device.

    Catches: a decision marked at the last rank's span instead of the first, marks not moved with the spans, the
    re-partition after a fault called a mode switch when the mode stayed, a fault marker left seconds before the
    layers it concerns (off the figure), the spans of a renumbered rank put in another device's row, a span
    taken for a decision or a fault by its label rather than its typed event."""
    spans = (
        _span("rpi4-a", None, "stall", 13.0, 13.0, "fault: jetson-nano-cpu lost at layer 4; re-partition over 3 "
              "devices", 4, lane="device 0", event="fault"),
        _span("rpi4-b", 1, "stall", 25.002, 25.003, "Hepti decides: 1d (first)", 4, event="decision"),
        _span("rpi4-a", 0, "stall", 25.001, 25.004, "Hepti decides: 1d (first)", 4, event="decision"),
        _span("rpi4-a", 0, "compute", 25.000, 25.001, "reports 4", 4, event="report"),
        _span("rpi4-b", 1, "compute", 25.004, 25.010, "attention 4", 4),
        _span("rpi4-a", 0, "stall", 25.020, 25.021, "Hepti decides: 1d (speed)", 5, event="decision"),
        _span("rpi4-b", 1, "compute", 25.000, 25.0005, "fault: a user's label", 4),
        _span("rpi4-b", 1, "compute", 25.010, 25.011, "Hepti decides: a user's label", 5),
    )
    measured = Timeline(spans, "measured")
    decisions = (Decision(0, "ws", (0.3, 0.3, 0.3, 0.1), (), "first", ()),
                 Decision(2, "1d", (0.3, 0.3, 0.3, 0.1), (), "rpi3's free memory fell", ()),
                 Decision(4, "1d", (0.4, 0.4, 0.2), (), "re-partition after the fault: jetson-nano-cpu lost", ()),
                 Decision(5, "ws", (0.5, 0.3, 0.2), (), "rpi4-b's measured speed moved", ()))
    p = hepti_partition(DEVICES, SHAPE, num_layers=L)
    predicted = steps_timeline(predicted_steps(p, SHAPE, L), NAMES)
    layer4 = min(s.start for s in predicted.spans if s.layer == 4)
    shift = measured_shift(measured, predicted)
    assert shift == pytest.approx(25.000 - layer4)                   # layer 4 measured beside layer 4 predicted
    marks = measured_marks(measured, decisions, shift)
    by_layer = {(m.kind, m.layer): m for m in marks}
    assert set(by_layer) == {("repartition", 4), ("switch", 5), ("fault", 4)}     # layers 0-3: no spans kept
    assert by_layer[("repartition", 4)].at_s == pytest.approx(25.001 - shift)
    assert by_layer[("switch", 5)].at_s == pytest.approx(25.020 - shift) and by_layer[("switch", 5)].text == "L5: WS"
    fault = by_layer[("fault", 4)]
    assert fault.at_s == pytest.approx(layer4) and "12.0 s before the resumed layers" in fault.hover
    moved = on_devices(Timeline(tuple(replace(s, start=s.start - shift, end=s.end - shift) for s in spans)), NAMES)
    assert not any(s.event == "fault" for s in moved.spans) and len(moved.spans) == len(spans) - 1
    assert {(s.device, s.lane, s.rank) for s in moved.spans} == {("rpi4-a", "device 0", 0), ("rpi4-b", "device 2", 2)}
    fig = timeline_figure(predicted, NAMES, Timeline(tuple(replace(s, start=s.start - shift, end=s.end - shift)
                                                          for s in spans), "measured"),
                          [("measured", marks)], "t")
    names = {t.name for t in fig.data}
    assert {f"{MARK_NAMES['fault']} (measured)", "mode switch (measured)", "compute (measured)"} <= names
    measured_rows = {y for t in fig.data if t.name == "compute (measured)" for y in t.y}
    assert measured_rows == {"rpi4-a · device 0", "rpi4-b · device 2"}
    assert math.isclose(fig.layout.yaxis2.range[1], 1.0)


@pytest.mark.parametrize("view", ["hepti", "partition"])
def test_a_slot_without_a_plan_keeps_its_figures_title_and_wraps_the_reason(view):
    """Catches: a no-plan figure titled with the page's internal slot name ("decision", "breakdown") and its
    reason on one line clipped on both sides of a half-width slot."""
    import importlib

    module = importlib.import_module(f"workbench.viz.{view}")
    reason = ("no partition meets the deadline of 50.0 ms: the best reachable is 122.7 ms (1D-tiled WS over 16 of "
              "the 32 devices (the other 16 take no share))")
    for slot, title in module.NO_PLAN_TITLES.items():
        fig = module.no_plan_figure(slot, reason)
        assert fig.layout.title.text == title and title.lower() != slot
        lines = fig.layout.annotations[0].text.split("<br>")
        assert len(lines) > 1 and all(len(line) <= 60 for line in lines)
        assert " ".join(lines) == reason
