"""The Gantt chart every mechanism draws its timelines with, and the colour of each span kind: one place,
so a kind means one colour on every page."""
from __future__ import annotations

import plotly.graph_objects as go

from workbench.timeline import Timeline
from workbench.viz.style import INK, MARGIN, TEMPLATE

LANE_COLORS = {"io": "#F58518", "swap_in": "#F58518", "decompress": "#B279A2", "compute": "#4C78A8",
               "recompute": "#54A24B", "stall": "#E45756"}
MEASURED_PATTERN = {"shape": "/", "solidity": 0.2, "size": 8, "bgcolor": "white"}


def gantt_figure(predicted: Timeline | None, measured: Timeline | None = None,
                 title: str = "Pipeline: IO, decompression and compute per layer") -> go.Figure:
    """Gantt of the predicted timeline (solid) with a measured run overlaid (hatched, dark labels), stalls
    in red; labels too small to read are left to the hover."""
    fig = go.Figure()
    rows = []
    for tl, tag in ((predicted, "predicted"), (measured, "measured")):
        if tl is None:
            continue
        for kind in LANE_COLORS:
            spans = tl.of_kind(kind)
            if not spans:
                continue
            y = [f"{tag}: {s.lane}" for s in spans]
            rows.extend(y)
            hatched = tag == "measured"
            fig.add_trace(go.Bar(
                base=[s.start * 1e3 for s in spans], x=[s.duration * 1e3 for s in spans], y=y, orientation="h",
                name=f"{kind} ({tag})", marker={"color": LANE_COLORS[kind],
                                                "line": {"color": LANE_COLORS[kind], "width": 1},
                                                "pattern": MEASURED_PATTERN if hatched else {"shape": ""}},
                text=[s.label for s in spans], textposition="inside", insidetextanchor="middle", textangle=0,
                textfont={"color": INK} if hatched else None,
                hovertemplate="%{text}: %{base:.2f} -> %{x:.2f} ms long<extra>" + f"{kind} ({tag})</extra>"))
    order = list(dict.fromkeys(rows))
    end = max([tl.end for tl in (predicted, measured) if tl is not None] + [0.0]) * 1e3
    fig.update_layout(
        template=TEMPLATE, title=title, barmode="overlay", height=300 + 18 * len(order),
        margin={**MARGIN, "l": 140}, uniformtext={"minsize": 10, "mode": "hide"},
        xaxis_title="time (ms)", yaxis={"categoryorder": "array", "categoryarray": order[::-1]})
    fig.update_xaxes(range=[0, end * 1.02 if end else 1])
    return fig
