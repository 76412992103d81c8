"""Pure figure builders: engine results in, ``plotly.graph_objects.Figure`` out (never shown here)."""
from workbench.viz.overview import accuracy_grid_figure, layer_times_figure

__all__ = ["accuracy_grid_figure", "layer_times_figure"]
