"""The Gantt chart every mechanism draws its timelines with, and the colour of each span kind: one place,
so a kind means one colour on every page."""
from __future__ import annotations

import plotly.graph_objects as go

from workbench.timeline import Span, Timeline, process_names
from workbench.viz.style import INK, MARGIN, TEMPLATE

KIND_COLORS = {"io": "#F58518", "swap_in": "#F58518", "decompress": "#B279A2", "compute": "#4C78A8",
               "recompute": "#54A24B", "stall": "#E45756", "comm": "#72B7B2", "queue": "#BAB0AC",
               "swap_out": "#9D755D", "idle": "#E5E7EB"}
FALLBACK_COLOR = "#79706E"
MEASURED_PATTERN = {"shape": "/", "solidity": 0.2, "size": 8, "bgcolor": "white"}
BAR_HALF = 0.4


def kind_color(kind: str) -> str:
    """The colour of a span kind; a kind without one of its own is drawn in the fallback grey."""
    return KIND_COLORS.get(kind, FALLBACK_COLOR)


def gantt_figure(predicted: Timeline | None, measured: Timeline | None = None,
                 title: str = "Pipeline: IO, decompression and compute per layer") -> go.Figure:
    """Gantt of the predicted timeline (solid) with a measured run overlaid (hatched, dark labels): one row
    per (device, lane), each kind in its colour, and an arrow from each send's end to its receive's start.

    With both timelines, a row holds the prediction in its upper half and the measurement in its lower
    half. Rows are named by lane alone while every span is on one device. Labels too small to read are
    left to the hover."""
    runs = [(tl, tag) for tl, tag in ((predicted, "predicted"), (measured, "measured")) if tl is not None]
    spans = [s for tl, _ in runs for s in tl.spans]
    names = process_names(spans)
    several = len(names) > 1

    def row(s: Span) -> str:
        return f"{names[(s.device, s.rank)]} · {s.lane}" if several else s.lane

    order = list(dict.fromkeys(row(s) for s in spans))
    kinds = [k for k in KIND_COLORS if any(s.kind == k for s in spans)]
    kinds += list(dict.fromkeys(s.kind for s in spans if s.kind not in KIND_COLORS))
    halves = len(runs) == 2
    fig = go.Figure()
    for tl, tag in runs:
        hatched = tag == "measured"
        for kind in kinds:
            of_kind = tl.of_kind(kind)
            if not of_kind:
                continue
            color = kind_color(kind)
            fig.add_trace(go.Bar(
                base=[s.start * 1e3 for s in of_kind], x=[s.duration * 1e3 for s in of_kind],
                y=[row(s) for s in of_kind], orientation="h", name=f"{kind} ({tag})",
                width=BAR_HALF if halves else None, offset=(-BAR_HALF if hatched else 0) if halves else None,
                marker={"color": color, "line": {"color": color, "width": 1},
                        "pattern": MEASURED_PATTERN if hatched else {"shape": ""}},
                text=[s.label for s in of_kind], customdata=[_details(s, names) for s in of_kind],
                textposition="inside", insidetextanchor="middle", textangle=0,
                textfont={"color": INK} if hatched else None,
                hovertemplate="%{text}: %{base:.2f} -> %{x:.2f} ms long<br>%{customdata}<extra>"
                              + f"{kind} ({tag})</extra>"))
        _add_flows(fig, tl, tag, row)
    end = max([tl.end for tl, _ in runs] + [0.0]) * 1e3
    fig.update_layout(
        template=TEMPLATE, title=title, barmode="overlay", height=300 + (30 if halves else 18) * len(order),
        margin={**MARGIN, "l": 140}, uniformtext={"minsize": 10, "mode": "hide"},
        xaxis_title="time (ms)", yaxis={"categoryorder": "array", "categoryarray": order[::-1]})
    fig.update_xaxes(range=[0, end * 1.02 if end else 1])
    return fig


def _add_flows(fig: go.Figure, tl: Timeline, tag: str, row) -> None:
    """One line trace with an arrow from the end of each flow's send to the start of each of its receives."""
    xs, ys, symbols, text = [], [], [], []
    for flow, (send, *receives) in tl.flows().items():
        for recv in receives:
            xs += [send.end * 1e3, recv.start * 1e3, None]
            ys += [row(send), row(recv), None]
            symbols += ["circle", "arrow", "circle"]
            what = f"flow {flow}: {send.label or send.kind} -> {recv.label or recv.kind}"
            text += [what + (f", {send.nbytes} bytes" if send.nbytes else ""), what, ""]
    if xs:
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines+markers", name=f"send -> receive ({tag})", hovertext=text,
            hoverinfo="text", line={"color": INK, "width": 1.5, "dash": "dot" if tag == "measured" else "solid"},
            marker={"symbol": symbols, "size": [5, 11, 0] * (len(xs) // 3), "angleref": "previous",
                    "color": INK}))


def _details(s: Span, names: dict) -> str:
    """What a span's hover says beside its label and times: where it ran and its typed fields."""
    parts = [f"{names[(s.device, s.rank)]}, lane {s.lane}"]
    if s.rank is not None and names[(s.device, s.rank)] == s.device:
        parts.append(f"rank {s.rank}")
    if s.layer is not None:
        parts.append(f"layer {s.layer}")
    if s.nbytes:
        parts.append(f"{s.nbytes:,} bytes")
    if s.flow is not None:
        parts.append(f"flow {s.flow}")
    return ", ".join(parts)
