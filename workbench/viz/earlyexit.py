"""Figures of early-exit serving (E3): pure functions from the engine's results to Plotly figures.

- :func:`profile_figure`: the batch size left after every ramp, window by window as measured from the ramps'
  real outputs, beside the ARIMA forecast E3 plans with.
- :func:`plan_figure`: the split plan, one bar per replica over the layers it runs, coloured by GPU type, with
  each split's batch and stage time, and the cuts marked with the share of the batch still present.
- :func:`bubbles_figure`: per replica, when it computes and when it idles (the pipeline's bubbles), drawn by the
  shared Gantt (:func:`~workbench.viz.timeline.gantt_figure`), a measured run overlaid.
- :func:`goodput_figure`: goodput of E3, of the early-exit model as it is and of the stock model against the
  batch every replica runs.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Sequence

import plotly.graph_objects as go

from workbench.earlyexit.scenario import GoodputRow
from workbench.timeline import Span, Timeline
from workbench.viz.style import INK, MARGIN, TEMPLATE, message_figure, wrap_text
from workbench.viz.timeline import gantt_figure

GPU_COLORS = {"v100": "#4C78A8", "p100": "#F58518", "k80": "#54A24B", "a6000": "#B279A2", "host": "#72B7B2"}
OTHER_GPU = "#9D755D"
SYSTEMS = {"e3": ("E3 (split, replicated)", "#E45756", "solid"),
           "early_exit": ("early-exit model as is (data parallel)", "#4C78A8", "dash"),
           "stock": ("stock model, no exits (data parallel)", "#7f7f7f", "dot")}
BUBBLE = "bubble"
"""The label of a gap between two batches of one replica while an upstream split is busy: the replica waits
for work the pipeline is still making for it (a ``stall`` span in the Gantt)."""
IDLE = "idle"
"""The label of a gap while no upstream split is busy (the first split: always): nothing is on its way to the
replica, because no request arrived (an ``idle`` span)."""
DRAIN = "drain"
"""The label of a replica's idle time after the last request arrived (the pipeline emptying), not a bubble."""
DRAIN_KIND = "queue"
"""The span kind of the drain (the timeline's kinds are fixed; ``queue`` draws grey, and no queue lane is drawn
in the bubbles figure, so the kind means the drain there)."""
BUBBLE_SPANS = 160
"""At most this many batches are drawn in the bubbles Gantt: the figure shows the run's start up to them."""


def gpu_color(gpu: str) -> str:
    return GPU_COLORS.get(gpu, OTHER_GPU)


def _layers(start: int, end: int) -> str:
    return f"layer {start}" if end == start + 1 else f"layers {start}-{end - 1}"


# -- the batch profile

def profile_figure(series, batch_size: int, title: str | None = None) -> go.Figure:
    """Samples left in a batch of ``batch_size`` after each ramp: every window of ``series`` (a
    :class:`~workbench.earlyexit.artifacts.SeriesForecast`) as measured (faint; the last one solid) and the
    ARIMA forecast made before the last window (dashed), which is what the optimizer plans with."""
    measured, forecasts = series.measured, series.forecast
    L = measured[-1].num_layers
    ramps = list(range(L))
    fig = go.Figure()
    xs, ys = [], []
    for profile in measured[:-1]:
        xs += ramps + [None]
        ys += [batch_size * f for f in profile.remaining] + [None]
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=f"measured, earlier windows ({len(measured) - 1})",
                                 line={"color": "#BAB0AC", "width": 1}, hoverinfo="skip"))
    last = measured[-1]
    window = len(measured)
    fig.add_trace(go.Scatter(
        x=ramps, y=[batch_size * f for f in last.remaining], mode="lines+markers",
        name=f"measured, window {window} (easy share {series.easy[-1]:.0%})", line={"color": INK, "width": 2.5},
        customdata=[100 * f for f in last.remaining],
        hovertemplate="after the ramp of layer %{x}: %{y:.2f} samples (%{customdata:.1f}%) measured<extra></extra>"))
    forecast = forecasts[-1]
    if forecast is not None:
        fig.add_trace(go.Scatter(
            x=ramps, y=[batch_size * f for f in forecast.remaining], mode="lines+markers",
            name=f"ARIMA forecast for window {window} ({series.methods[-1]}), the optimizer's input",
            line={"color": "#E45756", "width": 2, "dash": "dash"}, marker={"symbol": "diamond"},
            customdata=[100 * f for f in forecast.remaining],
            hovertemplate="after the ramp of layer %{x}: %{y:.2f} samples (%{customdata:.1f}%) forecast"
                          "<extra></extra>"))
    error = series.mean_abs_error[-1]
    said = (f"forecast off by {100 * error:.1f} points on average over the ramps" if error is not None
            else "no forecast before the first window")
    title = title or (f"Batch size after each exit ramp (a batch of {batch_size} entering)<br><sub>{window} windows of a "
                      f"drifting mix;<br>{said}</sub>")
    yaxis = {"title": f"samples left in the batch (of {batch_size})", "range": [0, batch_size * 1.05]}
    if batch_size < 8:                   # whole samples on the axis; the lines are averages (hover: 2 decimals)
        yaxis.update(title=f"samples left, on average (of {batch_size})", tickmode="linear", tick0=0, dtick=1)
    fig.update_layout(template=TEMPLATE, title=title, height=420, margin={**MARGIN, "t": 80},
                      xaxis={"title": "exit ramp after layer", "tickmode": "linear", "dtick": 1}, yaxis=yaxis)
    return fig


# -- the split plan

def plan_figure(plan, profile: Sequence[float] | None = None, title: str | None = None,
                no_plan: str | None = None) -> go.Figure:
    """E3's plan: for split i one trace with a bar per replica over layers ``[start, end)``, in the colour of
    its GPU type, labelled with the replica's batch and the split's stage time; a dashed line at each cut with
    the share of the batch still present there (from ``profile``, the fractions the optimizer got), the labels
    staggered over two rows when there are three cuts or more. An empty plan draws ``no_plan`` (default: its
    reason, :func:`no_plan_text`) wrapped to a half-width slot instead."""
    if not plan.splits:
        return message_figure(title or "E3's split plan: none meets the SLO",
                              wrap_text(no_plan or no_plan_text(plan.reason), HALF_WRAP), height=420)
    L = plan.splits[-1][1]
    fig = go.Figure()
    for st in plan.stages[:len(plan.stage_s)]:
        i, start, end, r, gpu, b, stage = (st.index, st.start, st.end, st.replicas, st.gpu_type, st.batch_size,
                                           st.stage_s)
        rows = [f"split {i + 1} · replica {j + 1}" for j in range(r)]
        fig.add_trace(go.Bar(
            y=rows, base=[start] * r, x=[end - start] * r, orientation="h",
            name=f"split {i + 1}: {_layers(start, end)} on {r} × {gpu}, batch {b}, {1e3 * stage:.2f} ms",
            marker={"color": gpu_color(gpu), "line": {"color": "white", "width": 1}},
            text=[f"{gpu} · batch {b}" for _ in rows], textposition="inside", insidetextanchor="middle",
            textangle=0, customdata=[[i + 1, r, b, 1e3 * stage, gpu] for _ in rows],
            hovertemplate=(f"{_layers(start, end)}: split %{{customdata[0]}} on %{{customdata[1]}} × "
                           "%{customdata[4]}<br>batch %{customdata[2]} per replica, stage %{customdata[3]:.2f} ms"
                           "<extra></extra>")))
    shapes, notes = [], []
    cuts = [start for start, _ in plan.splits[1:]]
    stagger = len(cuts) >= 3
    for k, start in enumerate(cuts):
        left = f": {100 * profile[start - 1]:.3g}% left" if profile is not None else ""
        shapes.append({"type": "line", "xref": "x", "x0": start, "x1": start, "yref": "paper", "y0": 0, "y1": 1,
                       "line": {"color": INK, "dash": "dash", "width": 1.5}})
        notes.append({"xref": "x", "x": start, "yref": "paper", "y": 1, "yanchor": "bottom", "showarrow": False,
                      "yshift": 15 if stagger and k % 2 else 0, "text": f"after layer {start - 1}{left}",
                      "font": {"size": 11}})
    rows = sum(plan.replicas)
    title = title or (f"E3's split plan: {len(plan.splits)} split{'s' if len(plan.splits) > 1 else ''} on "
                      f"{rows} GPU{'s' if rows > 1 else ''}, goodput {plan.goodput:,.0f} samples/s"
                      f"<br><sub>batch {plan.batch_size} on every replica, {plan.input_batches} input batch"
                      f"{'es' if plan.input_batches > 1 else ''} a cycle of {1e3 * plan.cycle_s:.2f} ms;<br>worst-case "
                      f"latency {1e3 * plan.latency_s:.2f} of {1e3 * plan.budget_s:.1f} ms (SLO less slack)<br>"
                      "(the optimizer's model: no queueing or batching wait)</sub>")
    fig.update_layout(template=TEMPLATE, title=title, barmode="overlay", bargap=0.2, shapes=shapes,
                      annotations=notes, height=max(360, 250 + 26 * rows),
                      margin={**MARGIN, "t": 150 if stagger else 135},
                      uniformtext={"minsize": 9, "mode": "hide"},
                      xaxis={"title": "layers (each bar runs its split's layers)", "range": [0, L],
                             "tickmode": "linear", "dtick": 1},
                      yaxis={"title": "GPU (replica)", "autorange": "reversed"})
    return fig


HALF_WRAP = 58
"""Characters per line of a message in a half-width slot (about 600 px at 1280 px)."""


def no_plan_text(reason: str) -> str:
    """The optimizer's reason for an empty plan as the page says it: one "no plan" (not "no plan: no plan
    meets ..."), and no advice to lower the slack, which the page has no control for (it keeps E3's 20 %)."""
    import re

    text = reason.strip()
    if text.startswith("no plan: "):
        text = text[len("no plan: "):]
    text = re.sub(r", lower the slack or the batch size \((\d+)\),", r", lower the batch per replica (\1)", text)
    text = text.replace("lower the slack or ", "lower ")
    text = re.sub(r"less (\d+)% slack\)", r"less E3's \1% slack for queueing)", text)
    return text[:1].upper() + text[1:]


# -- pipeline bubbles

def is_replica_lane(lane: str) -> bool:
    """A replica's compute lane ("split i · replica r"), not a queue or link lane."""
    return "replica" in lane and not lane.endswith("queue")


def one_based(lane: str) -> str:
    """The engine's 0-based lane "split 0 · replica 0" as the page numbers splits and replicas: "split 1 ·
    replica 1" (as the plan figure and the plan's explanation do); other lanes unchanged."""
    import re

    m = re.fullmatch(r"split (\d+) · replica (\d+)", lane)
    return f"split {int(m[1]) + 1} · replica {int(m[2]) + 1}" if m else lane


def split_of(lane: str) -> int | None:
    """The 0-based split of an engine lane "split 2 · replica 0"; None for other lanes."""
    m = re.fullmatch(r"split (\d+) · replica \d+", lane)
    return int(m[1]) if m else None


def _covered(a: float, b: float, busy: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of [a, b] inside the (sorted, merged) ``busy`` intervals."""
    return [(max(a, s), min(b, e)) for s, e in busy if s < b and e > a]


def _merged(intervals) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def bubble_timeline(timeline: Timeline, end_s: float | None = None, max_spans: int = BUBBLE_SPANS,
                    last_arrival_s: float | None = None) -> Timeline:
    """Each replica's batches (``compute`` spans of its lane) from 0 to ``end_s`` and the gaps between them,
    on lanes numbered from 1 (:func:`one_based`). A gap is a bubble (``stall``, :data:`BUBBLE`) while some
    replica of an earlier split is busy (work is on its way), else idle (``idle``, :data:`IDLE`: nothing
    arrived to serve; the first split's gaps are all idle). Without ``end_s``: up to the end of the
    ``max_spans``-th batch (all of them when fewer). With ``last_arrival_s``, the time after the last arrival
    is the pipeline draining: a :data:`DRAIN_KIND` span labelled :data:`DRAIN`, neither bubble nor idle."""
    compute = sorted((s for s in timeline.spans if s.kind == "compute" and is_replica_lane(s.lane)),
                     key=lambda s: s.start)
    if end_s is None:
        end_s = max((s.end for s in compute[:max_spans]), default=0.0)
    kept = [s for s in compute if s.start < end_s]
    spans = [replace(s, lane=one_based(s.lane)) for s in kept]
    drain_from = end_s if last_arrival_s is None else max(0.0, min(end_s, last_arrival_s))
    for lane in dict.fromkeys(s.lane for s in compute):
        mine = [s for s in kept if s.lane == lane]
        device = next(s.device for s in compute if s.lane == lane)
        name = one_based(lane)
        split = split_of(lane)
        upstream = _merged((s.start, s.end) for s in kept if split is not None and (split_of(s.lane) or 0) < split
                           and split_of(s.lane) is not None)

        def gap(a: float, b: float) -> None:
            waiting_end = min(b, drain_from)
            t = a
            for s, e in _covered(a, waiting_end, upstream):
                if s > t:
                    spans.append(Span(name, "idle", t, s, IDLE, {}, device))
                spans.append(Span(name, "stall", s, e, BUBBLE, {}, device))
                t = e
            if t < waiting_end:
                spans.append(Span(name, "idle", t, waiting_end, IDLE, {}, device))
            if max(a, drain_from) < b:
                spans.append(Span(name, DRAIN_KIND, max(a, drain_from), b, DRAIN, {}, device))

        t = 0.0
        for s in mine:
            if s.start > t:
                gap(t, s.start)
            t = max(t, s.end)
        if t < end_s:
            gap(t, end_s)
    spans.sort(key=lambda s: (s.start, lane_order(s.lane)))
    return Timeline(tuple(spans), timeline.source, name=timeline.name)


def lane_order(lane: str) -> tuple:
    """A sort key that puts "split 1 · replica 2" before "split 1 · replica 10" (numbers as numbers)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", lane))


def idle_shares(bubbles: Timeline, kind: str = "stall") -> dict[str, float]:
    """Per replica lane of a :func:`bubble_timeline`: the share of its time spent in gaps of ``kind`` (``stall``:
    bubbles; ``idle``: nothing to serve); the drain after the last arrival counts neither as a gap nor as time."""
    out = {}
    for lane in bubbles.lanes:
        spans = [s for s in bubbles.spans if s.lane == lane and s.kind != DRAIN_KIND]
        total = sum(s.duration for s in spans)
        out[lane] = sum(s.duration for s in spans if s.kind == kind) / total if total > 0 else 0.0
    return out


TRACE_WORDS = {"compute": "busy", "stall": "bubble, waiting for upstream", "idle": "idle, nothing arrived",
               DRAIN_KIND: "drain, no more arrivals", "predicted": "simulated"}
"""The shared Gantt's trace names ("stall (predicted)") in this page's words ("bubble (simulated)")."""


def bubbles_figure(predicted: Timeline, measured: Timeline | None = None, title: str = "") -> go.Figure:
    """The shared Gantt of :func:`bubble_timeline` results: per replica, batches (busy) and bubbles, the
    simulation solid and a measured run hatched; each row's idle share in the hover of its bubbles and, for
    the simulation (and the measurement), in the title. Traces are named in the page's words
    (:data:`TRACE_WORDS`): "busy (simulated)", "bubble (simulated)", "busy (measured)", ..."""
    fig = gantt_figure(predicted, measured, title=title or "Pipeline bubbles per replica")

    def words(text: str) -> str:
        for old, new in TRACE_WORDS.items():
            text = re.sub(rf"\b{old}\b", new, text)
        return text

    for trace in fig.data:
        if trace.name:
            trace.name = words(trace.name)
        if getattr(trace, "hovertemplate", None):
            trace.hovertemplate = words(trace.hovertemplate)
    fig.update_layout(xaxis_title="time since the first request (ms)", margin={"t": 90})
    return fig


def idle_text(bubbles: Timeline) -> str:
    """Mean bubble and idle shares over the replicas, and the range of the bubbles, as a title says them."""
    shares, idle = idle_shares(bubbles), idle_shares(bubbles, "idle")
    if not shares:
        return "no batches"
    low, high = min(shares.values()), max(shares.values())
    mean, idle_mean = sum(shares.values()) / len(shares), sum(idle.values()) / len(idle)
    return (f"bubbles {100 * mean:.0f}% on average ({100 * low:.0f}% to {100 * high:.0f}% per replica), idle "
            f"{100 * idle_mean:.0f}% with nothing arrived")


# -- goodput against the batch size

def goodput_figure(rows: Sequence[GoodputRow], batch_size: int | None = None, slo_ms: float | None = None,
                   title: str | None = None) -> go.Figure:
    """Goodput (samples/s) of each system in :data:`SYSTEMS` against the batch per replica; ``rows``: one
    :class:`~workbench.earlyexit.scenario.GoodputRow` per batch size (a goodput of 0: no plan meets the SLO,
    drawn as a gap with a cross at 0). The page's batch size is marked; ``slo_ms`` is named in the subtitle."""
    batches = [r.batch for r in rows]
    fig = go.Figure()
    for key, (name, color, dash) in SYSTEMS.items():
        values = [getattr(r, key) or None for r in rows]
        fig.add_trace(go.Scatter(
            x=batches, y=values, mode="lines+markers", name=name, line={"color": color, "dash": dash, "width": 2},
            hovertemplate=f"{name}<br>batch %{{x}} per replica: %{{y:,.0f}} samples/s<extra></extra>"))
        missing = [b for b, v in zip(batches, values) if v is None]
        if missing:
            fig.add_trace(go.Scatter(x=missing, y=[0] * len(missing), mode="markers", showlegend=False,
                                     name=f"{name}: no plan", marker={"symbol": "x", "color": color, "size": 9},
                                     hovertemplate=f"{name}<br>batch %{{x}} per replica: no plan meets the SLO"
                                                   "<extra></extra>"))
    shapes, notes = [], []
    if batch_size is not None:
        shapes.append({"type": "line", "xref": "x", "x0": batch_size, "x1": batch_size, "yref": "paper", "y0": 0,
                       "y1": 1, "line": {"color": INK, "dash": "dot", "width": 1}})
        notes.append({"xref": "x", "x": math.log10(batch_size), "yref": "paper", "y": 1, "yanchor": "bottom",
                      "showarrow": False, "text": f"this page: {batch_size}"})
    here = next((r for r in rows if r.batch == batch_size), None)
    slo = f" of {slo_ms:g} ms" if slo_ms else ""
    if here and here.e3 and here.early_exit:
        head = f"E3: {here.e3 / here.early_exit:.2f}x the early-exit model's goodput at batch {batch_size}"
    else:
        head = "Goodput against the batch per replica"
    title = title or (f"{head}<br><sub>the optimizer's prediction: samples/s meeting the SLO{slo},<br>every system "
                      "on the same GPUs, every replica at the same batch</sub>")
    if not any(getattr(r, key) for r in rows for key in SYSTEMS):
        notes.append({"xref": "paper", "yref": "paper", "x": 0.5, "y": 0.55, "showarrow": False,
                      "font": {"size": 14}, "text": f"no batch size meets the SLO{slo}<br>on these GPUs"})
    fig.update_layout(template=TEMPLATE, title=title, height=420, margin={**MARGIN, "t": 95}, shapes=shapes,
                      annotations=notes,
                      xaxis={"title": "batch per replica (samples)", "type": "log", "tickvals": batches,
                             "ticktext": [str(b) for b in batches]},
                      yaxis={"title": "goodput (samples/s)", "rangemode": "tozero"})
    return fig


def no_result_figure(title: str, reason: str, height: int = 360, width: int = HALF_WRAP) -> go.Figure:
    """What a slot shows when the settings give nothing to draw: ``title`` over ``reason`` wrapped to
    ``width`` characters a line."""
    return message_figure(title, wrap_text(reason, width), height=height)
