"""The overview page: models, tasks, the n x m accuracy grid, and device profiles."""
from __future__ import annotations

import html

import ipywidgets as widgets

from workbench.data import TASKS
from workbench.devices import DISTILBERT, MINILM, get_profile, profile_names
from workbench.elastic.artifacts import model_summary
from workbench.presets import default_preset
from workbench.ui.base import Panel
from workbench.viz.overview import accuracy_grid_figure, layer_times_figure

SHAPES = {"MiniLM layer (d=384)": MINILM, "DistilBERT layer (d=768)": DISTILBERT}
BITWIDTHS = (2, 3, 4, 5, 6, 32)

INTRO = """
<h2 style="margin:4px 0">Edge transformer workbench: overview</h2>
<p style="margin:2px 0 8px 0">Encoder <b>all-MiniLM-L6-v2</b> (6 layers x 12 shards, hidden 384), elastic-fine-tuned per task
so that every <i>n x m</i> submodel (first n layers, m most important shards per layer) classifies;
decoder <b>SmolLM2-135M-Instruct</b> (30 layers, 9/3 heads). Pick a task to see its accuracy grid, and a device
profile to see what one layer costs there.</p>
"""


class OverviewPanel(Panel):
    """Task -> accuracy grid; device profile + layer shape + bitwidth -> per-layer IO and compute times."""

    dashboard_page = "overview.ipynb"

    def __init__(self, preset: str | None = None):
        super().__init__()
        self.preset = preset or default_preset()
        self.task = widgets.Dropdown(options=[(s.title, n) for n, s in TASKS.items()], value="sentiment",
                                     description="Task", layout=widgets.Layout(width="420px"))
        self.device = widgets.Dropdown(options=profile_names(), value="odroid-n2", description="Device")
        self.shape = widgets.Dropdown(options=list(SHAPES), value="DistilBERT layer (d=768)", description="Layer")
        self.bits = widgets.SelectionSlider(options=BITWIDTHS, value=6, description="Shard bits",
                                            continuous_update=False)
        self.task_info = widgets.HTML()
        self.device_info = widgets.HTML()
        self.observe_controls(self.task, update=self._refresh_task)
        self.observe_controls(self.device, self.shape, self.bits, update=self._refresh_device)
        self.children = [
            widgets.HTML(INTRO),
            widgets.HBox([self.task, self.task_info]),
            self.figure_slot("grid"),
            widgets.HBox([self.device, self.shape, self.bits]),
            self.device_info,
            self.message,
            self.figure_slot("times"),
        ]
        self.refresh()

    def _refresh(self) -> None:
        """Both halves; each keeps its own error message (a control change redraws only its half)."""
        self.refresh(self._refresh_device)
        self.refresh(self._refresh_task)

    def _refresh_task(self) -> None:
        summary = model_summary(self.task.value, self.preset)
        grid = summary["accuracy_grid"]
        spec = TASKS[self.task.value]
        self.show_figure("grid", accuracy_grid_figure(grid, f"{spec.title}: dev accuracy of n x m submodels"))
        self.task_info.value = (f"<span class='wb-task-info'>full model {grid[-1, -1] * 100:.1f}% &middot; "
                                f"{summary['dev_examples']} dev examples &middot; trained in "
                                f"{summary['train_seconds']:.0f} s</span>")

    def _refresh_device(self) -> None:
        profile = get_profile(self.device.value)
        shape = SHAPES[self.shape.value]
        self.show_figure("times", layer_times_figure(profile, shape, int(self.bits.value)))
        full_ms = profile.layer_compute_s(shape.heads, shape) * 1e3
        io_ms = shape.heads * profile.shard_read_s(int(self.bits.value), shape) * 1e3
        self.device_info.value = (
            f"<span class='wb-device-info'>{html.escape(profile.title)}: full layer computes in {full_ms:.2f} ms, "
            f"loads in {io_ms:.2f} ms at {self.bits.value} bits (IO/compute {io_ms / full_ms:.2f}) "
            f"&middot; <i>{html.escape(profile.source)}</i></span>")
