"""Figures of early-exit serving (E3): pure functions from the engine's results to Plotly figures.

- :func:`profile_figure`: the batch size left after every ramp, window by window as measured from the ramps'
  real outputs, beside the ARIMA forecast E3 plans with.
- :func:`plan_figure`: the split plan, one bar per replica over the layers it runs, coloured by GPU type, with
  each split's batch and stage time, and the cuts marked with the share of the batch still present.
- :func:`bubbles_figure`: per replica, when it computes and when it idles (the pipeline's bubbles), drawn by the
  shared Gantt (:func:`~workbench.viz.timeline.gantt_figure`), a measured run overlaid.
- :func:`goodput_figure`: goodput of E3, of the early-exit model as it is and of the stock model against the
  input batch size.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import plotly.graph_objects as go

from workbench.timeline import Span, Timeline
from workbench.viz.style import INK, MARGIN, TEMPLATE, message_figure
from workbench.viz.timeline import gantt_figure

GPU_COLORS = {"v100": "#4C78A8", "p100": "#F58518", "k80": "#54A24B", "a6000": "#B279A2", "host": "#72B7B2"}
OTHER_GPU = "#9D755D"
SYSTEMS = {"e3": ("E3 (split, replicated)", "#E45756", "solid"),
           "early_exit": ("early-exit model as is (data parallel)", "#4C78A8", "dash"),
           "stock": ("stock model, no exits (data parallel)", "#7f7f7f", "dot")}
BUBBLE = "bubble"
"""The label of an idle gap between two batches of one replica (a ``stall`` span in the Gantt)."""
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
    title = title or (f"Batch size after each exit ramp (input batch {batch_size})<br><sub>{window} windows of a "
                      f"drifting mix; {said}</sub>")
    fig.update_layout(template=TEMPLATE, title=title, height=420, margin={**MARGIN, "t": 80},
                      xaxis={"title": "exit ramp after layer", "tickmode": "linear", "dtick": 1},
                      yaxis={"title": f"samples left in the batch (of {batch_size})",
                             "range": [0, batch_size * 1.05]})
    return fig


# -- the split plan

def plan_figure(plan, profile: Sequence[float] | None = None, title: str | None = None) -> go.Figure:
    """E3's plan: for split i one trace with a bar per replica over layers ``[start, end)``, in the colour of
    its GPU type, labelled with the replica's batch and the split's stage time; a dashed line at each cut with
    the share of the batch still present there (from ``profile``, the fractions the optimizer got). An empty
    plan draws its explanation instead."""
    if not plan.splits:
        return message_figure(title or "E3's split plan: none", _wrap(plan.explain()), height=420)
    L = plan.splits[-1][1]
    fig = go.Figure()
    for i, ((start, end), r, gpu, b, stage) in enumerate(zip(plan.splits, plan.replicas, plan.gpu_types,
                                                             plan.batch_sizes, plan.stage_s)):
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
    for start, _ in plan.splits[1:]:
        left = f", {100 * profile[start - 1]:.3g}% of the batch left" if profile is not None else ""
        shapes.append({"type": "line", "xref": "x", "x0": start, "x1": start, "yref": "paper", "y0": 0, "y1": 1,
                       "line": {"color": INK, "dash": "dash", "width": 1.5}})
        notes.append({"xref": "x", "x": start, "yref": "paper", "y": 1, "yanchor": "bottom", "showarrow": False,
                      "text": f"cut after layer {start - 1}{left}", "font": {"size": 11}})
    rows = sum(plan.replicas)
    title = title or (f"E3's split plan: {len(plan.splits)} split{'s' if len(plan.splits) > 1 else ''}, "
                      f"{rows} GPU{'s' if rows > 1 else ''}, goodput {plan.goodput:,.0f} samples/s"
                      f"<br><sub>cycle {1e3 * plan.cycle_s:.2f} ms, worst-case latency {1e3 * plan.latency_s:.2f} "
                      f"of {1e3 * plan.budget_s:.1f} ms (SLO less slack); input batch {plan.batch_size}</sub>")
    fig.update_layout(template=TEMPLATE, title=title, barmode="overlay", bargap=0.2, shapes=shapes,
                      annotations=notes, height=max(340, 230 + 26 * rows), margin={**MARGIN, "t": 100},
                      uniformtext={"minsize": 9, "mode": "hide"},
                      xaxis={"title": "layers (each bar runs its split's layers)", "range": [0, L],
                             "tickmode": "linear", "dtick": 1},
                      yaxis={"title": "GPU (replica)", "autorange": "reversed"})
    return fig


def _wrap(text: str, width: int = 110) -> str:
    """Plain text as annotation lines (<br>) of at most about ``width`` characters."""
    out = []
    for paragraph in text.splitlines():
        line = ""
        for word in paragraph.split(" "):
            if line and len(line) + 1 + len(word) > width:
                out.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        out.append(line)
    return "<br>".join(out)


# -- pipeline bubbles

def is_replica_lane(lane: str) -> bool:
    """A replica's compute lane ("split i · replica r"), not a queue or link lane."""
    return "replica" in lane and not lane.endswith("queue")


def bubble_timeline(timeline: Timeline, end_s: float | None = None, max_spans: int = BUBBLE_SPANS) -> Timeline:
    """Each replica's batches (``compute`` spans of its lane) from 0 to ``end_s`` and the gaps between them as
    ``stall`` spans labelled :data:`BUBBLE`. Without ``end_s``: up to the end of the ``max_spans``-th batch (all
    of them when fewer)."""
    compute = sorted((s for s in timeline.spans if s.kind == "compute" and is_replica_lane(s.lane)),
                     key=lambda s: s.start)
    if end_s is None:
        end_s = max((s.end for s in compute[:max_spans]), default=0.0)
    kept = [s for s in compute if s.start < end_s]
    spans = list(kept)
    for lane in dict.fromkeys(s.lane for s in compute):
        mine = [s for s in kept if s.lane == lane]
        device = next(s.device for s in compute if s.lane == lane)
        t = 0.0
        for s in mine:
            if s.start > t:
                spans.append(Span(lane, "stall", t, s.start, BUBBLE, {}, device))
            t = max(t, s.end)
        if t < end_s:
            spans.append(Span(lane, "stall", t, end_s, BUBBLE, {}, device))
    spans.sort(key=lambda s: (s.start, s.lane))
    return Timeline(tuple(spans), timeline.source, name=timeline.name)


def idle_shares(bubbles: Timeline) -> dict[str, float]:
    """Per replica lane of a :func:`bubble_timeline`: the share of its time spent in bubbles."""
    out = {}
    for lane in bubbles.lanes:
        spans = [s for s in bubbles.spans if s.lane == lane]
        total = sum(s.duration for s in spans)
        out[lane] = sum(s.duration for s in spans if s.kind == "stall") / total if total > 0 else 0.0
    return out


def bubbles_figure(predicted: Timeline, measured: Timeline | None = None, title: str = "") -> go.Figure:
    """The shared Gantt of :func:`bubble_timeline` results: per replica, batches (compute) and bubbles (stall),
    the prediction solid and a measured run hatched; each row's idle share in the hover of its bubbles and, for
    the prediction (and the measurement), in the title."""
    fig = gantt_figure(predicted, measured, title=title or "Pipeline bubbles per replica")
    fig.update_layout(xaxis_title="time since the first request (ms)")
    return fig


def idle_text(bubbles: Timeline) -> str:
    """Mean idle share over the replicas, and the least and most idle one, as a title says it."""
    shares = idle_shares(bubbles)
    if not shares:
        return "no batches"
    low, high = min(shares.values()), max(shares.values())
    mean = sum(shares.values()) / len(shares)
    return f"idle {100 * mean:.0f}% on average ({100 * low:.0f}% to {100 * high:.0f}% per replica)"


# -- goodput against the batch size

def goodput_figure(rows: Sequence[Mapping], batch_size: int | None = None, slo_ms: float | None = None,
                   title: str | None = None) -> go.Figure:
    """Goodput (samples/s) of each system in :data:`SYSTEMS` against the input batch size; ``rows``: one mapping
    per batch size with ``batch`` and each system's goodput (0 or None: no plan meets the SLO, drawn as a gap
    with a cross at 0). The page's batch size is marked; ``slo_ms`` is named in the subtitle."""
    batches = [int(r["batch"]) for r in rows]
    fig = go.Figure()
    for key, (name, color, dash) in SYSTEMS.items():
        values = [r.get(key) or None for r in rows]
        fig.add_trace(go.Scatter(
            x=batches, y=values, mode="lines+markers", name=name, line={"color": color, "dash": dash, "width": 2},
            hovertemplate=f"{name}<br>input batch %{{x}}: %{{y:,.0f}} samples/s<extra></extra>"))
        missing = [b for b, v in zip(batches, values) if v is None]
        if missing:
            fig.add_trace(go.Scatter(x=missing, y=[0] * len(missing), mode="markers", showlegend=False,
                                     name=f"{name}: no plan", marker={"symbol": "x", "color": color, "size": 9},
                                     hovertemplate=f"{name}<br>input batch %{{x}}: no plan meets the SLO"
                                                   "<extra></extra>"))
    shapes, notes = [], []
    if batch_size is not None:
        shapes.append({"type": "line", "xref": "x", "x0": batch_size, "x1": batch_size, "yref": "paper", "y0": 0,
                       "y1": 1, "line": {"color": INK, "dash": "dot", "width": 1}})
        notes.append({"xref": "x", "x": math.log10(batch_size), "yref": "paper", "y": 1, "yanchor": "bottom",
                      "showarrow": False, "text": f"this page: {batch_size}"})
    here = next((r for r in rows if int(r["batch"]) == batch_size), None)
    gain = ""
    if here and here.get("e3") and here.get("early_exit"):
        gain = f"; at batch {batch_size} E3 gives {here['e3'] / here['early_exit']:.2f}x the early-exit model's"
    title = title or (f"Goodput against the input batch size (the optimizer's prediction){gain}"
                      f"<br><sub>samples per second meeting the SLO{f' of {slo_ms:g} ms' if slo_ms else ''}, every "
                      "system on the same GPUs</sub>")
    fig.update_layout(template=TEMPLATE, title=title, height=420, margin={**MARGIN, "t": 80}, shapes=shapes,
                      annotations=notes,
                      xaxis={"title": "input batch size (samples)", "type": "log", "tickvals": batches,
                             "ticktext": [str(b) for b in batches]},
                      yaxis={"title": "goodput (samples/s)", "rangemode": "tozero"})
    return fig


def no_result_figure(name: str, reason: str, height: int = 360) -> go.Figure:
    """What a slot shows when the settings give nothing to draw."""
    return message_figure(name, _wrap(reason), height=height)
