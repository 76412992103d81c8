"""Figures of the overview page: the n x m accuracy grid and a device's per-layer IO/compute times."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from workbench.viz.style import MARGIN, TEMPLATE

from workbench.devices import DeviceProfile, LayerShape


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


def layer_times_figure(profile: DeviceProfile, shape: LayerShape, bits: int) -> go.Figure:
    """Per-layer compute time and IO time (m shards at ``bits`` bits) against the shard count m."""
    ms = list(range(1, shape.heads + 1))
    compute = [profile.layer_compute_s(m, shape) * 1e3 for m in ms]
    io = [m * profile.shard_read_s(bits, shape) * 1e3 for m in ms]
    fig = go.Figure([
        go.Bar(name="compute", x=ms, y=compute, marker_color="#4C78A8",
               hovertemplate="m=%{x}: compute %{y:.2f} ms<extra></extra>"),
        go.Bar(name=f"IO ({bits}-bit shards)", x=ms, y=io, marker_color="#F58518",
               hovertemplate="m=%{x}: load %{y:.2f} ms<extra></extra>"),
    ])
    fig.update_layout(
        template=TEMPLATE, barmode="group", title=f"{profile.title}: one layer (d={shape.hidden}, T={shape.seq_len})",
        xaxis_title="shards per layer m", yaxis_title="time per layer (ms)", height=360,
        margin=MARGIN)
    fig.update_xaxes(dtick=1)
    return fig
