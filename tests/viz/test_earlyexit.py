"""E3's figures read back against the engine's own numbers: the optimizer's plans (from a hand-made profile and
GPU latencies, no trained model), the simulator's busy periods, a batch-profile series. Each test says the wrong
code it catches."""
import pytest

from workbench.earlyexit.artifacts import SeriesForecast
from workbench.earlyexit.batchprofile import BatchProfile
from workbench.earlyexit.optimizer import optimize_splits
from workbench.earlyexit.simulator import ArrivalProcess, simulate_plan
from workbench.timeline import Span, Timeline
from workbench.earlyexit.scenario import GoodputRow
from workbench.viz.earlyexit import (BUBBLE, DRAIN, HALF_WRAP, IDLE, idle_text, SYSTEMS, bubble_timeline, bubbles_figure,
                                     goodput_figure, idle_shares, no_plan_text, one_based, plan_figure, profile_figure)

PROFILE = [1.0, 0.9, 0.5, 0.45, 0.4, 0.0]          # half the batch leaves by the third ramp


def latency(layer, batch, gpu):
    return {"v100": 1e-3, "k80": 3e-3}[gpu] * (0.2 + batch / 16)


def plan(**kwargs):
    args = dict(layer_latency=latency, batch_profile=PROFILE, gpus={"v100": 3, "k80": 2}, slo_s=0.05,
                batch_size=16, num_layers=6)
    args.update(kwargs)
    return optimize_splits(**args)


def test_plan_bars_are_the_splits_replicas_types_and_batches():
    """Catches: one bar per split instead of per replica, a split's layers shifted by one (end inclusive),
    colours not following the GPU type, the cut marked at the wrong layer."""
    p = plan()
    assert len(p.splits) >= 2                       # the case tells splits apart
    fig = plan_figure(p, PROFILE)
    assert len(fig.data) == len(p.splits)
    for trace, (start, end), r, gpu, b in zip(fig.data, p.splits, p.replicas, p.gpu_types, p.batch_sizes):
        assert list(trace.base) == [start] * r and list(trace.x) == [end - start] * r
        assert len(trace.y) == r and all(text == f"{gpu} · batch {b}" for text in trace.text)
        assert [row[1:3] for row in trace.customdata] == [[r, b]] * r
    colors = {t.marker.color for t in fig.data}
    assert len(colors) == len(set(p.gpu_types))
    cuts = [s.x0 for s in fig.layout.shapes]
    assert cuts == [start for start, _ in p.splits[1:]]
    for note, (start, _) in zip(fig.layout.annotations, p.splits[1:]):
        assert f"after layer {start - 1}: {100 * PROFILE[start - 1]:.3g}% left" == note.text
    assert f"goodput {p.goodput:,.0f} samples/s" in fig.layout.title.text
    assert tuple(fig.layout.xaxis.range) == (0, 6) and fig.layout.xaxis.title.text.startswith("layers")


def test_an_empty_plan_draws_its_explanation():
    """Catches: empty axes (or a crash) when no plan meets the SLO, instead of the optimizer's reason; lines too
    long for the half-width slot; "no plan: no plan ..."; advice to lower a slack the page cannot set."""
    p = plan(slo_s=1e-4)
    assert not p.splits and p.reason
    fig = plan_figure(p)
    lines = fig.layout.annotations[0].text.split("<br>")
    text = " ".join(lines)
    assert text.lower().count("no plan") == 1 and "raise the SLO" in text and not fig.data
    assert "lower the slack" not in text and "lower the batch per replica (16)" in text
    assert max(map(len, lines)) <= HALF_WRAP + 12          # a word longer than the rest of a line may stick out
    assert "none meets the SLO" in fig.layout.title.text


def test_no_plan_text_keeps_other_reasons():
    """Catches: the rewording eating reasons it does not know."""
    assert no_plan_text("no plan: the GPUs are busy") == "The GPUs are busy"
    assert no_plan_text("something else") == "Something else"


def test_gaps_are_bubbles_while_upstream_works_and_idle_while_nothing_arrived():
    """Catches: bubbles taken from another lane, gaps before the first batch or after the last one dropped,
    queue lanes drawn as replicas, a measured run not overlaid, and every gap called a bubble (the first split
    idle at light load drawn as a pipeline waiting on itself)."""
    spans = [Span("split 0 · replica 0", "compute", 0.001, 0.003), Span("split 0 · replica 0", "compute", 0.005, 0.006),
             Span("split 1 · replica 0", "compute", 0.004, 0.008), Span("split 0 queue", "queue", 0.0, 0.001)]
    bubbles = bubble_timeline(Timeline(tuple(spans)), end_s=0.01)
    gaps = {(s.kind, s.label, s.lane, round(s.start, 6), round(s.end, 6)) for s in bubbles.spans if s.kind != "compute"}
    assert gaps == {("idle", IDLE, "split 1 · replica 1", 0.0, 0.001), ("idle", IDLE, "split 1 · replica 1", 0.003, 0.005),
                    ("idle", IDLE, "split 1 · replica 1", 0.006, 0.01),    # the first split waits for arrivals only
                    ("idle", IDLE, "split 2 · replica 1", 0.0, 0.001),     # nothing upstream yet
                    ("stall", BUBBLE, "split 2 · replica 1", 0.001, 0.003),  # split 1 is making its work
                    ("idle", IDLE, "split 2 · replica 1", 0.003, 0.004),
                    ("idle", IDLE, "split 2 · replica 1", 0.008, 0.01)}    # lanes numbered from 1, as the plan
    assert idle_shares(bubbles) == pytest.approx({"split 1 · replica 1": 0.0, "split 2 · replica 1": 0.2})
    assert idle_shares(bubbles, "idle") == pytest.approx({"split 1 · replica 1": 0.7, "split 2 · replica 1": 0.4})
    assert idle_text(bubbles) == "bubbles 10% on average (0% to 20% per replica), idle 55% with nothing arrived"
    fig = bubbles_figure(bubbles, bubble_timeline(Timeline(tuple(spans[:2]), "measured"), 0.01), title="t")
    names = {t.name for t in fig.data}
    assert {"busy (simulated)", "bubble, waiting for upstream (simulated)", "idle, nothing arrived (simulated)",
            "busy (measured)", "idle, nothing arrived (measured)"} <= names
    assert not any("stall" in n or "predicted" in n for n in names)
    compute = next(t for t in fig.data if t.name == "busy (simulated)")
    assert sorted(compute.base) == pytest.approx([1.0, 4.0, 5.0])           # ms
    assert fig.layout.xaxis.title.text == "time since the first request (ms)"


def test_replica_rows_are_in_numeric_order():
    """Catches: rows sorted as text (replica 1, 10, 11, 12, 2, ...), as twelve replicas idle at 0 used to be."""
    spans = [Span(f"split 0 · replica {r}", "compute", 0.001 * (1 + r % 3), 0.005) for r in range(12)]
    spans += [Span("split 1 · replica 0", "compute", 0.0, 0.002)]
    fig = bubbles_figure(bubble_timeline(Timeline(tuple(spans)), end_s=0.01))
    rows = list(fig.layout.yaxis.categoryarray[::-1])                       # top to bottom
    assert rows == [f"split 1 · replica {r}" for r in range(1, 13)] + ["split 2 · replica 1"]


def test_idle_time_after_the_last_arrival_is_the_drain_not_a_bubble():
    """Catches: the pipeline emptying after the last request counted as bubbles (an idle share near 100% for a
    short run)."""
    spans = [Span("split 0 · replica 0", "compute", 0.0, 0.002), Span("split 0 · replica 0", "compute", 0.003, 0.004)]
    bubbles = bubble_timeline(Timeline(tuple(spans)), end_s=0.01, last_arrival_s=0.005)
    kinds = {(s.label, round(s.start, 6), round(s.end, 6)) for s in bubbles.spans if s.kind != "compute"}
    assert kinds == {(IDLE, 0.002, 0.003), (IDLE, 0.004, 0.005), (DRAIN, 0.005, 0.01)}
    assert idle_shares(bubbles, "idle") == pytest.approx({"split 1 · replica 1": 0.4})
    assert "drain, no more arrivals (simulated)" in {t.name for t in bubbles_figure(bubbles).data}


def test_simulated_bubbles_follow_the_simulators_busy_periods():
    """Catches: the figure drawn from something other than the simulator's per-replica busy periods."""
    p = plan()
    sim = simulate_plan(p, slo_s=0.05, arrivals=ArrivalProcess("uniform", 2000, count=200), layer_latency=latency,
                        transfer_s=p.transfers_s, exits=BatchProfile(tuple(PROFILE)))
    bubbles = bubble_timeline(sim.timeline, max_spans=10_000)
    for replica in sim.replicas:
        lane = one_based(replica.lane)
        drawn = [(s.start, s.end) for s in bubbles.spans if s.lane == lane and s.kind == "compute"]
        assert drawn == [(b.start_s, b.end_s) for b in replica.busy]
        idle = sum(s.duration for s in bubbles.spans if s.lane == lane and s.kind in ("stall", "idle"))
        assert idle == pytest.approx(bubbles.end - replica.busy_s, abs=1e-9)


def test_goodput_lines_are_the_rows_and_a_missing_plan_is_a_cross():
    """Catches: systems swapped, a zero drawn as a point on the line, the page's batch not marked."""
    rows = [GoodputRow(1, e3=100.0, early_exit=80.0, stock=0.0), GoodputRow(4, e3=400.0, early_exit=250.0, stock=200.0)]
    fig = goodput_figure(rows, batch_size=4, slo_ms=50)
    lines = {t.name: list(t.y) for t in fig.data if t.mode == "lines+markers"}
    assert lines == {SYSTEMS["e3"][0]: [100.0, 400.0], SYSTEMS["early_exit"][0]: [80.0, 250.0],
                     SYSTEMS["stock"][0]: [None, 200.0]}
    cross = next(t for t in fig.data if t.mode == "markers")
    assert list(cross.x) == [1] and list(cross.y) == [0]
    assert fig.layout.shapes[0].x0 == 4
    assert fig.layout.title.text.startswith("E3: 1.60x the early-exit model's goodput at batch 4<br>")
    assert "meeting the SLO of 50 ms" in fig.layout.title.text
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.title.text == "goodput (samples/s)"
    assert not any("no batch size" in (a.text or "") for a in fig.layout.annotations)


def test_goodput_figure_says_when_no_batch_size_meets_the_slo():
    """Catches: an empty axis with crosses at 0 and no word on why."""
    rows = [GoodputRow(b, 0.0, 0.0, 0.0) for b in (1, 2, 4)]
    fig = goodput_figure(rows, batch_size=2, slo_ms=1)
    assert any("no batch size meets the SLO of 1 ms" in (a.text or "") for a in fig.layout.annotations)


def test_titles_fit_a_half_width_slot():
    """Catches: titles whose first line runs past about 600 px (cut off on the right at 1280 px)."""
    rows = [GoodputRow(16, 12_230.0, 5000.0, 4000.0)]
    figs = [goodput_figure(rows, 16, 50), plan_figure(plan(), PROFILE)]
    for fig in figs:
        head, *subs = fig.layout.title.text.split("<br>")
        assert len(head) <= 62, head
        assert all(len(line.replace("<sub>", "").replace("</sub>", "")) <= 100 for line in subs), subs


def test_profile_lines_are_the_measured_windows_and_the_forecast():
    """Catches: fractions drawn instead of samples, the forecast of another window, earlier windows dropped."""
    measured = tuple(BatchProfile((1.0, f, f / 2, 0.0)) for f in (0.9, 0.8, 0.7))
    forecast = (None, measured[0], BatchProfile((1.0, 0.75, 0.3, 0.0)))
    series = SeriesForecast((0.8, 0.7, 0.6), measured, forecast, (None, 0.05, 0.04), ("none", "last", "arima"))
    fig = profile_figure(series, 16)
    past, last, ahead = fig.data
    assert list(past.y) == [16, 14.4, 7.2, 0, None, 16, 12.8, 6.4, 0, None]
    assert list(last.y) == pytest.approx([16, 11.2, 5.6, 0]) and "window 3" in last.name
    assert list(ahead.y) == pytest.approx([16, 12, 4.8, 0]) and "optimizer" in ahead.name
    assert "off by 4.0 points" in fig.layout.title.text
    assert fig.layout.yaxis.title.text == "samples left in the batch (of 16)"
    one = profile_figure(series, 1).layout.yaxis                # batch 1: whole samples on the axis
    assert one.dtick == 1 and "on average" in one.title.text


def test_cut_labels_are_staggered_with_many_splits():
    """Catches: the labels of three or more cuts drawn on one row, over each other."""
    from workbench.earlyexit.optimizer import SplitPlan

    splits = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 6)]
    p = SplitPlan(splits, [1] * 5, ["v100"] * 5, [16] * 5, 1000.0, stage_s=[1e-3] * 5, cycle_s=1e-3,
                  latency_s=5e-3, budget_s=0.04, batch_size=16)
    notes = plan_figure(p, PROFILE).layout.annotations
    assert [n.yshift for n in notes] == [0, 15, 0, 15]
    assert all(len(n.text) <= 24 for n in notes)
