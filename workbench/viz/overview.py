"""Figures of the overview page's shared part: a device's per-layer IO/compute times."""
from __future__ import annotations

import plotly.graph_objects as go

from workbench.viz.style import MARGIN, TEMPLATE

from workbench.devices import DeviceProfile, LayerShape


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
        template=TEMPLATE, barmode="group", title=f"{profile.title}: one layer (d={shape.hidden}, T={shape.seq_len}), "
                                                  f"shards read at {bits} bits",
        xaxis_title="shards per layer m", yaxis_title="time per layer (ms)", height=360,
        margin=MARGIN)
    fig.update_xaxes(dtick=1)
    return fig
