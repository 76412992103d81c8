"""Pure figure builders: engine results in, ``plotly.graph_objects.Figure`` out (never shown here)."""
from workbench.viz.elastic import (accuracy_grid_figure, accuracy_memory_figure, aib_figure, candidates_figure,
                                   importance_plan_figure)
from workbench.viz.kvcache import (chunk_map_figure, events_figure, latency_figure, load_gantt_figure,
                                   queue_figure)
from workbench.viz.overview import layer_times_figure
from workbench.viz.timeline import gantt_figure

__all__ = ["accuracy_grid_figure", "layer_times_figure", "importance_plan_figure", "aib_figure", "gantt_figure",
           "accuracy_memory_figure", "candidates_figure",
           "chunk_map_figure", "queue_figure", "events_figure", "latency_figure", "load_gantt_figure"]
