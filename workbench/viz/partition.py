"""Figures of position-wise partitioning (Voltage): the partition decision (which positions, heads or layers
each device computes), communication against compute for every scheme, the per-layer timeline across devices
(predicted, and measured on real processes) and Theorem 2's map of the attention order.

Every builder takes the engine's results (:class:`~workbench.partition.plan.PartitionPlan`, a
:class:`~workbench.partition.cost.ModelShape`) and draws their numbers as they are; none computes a cost of its own.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import numpy as np
import plotly.graph_objects as go

from workbench.partition.cost import ModelShape, attention_order, order_threshold
from workbench.partition.plan import PartitionPlan
from workbench.timeline import Timeline
from workbench.viz.style import INK, LEGEND_DEVICES, MARGIN, TEMPLATE, device_color, log_axis, message_figure
from workbench.viz.timeline import KIND_COLORS, gantt_figure

SCHEME_LABELS = {"voltage": "Voltage", "tensor_parallel": "tensor parallel", "torch_tp": "PyTorch TP",
                 "pipeline": "layer pipeline", "single": "one device"}
ORDER_LABELS = {"qk_first": "Eq. (3): Q, K, V first", "x_first": "Eq. (8): x multiplied in last",
                "none": "no positions"}
ORDER_PATTERNS = {"qk_first": "", "x_first": "/", "none": ""}
ORDER_COLORS = {"qk_first": "#C6DBEF", "x_first": "#F58518"}
NOTE_CHARS = 150
"""The prediction check's note is cut to this in a title (the page prints it whole beside the run)."""
ORDER_GRID = 64
"""Sequence lengths (and partition lengths) the order map evaluates, spread evenly on a log scale."""


def scheme_label(scheme: str) -> str:
    return SCHEME_LABELS.get(scheme, scheme)


def links_text(plan: PartitionPlan) -> str:
    """The devices' links as a title says them: one bandwidth, or their range."""
    rates = sorted({d.net_bytes_per_s * 8 / 1e6 for d in plan.devices})
    return f"{rates[0]:g} Mbit/s links" if len(rates) == 1 else f"links of {rates[0]:g} to {rates[-1]:g} Mbit/s"


def compute_on_path_s(plan: PartitionPlan) -> float:
    """Seconds of the predicted latency that are not communication: each compute step lasts as long as its
    slowest device (the others wait for it), so this is the predicted latency less :meth:`PartitionPlan.comm_s`."""
    return plan.predicted_s - plan.comm_s()


# -- the decision

def _layer_axis(fig: go.Figure, layers: int) -> None:
    fig.update_yaxes(title="layer", autorange="reversed", tickmode="linear" if layers <= 16 else "auto", dtick=1)


def decision_figure(plan: PartitionPlan, title: str | None = None) -> go.Figure:
    """What each device computes at each layer, one bar trace per device (one bar per layer).

    Voltage: the positions ``[bounds[l][i], bounds[l][i+1])`` of device i at layer l, hatched where the device
    multiplies x in last (Theorem 2's Eq. 8). Tensor parallelism: the heads each device computes at every layer
    (over all N positions). Layer pipeline and one device: all N positions at the layers a device holds."""
    K, L, N = plan.K, plan.shape.num_layers, plan.seq_len
    layers = list(range(L))
    fig = go.Figure()
    legend = K <= LEGEND_DEVICES
    if plan.scheme == "voltage":
        title = title or (f"Voltage's decision: positions each device computes per layer ({plan.shape.name}, "
                          f"N = {N}, {K} devices)")
        for i, d in enumerate(plan.devices):
            starts = [b[i] for b in plan.bounds]
            widths = [b[i + 1] - b[i] for b in plan.bounds]
            orders = [o[i] for o in plan.orders]
            shares = [s[i] for s in plan.shares]
            fig.add_trace(go.Bar(
                y=layers, base=starts, x=widths, orientation="h", name=f"device {i} ({d.name}): {shares[0]:.1%}",
                marker={"color": device_color(i), "line": {"color": "white", "width": 1},
                        "pattern": {"shape": [ORDER_PATTERNS[o] for o in orders], "fillmode": "overlay",
                                    "fgcolor": "white", "solidity": 0.35}},
                text=[f"d{i}" for _ in layers], textposition="inside", insidetextanchor="middle", textangle=0,
                customdata=[[s, e - b, ORDER_LABELS[o], d.name] for s, b, e, o in
                            zip(shares, starts, [b + w for b, w in zip(starts, widths)], orders)],
                hovertemplate=(f"device {i} (%{{customdata[3]}}), layer %{{y}}: positions %{{base}} to "
                               "%{x} more (share %{customdata[0]:.2%})<br>attention order %{customdata[2]}"
                               "<extra></extra>")))
        fig.update_xaxes(title=f"positions (of N = {N})", range=[0, N])
    elif plan.scheme in ("tensor_parallel", "torch_tp"):
        title = title or (f"{scheme_label(plan.scheme)}: heads each device computes at every layer, over all "
                          f"N = {N} positions ({K} devices)")
        start = 0
        for i, (d, h, f) in enumerate(zip(plan.devices, plan.heads, plan.ffn_columns)):
            fig.add_trace(go.Bar(
                y=layers, base=[start] * L, x=[h] * L, orientation="h", name=f"device {i} ({d.name}): {h} heads",
                marker={"color": device_color(i), "line": {"color": "white", "width": 1}},
                text=[f"d{i}" for _ in layers], textposition="inside", insidetextanchor="middle", textangle=0,
                hovertemplate=(f"device {i} ({d.name}), layer %{{y}}: heads {start} to {start + h - 1} and "
                               f"{f} FFN columns, all {N} positions<extra></extra>")))
            start += h
        fig.update_xaxes(title=f"attention heads (of H = {plan.shape.heads})", range=[0, plan.shape.heads])
    else:
        owner = [i for i, c in enumerate(plan.layers) for _ in range(c)]
        what = "the first device computes every layer" if plan.scheme == "single" else "layers each device holds"
        title = title or f"{scheme_label(plan.scheme)}: {what}, all N = {N} positions ({K} devices)"
        for i, d in enumerate(plan.devices):
            mine = [layer for layer in layers if owner[layer] == i]
            if not mine:
                continue
            fig.add_trace(go.Bar(
                y=mine, base=[0] * len(mine), x=[N] * len(mine), orientation="h",
                name=f"device {i} ({d.name}): {len(mine)} layers",
                marker={"color": device_color(i), "line": {"color": "white", "width": 1}},
                text=[f"d{i}" for _ in mine], textposition="inside", insidetextanchor="middle", textangle=0,
                hovertemplate=f"device {i} ({d.name}), layer %{{y}}: all {N} positions<extra></extra>"))
        fig.update_xaxes(title=f"positions (of N = {N})", range=[0, N])
    _layer_axis(fig, L)
    fig.update_layout(template=TEMPLATE, title=title, barmode="overlay", bargap=0.15, showlegend=legend,
                      height=max(360, 200 + 14 * L), margin={**MARGIN, "t": 70},
                      uniformtext={"minsize": 9, "mode": "hide"})
    return fig


# -- communication against compute

def schemes_figure(plans: Mapping[str, PartitionPlan | str], single_s: float | None = None,
                   selected: str | None = None, title: str | None = None) -> go.Figure:
    """Predicted compute and communication of each scheme, stacked to its predicted latency (ms), with the
    one-device latency as a dashed line. ``plans``: scheme -> its plan, or why it cannot be planned (drawn as
    "not possible" with the reason in the hover). The ``selected`` scheme's bar is outlined."""
    names = list(plans)
    good = {s: p for s, p in plans.items() if isinstance(p, PartitionPlan)}
    x = [scheme_label(s) for s in names]
    compute = [1e3 * compute_on_path_s(good[s]) if s in good else None for s in names]
    comm = [1e3 * good[s].comm_s() if s in good else None for s in names]
    busiest = [1e3 * max(good[s].compute_s()) if s in good else None for s in names]
    outline = [{"width": 2.5 if s == selected else 0.5, "color": INK if s == selected else "white"} for s in names]
    fig = go.Figure()
    fig.add_trace(go.Bar(
        x=x, y=compute, name="compute (predicted)", marker={"color": KIND_COLORS["compute"]},
        customdata=busiest, hovertemplate="%{x}: compute %{y:.2f} ms on the critical path (the busiest device "
                                          "computes %{customdata:.2f} ms)<extra></extra>"))
    fig.add_trace(go.Bar(
        x=x, y=comm, name="communication (predicted)", marker={"color": KIND_COLORS["comm"]},
        text=[f"{c + m:.1f} ms" if c is not None else "" for c, m in zip(compute, comm)], textposition="outside",
        hovertemplate="%{x}: communication %{y:.2f} ms<extra></extra>"))
    for trace in fig.data:
        trace.marker.line = {"width": [o["width"] for o in outline], "color": [o["color"] for o in outline]}
    annotations = [{"x": scheme_label(s), "y": 0, "yref": "y", "text": "not possible", "showarrow": False,
                    "yanchor": "bottom", "hovertext": reason, "font": {"color": "#9a3412"}}
                   for s, reason in plans.items() if not isinstance(reason, PartitionPlan)]
    shapes = []
    if single_s is not None:
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": 1e3 * single_s,
                       "y1": 1e3 * single_s, "line": {"color": INK, "dash": "dash", "width": 1.5},
                       "name": "one device"})
        annotations.append({"xref": "paper", "x": 0, "xanchor": "left", "yref": "y", "y": 1e3 * single_s,
                            "yanchor": "bottom", "text": f"one device: {1e3 * single_s:.1f} ms", "showarrow": False})
    if title is None:
        first = next(iter(good.values()), None)
        title = ("Communication vs compute per scheme" if first is None else
                 f"Communication vs compute per scheme<br><sub>{first.shape.name}, N = {first.seq_len}, "
                 f"{first.K} devices, {links_text(first)}</sub>")
    tops = [c + m for c, m in zip(compute, comm) if c is not None] + ([1e3 * single_s] if single_s else [])
    fig.update_layout(template=TEMPLATE, title=title, barmode="stack", height=440, margin={**MARGIN, "t": 80},
                      yaxis={"title": "predicted latency (ms)", "range": [0, 1.15 * max(tops, default=1.0)]},
                      shapes=shapes, annotations=annotations)
    return fig


# -- the timeline

def timeline_figure(plan: PartitionPlan, measured: Timeline | None = None, measured_s: float | None = None,
                    note: str = "") -> go.Figure:
    """The plan's predicted per-layer timeline across devices (compute, All-Gather / All-Reduce / send, stalls),
    drawn by the shared :func:`~workbench.viz.timeline.gantt_figure`; with a measured run overlaid, its latency
    beside the prediction in the title and the prediction check's ``note`` below it."""
    title = (f"{scheme_label(plan.scheme)} timeline on {plan.K} devices ({plan.shape.name}, N = {plan.seq_len}, "
             f"{links_text(plan)}): ")
    if measured is None:
        title += f"predicted {1e3 * plan.predicted_s:.1f} ms"
    else:
        title += f"measured {1e3 * measured_s:.1f} ms vs predicted {1e3 * plan.predicted_s:.1f} ms"
        if note:
            title += f"<br><sub>{note if len(note) <= NOTE_CHARS else note[:NOTE_CHARS - 3] + '...'}</sub>"
    return gantt_figure(plan.timeline, measured, title=title)


# -- Theorem 2

def _log_grid(high: int, points: int) -> list[int]:
    return sorted({int(round(v)) for v in np.geomspace(1, max(high, 2), points)})


@lru_cache(maxsize=32)
def _order_grid(F: int, F_H: int, high: int, points: int) -> tuple[tuple[int, ...], tuple[tuple, ...]]:
    """Lengths evaluated and, per partition length P (rows) and sequence length N (columns), 1 where Theorem 2
    picks Eq. (8), 0 where it keeps Eq. (3), None where P > N."""
    grid = _log_grid(high, points)
    z = tuple(tuple(None if P > N else int(attention_order(N, P, F, F_H) == "x_first") for N in grid) for P in grid)
    return tuple(grid), z


def order_boundary(N: float, F: int, F_H: int) -> float:
    """The partition length below which Theorem 2 picks Eq. (8) at sequence length N:
    1/P - 1/N > (F - F_H)/(F F_H)  <=>  P < N F F_H / (F F_H + N (F - F_H))."""
    return N * F * F_H / (F * F_H + N * (F - F_H))


def orders_figure(shape: ModelShape, seq_len: int, devices: int, points: int = ORDER_GRID,
                  title: str | None = None) -> go.Figure:
    """Theorem 2's choice over sequence length N (x) and partition length P (y), both on log scales, for the
    model's F and F_H: a heatmap of :func:`~workbench.partition.cost.attention_order` at each (N, P <= N), the
    boundary P = N F F_H / (F F_H + N (F - F_H)), and the page's point (N, N/K) marked."""
    F, F_H = shape.hidden, shape.head_dim
    high = shape.max_positions
    grid, z = _order_grid(F, F_H, high, points)
    P = seq_len / devices
    at = attention_order(seq_len, min(seq_len, max(1, round(P))), F, F_H)
    fig = go.Figure()
    fig.add_trace(go.Heatmap(
        x=list(grid), y=list(grid), z=[list(row) for row in z], zmin=0, zmax=1, showscale=False,
        colorscale=[[0, ORDER_COLORS["qk_first"]], [0.5, ORDER_COLORS["qk_first"]], [0.5, ORDER_COLORS["x_first"]],
                    [1, ORDER_COLORS["x_first"]]], name="Theorem 2's order",
        hovertemplate="N = %{x}, P = %{y}: %{z} (1: Eq. 8, 0: Eq. 3)<extra></extra>"))
    ns = np.geomspace(1, high, 200)
    fig.add_trace(go.Scatter(x=ns, y=[order_boundary(n, F, F_H) for n in ns], mode="lines",
                             name="1/P - 1/N = (F - F_H)/(F F_H)", line={"color": INK, "width": 1.5, "dash": "dot"},
                             hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=[1, high], y=[1, high], mode="lines", name="P = N (one device)",
                             line={"color": "#888", "width": 1}, hoverinfo="skip"))
    for order in ("qk_first", "x_first"):                  # legend entries for the two colours
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=ORDER_LABELS[order],
                                 marker={"symbol": "square", "size": 12, "color": ORDER_COLORS[order]}))
    fig.add_trace(go.Scatter(x=[seq_len], y=[P], mode="markers+text", name=f"this page: N = {seq_len}, P = N/K",
                             text=[f"N = {seq_len}, P = {P:.3g}"], textposition="bottom right",
                             marker={"symbol": "x", "size": 13, "color": "#E45756", "line": {"width": 1, "color": INK}},
                             hovertemplate="N = %{x}, P = N/K = %{y}<extra></extra>"))
    rotary = " (rotary keys: this model keeps Eq. 3 whatever the map says)" if shape.rotary else ""
    title = title or (f"Theorem 2's attention order for {shape.name}<br><sub>F = {F}, F_H = {F_H}, threshold "
                      f"{order_threshold(F, F_H):.4f}; at N = {seq_len}, P = N/K = {P:g}: "
                      f"{ORDER_LABELS[at]}{rotary}</sub>")
    fig.update_layout(template=TEMPLATE, title=title, height=440,
                      margin={**MARGIN, "t": 80},
                      xaxis=log_axis(1, high, "sequence length N"),
                      yaxis=log_axis(1, high, "partition length P (positions per device)"))
    return fig


NO_PLAN_TITLES = {"decision": "The partition's decision", "schemes": "Communication vs compute per scheme",
                  "orders": "Theorem 2's attention order", "timeline": "The partition's timeline"}
"""The title each figure keeps when there is no plan to draw (its slot's name is internal)."""


def no_plan_figure(name: str, reason: str, height: int = 360) -> go.Figure:
    """What slot ``name`` shows when the settings give no plan to draw: its figure's title, and the reason
    wrapped to fit a half-width slot."""
    return message_figure(NO_PLAN_TITLES.get(name, name), reason, height=height, wrap=60)
