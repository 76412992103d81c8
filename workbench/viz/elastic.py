"""Figures of elastic pipelining: importance with the plan on it, AIBs through allocation, the pipeline
Gantt (predicted, with the measured run overlaid), and accuracy against memory of every method."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from workbench.viz.style import TEMPLATE

from workbench.timeline import Timeline

LANE_COLORS = {"io": "#F58518", "decompress": "#B279A2", "compute": "#4C78A8", "stall": "#E45756"}
MARGIN = {"t": 50, "l": 60, "r": 20, "b": 50}


def importance_plan_figure(importance: np.ndarray, plan=None,
                           title: str = "Shard importance and the plan") -> go.Figure:
    """Heatmap of importance (layer x shard); the plan's bitwidth is written in each planned shard,
    preloaded shards are outlined, shards outside the submodel are left blank."""
    imp = np.asarray(importance, dtype=float)
    n_layers, n_shards = imp.shape
    text = [["" for _ in range(n_shards)] for _ in range(n_layers)]
    if plan is not None and plan.found:
        for k in range(plan.n):
            for i in range(plan.m):
                text[k][i] = str(int(plan.bits[k, i]))
    fig = go.Figure(go.Heatmap(
        z=imp * 100, x=list(range(n_shards)), y=list(range(n_layers)), text=text, texttemplate="%{text}",
        colorscale="Viridis", colorbar={"title": {"text": "accuracy with<br>shard at 32 bits (%)"}},
        hovertemplate="layer %{y}, shard %{x}<br>importance %{z:.1f}%<br>planned bits %{text}<extra></extra>",
        name="importance"))
    if plan is not None and plan.found:
        ks, iis = np.nonzero(plan.preloaded)
        fig.add_trace(go.Scatter(x=iis.tolist(), y=ks.tolist(), mode="markers", name="preloaded",
                                 marker={"symbol": "square-open", "size": 22, "color": "white",
                                         "line": {"width": 2}},
                                 hovertemplate="layer %{y}, shard %{x}: preloaded<extra></extra>"))
        fig.update_layout(shapes=[{"type": "rect", "x0": -0.5, "x1": plan.m - 0.5, "y0": -0.5, "y1": plan.n - 0.5,
                                   "line": {"color": "white", "width": 2, "dash": "dot"}}])
    fig.update_layout(
        template=TEMPLATE, title=title, xaxis_title="shard (vertical slice)", yaxis_title="layer", height=380,
        margin=MARGIN, legend={"orientation": "h", "y": 1.1})
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(dtick=1, autorange="reversed")
    return fig


def aib_figure(io_plan, step: int | None = None, title: str = "Accumulated IO budget per layer") -> go.Figure:
    """AIB of every layer after allocation step ``step`` (default: the last), with the binding layer marked,
    and the AIB trace of every layer through all steps."""
    steps = io_plan.steps
    if not steps:
        return go.Figure().update_layout(
            template=TEMPLATE, title=f"{title}: no allocation ({io_plan.reason})", height=380)
    step = len(steps) - 1 if step is None else max(0, min(int(step), len(steps) - 1))
    aib = np.array(steps[step].aib) * 1e3
    layers = list(range(len(aib)))
    binding = int(np.argmin(aib))
    colors = ["#E45756" if k == binding else "#54A24B" for k in layers]
    s = steps[step]
    what = {"init": "start: slack + earlier compute + preload bonus", "preload": f"preloaded layer {s.layer}",
            "uniform": f"layer {s.layer} at {s.bits} bits (first pass)",
            "forced": f"layer {s.layer} forced to {s.bits} bits", "upgrade":
            f"shard ({s.layer}, {s.shard}) {s.from_bits} -> {s.bits} bits"}[s.kind]
    trace = np.array([st.aib for st in steps]) * 1e3
    lines = [go.Scatter(x=list(range(len(steps))), y=trace[:, k], mode="lines", name=f"layer {k}", xaxis="x2",
                        yaxis="y2", hovertemplate=f"layer {k}" + ", step %{x}: %{y:.2f} ms<extra></extra>")
             for k in layers]
    fig = go.Figure([go.Bar(x=layers, y=aib, marker_color=colors, name=f"AIB after step {step}",
                            hovertemplate="layer %{x}: AIB %{y:.2f} ms<extra></extra>", xaxis="x", yaxis="y"),
                     *lines])
    fig.update_layout(
        shapes=[{"type": "line", "xref": "x2", "yref": "y2 domain", "x0": step, "x1": step, "y0": 0, "y1": 1,
                 "line": {"dash": "dot", "color": "gray"}}],
        template=TEMPLATE, title=f"{title} — step {step}/{len(steps) - 1}: {what}", height=380, margin=MARGIN,
        xaxis={"domain": [0, 0.42], "title": "layer", "dtick": 1}, yaxis={"title": "AIB (ms)"},
        xaxis2={"domain": [0.55, 1], "title": "allocation step"}, yaxis2={"anchor": "x2", "title": "AIB (ms)"},
        legend={"orientation": "h", "y": -0.25})
    return fig


def gantt_figure(predicted: Timeline | None, measured: Timeline | None = None,
                 title: str = "Pipeline: IO, decompression and compute per layer") -> go.Figure:
    """Gantt of the predicted timeline (solid) with a measured run overlaid (hatched), stalls in red."""
    fig = go.Figure()
    rows = []
    for tl, tag in ((predicted, "predicted"), (measured, "measured")):
        if tl is None:
            continue
        for kind in ("io", "decompress", "compute", "stall"):
            spans = tl.of_kind(kind)
            if not spans:
                continue
            y = [f"{tag}: {s.lane}" for s in spans]
            rows.extend(y)
            fig.add_trace(go.Bar(
                base=[s.start * 1e3 for s in spans], x=[s.duration * 1e3 for s in spans], y=y, orientation="h",
                name=f"{kind} ({tag})", marker={"color": LANE_COLORS[kind],
                                                "pattern": {"shape": "/" if tag == "measured" else ""}},
                text=[s.label for s in spans], textposition="inside", insidetextanchor="middle",
                hovertemplate="%{text}: %{base:.2f} -> %{x:.2f} ms long<extra>" + f"{kind} ({tag})</extra>"))
    order = list(dict.fromkeys(rows))
    end = max([tl.end for tl in (predicted, measured) if tl is not None] + [0.0]) * 1e3
    fig.update_layout(
        template=TEMPLATE, title=title, barmode="overlay", height=300 + 18 * len(order),
        margin={**MARGIN, "l": 140},
        xaxis_title="time (ms)", legend={"orientation": "h", "y": -0.2},
        yaxis={"categoryorder": "array", "categoryarray": order[::-1]})
    fig.update_xaxes(range=[0, end * 1.02 if end else 1])
    return fig


SHARD_MEMORY_FLOOR_MB = 0.01


def accuracy_memory_figure(cells, target_ms: float, device: str, gold: float | None = None,
                           title: str | None = None) -> go.Figure:
    """Accuracy against the shard memory each method holds before a run (log axis, as the paper's Figure 7).

    Methods that hold no shards (Load&Exec, StdPL, Ours-0MB) sit at 0.01 MB; the hover gives exact figures,
    including the resident parameters every method keeps alike."""
    rows = [c if isinstance(c, dict) else c.as_row() for c in cells]
    rows = [r for r in rows if r["device"] == device and float(r["target_ms"]) == float(target_ms)]
    fig = go.Figure()
    for r in rows:
        ours = r["method"].startswith("Ours")
        fig.add_trace(go.Scatter(
            x=[max(r["preload_mb"], SHARD_MEMORY_FLOOR_MB)], y=[100 * r["accuracy"]], mode="markers+text",
            name=r["method"], text=[r["method"]], textposition="top center",
            marker={"size": 14 if ours else 10, "symbol": "star" if ours else "circle"},
            hovertemplate=(f"{r['method']}: {r['n']}x{r['m']}<br>accuracy %{{y:.1f}}%<br>shards in memory "
                           f"{r['preload_mb']:.2f} MB (+ {r['resident_mb']:.1f} MB resident)<br>measured "
                           f"{r['measured_ms']:.1f} ms<extra></extra>")))
    if gold is not None:
        fig.add_hline(y=100 * gold, line={"dash": "dash", "color": "gray"}, annotation_text="full model (gold)")
    fig.update_layout(
        template=TEMPLATE, title=title or f"Accuracy vs memory at {target_ms:.0f} ms on {device}", height=380,
        margin=MARGIN, xaxis={"type": "log", "title": "shards held in memory before a run (MB; none at 0.01)"},
        yaxis_title="dev accuracy (%)", showlegend=False)
    return fig


def candidates_figure(compute_plan, title: str = "Compute planning: every n x m submodel") -> go.Figure:
    """The candidate table as a heatmap of compute time; fitting, similar and chosen candidates marked."""
    cands = compute_plan.candidates
    ns = sorted({c.n for c in cands})
    ms = sorted({c.m for c in cands})
    z = np.full((len(ns), len(ms)), np.nan)
    text = [["" for _ in ms] for _ in ns]
    for c in cands:
        r, col = ns.index(c.n), ms.index(c.m)
        z[r, col] = c.time_s * 1e3
        text[r][col] = "★" if c.chosen else ("≈" if c.similar else ("✓" if c.fits else ""))
    fig = go.Figure(go.Heatmap(z=z, x=ms, y=ns, text=text, texttemplate="%{text}", colorscale="Blues",
                               colorbar={"title": {"text": "time (ms)"}},
                               hovertemplate="%{y} x %{x}: %{z:.1f} ms %{text}<extra></extra>"))
    fig.add_trace(go.Contour(z=z, x=ms, y=ns, contours={"start": compute_plan.target_s * 1e3,
                                                         "end": compute_plan.target_s * 1e3, "coloring": "none"},
                             line={"color": "red", "width": 2}, showscale=False, hoverinfo="skip",
                             name="target"))
    fig.update_layout(
        template=TEMPLATE,
        title=f"{title} (★ chosen, ≈ similar size, ✓ fits {compute_plan.target_s * 1e3:.0f} ms)", xaxis_title="width m", yaxis_title="depth n", height=340, margin=MARGIN)
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(dtick=1)
    return fig
