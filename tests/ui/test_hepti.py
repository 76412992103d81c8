"""The Hepti page headless: every control off its default, the figures following the engine's numbers (partitions
made here independently with ``hepti_partition`` on devices built another way, the predicted timeline from
``predicted_steps``), bad input said in the page, and real runs on worker processes (a memory fall, then a killed
device) whose decisions and fault are marked on the timeline."""
import html
import math
import re
from dataclasses import replace

import pytest

from workbench.devices import get_cluster
from workbench.distributed import limits
from workbench.models.shapes import SHAPES
from workbench.hepti.plan import MODE_TITLES, hepti_partition, memory_bytes
from workbench.errors import WorkbenchError
from workbench.hepti.run import decide, predicted_steps, shape_of, split_of
from workbench.distributed.shares import proportional_shares
from workbench.distributed.steps import steps_timeline
from workbench.ui.hepti import HeptiPanel

FIGURES = {"decision", "breakdown", "compare", "timeline"}
CLUSTER = tuple(get_cluster("hepti").devices)
NAMES = [d.name for d in CLUSTER]
SHORT = {"ws": "WS", "1d": "1D", "2d": "2D", "serial": "serial"}


def devices(*changes):
    """The cluster's boards with (index, field, value) changed, in the engine's units."""
    out = list(CLUSTER)
    for i, name, value in changes:
        out[i] = replace(out[i], **{name: value})
    return tuple(out)


def text(widget) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", widget.value))


def cells(value: str, device: int) -> list[str]:
    """The cells of a device's row in a table of the page."""
    row = value.split(f"<tr data-device='{device}'>")[1].split("</tr>")[0]
    return [html.unescape(c) for c in re.findall(r">([^<]*)</td>", row)]


def shares_drawn(panel) -> list[list[float]]:
    """Per layer, the share of each device the decision figure draws."""
    traces = panel.figures["decision"].data
    return [[t.x[n] for t in traces] for n in range(len(traces[0].x))]


def compare_totals(panel) -> dict[str, float | None]:
    compute, comm = panel.figures["compare"].data
    return {x: (None if c is None else c + m) for x, c, m in zip(compute.x, compute.y, comm.y)}


def test_first_load_shows_heptis_partition_of_the_four_boards():
    """The encoder at T = 128 on Hepti's four boards with a 200 ms deadline: WS with the LP's shares, the
    engine's reasons and binding constraint beside it, every device's bar reaching its latency, the baselines'
    latencies, and the timeline the engine predicts for the partition."""
    panel = HeptiPanel()
    assert panel.message.value == "" and set(panel.figures) == FIGURES
    shape = shape_of(SHAPES["encoder"], 128)
    p = hepti_partition(CLUSTER, shape, 0.2, num_layers=6)
    assert p.mode == "ws"
    assert shares_drawn(panel) == [list(p.shares)] * 6
    reasons = text(panel.reasons)
    assert all(r in reasons for r in p.reasons) and f"Binding constraint: {p.binding}" in reasons
    need = memory_bytes("ws", shape, p.shares[3], 6) if p.shares[3] > 0 else 0.0
    assert cells(panel.reasons.value, 3) == ["3 (rpi3)", f"{p.shares[3]:.1%}", str(p.sizes[3]), str(p.heads[3]),
                                             f"{need / 1e6:.1f}", "1,000"]
    breakdown = panel.figures["breakdown"]
    stacks = [sum(t.y[i] for t in breakdown.data) for i in range(4)]
    assert stacks == pytest.approx([1e3 * p.predicted_latency_s] * 4)
    assert breakdown.layout.shapes[0].y0 == pytest.approx(200.0)
    assert f"predicted {1e3 * p.predicted_latency_s:.1f} ms, meets the deadline of 200 ms" in \
        breakdown.layout.title.text
    even = hepti_partition(CLUSTER, shape, num_layers=6, mode="ws", fixed_shares=[0.25] * 4)
    prop = hepti_partition(CLUSTER, shape, num_layers=6, mode="ws", fixed_shares=proportional_shares(CLUSTER))
    totals = compare_totals(panel)
    assert totals["Hepti's MILP"] == pytest.approx(1e3 * p.predicted_latency_s)
    assert totals["even shares"] == pytest.approx(1e3 * even.predicted_latency_s) and totals["even shares"] > 200
    assert totals["proportional shares"] == pytest.approx(1e3 * prop.predicted_latency_s)
    for mode in MODE_TITLES:
        forced = hepti_partition(CLUSTER, shape, num_layers=6, mode=mode)
        assert totals[f"{SHORT[mode]} forced"] == pytest.approx(1e3 * forced.predicted_latency_s), mode
    engine = steps_timeline(predicted_steps(p, shape, 6), NAMES)
    assert panel.predicted.spans == engine.spans                  # no fall: one partition for every layer
    assert f"predicted {1e3 * engine.end:.1f} ms" in panel.figures["timeline"].layout.title.text
    marks = {t.name: list(t.x) for t in panel.figures["timeline"].data if t.name.endswith("(predicted)") and
             t.type == "scatter"}
    assert marks == {"first decision (predicted)": [0.0]}


def test_a_memory_fall_switches_the_mode_at_its_layer_as_the_engine_decides():
    """rpi4-b's free memory falls to 20 MB from layer 2 (no deadline): WS for layers 0-1, then what the engine's
    ``decide`` makes of the fallen reports (called here on the engine's own first split), its reason said beside
    the figure, the latency summed layer by layer, and the switch marked on the predicted timeline."""
    panel = HeptiPanel(deadline_ms=None)
    panel.rows[2].fall_mb.value = 20.0
    panel.rows[2].fall_at.value = 2
    assert panel.message.value == ""
    shape = shape_of(SHAPES["encoder"], 128)
    ws = hepti_partition(CLUSTER, shape, num_layers=6)
    assert ws.mode == "ws" and ws.shares[2] > 0                   # rpi4-b takes part: its fall matters
    fallen = devices((2, "memory_bytes", 20e6))
    split, why, tiled = decide(split_of(ws, range(4), shape), None, fallen, shape, 6, 2, math.inf, range(4))
    assert tiled.mode == "1d" and why.startswith("rpi4-b's free memory fell to 20.0 MB")
    drawn = shares_drawn(panel)
    assert drawn[:2] == [list(ws.shares)] * 2
    assert all(layer == pytest.approx(list(tiled.shares)) for layer in drawn[2:])
    title = panel.figures["decision"].layout.title.text
    assert "weight-stationary (WS) then 1D-tiled WS" in title
    assert f"layer 2: {why} → 1D-tiled WS" in text(panel.reasons)
    total = 1e3 * (2 * ws.predicted_latency_s + 4 * tiled.predicted_latency_s) / 6
    assert f"predicted {total:.1f} ms, no deadline" in panel.figures["breakdown"].layout.title.text
    switch = next(t for t in panel.figures["timeline"].data if t.name == "mode switch (predicted)")
    layer2 = min(s.start for s in panel.predicted.spans if s.layer == 2)
    assert list(switch.x) == [pytest.approx(1e3 * layer2)] and list(switch.text) == ["L2: 1D"]
    deadline = math.floor(1e3 * tiled.predicted_latency_s) - 1        # the tiled partition alone misses it
    assert deadline > 1e3 * ws.predicted_latency_s
    panel.deadline.value = deadline
    panel.use_deadline.value = True
    # a decision mid-run carries on (the deadline was checked when the run was planned): the fall is not refused
    again = decide(split_of(ws, range(4), shape), None, fallen, shape, 6, 2, deadline / 1e3, range(4))
    assert again[2].mode == "1d" and again[2].shares == tiled.shares
    assert text(panel.message) == ""
    total = 1e3 * (2 * ws.predicted_latency_s + 4 * tiled.predicted_latency_s) / 6
    verdict = "meets" if total <= deadline else "misses"
    assert f"predicted {total:.1f} ms, {verdict} the deadline of {deadline} ms" in \
        panel.figures["breakdown"].layout.title.text
    panel.rows[2].fall_at.value = -1                    # "never": back to WS within the deadline
    assert panel.message.value == "" and shares_drawn(panel) == [list(ws.shares)] * 6


def test_every_control_off_its_default_reaches_the_partition_and_the_figures():
    panel = HeptiPanel()
    titles = lambda: {n: f.layout.title.text for n, f in panel.figures.items()}
    panel.model.value = "gpt2"                          # 939 ms at best: past the 200 ms deadline
    assert "no partition meets the deadline of 200.0 ms" in text(panel.message)
    panel.deadline.value = 3000
    assert "gpt2" in titles()["decision"] and "12 layers" in titles()["compare"]
    assert "the deadline of 3000 ms" in titles()["breakdown"] and panel.message.value == ""
    assert len(panel.rows[0].fall_at.options) == 12 and len(panel.kill_layer.options) == 11
    panel.seq_len.value = 256
    assert "T = 256" in titles()["decision"] and "T = 256" in titles()["timeline"]
    panel.use_deadline.value = False
    assert "no deadline" in titles()["breakdown"] and not panel.figures["breakdown"].layout.shapes
    assert panel.deadline.disabled
    panel.use_deadline.value = True
    assert "the deadline of 3000 ms" in titles()["breakdown"] and not panel.deadline.disabled
    panel.count.value = 3
    assert len(panel.table.children) == 3 and "3 devices" in titles()["decision"]
    assert [v for _, v in panel.kill_device.options] == ["", "jetson-nano-cpu", "rpi4-b"]
    panel.rows[0].speed.value = 30.0                     # one fast board
    panel.rows[1].bandwidth.value = 300.0               # one slow link
    panel.rows[2].memory.value = 0.5
    panel.shares.value = "proportional"
    shape = shape_of(SHAPES["gpt2"], 256)
    mine = devices((0, "flops_per_s", 30e9), (1, "net_bytes_per_s", 300e6 / 8), (2, "memory_bytes", 0.5e9))[:3]
    fixed = proportional_shares(mine)
    p = hepti_partition(mine, shape, 3.0, num_layers=12, mode="ws", fixed_shares=fixed)
    assert shares_drawn(panel) == [list(p.shares)] * 12 and p.shares[0] == pytest.approx(30 / 53.44)
    assert "shares: in proportion to speed" in titles()["decision"]
    assert list(panel.figures["compare"].data[0].marker.line.width)[:3] == [0.5, 0.5, 2.5]
    assert f"predicted {1e3 * p.predicted_latency_s:.1f} ms" in titles()["breakdown"]
    panel.mode.value = "1d"
    p = hepti_partition(mine, shape, 3.0, num_layers=12, mode="1d", fixed_shares=fixed)
    assert shares_drawn(panel) == [list(p.shares)] * 12 and "1D-tiled WS" in titles()["decision"]
    assert "the first three in 1D-tiled WS" in titles()["compare"]
    assert compare_totals(panel)["even shares"] == pytest.approx(1e3 * hepti_partition(
        mine, shape, num_layers=12, mode="1d", fixed_shares=[1 / 3] * 3).predicted_latency_s)
    panel.shares.value = "hepti"
    panel.mode.value = "2d"
    p = hepti_partition(mine, shape, 3.0, num_layers=12, mode="2d")
    assert p.grid == (1, 3) and shares_drawn(panel)[0] == pytest.approx(list(p.shares))
    assert "2D-tiled WS" in titles()["decision"]
    panel.mode.value = "auto"
    panel.rows[2].fall_at.value = 5
    panel.rows[2].fall_mb.value = 0.0                   # rpi4-b's memory gone from layer 5: it is dropped
    after = hepti_partition(tuple(replace(d, memory_bytes=0.0) if i == 2 else d for i, d in enumerate(mine)),
                            shape, 3.0, num_layers=12)
    assert after.shares[2] == 0 and shares_drawn(panel)[5] == list(after.shares)
    assert "rpi4-b's free memory fell to 0.0 MB" in text(panel.reasons)
    panel.kill_device.value = "rpi4-b"
    panel.kill_layer.value = 7
    assert panel.kill() == ("rpi4-b", 7) and panel.run_key()[1:] == (("rpi4-b", 7), True)
    assert panel.message.value == ""


def test_bad_table_values_and_an_unmeetable_deadline_show_the_engines_message():
    panel = HeptiPanel()
    panel.rows[0].memory.value = 0.0                    # the primary with no free memory
    with pytest.raises(WorkbenchError) as refused:
        hepti_partition(devices((0, "memory_bytes", 0.0)), shape_of(SHAPES["encoder"], 128), 0.2, num_layers=6)
    said = text(panel.message)
    assert said == str(refused.value) and "the primary 'rpi4-a' has no free memory" in said
    assert "Traceback" not in panel.message.value and "internal error" not in panel.message.value
    assert "no partition" in panel.figures["decision"].layout.annotations[0].text
    panel.rows[0].memory.value = 4.0
    assert panel.message.value == ""
    panel.rows[2].speed.value = -1.0
    assert "device 2's speed: must be more than 0 GFLOP/s, got -1" in text(panel.message)
    assert "no devices" in panel.figures["compare"].layout.annotations[0].text
    panel.rows[2].speed.value = 12.0
    panel.rows[1].memory.value = -2.0
    assert "device 1's memory: must be at least 0 GB, got -2" in text(panel.message)
    panel.rows[1].memory.value = 4.0
    panel.rows[3].fall_at.value = 3
    panel.rows[3].fall_mb.value = -5.0
    assert "device 3's free memory after the fall: must be at least 0 MB, got -5" in text(panel.message)
    panel.rows[3].fall_at.value = -1
    assert panel.message.value == ""
    panel.deadline.value = 50
    with pytest.raises(WorkbenchError) as refused:
        hepti_partition(CLUSTER, shape_of(SHAPES["encoder"], 128), 0.05, num_layers=6)
    assert text(panel.message) == str(refused.value)
    assert str(refused.value).startswith("no partition meets the deadline of 50.0 ms: the best reachable is")
    assert all("(misses)" in t for t in panel.figures["compare"].data[1].text if t)
    panel.deadline.value = 250
    assert panel.message.value == ""


def test_more_devices_than_worker_processes_is_refused_beside_the_button():
    panel = HeptiPanel(deadline_ms=None)
    panel.count.value = int(limits.ranks.maximum) + 1
    assert panel.message.value == "" and len(panel.settings.devices) == panel.count.value
    panel.runner.button.click()
    said = text(panel.runner.message)
    assert f"at most {int(limits.ranks.maximum)}" in said and "Set Devices to" in said
    assert len(panel.runs) == 0


@pytest.fixture(scope="module")
def ran():
    """One panel run twice on 4 worker processes (encoder, T = 32, no deadline, memory reports alone deciding: a
    busy host's measured speeds would add re-partitions of their own): rpi4-b's memory falling to 20 MB at layer
    2, then the same with jetson-nano-cpu killed at layer 4."""
    panel = HeptiPanel(seq_len=32, deadline_ms=None)
    panel.rows[2].fall_mb.value = 20.0
    panel.rows[2].fall_at.value = 2
    panel.adapt.value = False
    panel.runner.button.click()                         # no event loop in a test: the run completes here
    first = (panel.runner.message.value, panel.run_info.value, panel.decisions_info.value, panel.figures["timeline"],
             panel.runs.get(panel.run_key()))
    panel.kill_device.value = "jetson-nano-cpu"
    panel.kill_layer.value = 4
    panel.runner.button.click()
    return panel, first


@pytest.mark.alone
@pytest.mark.integration
def test_run_for_real_decides_as_the_page_predicts_and_marks_the_mode_switch(ran):
    """The ranks' decisions from their reports: WS with the page's shares at layer 0 (no layer measured yet), the
    switch to 1D at the fall's layer for the reason the page gives, nothing else; the switch marked on the
    measured timeline at the first rank's decision span."""
    panel, (message, info, decisions, fig, run) = ran
    assert message == "" and run is not None
    result = run.result
    assert not result.faults
    first = panel.layers[0].partition
    assert [(d.layer, d.mode) for d in result.decisions] == [(0, "ws"), (2, "1d")]
    assert result.decisions[0].shares == pytest.approx(first.shares)
    assert result.decisions[1].changed == panel.layers[2].changed
    assert result.decisions[1].changed.startswith("rpi4-b's free memory fell to 20.0 MB, below the")
    assert [ld.partition.mode for ld in panel.layers] == ["ws"] * 2 + ["1d"] * 4
    names = {t.name for t in fig.data}
    assert {"compute (predicted)", "compute (measured)", "mode switch (measured)", "first decision (measured)"} <= names
    mark = next(t for t in fig.data if t.name == "mode switch (measured)")
    decides = [s for s in result.timeline.spans if s.event == "decision" and s.layer == 2]
    origin = min(s.start for s in result.timeline.spans)
    assert list(mark.text) == ["L2: 1D"]
    assert list(mark.x) == [pytest.approx(1e3 * (min(s.start for s in decides) - origin))]
    assert f"replayed {1e3 * result.latency_s:.1f} ms vs predicted" in fig.layout.title.text
    assert f"Replayed {1e3 * result.latency_s:.1f} ms" in info and "a replay of the cost model, not a measurement" in info
    rows = re.findall(r"<tr data-layer='(\d+)'>(.*?)</tr>", decisions)
    assert [int(n) for n, _ in rows] == [0, 2]
    layer2 = html.unescape(dict(rows)["2"])
    assert "1D-tiled WS" in layer2 and "rpi4-b's free memory fell to 20.0 MB" in layer2
    assert all(f"{n} {s:.1%}" in layer2 for n, s in zip(NAMES, result.decisions[1].shares))


@pytest.mark.alone
@pytest.mark.integration
def test_a_killed_device_is_marked_as_a_fault_and_the_run_goes_on_over_the_rest(ran):
    """The kill lands as the primary starts layer 4 (or, on a quick run, 5 already): the fault is marked where the
    prediction starts the layer the run resumed at, the resumed layers are drawn in the rows of the devices left,
    and the decisions table names the devices of the re-partition."""
    panel, _ = ran
    assert panel.runner.message.value == "" and panel.message.value == ""
    result = panel.runs[panel.run_key()].result
    assert len(result.faults) == 1 and result.faults[0].startswith("rank 1 (jetson-nano-cpu) died")
    (span,) = [s for s in result.timeline.spans if s.event == "fault"]
    resumed = span.layer
    assert resumed in (4, 5) and f"resumed at layer {resumed}" in result.faults[0]
    assert [(d.layer, d.mode) for d in result.decisions] == [(0, "ws"), (2, "1d"), (resumed, "1d")]
    assert result.decisions[2].changed == "re-partition after the fault: jetson-nano-cpu lost"
    fig = panel.figures["timeline"]
    fault = next(t for t in fig.data if t.name == "fault (measured)")
    start = min(s.start for s in panel.predicted.spans if s.layer == resumed)
    assert list(fault.x) == [pytest.approx(1e3 * start)]
    assert f"jetson-nano-cpu lost at layer {resumed}" in fault.hovertext[0]
    repartition = next(t for t in fig.data if t.name == "re-partition (measured)")
    assert len(repartition.x) == 1 and 1e3 * start <= repartition.x[0] < 1e3 * start + 50   # its first rank's span
    measured_rows = {y for t in fig.data if t.name == "compute (measured)" for y in t.y}
    assert measured_rows <= {f"{n} · device {i}" for i, n in enumerate(NAMES) if n != "jetson-nano-cpu"}
    assert "1 fault" in fig.layout.title.text and "jetson-nano-cpu" in text(panel.run_info)
    drawn = [(s.start, s.end) for s in result.timeline.spans if s.layer is not None and not s.label.startswith("fault")]
    extent = max(e for _, e in drawn) - min(b for b, _ in drawn)        # the title's drawn time is the spans' own
    assert f"drawn: layers {resumed}-{len(panel.layers) - 1} after the fault, {1e3 * extent:.1f} ms" in \
        fig.layout.title.text
    assert f"the other {1e3 * (result.latency_s - extent):.1f} ms are the run the fault cut short" in \
        fig.layout.title.text
    rows = dict(re.findall(r"<tr data-layer='(\d+)'>(.*?)</tr>", panel.decisions_info.value))
    after = html.unescape(rows[str(resumed)])
    assert "re-partition after the fault: jetson-nano-cpu lost" in after and "jetson" not in after.split("</td>")[2]
    assert all(n in after for n in ("rpi4-a", "rpi4-b", "rpi3"))
    panel.kill_device.value = ""                        # back to the first run's settings: it shows again
    assert "fault (measured)" not in {t.name for t in panel.figures["timeline"].data}
    assert "mode switch (measured)" in {t.name for t in panel.figures["timeline"].data}
    panel.adapt.value = True                            # another run's key: none has run with it
    assert "compute (measured)" not in {t.name for t in panel.figures["timeline"].data}


@pytest.mark.alone
@pytest.mark.integration
def test_cancel_stops_the_worker_processes_and_says_so(cancel_a_run):
    panel = HeptiPanel(seq_len=16, deadline_ms=None, devices=2)
    cancel_a_run(panel)
    assert not math.isnan(panel.figures["breakdown"].data[0].y[0])


def test_the_timeline_says_why_its_prediction_is_not_the_decisions_and_draws_no_dropped_device():
    """Catches: 119.9 ms in the decision and 122.7 ms in the timeline with nothing said, and the dropped rpi3
    drawn waiting for rows it takes no part in."""
    from workbench.viz.hepti import predicted_s

    panel = HeptiPanel(deadline_ms=None)
    first = panel.layers[0].partition
    dropped = [d.name for d, share in zip(first.devices, first.shares) if share == 0]
    assert dropped and {s.kind for s in panel.predicted.spans if s.device in dropped} == {"idle"}
    decided, timed = predicted_s(panel.layers), panel.predicted.end
    latency = sum(st.latency_s for st in panel.predicted_steps(panel.settings, panel.layers) if st.kind != "compute")
    title = html.unescape(panel.figures["timeline"].layout.title.text)
    said = re.search(r"([\d.]+) ms, not the decision's ([\d.]+) ms: the links' latency ([\d.]+) ms and whole heads "
                     r"per device ([+-][\d.]+) ms", title)
    assert said, title
    assert [float(x) for x in said.groups()] == [round(1e3 * timed, 1), round(1e3 * decided, 1),
                                                 round(1e3 * latency, 1), round(1e3 * (timed - decided - latency), 1)]
    assert latency > 0 and timed > decided


@pytest.mark.parametrize("remembered", [True, False], ids=["last optimum remembered", "nothing remembered"])
def test_a_missed_deadline_shows_at_once_in_the_browser_and_its_best_reachable_as_soon_as_known(monkeypatch,
                                                                                              remembered):
    """At many devices the full solve that quotes the best reachable latency is the costliest part of a change.
    A change from the browser that misses the deadline says so at once (the program given the deadline proves
    it) with the best reachable where the last optimum's devices prove it; otherwise the quote follows with the
    comparison once the hand pauses. Either way the page ends with the engine's full quote, as a change from
    Python shows it at once."""
    import asyncio

    from tests.ui.test_base import in_event_loop
    from workbench.hepti import plan
    from workbench.ui.base import DEFER_S, SETTLE_S

    panel = HeptiPanel(deadline_ms=20)
    panel.count.value = 24
    assert "the best reachable is" in text(panel.message)           # a change from Python: the quote at once
    if not remembered:
        monkeypatch.setattr(plan, "OPTIMA", plan.Optima())
    seen = {}

    async def move():
        panel.seq_len.set_state({"value": 200})
        await asyncio.sleep(SETTLE_S * 3)
        seen["steered"] = (text(panel.message), panel.deferred, panel.figures["breakdown"].layout.annotations[0].text)
        await asyncio.sleep(DEFER_S * 3)

    in_event_loop(move())
    said, deferred, drawn = seen["steered"]
    with pytest.raises(WorkbenchError) as refused:
        hepti_partition(panel.devices(), shape_of(SHAPES["encoder"], 200), 0.02, num_layers=6)
    quote = str(refused.value)
    assert quote.startswith("no partition meets the deadline of 20.0 ms: the best reachable is")
    assert deferred == [panel._refresh_compare] and "no partition meets the deadline of 20.0 ms" in drawn
    if remembered:
        assert said == quote
    else:
        assert said.startswith("no partition meets the deadline of 20.0 ms (") and "best reachable" not in said
    assert text(panel.message) == quote
    assert "best reachable" in panel.figures["breakdown"].layout.annotations[0].text.replace("<br>", " ")
