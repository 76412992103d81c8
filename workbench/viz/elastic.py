"""Figures of elastic pipelining: importance with the plan on it, AIBs through allocation, the pipeline
Gantt (predicted, with the measured run overlaid), and accuracy against memory of every method."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from workbench.viz.style import INK, MARGIN, TEMPLATE, log_axis, message_figure, outline

MARK_COLOR, LAYER_BAR_COLOR = "#E45756", "#54A24B"
LAYER_LINE_COLORS = ("#4C78A8", "#F58518", "#72B7B2", "#B279A2", "#9D755D", "#FF9DA6", "#EECA3B", "#79706E")


def accuracy_grid_figure(grid: np.ndarray, title: str = "Dev accuracy of every n x m submodel") -> go.Figure:
    """Heatmap of ``grid[n-1, m-1]``: rows = depth n (layers), columns = width m (shards per layer)."""
    grid = np.asarray(grid, dtype=float)
    n_layers, n_shards = grid.shape
    fig = go.Figure(go.Heatmap(
        z=grid * 100, x=list(range(1, n_shards + 1)), y=list(range(1, n_layers + 1)),
        text=[[f"{v * 100:.1f}" for v in row] for row in grid], texttemplate="%{text}",
        colorscale="Viridis", zmin=float(np.nanmin(grid) * 100), zmax=float(np.nanmax(grid) * 100),
        colorbar={"title": {"text": "accuracy (%)"}},
        hovertemplate="depth n=%{y}, width m=%{x}<br>accuracy %{z:.1f}%<extra></extra>"))
    fig.update_layout(
        template=TEMPLATE, title=title, xaxis_title="width m (shards per layer)", yaxis_title="depth n (layers)",
        margin=MARGIN, height=380)
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(dtick=1)
    return fig


def importance_plan_figure(importance: np.ndarray, plan=None,
                           title: str = "Shard importance and the plan") -> go.Figure:
    """Heatmap of importance (layer x shard); the plan's bitwidth is written in each planned shard, the
    submodel and the preloaded shards are outlined (both in the legend), shards outside it left blank."""
    imp = np.asarray(importance, dtype=float)
    n_layers, n_shards = imp.shape
    found = plan is not None and plan.found
    text = [["" for _ in range(n_shards)] for _ in range(n_layers)]
    status = [["outside the submodel" for _ in range(n_shards)] for _ in range(n_layers)]
    if found:
        for k in range(plan.n):
            for i in range(plan.m):
                text[k][i] = str(int(plan.bits[k, i]))
                status[k][i] = f"planned at {text[k][i]} bits" + (", preloaded" if plan.preloaded[k, i] else "")
    fig = go.Figure(go.Heatmap(
        z=imp * 100, x=list(range(n_shards)), y=list(range(n_layers)), text=text, texttemplate="%{text}",
        customdata=status if found else None, colorscale="Viridis",
        colorbar={"title": {"text": "accuracy with<br>shard at 32 bits (%)"}},
        hovertemplate="layer %{y}, shard %{x}<br>importance %{z:.1f}%"
                      + ("<br>%{customdata}" if found else "") + "<extra></extra>",
        name="importance", showlegend=False))
    if found:
        x, y = outline([(-0.5, -0.5, plan.m - 0.5, plan.n - 0.5)])
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"planned submodel {plan.n} x {plan.m}",
                                 line={"color": INK, "width": 2, "dash": "dash"}, hoverinfo="skip"))
        ks, iis = np.nonzero(plan.preloaded)
        x, y = outline([(i - 0.4, k - 0.4, i + 0.4, k + 0.4) for k, i in zip(ks.tolist(), iis.tolist())])
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name="preloaded (in memory before a run)",
                                 line={"color": MARK_COLOR, "width": 2}, hoverinfo="skip"))
    fig.update_layout(
        template=TEMPLATE, title=title, xaxis_title="shard (vertical slice)", yaxis_title="layer", height=400,
        margin=MARGIN)
    fig.update_xaxes(tickvals=list(range(n_shards)), range=[-0.5, n_shards - 0.5])
    fig.update_yaxes(tickvals=list(range(n_layers)), range=[n_layers - 0.5, -0.5])
    return fig


def aib_figure(io_plan, step: int | None = None, title: str = "Accumulated IO budget per layer") -> go.Figure:
    """AIB of every layer after allocation step ``step`` (default: the last), with the binding layer marked,
    and the AIB trace of every layer through all steps."""
    steps = io_plan.steps
    if not steps:
        return message_figure(title, f"no allocation: {io_plan.reason}", height=420)
    step = len(steps) - 1 if step is None else max(0, min(int(step), len(steps) - 1))
    aib = np.array(steps[step].aib) * 1e3
    layers = list(range(len(aib)))
    binding = int(np.argmin(aib))
    s = steps[step]
    what = {"init": "start: slack + earlier compute + preload bonus", "preload": f"preloaded layer {s.layer}",
            "uniform": f"layer {s.layer} at {s.bits} bits (first pass)",
            "forced": f"layer {s.layer} forced to {s.bits} bits", "upgrade":
            f"shard ({s.layer}, {s.shard}) {s.from_bits} -> {s.bits} bits"}[s.kind]
    trace = np.array([st.aib for st in steps]) * 1e3
    others = [k for k in layers if k != binding]
    bars = [go.Bar(x=ks, y=aib[ks], marker_color=color, name=name,
                   hovertemplate="layer %{x}: AIB %{y:.2f} ms<extra></extra>", xaxis="x", yaxis="y")
            for ks, color, name in ((others, LAYER_BAR_COLOR, f"AIB after step {step}"),
                                    ([binding], MARK_COLOR, "binding layer (smallest AIB)"))]
    lines = [go.Scatter(x=list(range(len(steps))), y=trace[:, k], mode="lines", name=f"layer {k}", xaxis="x2",
                        yaxis="y2", line={"color": LAYER_LINE_COLORS[k % len(LAYER_LINE_COLORS)]},
                        hovertemplate=f"layer {k}" + ", step %{x}: %{y:.2f} ms<extra></extra>")
             for k in layers]
    fig = go.Figure([*bars, *lines])
    fig.update_layout(
        shapes=[{"type": "line", "xref": "x2", "yref": "y2 domain", "x0": step, "x1": step, "y0": 0, "y1": 1,
                 "line": {"dash": "dot", "color": "gray"}, "name": f"step {step} (bars on the left)",
                 "showlegend": True}],
        template=TEMPLATE, title=f"{title}<br><sub>step {step}/{len(steps) - 1}: {what}</sub>", height=440,
        margin={**MARGIN, "t": 80}, barmode="overlay",
        xaxis={"domain": [0, 0.42], "title": "layer", "dtick": 1, "range": [-0.5, len(aib) - 0.5]},
        yaxis={"title": "AIB (ms)"}, xaxis2={"domain": [0.55, 1], "title": "allocation step"},
        yaxis2={"anchor": "x2", "title": "AIB of each layer (ms)"})
    return fig


SHARD_MEMORY_FLOOR_MB = 0.01


EMPTY_HEIGHT = 160


def accuracy_memory_figure(cells, target_ms: float, device: str, gold: float | None = None,
                           title: str | None = None, asked_ms: float | None = None) -> go.Figure:
    """Accuracy against the shard memory each method holds before a run (log axis, as the paper's Figure 7);
    ``cells``: :class:`~workbench.elastic.evaluate.CellResult` (or ``CellRow``, as the results file is read back).

    Methods that hold no shards (Load&Exec, StdPL, Ours-0MB) sit at 0.01 MB; the hover gives exact figures,
    including the resident parameters every method keeps alike. ``asked_ms``: the target the user chose,
    when ``target_ms`` is the evaluated one nearest to it (the title says both). With no cell for this
    device and target a short figure says so instead of showing empty axes."""
    rows = [c for c in cells if c.device == device and c.target_ms == target_ms]
    nearest = (f" (the evaluated target nearest to your {asked_ms:.0f} ms)"
               if asked_ms is not None and round(asked_ms) != round(target_ms) else "")
    title = title or f"Accuracy vs memory at {target_ms:.0f} ms on {device}{nearest}"
    if not rows:
        return message_figure(title, f"No evaluated cells for {device} at {target_ms:.0f} ms: run "
                                     "'workbench bench elastic' to fill this view", height=EMPTY_HEIGHT)
    fig = go.Figure()
    for r in rows:
        ours = r.method.startswith("Ours")
        fig.add_trace(go.Scatter(
            x=[max(r.preload_mb, SHARD_MEMORY_FLOOR_MB)], y=[100 * r.accuracy], mode="markers",
            name=r.method, marker={"size": 14 if ours else 10, "symbol": "star" if ours else "circle"},
            hovertemplate=(f"{r.method}: {r.n}x{r.m}<br>accuracy %{{y:.1f}}%<br>shards in memory "
                           f"{r.preload_mb:.2f} MB (+ {r.resident_mb:.1f} MB resident)<br>measured "
                           f"{r.measured_ms:.1f} ms<extra></extra>")))
    if gold is not None:
        fig.add_shape(type="line", xref="x domain", x0=0, x1=1, y0=100 * gold, y1=100 * gold,
                      line={"dash": "dash", "color": "gray"}, name=f"full model (gold) {100 * gold:.1f}%",
                      showlegend=True)
    return fig.update_layout(
        template=TEMPLATE, title=title, height=400, margin=MARGIN,
        xaxis=log_axis(SHARD_MEMORY_FLOOR_MB / 2, 2 * max(SHARD_MEMORY_FLOOR_MB, *(r.preload_mb for r in rows)),
                       "shards held in memory before a run (MB; none at 0.01)"),
        yaxis_title="dev accuracy (%)")


def candidates_figure(compute_plan, title: str = "Compute planning: every n x m submodel") -> go.Figure:
    """The candidate table as a heatmap of compute time, with the chosen and similar-size candidates marked
    and the target's limit drawn along cell edges: right of the widest fitting submodel of each depth."""
    cands = compute_plan.candidates
    target_ms = compute_plan.target_s * 1e3
    ns = sorted({c.n for c in cands})
    ms = sorted({c.m for c in cands})
    z = np.full((len(ns), len(ms)), np.nan)
    fits = np.zeros((len(ns), len(ms)), dtype=bool)
    status = [["" for _ in ms] for _ in ns]
    for c in cands:
        r, col = ns.index(c.n), ms.index(c.m)
        z[r, col], fits[r, col] = c.time_s * 1e3, c.fits
        status[r][col] = ("chosen" if c.chosen else "similar size" if c.similar else
                          f"fits {target_ms:.0f} ms" if c.fits else f"over {target_ms:.0f} ms")
    fig = go.Figure(go.Heatmap(z=z, x=ms, y=ns, text=status, colorscale="Blues", name="compute time",
                               colorbar={"title": {"text": "compute<br>time (ms)"}}, showlegend=False,
                               hovertemplate="%{y} x %{x}: %{z:.1f} ms, %{text}<extra></extra>"))
    edges = [(ms[c] + 0.5, ns[r] - 0.5, ms[c] + 0.5, ns[r] + 0.5) for r in range(len(ns))
             for c in range(len(ms) - 1) if fits[r, c] != fits[r, c + 1] and not np.isnan(z[r, c + 1])]
    edges += [(ms[c] - 0.5, ns[r] + 0.5, ms[c] + 0.5, ns[r] + 0.5) for r in range(len(ns) - 1)
              for c in range(len(ms)) if fits[r, c] != fits[r + 1, c] and not np.isnan(z[r + 1, c])]
    if edges:
        x, y = outline(edges)
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line={"color": MARK_COLOR, "width": 3}, hoverinfo="skip",
                                 name=f"limit of the {target_ms:.0f} ms target (fitting sizes left and below)"))
    for name, keep, marker in (
            ("similar size (one shard per layer from the largest)", lambda c: c.similar and not c.chosen,
             {"symbol": "circle-open", "size": 11, "line": {"width": 2}}),
            (f"chosen {compute_plan.n} x {compute_plan.m}", lambda c: c.chosen,
             {"symbol": "star", "size": 15, "line": {"width": 1, "color": "white"}})):
        picked = [c for c in cands if keep(c)]
        if picked:
            fig.add_trace(go.Scatter(x=[c.m for c in picked], y=[c.n for c in picked], mode="markers", name=name,
                                     marker={"color": MARK_COLOR, **marker}, hoverinfo="skip"))
    note = "" if edges else (f": all fit {target_ms:.0f} ms" if fits.all() else
                             f": none fits {target_ms:.0f} ms" if not fits.any() else "")
    fig.update_layout(template=TEMPLATE, title=title + note, xaxis_title="width m", yaxis_title="depth n",
                      height=400, margin=MARGIN)
    fig.update_xaxes(tickvals=ms, range=[ms[0] - 0.5, ms[-1] + 0.5])
    fig.update_yaxes(tickvals=ns, range=[ns[0] - 0.5, ns[-1] + 0.5])
    return fig
