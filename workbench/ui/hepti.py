"""The Hepti dashboard: heterogeneous edge devices in an editable table (speed, memory, link, and the free memory
each may fall to mid-run), a deadline, a mode and a share rule -> Hepti's partition (:func:`hepti_partition`)
decided layer by layer as the ranks decide it (the settings are a :class:`~workbench.hepti.scenario.Scenario`;
its engine calls live there, the panel remembers their answers) -> four figures:
the shares and mode of every layer with the reasons and the binding constraint beside them, the latency per
device (compute, waiting, communication) against the deadline, Hepti's MILP against even and proportional shares
and each mode forced, and the per-layer timeline with Hepti's decisions marked. "Run for real" runs it on one
worker process per device in the background (memory falls and an optional killed device included) and overlays
the measured timeline with its mode switches, re-partitions and fault marked."""
from __future__ import annotations

import html
import math
from dataclasses import replace

import ipywidgets as widgets

from workbench.devices import DeviceProfile, get_cluster
from workbench.errors import WorkbenchError
from workbench.distributed import limits
from workbench.models.shapes import SHAPES, get_shape
from workbench.hepti import scenario
from workbench.hepti.plan import MODE_TITLES, DeadlineMissed, Partition, hepti_partition, memory_bytes
from workbench.hepti.run import shape_of
from workbench.hepti.scenario import COMPARE, LayerDecision, Scenario
from workbench.distributed.steps import steps_timeline
from workbench.presets import default_preset
from workbench.ui.base import (BackgroundRun, DeviceRowWidgets, KeptRuns, Memo, Panel, RunOutcome, html_table,
                               table_row)
from workbench.viz.hepti import (breakdown_figure, compare_figure, decision_figure, drawn_note, measured_marks,
                                 measured_shift, no_plan_figure, predicted_marks, predicted_s, timeline_figure,
                                 timeline_note, verdict)

CLUSTER = "hepti"
"""The default devices: Hepti's four unequal boards (the first the primary)."""
MAX_ROWS = 32
"""The Devices slider's top: 2D-tiled WS starts at 16 devices."""
DEADLINE = "Deadline (ms)"
DEADLINE_RANGE = (10, 30_000, 10)
"""The deadline slider (ms): BERT-Large at 512 positions on one board takes about 28 s."""
MODE_CHOICES = {"auto": "Hepti decides (by memory)", **{m: f"{t} forced" for m, t in MODE_TITLES.items()}}
SHARE_CHOICES = {"hepti": "Hepti's MILP", "even": "even", "proportional": "in proportion to speed"}
ENCODERS = tuple(n for n, s in SHAPES.items() if s.kind == "encoder")
CACHE = 512
RUNS_KEPT = 8
NEVER = -1

INTRO = """
<h2 class="wb-title">Heterogeneous partitioning (Hepti)</h2>
<p class="wb-lead">One encoder split over <b>unequal</b> edge devices (the first is the primary). Hepti
keeps weights where they are (<b>weight-stationary</b>, WS: every secondary holds the output projection and the
MLP whole); when a secondary cannot hold that it tiles the weights (<b>1D-tiled</b> below 16 devices,
<b>2D-tiled</b> from 16), and with no secondary it runs <b>serial</b>. Each device's <b>share</b> of the split
comes from a linear program (min-max latency under the memory bounds). At every layer's start the devices report
their free memory; when a device can no longer hold its share Hepti re-decides. The figures come from the cost
model at once; <b>Run for real</b> runs it on one worker process per device (emulating their speed and links).</p>
"""

TABLE_NOTE = ("<span class='wb-note wb-table-note'>Each device's speed, free memory and "
              "link; <i>falls to</i> lowers its free memory from the chosen layer on (what the device reports "
              "mid-run). Memory 0 drops a secondary.</span>")


class HeptiRowWidgets(DeviceRowWidgets):
    """One editable row of the device table: speed (GFLOP/s), free memory (GB), link (Mbit/s), and the free
    memory (MB) it falls to from a layer on ("never" by default). Values are checked when devices are built."""

    CELL_WIDTH = "100px"
    LABEL_WIDTH = "150px"
    COLUMNS = (*DeviceRowWidgets.COLUMNS, "falls to (MB)", "from")

    def __init__(self, index: int, base: DeviceProfile, name: str, layers: int):
        self.base, self.name = base, name
        box = widgets.Layout(width=self.CELL_WIDTH)
        self.fall_mb = widgets.FloatText(value=20.0, layout=box)
        self.fall_at = widgets.Dropdown(options=layer_options(layers), value=NEVER, layout=box)
        super().__init__(index, f"<span class='wb-dev-name'>{index} · {html.escape(name)}</span>",
                         round(base.flops_per_s / 1e9, 3), base.memory_bytes / 1e9, base.net_bytes_per_s * 8 / 1e6,
                         extra=(("fall-mb", self.fall_mb), ("fall-at", self.fall_at)))

    def device(self) -> DeviceProfile:
        """The row's device: its preset with the row's speed, memory and link (each checked; the message names
        the row and the range)."""
        i = self.index
        return replace(self.base, name=self.name,
                       flops_per_s=limits.speed_gflops.check(f"device {i}'s speed", float(self.speed.value)) * 1e9,
                       memory_bytes=limits.free_memory_gb.check(f"device {i}'s memory", float(self.memory.value)) * 1e9,
                       net_bytes_per_s=limits.bandwidth_mbit.check(f"device {i}'s bandwidth",
                                                                   float(self.bandwidth.value)) * 1e6 / 8)

    def fall(self) -> tuple[str, int, float] | None:
        """(name, layer, bytes) when the row's free memory falls mid-run, else None."""
        if self.fall_at.value == NEVER:
            return None
        mb = limits.fall_mb.check(f"device {self.index}'s free memory after the fall", float(self.fall_mb.value))
        return (self.name, int(self.fall_at.value), mb * 1e6)


def layer_options(layers: int) -> list[tuple[str, int]]:
    """"never", then the layers a fall or a kill may come at (layer 0 is the first decision itself)."""
    return [("never", NEVER)] + [(f"layer {n}", n) for n in range(1, layers)]


class HeptiOverview(Panel):
    """Hepti's part of the overview page: the mode and shares its MILP picks for the four boards (the encoder at
    T = 128) as the secondaries' free memory falls: weight-stationary while they hold their slices, tiled below."""

    def __init__(self, preset: str | None = None):
        super().__init__()
        self.preset = preset or default_preset()
        self.free = widgets.SelectionSlider(options=[4000, 1000, 100, 40, 30, 20, 10], value=4000,
                                            description="Free MB", continuous_update=False,
                                            layout=widgets.Layout(width="420px"))
        self.observe_controls(self.free)
        self.children = [self.free, self.message, self.figure_slot("decision")]
        self.refresh()

    def _refresh(self) -> None:
        mb, shape, N, L = int(self.free.value), SHAPES["encoder"], 128, 6
        devices = [d if i == 0 else replace(d, memory_bytes=min(d.memory_bytes, mb * 1e6))
                   for i, d in enumerate(get_cluster("hepti").devices)]
        self.partition = p = hepti_partition(devices, shape_of(shape, N), num_layers=L)
        layers = [LayerDecision(p, "first" if n == 0 else "") for n in range(L)]
        self.show_figure("decision", decision_figure(
            layers, shape.name, N, title=f"Hepti picks {MODE_TITLES[p.mode]} with {mb:,} MB free on each "
                                         f"secondary<br><sub>{shape.name}, T = {N}, {len(devices)} boards: shares "
                                         f"per device, predicted {1e3 * p.predicted_latency_s:.1f} ms</sub>"))


class HeptiPanel(Panel):
    """Controls -> Hepti's decision per layer -> four figures; a button runs it on real worker processes."""

    dashboard_page = "hepti.ipynb"

    def __init__(self, preset: str | None = None, *, devices: int = 4, model: str = "encoder", seq_len: int = 128,
                 deadline_ms: int | None = 200, mode: str = "auto", shares: str = "hepti"):
        super().__init__()
        self.preset = preset or default_preset()
        self._syncing = False
        self._cache = Memo(CACHE)               # engine inputs -> its result, or its refusal
        self._rows: list[HeptiRowWidgets] = []
        self.settings: Scenario | None = None
        self.layers: list[LayerDecision] | None = None
        self.predicted = None                  # the predicted Timeline of ``layers``
        self._compare_for = None               # the settings the last change compares
        self._quote_for = None                 # settings whose missed deadline awaits its best reachable latency
        self._quoted: WorkbenchError | None = None    # ... and that deadline's error with the quote
        self.compared: dict[str, Partition | str] = {}
        self.runs: KeptRuns = KeptRuns(RUNS_KEPT)    # run key -> the last real run with those settings
        label = {"description_width": "130px"}
        low, high, step = DEADLINE_RANGE
        shape = get_shape(model)
        self.model = widgets.Dropdown(options=[(SHAPES[n].title, n) for n in ENCODERS], value=model,
                                      description="Model", style=label, layout=widgets.Layout(width="440px"))
        self.mode = widgets.Dropdown(options=[(t, m) for m, t in MODE_CHOICES.items()], value=mode,
                                     description="Mode", style=label, layout=widgets.Layout(width="400px"))
        self.shares = widgets.Dropdown(options=[(t, s) for s, t in SHARE_CHOICES.items()], value=shares,
                                       description="Shares", style=label, layout=widgets.Layout(width="340px"))
        self.count = widgets.IntSlider(value=devices, min=1, max=MAX_ROWS, description="Devices", style=label,
                                       layout=widgets.Layout(width="420px"), continuous_update=False)
        self.seq_len = widgets.IntSlider(value=seq_len, min=1, max=shape.max_positions, description="Sequence length",
                                         style=label, layout=widgets.Layout(width="420px"), continuous_update=False)
        self.use_deadline = widgets.Checkbox(value=deadline_ms is not None, description="Meet a deadline",
                                             indent=False, layout=widgets.Layout(width="150px"))
        self.deadline = widgets.IntSlider(value=deadline_ms or 200, min=low, max=high, step=step,
                                          description=DEADLINE, style=label, layout=widgets.Layout(width="520px"),
                                          continuous_update=False)
        self.table = widgets.VBox(layout=widgets.Layout(max_height="260px", overflow="auto", width="720px"))
        self.table.add_class("wb-dev-table")
        self.kill_device = widgets.Dropdown(options=[("none", "")], value="", description="Kill device",
                                            style={"description_width": "80px"}, layout=widgets.Layout(width="300px"))
        self.kill_layer = widgets.Dropdown(options=layer_options(shape.num_layers)[1:], description="at",
                                           style={"description_width": "20px"}, layout=widgets.Layout(width="140px"))
        self.adapt = widgets.Checkbox(value=True, description="Re-partition on measured speeds", indent=False,
                                      layout=widgets.Layout(width="260px"),
                                      tooltip="Hepti re-partitions when a device's measured speed (the median of its "
                                              "last three layers) moves by more than half; off: memory reports "
                                              "alone decide")
        self.runs_note = widgets.HTML(
            f"<span class='wb-note wb-run-note'>Run for real starts one worker process per "
            f"device: up to {int(limits.ranks.maximum)} here ({html.escape(limits.ranks.at_most.why)}). A killed "
            f"device's process gets SIGKILL when the primary starts that layer; the run resumes over the rest. The "
            f"figures above predict with each device's own speed; a real run measures them, and on a busy host "
            f"they move (re-partitions the figures do not show).</span>")
        self.runner = BackgroundRun(self, "Run for real", self._run_for_real, self._show_measured)
        self.reasons = widgets.HTML(layout=widgets.Layout(width="420px"))
        self.run_info = widgets.HTML()
        self.decisions_info = widgets.HTML()
        self._sync()
        self.observe_controls(self.model, self.mode, self.shares, self.count, self.seq_len, self.use_deadline,
                              self.deadline, self.kill_device, self.kill_layer, self.adapt)
        self.children = [
            widgets.HTML(INTRO),
            widgets.HBox([self.model, self.mode]),
            widgets.HBox([self.count, self.shares]),
            widgets.HBox([self.seq_len]),
            widgets.HBox([self.deadline, self.use_deadline]),
            widgets.HTML(TABLE_NOTE),
            HeptiRowWidgets.header(),
            self.table,
            self.message,
            widgets.HBox([self.figure_slot("decision"), self.reasons],
                         layout=widgets.Layout(width="100%", align_items="flex-start")),
            widgets.HBox([self.figure_slot("breakdown", height=440), self.figure_slot("compare", height=440)],
                         layout=widgets.Layout(width="100%")),
            self.runs_note,
            widgets.HBox([self.kill_device, self.kill_layer, self.adapt]),
            self.runner,
            self.run_info,
            self.figure_slot("timeline"),
            self.decisions_info,
        ]
        for name in ("decision", "breakdown", "compare"):
            self.figure_slot(name).layout.flex = "1 1 0%"
        self.refresh()

    # -- the device table

    def _new_row(self, index: int) -> HeptiRowWidgets:
        cluster = get_cluster(CLUSTER).devices
        base = cluster[index % len(cluster)]
        name = base.name if index < len(cluster) else f"{base.preset or base.name}-{index}"
        row = HeptiRowWidgets(index, base, name, get_shape(self.model.value).num_layers)
        self.observe_controls(*row.cells)
        return row

    def _sync(self) -> None:
        """One row per device (rows beyond the count kept, hidden, with their values); the layer choices, the
        sequence slider and the kill choices follow the model and the devices."""
        K, shape = int(self.count.value), get_shape(self.model.value)
        self._syncing = True
        try:
            while len(self._rows) < K:
                self._rows.append(self._new_row(len(self._rows)))
            layers = layer_options(shape.num_layers)
            for row in self._rows:
                if list(row.fall_at.options) != layers:
                    keep = row.fall_at.value if row.fall_at.value < shape.num_layers else NEVER
                    row.fall_at.options, row.fall_at.value = layers, keep
            if list(self.kill_layer.options) != layers[1:]:
                keep = self.kill_layer.value if (self.kill_layer.value or 0) < shape.num_layers else 1
                self.kill_layer.options = layers[1:]
                self.kill_layer.value = keep if shape.num_layers > 1 else None
            victims = [("none", "")] + [(r.name, r.name) for r in self._rows[1:K]]
            if list(self.kill_device.options) != victims:
                keep = self.kill_device.value if any(v == self.kill_device.value for _, v in victims) else ""
                self.kill_device.options, self.kill_device.value = victims, keep
            if self.seq_len.max != shape.max_positions:
                self.seq_len.max = shape.max_positions           # clamps the value where it was longer
            self.deadline.disabled = not self.use_deadline.value
        finally:
            self._syncing = False
        if len(self.table.children) != K:
            self.table.children = self._rows[:K]

    @property
    def rows(self) -> list[HeptiRowWidgets]:
        """The table's rows in use (one per device)."""
        return self._rows[:int(self.count.value)]

    def devices(self) -> tuple[DeviceProfile, ...]:
        """The devices of the table (each value checked; an error names the row and the range)."""
        return tuple(r.device() for r in self.rows)

    def falls(self) -> tuple[tuple[str, int, float], ...]:
        return tuple(f for f in (r.fall() for r in self.rows) if f is not None)

    def kill(self) -> tuple[str, int] | None:
        if not self.kill_device.value or self.kill_layer.value is None:
            return None
        return (self.kill_device.value, int(self.kill_layer.value))

    # -- the engine, cached by its inputs

    def _cached(self, key: tuple, make):
        return self._cache.get_or(key, make)

    def partition(self, devices, shape, deadline_s: float, num_layers: int, mode: str | None = None,
                  fixed: tuple[float, ...] | None = None) -> Partition:
        """:func:`hepti_partition` (remembered); a refusal raises the engine's error."""
        return self._cached(("partition", devices, shape, deadline_s, num_layers, mode, fixed),
                            lambda: scenario.solve(devices, shape, deadline_s, num_layers, mode, fixed))

    def run_mode(self, s: Scenario) -> str | None:
        return scenario.run_mode(s, self.partition)

    def schedule(self, s: Scenario, quote_best: bool = True) -> list[LayerDecision]:
        """:func:`~workbench.hepti.scenario.schedule` (remembered)."""
        return self._cached(("schedule", s) if quote_best else ("schedule", s, "unquoted"),
                            lambda: scenario.schedule(s, quote_best, self.partition))

    def predicted_steps(self, s: Scenario, layers: list[LayerDecision]):
        return self._cached(("steps", s), lambda: scenario.scenario_steps(s, layers))

    def predicted_timeline(self, s: Scenario, layers: list[LayerDecision]):
        """The predicted schedule of every layer with its own partition (the executed split's steps)."""
        return self._cached(("timeline", s), lambda: steps_timeline(self.predicted_steps(s, layers), s.names,
                                                                   "hepti predicted"))

    def compare(self, s: Scenario) -> dict[str, Partition | str]:
        return scenario.compare(s, self.partition)

    # -- updates

    def _refresh(self) -> None:
        if self._syncing:
            return
        self._sync()
        model, N = self.model.value, int(self.seq_len.value)
        deadline_s = self.deadline.value / 1e3 if self.use_deadline.value else math.inf
        try:
            settings = Scenario(self.devices(), model, N, deadline_s,
                                None if self.mode.value == "auto" else self.mode.value, self.shares.value,
                                self.falls())
        except WorkbenchError as exc:
            self.settings = self.layers = None
            self._no_plan(("decision", "breakdown", "compare", "timeline"), f"no devices: {exc}")
            raise
        self._quote_for = self._quoted = None
        try:
            layers = self.schedule(settings, quote_best=False)
            predicted = self.predicted_timeline(settings, layers)
        except WorkbenchError as exc:
            self.settings = self.layers = None
            self._no_plan(("decision", "breakdown", "timeline"), f"no partition: {exc}")
            self._compare_for = settings                    # the comparison still says what each choice gives
            if isinstance(exc, DeadlineMissed) and exc.best_s is None:   # the best comes with the comparison's solve
                self._quote_for = settings
            self.defer(self._refresh_compare, "compare")
            if self._quoted is not None:                    # the comparison ran at once (a change from Python)
                raise self._quoted
            raise
        self.settings, self.layers, self.predicted = settings, layers, predicted
        title = SHAPES[model].name
        self.show_if_changed("decision", ("decision", settings), lambda: decision_figure(layers, title, N,
                                                                                   SHARE_CHOICES[settings.shares]))
        self.show_if_changed("breakdown", ("breakdown", settings), lambda: breakdown_figure(layers, deadline_s))
        self.reasons.value = self._reasons_html(settings, layers)
        self._compare_for = settings
        self.defer(self._refresh_compare, "compare", "timeline")

    def _refresh_compare(self) -> None:
        """The secondary part of a change: every mode and share rule compared (seven partitions, the costliest
        part at many devices) and the timeline."""
        self._show_compare(self._compare_for)
        if self.settings is not None:
            self._show_run()
        elif self._quote_for is not None:
            self._quote_best(self._quote_for)

    def _quote_best(self, s: Scenario) -> None:
        """A deadline missed, said again with the best reachable latency (the comparison's solve, remembered by
        the engine, makes it instant)."""
        self._quote_for = None
        try:
            self.schedule(s)
        except WorkbenchError as exc:
            self._quoted = exc
            self._no_plan(("decision", "breakdown", "timeline"), f"no partition: {exc}")
            self.report(self._refresh, exc)

    def _show_compare(self, s: Scenario) -> None:
        self.compared = self.compare(s)
        selected = COMPARE[s.shares]
        self.show_if_changed("compare", (s.devices, s.model, s.seq_len, s.mode, s.deadline_s, selected),
                             lambda: compare_figure(self.compared, s.deadline_s, selected))

    def _no_plan(self, names, reason: str) -> None:
        self.reasons.value = self.run_info.value = self.decisions_info.value = ""
        for name in names:
            self.show_if_changed(name, ("none", reason), lambda name=name: no_plan_figure(name, reason))

    @staticmethod
    def _reasons_html(s: Scenario, layers: list[LayerDecision]) -> str:
        """Why the first layer's partition is what it is (the engine's reasons and binding constraint), what each
        device computes and holds, and every later re-decision with its reason."""
        first = layers[0].partition
        total = predicted_s(layers)
        items = "".join(f"<li>{html.escape(r)}</li>" for r in first.reasons)
        head = ("device", "share", first.dimension, "heads", "needs (MB)", "free (MB)")
        rows = []
        for i, d in enumerate(first.devices):
            need = memory_bytes(first.mode, s.shape, first.shares[i], s.num_layers) if first.shares[i] > 0 else 0.0
            rows.append(table_row((f"{i} ({d.name})", f"{first.shares[i]:.1%}", str(first.sizes[i]),
                                   str(first.heads[i]) if first.heads else "", f"{need / 1e6:.1f}",
                                   f"{d.memory_bytes / 1e6:,.0f}"), device=i))
        later = [(n, ld) for n, ld in enumerate(layers) if ld.changed and ld.changed != "first"]
        redecided = "".join(
            f"<li data-layer='{n}'>layer {n}: {html.escape(ld.changed)} &rarr; <b>{html.escape(MODE_TITLES[ld.partition.mode])}"
            f"</b>, shares {', '.join(f'{x:.1%}' for x in ld.partition.shares)}; binding: "
            f"{html.escape(ld.partition.binding)}</li>" for n, ld in later)
        return (f"<div class='wb-reasons'><b>Why this split</b>: "
                f"{html.escape(MODE_TITLES[first.mode])}, predicted {1e3 * total:.1f} ms, "
                f"{html.escape(verdict(total, s.deadline_s))}"
                f"<ul class='wb-list'>{items}</ul>"
                f"<div class='wb-binding'><b>Binding constraint:</b> {html.escape(first.binding)}</div>"
                + html_table(head, rows, "wb-decision-table")
                + (f"<b>Re-decided mid-run</b><ul class='wb-list wb-redecisions'>"
                   f"{redecided}</ul>" if later else "")
                + "</div>")

    def run_key(self) -> tuple | None:
        """What a run is made from: the settings, the device killed and whether measured speeds re-partition."""
        return None if self.settings is None else (self.settings, self.kill(), bool(self.adapt.value))

    def _show_run(self) -> None:
        """The timeline (predicted, with the measured run of these settings overlaid when there is one), the run's
        numbers and its decisions."""
        s, layers, predicted = self.settings, self.layers, self.predicted
        key = self.run_key()
        run = self.runs.get(key)
        result = run.result if run else None

        def build():
            marks = [("predicted", predicted_marks(layers, predicted))]
            head = (f"Hepti timeline on {len(s.devices)} devices ({s.model}, T = {s.seq_len}): ")
            if result is None:
                return timeline_figure(predicted, s.names, None, marks, head + f"predicted {1e3 * predicted.end:.1f} ms"
                                       + timeline_note(layers, predicted, self.predicted_steps(s, layers)))
            measured = result.timeline
            shift = measured_shift(measured, predicted)
            shifted = replace(measured, spans=tuple(replace(x, start=x.start - shift, end=x.end - shift)
                                                    for x in measured.spans))
            marks.append(("measured", measured_marks(measured, result.decisions, shift)))
            fault = f"; {len(result.faults)} fault" if result.faults else ""
            return timeline_figure(predicted, s.names, shifted, marks,
                                   head + f"{result.label} {1e3 * result.latency_s:.1f} ms vs predicted "
                                   f"{1e3 * predicted.end:.1f} ms{fault}" + drawn_note(shifted, result))
        self.show_if_changed("timeline", (key, id(result)), build)
        if result is None:
            self.run_info.value = self.decisions_info.value = ""
            return
        note = result.check().note()
        self.run_info.value = (
            f"<span class='wb-run-info'>{result.label.capitalize()} {1e3 * result.latency_s:.1f} ms vs predicted "
            f"{1e3 * predicted.end:.1f} ms ({s.num_layers} layers on {len(s.devices)} worker processes, "
            + ("compute and links padded to the devices' profiles: a replay of the cost model, not a measurement"
               if result.emulated else "each under its device's CPU limit")
            + f"; {len(result.switches())} re-partitions after the first decision"
            + ("; the time includes the run the fault cut short, its worker processes' start included"
               if result.faults else "") + ")</span>"
            + (f"<br><span class='wb-warn wb-miss'>{html.escape(note)}</span>" if note else "")
            + "".join(f"<br><span class='wb-warn wb-fault'>fault: {html.escape(f)}</span>"
                      for f in result.faults))
        self.decisions_info.value = self._decisions_html(s, result)

    @staticmethod
    def _decisions_html(s: Scenario, result) -> str:
        """Every decision the run's ranks made, with the devices taking part named (after a fault the ranks are
        the devices left)."""
        names_at: dict[int, dict[int, str]] = {}
        for span in result.timeline.spans:
            if span.event == "decision" and span.rank is not None:
                names_at.setdefault(span.layer, {})[span.rank] = span.device
        rows = []
        for d in result.decisions:
            names = names_at.get(d.layer) or ({r: n for r, n in enumerate(s.names)} if len(d.shares) == len(s.names)
                                               else {})
            shares = ", ".join(f"{names.get(r, f'rank {r}')} {x:.1%}" for r, x in enumerate(d.shares))
            rows.append(table_row((d.layer, MODE_TITLES[d.mode], shares, d.changed), layer=d.layer))
        head = ("layer", "mode", "shares", "why decided here")
        return (f"<div class='wb-run-decisions-box'><b>The run's decisions</b> (every rank decides the same from "
                f"the reports){html_table(head, rows, 'wb-small', 'wb-run-decisions')}</div>")

    # -- the real run

    def _run_for_real(self, handle) -> RunOutcome | None:
        """Worker thread: the current settings on one worker process per device (devices emulated)."""
        s, kill, adapt = self.settings, self.kill(), bool(self.adapt.value)
        if s is None:
            raise WorkbenchError("nothing to run: the settings above give no partition (see the message above)")
        K = len(s.devices)
        if not limits.ranks.accepts(K):
            raise WorkbenchError(
                f"Run for real starts one worker process per device and this machine takes at most "
                f"{int(limits.ranks.maximum)} ({limits.ranks.at_most.why}); {K} devices is more. Set Devices to "
                f"{int(limits.ranks.maximum)} or fewer to run.")
        from workbench.hepti.run import run_hepti
        from workbench.distributed.ranks import RunFailed

        handle.progress(0, s.num_layers)
        try:
            result = run_hepti(list(s.devices), s.model, s.seq_len, deadline_s=s.deadline_s,
                               memory_falls=s.memory_falls(), emulate=True, kill_at=kill, mode=self.run_mode(s),
                               adapt=adapt, shares=s.fixed(), progress=handle.progress,
                               should_stop=handle.should_stop)
        except RunFailed:
            if handle.should_stop():
                return None
            raise
        return RunOutcome((s, kill, adapt), result)

    def _show_measured(self, outcome: RunOutcome | None, cancelled: bool) -> None:
        """Kernel loop: keep the run with its settings; draw it if they are still the page's."""
        if outcome is None:
            self.run_info.value = "<span class='wb-run-info'>cancelled: its worker processes were stopped</span>"
            return
        self.runs.keep(outcome)
        if self.run_key() == outcome.key:
            self._show_run()
        else:
            self.run_info.value = ("<span class='wb-run-info'>the settings changed during the run; its timeline "
                                   "shows when they are set back</span>")
