"""Pure figure builders: engine results in, ``plotly.graph_objects.Figure`` out (never shown here).

This face re-exports the shared builders only; a mechanism's figures come from its own module
(``workbench.viz.kvcache``, ``workbench.viz.elastic``, ...), so importing one view loads no other.
"""
from workbench.viz.overview import layer_times_figure
from workbench.viz.timeline import gantt_figure

__all__ = ["layer_times_figure", "gantt_figure"]
