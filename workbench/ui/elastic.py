"""The elastic-pipelining dashboard: move the target latency, preload buffer, device or task and the
two-stage planner re-plans at once; "Run for real" executes the plan on the engine and overlays the
measured timeline on the predicted one."""
from __future__ import annotations

import base64
import html
import json
from typing import Callable

import ipywidgets as widgets
import numpy as np

from workbench.data import TASKS, load_task
from workbench.devices import profile_names
from workbench.presets import default_preset
from workbench.errors import WorkbenchError
from workbench.ui.base import BackgroundRun, Panel, RunOutcome
from workbench.viz.elastic import (accuracy_grid_figure, accuracy_memory_figure, aib_figure, candidates_figure,
                                   importance_plan_figure)
from workbench.viz.timeline import gantt_figure

DEVICES = tuple(profile_names("wrx"))

INTRO = """
<h2 class="wb-title">Elastic pipelining (WRX)</h2>
<p class="wb-lead">The model is cut into <i>layers x shards x bitwidths</i>. For a target latency the planner
picks the largest submodel whose compute fits (<b>compute planning</b>), then spends each layer's
<b>accumulated IO budget</b> (AIB) on bitwidths, most important shards first (<b>IO planning</b>); a small
<b>preload buffer</b> keeps the first shards in memory. Presets are emulated: a real run is slowed to the device.</p>
"""

OVERVIEW_INTRO = """
<p class="wb-lead">The encoder is elastic-fine-tuned per task so that every <i>n x m</i> submodel (first n
layers, m most important shards per layer) classifies. Pick a task to see its accuracy grid.</p>
"""


def task_menu(task: str, ready: Callable[[str], bool],
              layout: widgets.Layout) -> tuple[widgets.Dropdown, widgets.HTML]:
    """The task dropdown of a page that opens with its first task prepared: the tasks ``ready`` accepts (every
    task when none is, so that the page's message says what to prepare), ``task`` chosen when it is one, and a
    note naming the tasks still being prepared."""
    offered = [n for n in TASKS if ready(n)] or list(TASKS)
    waiting = [n for n in TASKS if n not in offered]
    menu = widgets.Dropdown(options=[(TASKS[n].title, n) for n in offered], value=task if task in offered
                            else offered[0], description="Task", layout=layout)
    names = html.escape(", ".join(TASKS[n].title for n in waiting))
    note = widgets.HTML(f"<span class='wb-note wb-tasks-waiting'>{names}: still being prepared; reload the page "
                        "once the gallery says it is ready</span>" if waiting else "")
    return menu, note


class ElasticOverview(Panel):
    """Elastic's part of the overview page: task -> the dev accuracy of every n x m submodel."""

    def __init__(self, preset: str | None = None):
        super().__init__()
        from workbench.elastic.artifacts import model_ready

        self.preset = preset or default_preset()
        self.task, self.tasks_waiting = task_menu("sentiment", lambda name: model_ready(name, self.preset),
                                                  widgets.Layout(width="420px"))
        self.task_info = widgets.HTML()
        self.observe_controls(self.task)
        self.children = [widgets.HTML(OVERVIEW_INTRO), widgets.HBox([self.task, self.task_info]), self.tasks_waiting,
                         self.message, self.figure_slot("grid")]
        self.refresh()

    def _refresh(self) -> None:
        from workbench.elastic.artifacts import model_summary

        summary = model_summary(self.task.value, self.preset)
        grid = summary["accuracy_grid"]
        spec = TASKS[self.task.value]
        self.show_figure("grid", accuracy_grid_figure(grid, f"{spec.title}: dev accuracy of n x m submodels"))
        self.task_info.value = (f"<span class='wb-task-info'>full model {grid[-1, -1] * 100:.1f}% &middot; "
                                f"{summary['dev_examples']} dev examples &middot; trained in "
                                f"{summary['train_seconds']:.0f} s</span>")


class ElasticPanel(Panel):
    """Controls -> ``plan_elastic`` -> five figures; a button runs the plan for real."""

    dashboard_page = "elastic.ipynb"

    def __init__(self, preset: str | None = None, task: str = "sentiment", device: str = "odroid-n2",
                 target_ms: float = 200.0, preload_mb: float = 1.0):
        super().__init__()
        self.preset = preset or default_preset()
        self._contexts: dict[tuple[str, str], object] = {}
        self._results_cache: dict | None = None
        self.plan = None
        self.measured = None
        self.plans_computed = 0
        wide = widgets.Layout(width="460px")
        from workbench.elastic.artifacts import task_ready

        self.task, self.tasks_waiting = task_menu(task, lambda name: task_ready(name, self.preset), wide)
        self.device = widgets.Dropdown(options=list(DEVICES), value=device, description="Device")
        self.target = widgets.FloatSlider(value=target_ms, min=50, max=1000, step=10, description="Target (ms)",
                                          continuous_update=False, layout=wide, readout_format=".0f",
                                          style={"description_width": "90px"})
        self.preload = widgets.FloatSlider(value=preload_mb, min=0, max=32, step=0.25, description="Preload (MB)",
                                           continuous_update=False, layout=wide, readout_format=".2f",
                                           style={"description_width": "90px"})
        self.step = widgets.IntSlider(value=0, min=0, max=0, description="AIB step", continuous_update=False,
                                      layout=wide, style={"description_width": "90px"})
        self.runs = widgets.BoundedIntText(value=3, min=1, max=50, description="runs",
                                           layout=widgets.Layout(width="130px"), style={"description_width": "40px"})
        self.runner = BackgroundRun(self, "Run for real", self._run_for_real, self._show_measured)
        self.export_button = widgets.Button(description="Export trace", icon="download")
        self.download = widgets.HTML()
        self.submodel = widgets.HTML()
        self.run_info = widgets.HTML()
        self.export_message = self.message_slot(self._export)
        self.observe_controls(self.task, self.device, update=self._refresh)
        self.observe_controls(self.target, self.preload, update=self._replan)
        self.observe_controls(self.step, update=self._redraw_aib)
        self.export_button.on_click(lambda _b: self.refresh(self._export))
        self.children = [
            widgets.HTML(INTRO),
            widgets.HBox([self.task, self.device]),
            self.tasks_waiting,
            widgets.HBox([self.target, self.preload]),
            self.message,
            self.submodel,
            widgets.HBox([self.figure_slot("importance"), self.figure_slot("candidates")],
                         layout=widgets.Layout(width="100%")),
            self.step,
            self.figure_slot("aib"),
            widgets.HBox([self.runs, self.runner]),
            widgets.HBox([self.export_button, self.download, self.export_message]),
            self.run_info,
            self.figure_slot("gantt"),
            self.figure_slot("memory"),
        ]
        for name in ("importance", "candidates"):
            self.figure_slot(name).layout.flex = "1 1 0%"
        self.refresh()

    def bench_sweeps(self) -> dict[str, tuple[widgets.Widget, list]]:
        return {"target": (self.target, [float(v) for v in range(60, 1001, 20)]),
                "preload": (self.preload, [float(v) for v in np.arange(0, 32.01, 0.75)])}

    # -- engine calls

    def context(self):
        """The prepared artifacts and cost model of the selected task and device (loaded once per pair)."""
        from workbench.elastic.artifacts import load_context

        key = (self.task.value, self.device.value)
        if key not in self._contexts:
            self._contexts[key] = load_context(self.task.value, self.device.value, self.preset)
        return self._contexts[key]

    def evaluation_cells(self) -> list:
        """Cells (``CellRow``) of the last `workbench bench elastic` run for this task and prepare preset (none
        when there is none, or its table was written by an older version)."""
        from workbench.bench.results import load_results, run_label
        from workbench.elastic.evaluate import CellRow

        found = load_results("elastic-cells", run_label(self.preset))
        if found is None:
            return []
        stamp = (found.path.stat().st_mtime_ns, self.task.value)
        if self._results_cache is not None and self._results_cache[0] == stamp:
            return self._results_cache[1]
        try:
            rows = [r for r in found.rows_as(CellRow) if r.task == self.task.value and r.preset == self.preset]
        except WorkbenchError:
            rows = []
        self._results_cache = (stamp, rows)
        return rows

    # -- updates

    def _refresh(self) -> None:
        self.refresh(self._replan)

    def _replan(self) -> None:
        from workbench.elastic.planner import plan_elastic

        ctx = self.context()
        self.plan = plan_elastic(ctx.cost_model, self.target.value / 1e3, ctx.importance.accuracy, self.preload.value * 1e6)
        self.plans_computed += 1
        self.measured = None
        self.download.value = ""
        self.run_info.value = ""
        plan = self.plan
        if not plan.found:
            self.submodel.value = (f"<span class='wb-submodel' data-plans='{self.plans_computed}'>No plan: {html.escape(plan.reason)}</span>")
        else:
            upgrades = sum(s.kind == "upgrade" for s in plan.io.steps)
            self.submodel.value = (
                f"<span class='wb-submodel' data-plans='{self.plans_computed}'><b>Submodel {plan.n} x {plan.m}</b> &middot; predicted "
                f"{1e3 * plan.predicted_s:.1f} ms of {self.target.value:.0f} ms &middot; preload "
                f"{plan.memory_bytes / 1e6:.2f} MB ({len(plan.preload)} shards at "
                f"{plan.preload_bits} bits) &middot; first pass {plan.io.uniform_bits} bits, "
                f"{upgrades} upgrades &middot; planned in {1e3 * plan.plan_s:.2f} ms</span><br>"
                f"<small>Why {plan.n} x {plan.m}: {html.escape(plan.compute.rule)}."
                + (f" Rejected as unloadable in time: {', '.join(f'{r.n}x{r.m}' for r in plan.rejected)}."
                   if plan.rejected else "") + "</small>")
        n_steps = len(plan.io.steps) if plan.io is not None else 1
        self._replanning = True
        try:
            self.step.max = max(0, n_steps - 1)
            self.step.value = self.step.max
        finally:
            self._replanning = False
        self._redraw_gantt()
        self.defer(self._redraw_plan_figures, "importance", "candidates", "aib", "memory")

    def _redraw_plan_figures(self) -> None:
        """The secondary part of a re-plan: the plan on the importance map, the compute candidates, the AIBs and
        the accuracy-memory points (deferred while a slider moves: the submodel line and the pipeline come first)."""
        plan, ctx = self.plan, self.context()
        if plan is None:
            return
        key = (self.task.value, plan.n, plan.m, plan.bits.tobytes(), plan.preloaded.tobytes())
        task = TASKS[self.task.value].title
        shown = f"the {plan.n} x {plan.m} plan" if plan.found else "no plan"
        self.show_if_changed("importance", key,
                             lambda: importance_plan_figure(ctx.importance.accuracy, plan if plan.found else None,
                                                            title=f"Shard importance and {shown}<br><sub>{task}</sub>"))
        if plan.compute is not None:             # depends on the target and device only, not on the buffer
            compute = plan.compute
            key = (self.task.value, self.device.value, compute.target_s, compute.n, compute.m,
                   tuple((r.n, r.m) for r in plan.rejected))      # rejections depend on the buffer
            title = f"Compute planning at {1e3 * compute.target_s:.0f} ms on {self.device.value}: every n x m submodel"
            self.show_if_changed("candidates", key, lambda: candidates_figure(compute, title=title))
        self._redraw_aib()
        self._redraw_memory()

    def _redraw_aib(self) -> None:
        if self.plan is None or self.plan.io is None or getattr(self, "_replanning", False):
            return
        self.show_figure("aib", aib_figure(self.plan.io, self.step.value,
                                           title=f"Accumulated IO budget per layer, {self.preload.value:.2f} MB preload "
                                                 f"buffer"))

    def _redraw_gantt(self) -> None:
        plan = self.plan
        title = f"Pipeline of {plan.n} x {plan.m} on {self.device.value}" if plan.found else "No pipeline"
        self.show_figure("gantt", gantt_figure(plan.timeline if plan.found else None, self.measured, title=title))

    def _redraw_memory(self) -> None:
        rows = self.evaluation_cells()
        device = self.device.value
        targets = sorted({r.target_ms for r in rows if r.device == device})
        asked = self.target.value
        if not targets:
            self.show_if_changed("memory", (self.task.value, device, asked, None),
                                 lambda: accuracy_memory_figure([], asked, device))
            return
        nearest = min(targets, key=lambda t: abs(t - asked))
        self.show_if_changed("memory", (self.task.value, device, nearest, asked, len(rows)),
                             lambda: accuracy_memory_figure(rows, nearest, device, gold=rows[0].gold, asked_ms=asked))

    def _run_for_real(self, handle) -> RunOutcome:
        """Worker thread: run the current plan ``runs`` times on dev texts (emulated on presets)."""
        from workbench.elastic.pipeline import ElasticEngine, PreloadBuffer, run_repeatedly
        from workbench.models.tokenizer import encoder_tokenizer

        plan, ctx, runs = self.plan, self.context(), int(self.runs.value)
        if plan is None or not plan.found:
            raise WorkbenchError("nothing to run: the current settings give no plan")
        texts = load_task(ctx.task.name).dev.texts[:runs]
        tok = encoder_tokenizer(ctx.task.max_length)
        inputs = [tok([text], pad_to=ctx.task.max_length) for text in texts]
        handle.progress(0, runs)
        results = run_repeatedly(ElasticEngine(ctx.store, PreloadBuffer(plan.memory_bytes)), plan, inputs, runs,
                                 emulate=None if ctx.device == "host" else ctx.cost_model,
                                 on_run=lambda r, _result: handle.progress(r + 1, runs),
                                 should_stop=handle.should_stop)
        return RunOutcome(id(plan), results, made_with=plan,
                          note=", ".join(ctx.task.labels[int(r.logits.argmax())] for r in results[:5]))

    def _show_measured(self, outcome: RunOutcome, cancelled: bool) -> None:
        """Kernel loop: overlay the last measured run on the prediction, if the plan is still the current one."""
        plan, results = outcome.made_with, outcome.result
        if plan is not self.plan:
            self.run_info.value = "<span class='wb-run-info'>the settings changed during the run; run again</span>"
            return
        if not results:
            self.run_info.value = "<span class='wb-run-info'>cancelled before the first run</span>"
            return
        latencies = [r.latency_s for r in results]
        self.measured = results[-1].timeline
        note = results[-1].check(plan).note()
        self.run_info.value = (
            f"<span class='wb-run-info'>{len(results)} real run(s){' (cancelled)' if cancelled else ''}: median "
            f"{1e3 * float(np.median(latencies)):.1f} ms, last {1e3 * latencies[-1]:.1f} ms "
            f"(predicted {1e3 * plan.predicted_s:.1f} ms); stalls in the last run "
            f"{1e3 * self.measured.busy('stall'):.1f} ms; predictions: {outcome.note}</span>"
            + (f"<br><span class='wb-warn wb-miss'>Last run: {html.escape(note)}.</span>"
               if note else ""))
        self._redraw_gantt()

    def _export(self) -> None:
        timeline = self.measured or (self.plan.timeline if self.plan is not None and self.plan.found else None)
        if timeline is None:
            raise WorkbenchError("nothing to export: the current settings give no plan")
        payload = base64.b64encode(json.dumps(timeline.to_chrome_trace()).encode()).decode()
        name = f"wrx-{self.device.value}-{self.target.value:.0f}ms-{timeline.source}.json"
        self.download.value = (f"<a class='wb-trace-link' download='{name}' href='data:application/json;base64,"
                               f"{payload}'>Download {html.escape(name)}</a> (open it in ui.perfetto.dev)")
