"""The early-exit serving (E3) dashboard: task, SLO, batch per replica, GPUs per type, easy:hard mix, exit threshold,
arrival pattern and rate -> the batch size left after every ramp (measured window by window, and the ARIMA
forecast E3 plans with), E3's split plan and why, the simulated pipeline bubbles per replica, and goodput of E3,
the early-exit model as it is and the stock model against the batch size. The optimizer and the simulator
redraw as the controls move; "Run for real" serves a small copy of the plan on Ray Serve on this host in the
background (its own plan for CPU replicas; it uses the task, mix, threshold and arrivals only) and draws its
measured bubbles over the simulator's prediction of that same run, in a slot of its own."""
from __future__ import annotations

import html
import math

import ipywidgets as widgets

from workbench.devices import profile_names
from workbench.earlyexit.scenario import (SIM_MAX_REQUESTS, StudySettings, default_threshold, exit_share,
                                          goodput_rows, stock_of)
from workbench.errors import WorkbenchError
from workbench.presets import default_preset
from workbench.ui.base import BackgroundRun, KeptRuns, Memo, Panel, RunOutcome
from workbench.viz.earlyexit import (bubble_timeline, bubbles_figure, goodput_figure, idle_text, no_plan_text,
                                     no_result_figure, plan_figure, profile_figure)

GPU_TYPES = tuple(profile_names("e3", host=False))
"""E3's GPU types; their layer times come from published BERT batch curves (workbench.earlyexit.gpu_curves)."""
MAX_GPUS = 32
RUNS_KEPT = 8
SWEEP_BATCHES = (1, 2, 4, 8, 16, 32, 64)
"""The batches per replica of the goodput figure (and the batch slider's range)."""
SERIES_WINDOWS = 6
"""Windows of the drifting mix behind the forecast: ARIMA(1, 1, 0) needs five past windows, so the last
window's forecast is the model's; each window more costs ARIMA fits (about 0.3 s here)."""
FEW_EXITS = 0.25
"""Below this share of samples leaving before the last layer, the page says E3's gain is pipelining, not exits."""
FIGURE_TITLES = {"plan": "E3's split plan", "goodput": "Goodput against the batch per replica",
                 "bubbles": "Pipeline bubbles per replica, simulated"}
"""What an empty slot is titled (a figure names itself once it has something to draw)."""
HOST_REPLICAS = 4
HOST_REQUESTS = 48
HOST_SLO_S = 1.0
HOST_BATCH = 4
DRIFT_REQUESTS = 96
DRIFT_WINDOW_S = 2.0
DRIFT_WINDOWS = 4
"""A drifting run: this many requests over this many windows of that many seconds (12 requests/s, well within
what the CPU plan sustains), the second half of the other mix; the forecast is made after every window."""
"""A real run: E3's plan for this many CPU replicas of this host (their layer times measured here), serving
this many requests of the page's mix and arrival pattern at 80% of that plan's goodput, within this SLO, at
this batch per replica (the page's GPU SLO and batch sizes are far below what one CPU core takes)."""
CACHE = 128
SLO = "SLO (ms)"

INTRO = """
<h2 class="wb-title">Early-exit serving (E3)</h2>
<p class="wb-lead">An early-exit model lets confident samples leave at a ramp after any layer, so a
batch <b>shrinks</b> as it runs and the GPU idles. <b>E3</b> cuts the model where the batch has shrunk and gives
the early splits more <b>replicas</b>, so that every split runs full batches; the splits form a pipeline over
(possibly mixed) GPUs. The batch profile comes from the trained ramps' real outputs on the task's dev set,
drawn as an easy:hard mix that drifts window by window; E3 plans with its ARIMA forecast. GPU layer times are
read off published BERT batch curves (derived for the P100, K80 and A6000); <b>Run for real</b> serves the plan's splits on Ray Serve with CPU
replicas on this host.</p>
"""


class EarlyExitOverview(Panel):
    """E3's part of the overview page: the page's own plan and simulated bubbles at its default settings (the
    sentiment task, four V100s, the default SLO, mix and arrivals), drawn by the same engine calls."""

    def __init__(self, preset: str | None = None):
        super().__init__()
        self.preset = preset or default_preset()
        self.children = [self.message, self.figure_slot("plan"), self.figure_slot("bubbles")]
        self.refresh()

    def _refresh(self) -> None:
        page = EarlyExitPanel(self.preset)
        self.plan = page.plan
        for name in ("plan", "bubbles"):
            self.show_figure(name, page.figures[name])


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
        self._records, self._series, self._plans, self._sims = Memo(CACHE), Memo(CACHE), Memo(CACHE), Memo(CACHE)
        self.plan = None
        self.profile = None          # the fractions the optimizer got (the forecast)
        self.series = None
        self.simulation = None
        self.goodput = []
        self.runs: KeptRuns = KeptRuns(RUNS_KEPT)    # run_key -> the real run of those settings
        self.drift_run = None                      # the last drifting run (realrun.DriftRun)
        self.drift_replan = None                   # None: the scenario's optimizer re-plans (a hook for studies)
        self.exit_share = 0.0                      # of the forecast: samples that leave before the last layer
        gpus = {"v100": 4} if gpus is None else dict(gpus)
        label = {"description_width": "150px"}
        wide = widgets.Layout(width="440px")
        self.task = widgets.Dropdown(options=[(t.title, n) for n, t in TASKS.items()], value=task,
                                     description="Task", style=label, layout=widgets.Layout(width="520px"))
        self.slo = widgets.FloatSlider(value=slo_ms, min=1, max=500, step=1, description=SLO, style=label,
                                       layout=wide, continuous_update=False, readout_format=".0f")
        self.batch = widgets.IntSlider(value=batch_size, min=1, max=SWEEP_BATCHES[-1], description="Batch per replica",
                                       style=label, layout=wide, continuous_update=False)
        self.gpus = {g: widgets.IntText(value=int(gpus.get(g, 0)), description=g.upper(),   # not clamped: said
                                        style={"description_width": "50px"}, layout=widgets.Layout(width="120px"))
                     for g in GPU_TYPES}
        for g, box in self.gpus.items():
            box.add_class(f"wb-gpu-{g}")
        options = [(k, v) for k, v in MIXES.items()]
        if not any(abs(v - MIXES.get(mix, -1)) < 1e-9 for _, v in options):
            raise WorkbenchError(f"mix {mix!r} is not one of {', '.join(MIXES)}")
        self.mix = widgets.Dropdown(options=options, value=MIXES[mix], description="Easy:hard mix", style=label,
                                    layout=wide)
        self.threshold = widgets.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.01, readout_format=".2f",
                                             description="Exit threshold (nats)", style=label, layout=wide,
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
        self.exits_note = widgets.HTML()
        self.run_stage = widgets.HTML()
        self.runner = BackgroundRun(self, "Run for real", self._run_for_real, self._show_measured)
        self.drifter = BackgroundRun(self, "Serve a drifting mix", self._run_drift, self._show_drift)
        self.drift_info = widgets.HTML()
        self.drift_note = widgets.HTML(
            f"<span class='wb-note wb-run-note'>Serve a drifting mix: the same CPU plan "
            f"serves {DRIFT_REQUESTS} requests over {DRIFT_WINDOWS * DRIFT_WINDOW_S:g} s whose mix switches halfway from "
            f"the one above to its opposite; every "
            f"{DRIFT_WINDOW_S:g} s the served exits update E3's ARIMA forecast, and when the forecast moves the plan, "
            "the optimizer runs and the application is redeployed in place. Each re-plan is listed below.</span>")
        self.runs_note = widgets.HTML(
            f"<span class='wb-note wb-run-note'>Run for real uses only the task, mix, "
            f"threshold and arrival pattern above: it makes <b>its own E3 plan for {HOST_REPLICAS} CPU replicas of "
            f"this host</b> (SLO {1e3 * HOST_SLO_S:.0f} ms, batch {HOST_BATCH} per replica, 80% of that plan's goodput; "
            f"the GPU plan, SLO, batch and rate above are far below what a CPU core takes), serves {HOST_REQUESTS} "
            f"requests on Ray Serve and draws the measured batches over the simulator's prediction of that same "
            f"run, below.</span>")
        self._task_threshold(task, threshold)
        self.observe_controls(self.task, self.slo, self.batch, self.mix, self.threshold, self.pattern, self.rate,
                              *self.gpus.values())
        gpu_row = widgets.HBox([widgets.HTML("GPUs per type", layout=widgets.Layout(width="150px")),
                                *self.gpus.values()])
        # the real run's figure is in the page only while a run of these settings exists
        self.hostrun_box = widgets.Box([], layout=widgets.Layout(width="100%"))
        self.children = [
            widgets.HTML(INTRO),
            widgets.HBox([self.task, self.mix]),
            widgets.HBox([self.threshold, self.threshold_info]),
            self.exits_note,
            widgets.HBox([self.slo, self.batch]),
            gpu_row,
            widgets.HBox([self.pattern, self.rate]),
            self.message,
            widgets.HBox([self.figure_slot("profile"), self.figure_slot("goodput")],
                         layout=widgets.Layout(width="100%")),
            widgets.HBox([self.figure_slot("plan"), self.why],
                         layout=widgets.Layout(width="100%", align_items="flex-start")),
            self.sim_info,
            self.figure_slot("bubbles"),
            self.runs_note,
            self.runner,
            self.run_stage,
            self.run_info,
            self.hostrun_box,
            self.drift_note,
            self.drifter,
            self.drift_info,
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

    def settings(self) -> StudySettings:
        """The controls' values as the engine is asked with them."""
        return StudySettings(task=self.task.value, easy=float(self.mix.value), threshold=float(self.threshold.value),
                             slo_s=float(self.slo.value) / 1e3, batch_size=int(self.batch.value),
                             gpus=tuple(self.gpu_counts().items()), pattern=self.pattern.value,
                             rate=float(self.rate.value))

    def series_for(self, task: str, easy: float, threshold: float):
        from workbench.earlyexit.artifacts import profile_series

        def make():
            return profile_series(self.record(task), easy, threshold, windows=SERIES_WINDOWS)

        return self._series.get_or((task, easy, threshold), make)

    def scenario(self, s: StudySettings):
        """The engine's :class:`~workbench.earlyexit.scenario.Scenario` of these settings (it checks them: no
        GPUs, an SLO or batch out of range are said in the page)."""
        for g, n in s.gpus:
            if not 0 <= n <= MAX_GPUS:
                raise WorkbenchError(f"the count of {g.upper()} GPUs on this page is a whole number in 0..{MAX_GPUS}, "
                                     f"got {n} (`workbench earlyexit plan --gpus` plans with up to 64 of a type)")
        return s.scenario(self.preset)

    def plan_at(self, sc, profile: tuple[float, ...], batch_size: int, stock: bool = False):
        """E3's plan at ``batch_size`` for the forecast ``profile`` (``stock``: of the model without exits)."""
        from workbench.earlyexit.batchprofile import BatchProfile

        key = (sc.task, profile, tuple(sorted(sc.gpus.items())), sc.slo_s, batch_size, stock)

        def make():
            at = sc.with_(batch_size=batch_size)
            if stock:
                return stock_of(at).optimize(BatchProfile((1.0,) * (len(profile) - 1) + (0.0,)))
            return at.optimize(BatchProfile(profile))

        return self._plans.get_or(key, make)

    def simulate(self, sc, s: StudySettings, plan, measured):
        """The simulator on ``plan``: the page's arrivals (``s.sim_requests()`` of them), exits drawn from the
        ``measured`` window."""
        key = (sc.task, s.easy, s.threshold, tuple(map(tuple, plan.splits)), tuple(plan.replicas),
               tuple(plan.gpu_types), tuple(plan.batch_sizes), s.slo_s, s.pattern, s.rate)

        def make():
            return sc.simulate(plan, pattern=s.pattern, rate=s.rate, requests=s.sim_requests(),
                               profile=measured)

        return self._sims.get_or(key, make)

    # -- updates

    def _refresh(self) -> None:
        if self._syncing:
            return
        if self.task.value != self._threshold_task:
            self._task_threshold(self.task.value, None)
        s = self.settings()
        record = self.record(s.task)
        self.threshold_info.value = self._threshold_html(record, s.threshold)
        self.series = series = self.series_for(s.task, s.easy, s.threshold)
        self.profile = profile = tuple(series.forecast[-1].remaining)
        self.exit_share = exit_share(profile)
        self.exits_note.value = self._exits_html(self.exit_share)
        B = s.batch_size
        self.show_if_changed("profile", (s.task, s.easy, s.threshold, B), lambda: profile_figure(series, B))
        try:
            sc = self.scenario(s)
        except WorkbenchError as exc:                       # no GPUs, say: in the message and in the figures
            self.plan, self.simulation, self.goodput = None, None, []
            self._nothing(("plan", "goodput", "bubbles"), str(exc))
            self._show_host_run()
            raise
        self.plan = plan = self.plan_at(sc, profile, B)
        self.show_if_changed("plan", (id(plan),), lambda: plan_figure(plan, profile))
        self.why.value = self._why_html(plan, profile)
        self._show_host_run()
        self.defer(self._refresh_goodput_and_bubbles, "goodput", "bubbles")

    def _refresh_goodput_and_bubbles(self) -> None:
        """The secondary part of a change: E3 against the stock model over every batch size, and the simulated
        bubbles of the plan (the costliest part at many GPUs and high rates)."""
        s, series, profile = self.settings(), self.series, self.profile     # as the refresh that deferred this set them
        B = s.batch_size
        try:
            sc = self.scenario(s)
        except WorkbenchError:                              # said by the refresh that deferred this
            return
        plans = {b: self.plan_at(sc, profile, b) for b in sorted(set(SWEEP_BATCHES) | {B})}
        stock = {b: self.plan_at(sc, profile, b, stock=True) for b in plans}
        self.goodput = goodput_rows(plans, stock)
        self.show_if_changed("goodput", (s.task, profile, s.gpus, s.slo_s, B),
                             lambda: goodput_figure(self.goodput, B, 1e3 * s.slo_s))
        plan = plans[B]
        if not plan:
            self.simulation = None
            self._nothing(("bubbles",), f"Nothing to simulate. {no_plan_text(plan.reason)}", keep_why=True)
            return
        self.simulation = self.simulate(sc, s, plan, series.measured[-1])
        self._show_bubbles()

    def _nothing(self, names, reason: str, keep_why: bool = False) -> None:
        if not keep_why:
            self.why.value = ""
        self.sim_info.value = ""
        for name in names:
            wide = name == "bubbles"
            self.show_if_changed(name, ("none", reason), lambda name=name, wide=wide: no_result_figure(
                FIGURE_TITLES[name], reason, width=110 if wide else 58))

    @staticmethod
    def _threshold_html(record, threshold: float) -> str:
        exits = record.exits(threshold)
        early = float((exits < record.num_layers - 1).mean())
        return (f"<span class='wb-note wb-threshold-info'>a ramp's answer exits when its "
                f"entropy is below {threshold:.2f} nats; on the dev set: accuracy "
                f"{100 * record.accuracy(threshold):.1f}% (stock {100 * record.stock_accuracy():.1f}%), "
                f"{100 * early:.0f}% leave early, {exits.mean() + 1:.2f} of {record.num_layers} layers on average"
                "</span>")

    def _exits_html(self, share: float) -> str:
        """The few-exits line: shown while fewer than :data:`FEW_EXITS` of the samples leave early."""
        if share >= FEW_EXITS:
            return ""
        who = "no sample leaves" if share < 0.0005 else f"{100 * share:.1f} % of samples leave"
        return (f"<div class='wb-notice wb-few-exits'>At this threshold "
                f"({self.threshold.value:.2f} nats) {who} before the last layer (the forecast E3 plans with): "
                f"E3's gain over the early-exit model here comes from pipelining the layers over GPUs, not from "
                f"exits. Raise the threshold, or use an easier mix, to see exits shrink the batch.</div>")

    @staticmethod
    def _why_html(plan, profile) -> str:
        """The plan and why, in the page's words: one-based splits, numbers with separators, the worst case
        named as the optimizer's model, cuts where the batch has not shrunk said as such; an empty plan's
        reason without the duplicate "no plan" and without slack advice (:func:`no_plan_text`)."""
        if not plan:
            items = [no_plan_text(plan.reason)]
        else:
            items = [f"{len(plan.splits)} split{'s' if len(plan.splits) > 1 else ''}, goodput {plan.goodput:,.0f} "
                     f"samples/s, cycle {1e3 * plan.cycle_s:.3g} ms; modelled worst-case latency "
                     f"{1e3 * plan.latency_s:.3g} ms of the {1e3 * plan.budget_s:.3g} ms budget (SLO less slack; "
                     "the optimizer's model, without queueing or batching waits)"]
            for row in plan.rows():
                items.append(f"split {row['split']}: {row['layers']} on {row['replicas']} × {row['gpu_type']}, "
                             f"{row['batches_per_cycle']:.3g} batch(es) of {row['batch']} a cycle, "
                             f"{row['stage_ms']:.3g} ms each"
                             + (f" (after a {row['transfer_in_ms']:.3g} ms transfer)" if row["split"] > 1 else ""))
            items.append(f"binding: {plan.binding}")
            cuts = [start for start, _ in plan.splits[1:]]
            if cuts:
                left = [profile[c - 1] for c in cuts]
                where = ", ".join(f"after layer {c - 1} ({100 * f:.3g}% left)" for c, f in zip(cuts, left))
                if min(left) >= 0.995:
                    items.append(f"cut {where}: the batch has not shrunk there, so the cuts pipeline the layers "
                                 "over GPUs rather than follow exits")
                else:
                    items.append(f"cut {where}: the survivors of {plan.input_batches} input batch(es) merge into "
                                 "full batches, so every replica runs the same batch")
            else:
                items.append("no cut: the whole model on one GPU type beats every split within the SLO")
            base = plan.baseline
            if base:
                on = ", ".join(f"{n} × {g}" for g, n in base.replicas.items())
                items.append(f"{plan.goodput / base.goodput:.2f}x the goodput of the early-exit model as is, data "
                             f"parallel on {on} at the same batch ({base.goodput:,.0f} samples/s)")
            else:
                items.append("the early-exit model as is, data parallel on these GPUs, meets no SLO")
        body = "".join(f"<li>{html.escape(item)}</li>" for item in items)
        head = "Why this split" if plan else "No split plan"
        return f"<div class='wb-why'><b>{head}</b><ul class='wb-list'>{body}</ul></div>"

    def run_key(self, s: StudySettings | None = None) -> tuple:
        """The settings a real run uses, and so belongs to: task, mix, threshold and arrival pattern (it makes
        its own plan for CPU replicas of this host, with its own SLO, batch and rate)."""
        s = s or self.settings()
        return (s.task, s.easy, s.threshold, s.pattern)

    def _show_bubbles(self) -> None:
        """The simulated bubbles of the page's plan, with the offered rate against what the plan sustains."""
        sim, plan, s = self.simulation, self.plan, self.settings()
        n = len(sim.requests)
        arrivals = [r.arrival_s for r in sim.requests]
        last = max(arrivals, default=0.0)
        drawn = n / last if last > 0 else float(s.rate)
        share = s.rate / plan.goodput if plan.goodput else math.inf
        capped = " (capped to keep a redraw short)" if n == SIM_MAX_REQUESTS else ""
        offered = (f"offered {s.rate:,.0f}/s = {100 * share:,.0f}% of what the plan sustains "
                   f"({plan.goodput:,.0f}/s)")
        drew = (f"; this draw's arrivals average {drawn:,.0f}/s over {last:.2f} s"
                if abs(drawn - s.rate) > 0.1 * s.rate else "")
        if s.pattern == "bursty":
            from workbench.earlyexit.simulator import ArrivalProcess

            bursts = ArrivalProcess("bursty", s.rate, count=1)
            cycle = bursts.burst_s * bursts.burst_factor
            drew += (f" ({last / cycle:.1f} on/off cycles of {cycle:g} s on average"
                     + ("; too few to average out the bursts" if last < 3 * cycle else "") + ")")
        self.sim_info.value = (
            f"<span class='wb-sim-info'>Simulated {n:,} {self.pattern.value} requests{capped} at "
            f"{self.rate.value:,} per second, {offered}{drew}: goodput {sim.goodput:,.0f} samples/s, p50 "
            f"{1e3 * sim.p50_latency_s:.2f} ms, p95 {1e3 * sim.p95_latency_s:.2f} ms (with queueing and batching "
            f"waits; the plan's modelled worst case without them is {1e3 * plan.latency_s:.2f} ms), "
            f"{100 * sim.drop_rate:.1f}% dropped, {100 * sim.straggler_rate:.1f}% past the SLO.</span>")
        bubbles = bubble_timeline(sim.timeline, last_arrival_s=last)
        title = (f"Pipeline bubbles per replica, simulated: {offered}<br><sub>{len(plan.splits)} split(s) on "
                 f"{sum(plan.replicas)} GPUs, {n:,} {self.pattern.value} requests over {1e3 * sim.duration_s:,.0f} "
                 f"ms, the first {1e3 * bubbles.end:.1f} ms drawn; {idle_text(bubbles)}; the time after the last "
                 "arrival is the drain</sub>")
        self.show_if_changed("bubbles", ("sim", id(sim)), lambda: bubbles_figure(bubbles, title=title))

    def _show_host_run(self) -> None:
        """The real run of this task, mix, threshold and pattern in its own slot (its measured bubbles over the
        simulator's prediction of that host run); hidden, with a line saying why, when there is none."""
        slot = self.figure_slot("hostrun")
        run = self.runs.get(self.run_key())
        if run is None:
            self.hostrun_box.children = ()
            self.run_info.value = ("" if not self.runs else
                                   "<span class='wb-run-info'>The real run(s) so far used another task, mix, "
                                   "threshold or arrival pattern; a run shows here while those are the page's "
                                   "(or run again).</span>")
            return
        real = run.result
        served, predicted, hp = real.served, real.simulated, real.plan
        end = max(span.end for span in served.timeline.spans + predicted.timeline.spans if span.kind == "compute")
        last = max((r.arrival_s for r in predicted.requests), default=None)
        measured_b = bubble_timeline(served.timeline, end, last_arrival_s=last)
        predicted_b = bubble_timeline(predicted.timeline, end, last_arrival_s=last)
        title = (f"Real run on this host: its own plan, {len(hp.splits)} split(s) on {sum(hp.replicas)} CPU "
                 f"replicas<br><sub>measured on Ray Serve (hatched) vs simulated: measured {idle_text(measured_b)};"
                 f"<br>simulated {idle_text(predicted_b)}</sub>")
        self.show_if_changed("hostrun", ("run", id(served)),
                             lambda: bubbles_figure(predicted_b, measured_b, title=title))
        self.hostrun_box.children = (slot,)
        lines = "".join(f"<li>{html.escape(line)}</li>" for line in real.lines())
        self.run_info.value = (f"<div class='wb-run-info'><b>Measured on this host</b> (its own CPU plan, not the "
                               f"GPU plan above: {html.escape(hp.explain().splitlines()[0])})"
                               f"<ul class='wb-list'>{lines}</ul></div>")

    # -- the real run

    def _run_for_real(self, handle) -> RunOutcome | None:
        """Worker thread: :func:`~workbench.earlyexit.realrun.real_run` for this task, mix, threshold and
        arrival pattern on CPU replicas of this host (its own plan, SLO and batch: see ``runs_note``). Its
        stages show beside the button: planning, starting Ray and deploying (no callback comes then), then
        serving k of N as requests are answered."""
        from workbench.earlyexit.realrun import real_run

        s = self.settings()
        self._stage(handle, f"planning for {HOST_REPLICAS} CPU replicas, starting Ray and deploying the splits "
                            "(about 20-40 s) ...")

        def progress(done: int, total: int) -> None:
            handle.progress(done, total)
            self._stage(handle, f"serving: {done} of {total} requests answered")

        try:
            run = real_run(task=s.task, preset=self.preset, replicas=HOST_REPLICAS, slo_s=HOST_SLO_S,
                           batch_size=HOST_BATCH, easy=s.easy, threshold=s.threshold, pattern=s.pattern,
                           requests=HOST_REQUESTS, progress=progress)
        finally:
            self._stage(handle, "")
        return None if handle.should_stop() else RunOutcome(self.run_key(s), run)

    def _run_drift(self, handle):
        """Worker thread: :func:`~workbench.earlyexit.realrun.drift_run`, the page's mix then its opposite."""
        from workbench.earlyexit.realrun import drift_run

        s = self.settings()
        return drift_run(task=s.task, preset=self.preset, replicas=HOST_REPLICAS, slo_s=HOST_SLO_S,
                         batch_size=HOST_BATCH, easy=s.easy, drift_to=round(1.0 - s.easy, 2),
                         threshold=s.threshold, requests=DRIFT_REQUESTS, window_s=DRIFT_WINDOW_S,
                         rate=DRIFT_REQUESTS / (DRIFT_WINDOWS * DRIFT_WINDOW_S),
                         replan=self.drift_replan, progress=handle.progress)

    def _show_drift(self, run, cancelled: bool) -> None:
        """Kernel loop: the drifting run's windows and re-plans."""
        if run is None:
            self.drift_info.value = "<span class='wb-drift-info'>cancelled: the run's result was dropped</span>"
            return
        self.drift_run = run
        lines = "".join(f"<li>{html.escape(line)}</li>" for line in run.lines())
        self.drift_info.value = (f"<div class='wb-drift-info'><b>Re-planned online on this host</b> "
                                 f"({len(run.served.replans)} re-plan(s))<ul class='wb-list'>{lines}</ul></div>")

    def _stage(self, handle, text: str) -> None:
        """Say the real run's stage beside its button (posted to the kernel's loop from the worker thread)."""
        value = f"<span class='wb-note wb-run-stage'>{html.escape(text)}</span>" if text else ""

        def show() -> None:
            self.run_stage.value = value
        handle.on_page(show)

    def _show_measured(self, outcome: RunOutcome | None, cancelled: bool) -> None:
        """Kernel loop: keep the run under the settings it used; draw it while they are the page's."""
        if outcome is None:
            self.run_info.value = "<span class='wb-run-info'>cancelled: the run's result was dropped</span>"
            return
        self.runs.keep(outcome)
        self._show_host_run()
        if self.run_key() != outcome.key:
            self.run_info.value = ("<span class='wb-run-info'>The task, mix, threshold or arrival pattern changed "
                                   "during the run; its measurement shows when they are set back.</span>")
