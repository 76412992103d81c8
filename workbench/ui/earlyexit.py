"""The early-exit serving (E3) dashboard: task, SLO, input batch size, GPUs per type, easy:hard mix, exit threshold,
arrival pattern and rate -> the batch size left after every ramp (measured window by window, and the ARIMA
forecast E3 plans with), E3's split plan and why, the simulated pipeline bubbles per replica, and goodput of E3,
the early-exit model as it is and the stock model against the batch size. The optimizer and the simulator
redraw as the controls move; "Run for real" serves a small copy of the plan on Ray Serve on this host in the
background and overlays its measured bubbles on the simulator's prediction of that same run."""
from __future__ import annotations

import html
import math

import ipywidgets as widgets

from workbench.errors import WorkbenchError
from workbench.presets import default_preset
from workbench.ui.base import BackgroundRun, Panel
from workbench.viz.earlyexit import (bubble_timeline, bubbles_figure, goodput_figure, idle_text, no_result_figure,
                                     plan_figure, profile_figure)

GPU_TYPES = ("v100", "p100", "k80", "a6000")
"""E3's GPU presets (workbench.devices); their layer times are estimates (workbench.earlyexit.profiles)."""
MAX_GPUS = 32
SWEEP_BATCHES = (1, 2, 4, 8, 16, 32, 64)
"""The input batch sizes of the goodput figure (and the batch slider's range)."""
SERIES_WINDOWS = 6
"""Windows of the drifting mix behind the forecast: ARIMA(1, 1, 0) needs five past windows, so the last
window's forecast is the model's; each window more costs ARIMA fits (about 0.3 s here)."""
SIM_REQUESTS = 400
"""Requests the simulator serves per redraw (the bubbles figure shows the run's start)."""
HOST_REPLICAS = 4
HOST_REQUESTS = 48
HOST_SLO_S = 1.0
HOST_BATCH = 4
"""A real run: E3's plan for this many CPU replicas of this host (their layer times measured here), serving
this many requests of the page's mix and arrival pattern at 80% of that plan's goodput, within this SLO, at
this input batch size (the page's GPU SLO and batch sizes are far below what one CPU core takes)."""
CACHE = 128
SLO = "SLO (ms)"

INTRO = """
<h2 style="margin:4px 0">Early-exit serving (E3)</h2>
<p style="margin:2px 0 8px 0">An early-exit model lets confident samples leave at a ramp after any layer, so a
batch <b>shrinks</b> as it runs and the GPU idles. <b>E3</b> cuts the model where the batch has shrunk and gives
the early splits more <b>replicas</b>, so that every split runs full batches; the splits form a pipeline over
(possibly mixed) GPUs. The batch profile comes from the trained ramps' real outputs on the task's dev set,
drawn as an easy:hard mix that drifts window by window; E3 plans with its ARIMA forecast. GPU layer times are
estimates from the GPUs' spec sheets; <b>Run for real</b> serves the plan's splits on Ray Serve with CPU
replicas on this host.</p>
"""


def easy_label(easy: float) -> str:
    return f"{round(100 * easy)}:{round(100 * (1 - easy))}"


def default_threshold(record) -> float:
    """The largest entropy threshold of the record's table that keeps accuracy within a point of the stock
    model's while some samples exit; DeeBERT's default when none does."""
    from workbench.earlyexit.record import DEFAULT_THRESHOLD

    good = [row["threshold"] for row in record.table()
            if row["loss"] <= 0.01 and row["mean_layers"] < record.num_layers]
    return max(good, default=DEFAULT_THRESHOLD)


def stock_of(sc, num_layers: int):
    """The scenario of the same model without exits: every ramp but the classifier off."""
    return sc.with_(disabled=tuple(range(num_layers - 1)))


def goodput_rows(plans: dict[int, object], stock: dict[int, object]) -> list[dict]:
    """Per batch size, the optimizer's goodput of E3's plan, of the best data-parallel copy of the whole
    early-exit model (the plan's unsplit alternative) and of the stock model (its unsplit plan without exits);
    0 where none meets the SLO."""
    def unsplit(plan) -> float:
        return plan.unsplit["goodput"] if plan.unsplit else 0.0

    return [{"batch": b, "e3": plans[b].goodput, "early_exit": unsplit(plans[b]), "stock": unsplit(stock[b])}
            for b in plans]


class _Cache(dict):
    """A dict that forgets everything when full (the page's keys are small; recomputing is cheap)."""

    def get_or(self, key, make):
        if key not in self:
            if len(self) >= CACHE:
                self.clear()
            self[key] = make()
        return self[key]


class EarlyExitPanel(Panel):
    """Controls -> batch profile, ``optimize_splits``, ``simulate_plan`` -> four figures; a button serves the plan
    for real on Ray Serve."""

    dashboard_page = "earlyexit.ipynb"

    def __init__(self, preset: str | None = None, *, task: str = "sentiment", slo_ms: float = 50.0,
                 batch_size: int = 16, gpus: dict[str, int] | None = None, mix: str = "80:20",
                 threshold: float | None = None, pattern: str = "poisson", rate: int = 2000):
        from workbench.data import TASKS
        from workbench.earlyexit.artifacts import MIXES
        from workbench.earlyexit.simulator import PATTERNS

        super().__init__()
        self.preset = preset or default_preset()
        self._syncing = False
        self._records, self._series, self._plans, self._sims = _Cache(), _Cache(), _Cache(), _Cache()
        self.plan = None
        self.profile = None          # the fractions the optimizer got (the forecast)
        self.series = None
        self.simulation = None
        self.goodput = []
        self.runs: dict[tuple, dict] = {}
        self.engine_calls = {"optimize": 0, "simulate": 0, "series": 0}
        gpus = {"v100": 4} if gpus is None else dict(gpus)
        label = {"description_width": "150px"}
        wide = widgets.Layout(width="440px")
        self.task = widgets.Dropdown(options=[(t.title, n) for n, t in TASKS.items()], value=task,
                                     description="Task", style=label, layout=wide)
        self.slo = widgets.FloatSlider(value=slo_ms, min=1, max=500, step=1, description=SLO, style=label,
                                       layout=wide, continuous_update=False, readout_format=".0f")
        self.batch = widgets.IntSlider(value=batch_size, min=1, max=SWEEP_BATCHES[-1], description="Input batch size",
                                       style=label, layout=wide, continuous_update=False)
        self.gpus = {g: widgets.BoundedIntText(value=int(gpus.get(g, 0)), min=0, max=MAX_GPUS, description=g.upper(),
                                               style={"description_width": "50px"},
                                               layout=widgets.Layout(width="120px"))
                     for g in GPU_TYPES}
        for g, box in self.gpus.items():
            box.add_class(f"wb-gpu-{g}")
        options = [(k, v) for k, v in MIXES.items()]
        if not any(abs(v - MIXES.get(mix, -1)) < 1e-9 for _, v in options):
            raise WorkbenchError(f"mix {mix!r} is not one of {', '.join(MIXES)}")
        self.mix = widgets.Dropdown(options=options, value=MIXES[mix], description="Easy:hard mix", style=label,
                                    layout=wide)
        self.threshold = widgets.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.01, readout_format=".2f",
                                             description="Exit threshold", style=label, layout=wide,
                                             continuous_update=False,
                                             tooltip="entropy (nats) below which a ramp's answer exits")
        self.pattern = widgets.Dropdown(options=list(PATTERNS), value=pattern, description="Arrivals", style=label,
                                        layout=wide)
        self.rate = widgets.IntSlider(value=rate, min=10, max=50_000, step=10, description="Rate (requests/s)",
                                      style=label, layout=wide, continuous_update=False)
        self.why = widgets.HTML(layout=widgets.Layout(width="420px"))
        self.sim_info = widgets.HTML()
        self.run_info = widgets.HTML()
        self.threshold_info = widgets.HTML()
        self.runner = BackgroundRun(self, "Run for real", self._run_for_real, self._show_measured)
        self.runs_note = widgets.HTML(
            f"<span class='wb-run-note' style='color:#555;font-size:90%'>Run for real plans E3 for {HOST_REPLICAS} "
            f"CPU replicas of this host (SLO {1e3 * HOST_SLO_S:.0f} ms, input batch {HOST_BATCH}, the task, mix, "
            f"threshold and arrival pattern above), serves {HOST_REQUESTS} requests on Ray Serve and draws the "
            f"measured batches over the simulator's prediction of that same run.</span>")
        self._task_threshold(task, threshold)
        self.observe_controls(self.task, self.slo, self.batch, self.mix, self.threshold, self.pattern, self.rate,
                              *self.gpus.values())
        gpu_row = widgets.HBox([widgets.HTML("<span style='width:150px;display:inline-block'>GPUs per type</span>"),
                                *self.gpus.values()])
        self.children = [
            widgets.HTML(INTRO),
            widgets.HBox([self.task, self.mix]),
            widgets.HBox([self.threshold, self.threshold_info]),
            widgets.HBox([self.slo, self.batch]),
            gpu_row,
            widgets.HBox([self.pattern, self.rate]),
            self.message,
            widgets.HBox([self.figure_slot("profile"), self.figure_slot("goodput")],
                         layout=widgets.Layout(width="100%")),
            widgets.HBox([self.figure_slot("plan"), self.why],
                         layout=widgets.Layout(width="100%", align_items="flex-start")),
            self.sim_info,
            self.runs_note,
            self.runner,
            self.run_info,
            self.figure_slot("bubbles"),
        ]
        for name in ("profile", "goodput", "plan"):
            self.figure_slot(name).layout.flex = "1 1 0%"
        self.refresh()

    # -- what the engine is asked

    def record(self, task: str | None = None):
        from workbench.earlyexit.artifacts import load_record

        task = task or self.task.value
        return self._records.get_or(task, lambda: load_record(task, self.preset))

    def _task_threshold(self, task: str, threshold: float | None) -> None:
        """The threshold slider's range is the task's entropy range (0 to ln classes); a new task starts at its
        own default threshold."""
        record = self.record(task)
        top = math.floor(100 * math.log(record.num_classes)) / 100
        value = default_threshold(record) if threshold is None else float(threshold)
        self._syncing = True
        try:
            self.threshold.max = top
            self.threshold.value = min(top, max(0.0, value))
        finally:
            self._syncing = False
        self._threshold_task = task

    def gpu_counts(self) -> dict[str, int]:
        """GPU type -> count, the types set to 0 left out."""
        return {g: int(box.value) for g, box in self.gpus.items() if box.value}

    def settings(self) -> dict:
        """The controls' values as the engine is asked with them."""
        return {"task": self.task.value, "easy": float(self.mix.value), "threshold": float(self.threshold.value),
                "slo_s": float(self.slo.value) / 1e3, "batch_size": int(self.batch.value), "gpus": self.gpu_counts(),
                "pattern": self.pattern.value, "rate": float(self.rate.value)}

    def series_for(self, task: str, easy: float, threshold: float):
        from workbench.earlyexit.artifacts import profile_series

        def make():
            self.engine_calls["series"] += 1
            return profile_series(self.record(task), easy, threshold, windows=SERIES_WINDOWS)

        return self._series.get_or((task, easy, threshold), make)

    def scenario(self, s: dict):
        """The engine's :class:`~workbench.earlyexit.scenario.Scenario` of these settings (it checks them: no
        GPUs, an SLO or batch out of range are said in the page)."""
        from workbench.earlyexit.scenario import Scenario

        return Scenario(model="encoder", task=s["task"], preset=self.preset, gpus=s["gpus"], slo_s=s["slo_s"],
                        batch_size=s["batch_size"], easy=s["easy"], threshold=s["threshold"])

    def plan_at(self, sc, profile: tuple[float, ...], batch_size: int, stock: bool = False):
        """E3's plan at ``batch_size`` for the forecast ``profile`` (``stock``: of the model without exits)."""
        from workbench.earlyexit.batchprofile import BatchProfile

        key = (sc.task, profile, tuple(sorted(sc.gpus.items())), sc.slo_s, batch_size, stock)

        def make():
            self.engine_calls["optimize"] += 1
            at = sc.with_(batch_size=batch_size)
            if stock:
                return stock_of(at, len(profile)).optimize(BatchProfile((1.0,) * (len(profile) - 1) + (0.0,)))
            return at.optimize(BatchProfile(profile))

        return self._plans.get_or(key, make)

    def simulate(self, sc, s: dict, plan, measured):
        """The simulator on ``plan``: the page's arrivals, exits drawn from the ``measured`` window."""
        key = (sc.task, s["easy"], s["threshold"], tuple(map(tuple, plan.splits)), tuple(plan.replicas),
               tuple(plan.gpu_types), tuple(plan.batch_sizes), s["slo_s"], s["pattern"], s["rate"])

        def make():
            self.engine_calls["simulate"] += 1
            return sc.simulate(plan, pattern=s["pattern"], rate=s["rate"], requests=SIM_REQUESTS, profile=measured)

        return self._sims.get_or(key, make)

    # -- updates

    def _refresh(self) -> None:
        if self._syncing:
            return
        if self.task.value != self._threshold_task:
            self._task_threshold(self.task.value, None)
        s = self.settings()
        record = self.record(s["task"])
        self.threshold_info.value = self._threshold_html(record, s["threshold"])
        self.series = series = self.series_for(s["task"], s["easy"], s["threshold"])
        self.profile = profile = tuple(series.forecast[-1].remaining)
        B = s["batch_size"]
        self.show_if_changed("profile", (s["task"], s["easy"], s["threshold"], B), lambda: profile_figure(series, B))
        try:
            sc = self.scenario(s)
        except WorkbenchError as exc:                       # no GPUs, say: in the message and in the figures
            self.plan, self.simulation, self.goodput = None, None, []
            self._nothing(("plan", "goodput", "bubbles"), str(exc))
            raise
        plans = {b: self.plan_at(sc, profile, b) for b in sorted(set(SWEEP_BATCHES) | {B})}
        stock = {b: self.plan_at(sc, profile, b, stock=True) for b in plans}
        self.goodput = goodput_rows(plans, stock)
        self.show_if_changed("goodput", (s["task"], profile, tuple(s["gpus"].items()), s["slo_s"], B),
                             lambda: goodput_figure(self.goodput, B, 1e3 * s["slo_s"]))
        self.plan = plan = plans[B]
        self.show_if_changed("plan", (id(plan),), lambda: plan_figure(plan, profile))
        self.why.value = self._why_html(plan)
        if not plan:
            self.simulation = None
            self._nothing(("bubbles",), f"no plan to simulate: {plan.reason}")
            self.why.value = self._why_html(plan)
            return
        self.simulation = self.simulate(sc, s, plan, series.measured[-1])
        self._show_bubbles()

    def _nothing(self, names, reason: str) -> None:
        self.why.value = self.sim_info.value = self.run_info.value = ""
        for name in names:
            self.show_if_changed(name, ("none", reason), lambda name=name: no_result_figure(name, reason))

    @staticmethod
    def _threshold_html(record, threshold: float) -> str:
        exits = record.exits(threshold)
        return (f"<span class='wb-threshold-info' style='font-size:90%;color:#555'>on the dev set: accuracy "
                f"{100 * record.accuracy(threshold):.1f}% (stock {100 * record.stock_accuracy():.1f}%), "
                f"{exits.mean() + 1:.2f} of {record.num_layers} layers on average</span>")

    @staticmethod
    def _why_html(plan) -> str:
        lines = plan.explain().splitlines()
        items = "".join(f"<li>{html.escape(line.strip())}</li>" for line in lines)
        return (f"<div class='wb-why' style='font-size:90%'><b>Why this split</b><ul style='margin:2px 0;"
                f"padding-left:18px'>{items}</ul></div>")

    def run_key(self, s: dict | None = None) -> tuple:
        """The settings a real run belongs to (its measurement shows while they are the page's)."""
        s = s or self.settings()
        return (s["task"], s["easy"], s["threshold"], s["slo_s"], s["batch_size"], tuple(s["gpus"].items()),
                s["pattern"], s["rate"])

    def _show_bubbles(self) -> None:
        """The simulated bubbles of the page's plan, or, when a real run of these settings exists, its measured
        bubbles over the simulator's prediction of that host run."""
        run = self.runs.get(self.run_key())
        sim, plan = self.simulation, self.plan
        self.sim_info.value = (
            f"<span class='wb-sim-info'>Simulated {len(sim.requests)} {self.pattern.value} requests at "
            f"{self.rate.value:,} per second: goodput {sim.goodput:,.0f} samples/s, p50 {1e3 * sim.p50_latency_s:.2f} "
            f"ms, p95 {1e3 * sim.p95_latency_s:.2f} ms, {100 * sim.drop_rate:.1f}% dropped, "
            f"{100 * sim.straggler_rate:.1f}% past the SLO.</span>")
        if run is None:
            self.run_info.value = ""
            bubbles = bubble_timeline(sim.timeline)
            title = (f"Pipeline bubbles per replica, simulated (first {1e3 * bubbles.end:.1f} ms of "
                     f"{1e3 * sim.duration_s:.0f} ms)<br><sub>{len(plan.splits)} split(s) on "
                     f"{sum(plan.replicas)} GPUs; {idle_text(bubbles)}</sub>")
            self.show_if_changed("bubbles", ("sim", id(sim)), lambda: bubbles_figure(bubbles, title=title))
            return
        real = run["run"]
        served, predicted, hp = real.served, real.simulated, real.plan
        end = max(span.end for span in served.timeline.spans + predicted.timeline.spans if span.kind == "compute")
        measured_b = bubble_timeline(served.timeline, end)
        predicted_b = bubble_timeline(predicted.timeline, end)
        title = (f"Pipeline bubbles on this host: {len(hp.splits)} split(s) on {sum(hp.replicas)} CPU replicas, "
                 f"measured on Ray Serve (hatched) vs simulated<br><sub>measured {idle_text(measured_b)}; "
                 f"simulated {idle_text(predicted_b)}</sub>")
        self.show_if_changed("bubbles", ("run", id(served)),
                             lambda: bubbles_figure(predicted_b, measured_b, title=title))
        lines = "".join(f"<li>{html.escape(line)}</li>" for line in real.lines())
        self.run_info.value = (f"<div class='wb-run-info'><b>Measured on this host</b> (plan: "
                               f"{html.escape(hp.explain().splitlines()[0])})<ul style='margin:2px 0'>{lines}</ul>"
                               "</div>")

    # -- the real run

    def _run_for_real(self, handle):
        """Worker thread: :func:`~workbench.earlyexit.realrun.real_run` for this task, mix, threshold and
        arrival pattern on CPU replicas of this host (its own plan, SLO and batch: see ``runs_note``)."""
        from workbench.earlyexit.realrun import real_run

        s = self.settings()
        handle.progress(0, HOST_REQUESTS)
        run = real_run(task=s["task"], preset=self.preset, replicas=HOST_REPLICAS, slo_s=HOST_SLO_S,
                       batch_size=HOST_BATCH, easy=s["easy"], threshold=s["threshold"], pattern=s["pattern"],
                       requests=HOST_REQUESTS, progress=handle.progress)
        return None if handle.should_stop() else {"key": self.run_key(s), "run": run}

    def _show_measured(self, outcome: dict | None, cancelled: bool) -> None:
        """Kernel loop: keep the run with its settings; draw it if they are still the page's."""
        if outcome is None:
            self.run_info.value = "<span class='wb-run-info'>cancelled: the run's result was dropped</span>"
            return
        self.runs[outcome["key"]] = outcome
        if self.run_key() == outcome["key"] and self.plan:
            self._show_bubbles()
        else:
            self.run_info.value = ("<span class='wb-run-info'>the settings changed during the run; its measurement "
                                   "shows when they are set back</span>")
