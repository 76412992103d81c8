"""One light Plotly template for every figure of the workbench.

Plotly's default template is large: validating it costs about 0.1 s per figure and
again per ``FigureWidget`` (measured here), which would dominate a dashboard's
redraw. This small template keeps a consistent look at a few milliseconds.

Titles sit left-aligned below the mode bar's row, so its buttons never cover them; legends
sit at the bottom of the figure (``yref="container"``), where Plotly makes room for them
below the x-axis title instead of drawing over it, at any width.
"""
import plotly.graph_objects as go

MARGIN = {"t": 60, "l": 60, "r": 20, "b": 50}
DEVICE_COLORS = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D",
                 "#EECA3B", "#BAB0AC"]
LEGEND_DEVICES = 12
"""Devices named in a legend; with more, the hover names each bar."""
INK = "#2a3f5f"

TEMPLATE = go.layout.Template(layout={
    "font": {"family": "Helvetica, Arial, sans-serif", "size": 12, "color": INK},
    "paper_bgcolor": "white", "plot_bgcolor": "#f4f6fb", "showlegend": True,
    "title": {"x": 0, "xanchor": "left", "xref": "container", "y": 1, "yanchor": "top", "yref": "container",
              "pad": {"l": 10, "t": 28}},
    "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": 0, "yanchor": "bottom", "yref": "container"},
    "xaxis": {"gridcolor": "white", "zeroline": False, "linecolor": "#c8d0e0", "automargin": True},
    "yaxis": {"gridcolor": "white", "zeroline": False, "linecolor": "#c8d0e0", "automargin": True},
    "colorway": ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D"],
    "hoverlabel": {"align": "left"},
})


def device_color(i: int) -> str:
    """Device i's colour, the same on every mechanism's figures."""
    return DEVICE_COLORS[i % len(DEVICE_COLORS)]


def outline(boxes) -> tuple[list, list]:
    """x and y of one line trace drawing every ``(x0, y0, x1, y1)`` box (a zero-width box is a segment)."""
    xs, ys = [], []
    for x0, y0, x1, y1 in boxes:
        if x0 == x1 or y0 == y1:
            xs += [x0, x1, None]
            ys += [y0, y1, None]
        else:
            xs += [x0, x1, x1, x0, x0, None]
            ys += [y0, y0, y1, y1, y0, None]
    return xs, ys


def wrap_text(text: str, width: int = 110) -> str:
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


def message_figure(title: str, message: str, height: int = 400, wrap: int | None = None) -> go.Figure:
    """A figure that says why there is nothing to draw, instead of showing empty axes; ``wrap``: the message
    as lines of at most that many characters (a half-width slot holds about 60)."""
    if wrap:
        message = wrap_text(message, wrap)
    return go.Figure().update_layout(
        template=TEMPLATE, title=title, height=height, margin=MARGIN, plot_bgcolor="white", xaxis={"visible": False},
        yaxis={"visible": False}, annotations=[{"text": message, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                                                "showarrow": False, "font": {"size": 14}}])


def log_axis(low: float, high: float, title: str) -> dict:
    """A log axis from ``low`` to ``high`` (data units) labelled at powers of ten only, where the range holds
    one; within one decade at 1, 2 and 5 times a power of ten (Plotly's default labels every minor step)."""
    import math

    span = math.log10(max(high, low * 1.0001)) - math.log10(low)
    return {"type": "log", "title": title, "dtick": 1 if span >= 1 else "D2", "minor": {"showgrid": False},
            "range": [math.log10(low), math.log10(max(high, low * 1.0001))]}
