"""The position-wise partitioning (Voltage) dashboard: device count, link bandwidth, sequence length, model,
scheme, shares and a table of unequal devices -> the cost model's plans -> which positions each device computes
and why, communication against compute per scheme, the per-layer timeline across devices and Theorem 2's order
map. "Run for real" runs the plan on real worker processes (one per device) in the background and overlays the
measured timeline and the bytes each device sent."""
from __future__ import annotations

import html

import ipywidgets as widgets

from workbench.errors import WorkbenchError
from workbench.distributed import limits
from workbench.partition.cost import SHAPES, comm_bytes, get_shape
from workbench.partition.plan import (DEFAULT_DEVICE, MAX_DEVICES, SCHEMES, SHARE_RULES, DeviceRow, PartitionPlan,
                                      devices_from_table, plan_partition)
from workbench.presets import default_preset
from workbench.ui.base import (BackgroundRun, DeviceRowWidgets, KeptRuns, Memo, Panel, RunOutcome, html_table,
                               table_row)
from workbench.viz.partition import (decision_figure, no_plan_figure, orders_figure, scheme_label,
                                     schemes_figure, timeline_figure)

BANDWIDTH = "Bandwidth (Mbit/s)"
BANDWIDTH_RANGE = (10, 2000, 10)
"""The slider's range and step (Mbit/s); the table takes any link the engine allows (above 0 to 100 Gbit/s)."""
PLAN_CACHE = 256
RUNS_KEPT = 16
"""Real runs kept (each with its plan) for their timeline, bytes and the Voltage : tensor parallel ratio."""
ORDER_SHORT = {"qk_first": "Eq. (3)", "x_first": "Eq. (8)", "none": "none"}
REASON_ROWS = 16
"""Devices listed beside the decision; the figure's hover names the others."""

INTRO = """
<h2 class="wb-title">Position-wise partitioning (Voltage)</h2>
<p class="wb-lead">One request's transformer layers split over several edge devices. <b>Voltage</b> gives
each device a range of <i>positions</i> of every layer (its <b>share</b>), lets each pick the cheaper
<b>attention order</b> for its rows (Theorem 2: multiply x in last when 1/P - 1/N exceeds (F - F_H)/(F F_H)), and
joins the rows with one <b>All-Gather</b> per layer. Tensor parallelism splits heads and FFN columns and needs two
<b>All-Reduces</b> per layer (four times the bytes); the layer pipeline runs devices one after another. The figures
come from the cost model at once; <b>Run for real</b> runs the plan on one worker process per device, each held
to its device's speed by a CPU limit (calibrated by a short probe) and its link shaped by tc, and draws what it
measured; without root it runs at this host's speed and says so.</p>
"""

TABLE_NOTE = ("<span class='wb-note wb-table-note'>Each device's speed, memory and "
              "link. Proportional shares follow the speeds; the layer pipeline splits layers by memory. "
              f"<i>{BANDWIDTH}</i> sets every device's link; edit a row for one device's own.</span>")


class PartitionRowWidgets(DeviceRowWidgets):
    """One editable row of the device table: speed (GFLOP/s), memory (GB), link (Mbit/s)."""

    def __init__(self, index: int, speed_gflops: float, memory_gb: float, bandwidth_mbit: float):
        super().__init__(index, f"<span class='wb-dev-name'>device {index}</span>", speed_gflops, memory_gb,
                         bandwidth_mbit)

    def row(self) -> DeviceRow:
        return DeviceRow(speed_gflops=float(self.speed.value), memory_gb=float(self.memory.value),
                         bandwidth_mbit=float(self.bandwidth.value), name=f"vm{self.index}")


def traffic_per_layer(table, device: int) -> tuple[int, int]:
    """Least and most bytes ``device`` sent in one layer (``table``: per layer, per device, as ``traffic()``)."""
    sent = [layer[device].sent for layer in table]
    return min(sent), max(sent)


def bytes_text(low: int, high: int) -> str:
    return f"{low:,}" if low == high else f"{low:,} to {high:,}"


class PartitionOverview(Panel):
    """Voltage's part of the overview page: every scheme's predicted compute and communication on K equal
    devices (the encoder at N = 128, the default device and its link), the cost model's own numbers."""

    def __init__(self, preset: str | None = None):
        super().__init__()
        self.preset = preset or default_preset()
        self.count = widgets.IntSlider(value=4, min=1, max=16, description="Devices", continuous_update=False,
                                       layout=widgets.Layout(width="420px"))
        self.observe_controls(self.count)
        self.children = [self.count, self.message, self.figure_slot("schemes", height=440)]
        self.refresh()

    def _refresh(self) -> None:
        from workbench.distributed.shares import devices_like

        K, shape, N = int(self.count.value), get_shape("encoder"), 128
        devices = devices_like(K)
        plans: dict[str, PartitionPlan | str] = {}
        for scheme in SCHEMES:
            try:
                plans[scheme] = plan_partition(scheme, shape, N, devices)
            except WorkbenchError as exc:
                plans[scheme] = str(exc)
        single = plans["single"]
        self.plans = plans
        self.show_figure("schemes", schemes_figure(
            plans, single.predicted_s if isinstance(single, PartitionPlan) else None, "voltage",
            title=f"Voltage beside the other schemes on {K} equal devices<br><sub>{shape.name}, N = {N}: predicted "
                  f"compute and communication per inference</sub>"))


class PartitionPanel(Panel):
    """Controls -> ``plan_partition`` for every scheme -> four figures; a button runs the selected plan for real."""

    dashboard_page = "partition.ipynb"

    def __init__(self, preset: str | None = None, *, devices: int = 6, bandwidth_mbit: int = 500,
                 seq_len: int = 128, model: str = "encoder", scheme: str = "voltage", shares: str = "even"):
        super().__init__()
        self.preset = preset or default_preset()
        self._syncing = False                  # controls set from code: their own updates wait for this one
        self._plans = Memo(PLAN_CACHE)          # plan inputs -> the plan, or the engine's refusal
        self._rows: list[DeviceRowWidgets] = []
        self._applied_bandwidth: float | None = None
        self.plan: PartitionPlan | None = None
        self.plans: dict[str, PartitionPlan | str] = {}
        self.runs: KeptRuns = KeptRuns(RUNS_KEPT)    # plan key -> the last real run of that plan
        label = {"description_width": "130px"}
        low, high, step = BANDWIDTH_RANGE
        shape = get_shape(model)
        self.model = widgets.Dropdown(options=[(s.title, n) for n, s in SHAPES.items()], value=model,
                                      description="Model", style=label, layout=widgets.Layout(width="440px"))
        self.scheme = widgets.Dropdown(options=[(text, n) for n, text in SCHEMES.items()],
                                       value=scheme, description="Scheme", style=label,
                                       layout=widgets.Layout(width="560px"))
        self.shares = widgets.Dropdown(options=list(SHARE_RULES), value=shares, description="Shares", style=label,
                                       layout=widgets.Layout(width="260px"),
                                       tooltip="Voltage's share of positions per device: even, or in proportion "
                                               "to each device's speed")
        self.count = widgets.IntSlider(value=devices, min=1, max=int(limits.devices.maximum), description="Devices",
                                       style=label, layout=widgets.Layout(width="420px"), continuous_update=False)
        self.bandwidth = widgets.IntSlider(value=bandwidth_mbit, min=low, max=high, step=step, description=BANDWIDTH,
                                           style=label, layout=widgets.Layout(width="420px"),
                                           continuous_update=False)
        self.seq_len = widgets.IntSlider(value=seq_len, min=1, max=shape.max_positions, description="Sequence length",
                                         style=label, layout=widgets.Layout(width="420px"), continuous_update=False)
        self.table = widgets.VBox(layout=widgets.Layout(max_height="230px", overflow="auto", width="540px"))
        self.table.add_class("wb-dev-table")
        self.runs_note = widgets.HTML(
            f"<span class='wb-note wb-run-note'>Run for real starts one worker process per "
            f"device: up to {int(limits.ranks.maximum)} here ({html.escape(limits.ranks.at_most.why)}); the figures "
            f"above take up to {MAX_DEVICES} devices.</span>")
        self.runner = BackgroundRun(self, "Run for real", self._run_for_real, self._show_measured)
        self.reasons = widgets.HTML(layout=widgets.Layout(width="360px"))
        self.run_info = widgets.HTML()
        self.bytes_info = widgets.HTML()
        self._sync_rows()
        self.observe_controls(self.model, self.scheme, self.shares, self.count, self.bandwidth, self.seq_len)
        self.children = [
            widgets.HTML(INTRO),
            widgets.HBox([self.model, self.shares]),
            self.scheme,
            widgets.HBox([self.count, self.seq_len]),
            self.bandwidth,
            widgets.HTML(TABLE_NOTE),
            PartitionRowWidgets.header(),
            self.table,
            self.message,
            widgets.HBox([self.figure_slot("decision"), self.reasons],
                         layout=widgets.Layout(width="100%", align_items="flex-start")),
            widgets.HBox([self.figure_slot("schemes", height=440), self.figure_slot("orders", height=440)],
                         layout=widgets.Layout(width="100%")),
            self.runs_note,
            self.runner,
            self.run_info,
            self.figure_slot("timeline"),
            self.bytes_info,
        ]
        for name in ("decision", "schemes", "orders"):
            self.figure_slot(name).layout.flex = "1 1 0%"
        self.refresh()

    # -- the device table

    def _new_row(self, index: int) -> DeviceRowWidgets:
        from workbench.devices import get_profile

        base = get_profile(DEFAULT_DEVICE)
        row = PartitionRowWidgets(index, base.flops_per_s / 1e9, base.memory_bytes / 1e9, float(self.bandwidth.value))
        self.observe_controls(*row.cells)
        return row

    def _sync_rows(self) -> None:
        """The table holds one row per device (rows beyond the count are kept, hidden, with their values); a moved
        bandwidth slider sets every row's link."""
        K = int(self.count.value)
        self._syncing = True
        try:
            while len(self._rows) < K:
                self._rows.append(self._new_row(len(self._rows)))
            if self._applied_bandwidth is not None and self.bandwidth.value != self._applied_bandwidth:
                for row in self._rows:
                    row.bandwidth.value = float(self.bandwidth.value)
            self._applied_bandwidth = self.bandwidth.value
            shape = get_shape(self.model.value)
            if self.seq_len.max != shape.max_positions:
                self.seq_len.max = shape.max_positions           # clamps the value where it was longer
        finally:
            self._syncing = False
        if len(self.table.children) != K:
            self.table.children = self._rows[:K]

    @property
    def rows(self) -> list[DeviceRowWidgets]:
        """The table's rows in use (one per device)."""
        return self._rows[:int(self.count.value)]

    def devices(self):
        """The devices of the table (each value checked by the engine; an error names the row and the range)."""
        return devices_from_table([r.row() for r in self.rows])

    # -- planning

    def plan_for(self, scheme: str, shape, N: int, devices) -> PartitionPlan | str:
        """The cost model's plan (cached by its inputs), or why there is none."""
        key = (scheme, shape.name, N, devices, self.shares.value)
        try:
            return self._plans.get_or(key, lambda: plan_partition(scheme, shape, N, devices, shares=self.shares.value))
        except WorkbenchError as exc:
            return str(exc)

    @staticmethod
    def plan_key(plan: PartitionPlan) -> tuple:
        return (plan.scheme, plan.shape.name, plan.seq_len, plan.devices, plan.shares)

    # -- updates

    def _refresh(self) -> None:
        if self._syncing:
            return
        self._sync_rows()
        shape, N, K = get_shape(self.model.value), int(self.seq_len.value), int(self.count.value)
        self.show_if_changed("orders", (shape.name, N, K), lambda: orders_figure(shape, N, K))
        try:
            devices = self.devices()
        except WorkbenchError as exc:
            self.plan, self.plans = None, {}
            self._no_plan(("decision", "schemes", "timeline"), f"no devices: {exc}")
            raise
        self.plans = {s: self.plan_for(s, shape, N, devices) for s in SCHEMES}
        single = self.plans["single"]
        selected = self.scheme.value
        self.show_if_changed("schemes", (shape.name, N, devices, self.shares.value, selected),
                             lambda: schemes_figure(self.plans, single.predicted_s if isinstance(single, PartitionPlan)
                                                    else None, selected))
        plan = self.plans[selected]
        if not isinstance(plan, PartitionPlan):
            self.plan = None
            self._no_plan(("decision", "timeline"), f"no {scheme_label(selected)} plan: {plan}")
            raise WorkbenchError(f"{scheme_label(selected)}: {plan}")
        self.plan = plan
        self.show_if_changed("decision", (plan.scheme, shape.name, N, plan.bounds, plan.orders, plan.heads,
                                          plan.layers, tuple(d.name for d in plan.devices)),
                             lambda: decision_figure(plan))
        self.reasons.value = self._reasons_html(plan)
        self.defer(self._show_run, "timeline")            # the timeline of every device and layer: after a pause

    def _no_plan(self, names, reason: str) -> None:
        self.reasons.value = ""
        self.run_info.value = self.bytes_info.value = ""
        for name in names:
            self.show_if_changed(name, ("none", reason), lambda name=name: no_plan_figure(name, reason))

    @staticmethod
    def _reasons_html(plan: PartitionPlan) -> str:
        """Why the plan is what it is (its reasons), and per device what it computes."""
        items = "".join(f"<li>{html.escape(r)}</li>" for r in plan.reasons)
        if plan.scheme == "voltage":
            head = ("device", "share", "positions (layer 0)", "order")
            cells = [(f"{plan.shares[0][i]:.1%}", "[{}, {})".format(*plan.positions(0, i)),
                      ORDER_SHORT[plan.orders[0][i]]) for i in range(plan.K)]
        elif plan.heads:
            head = ("device", "heads", "FFN columns")
            cells = [(str(h), str(f)) for h, f in zip(plan.heads, plan.ffn_columns)]
        else:
            head = ("device", "layers")
            cells = [(str(n),) for n in plan.layers]
        rows = [table_row((f"{i} ({d.name})", *cells[i]), device=i) for i, d in enumerate(plan.devices[:REASON_ROWS])]
        if plan.K > REASON_ROWS:
            rows.append(f"<tr><td colspan='{len(head)}'>... and {plan.K - REASON_ROWS} more (hover the bars)</td></tr>")
        return (f"<div class='wb-reasons'><b>Why this plan</b> (predicted "
                f"{1e3 * plan.predicted_s:.1f} ms)<ul class='wb-list'>{items}</ul>"
                + html_table(head, rows, "wb-decision-table")
                + ("<small>Hatched bars: Eq. (8), x multiplied in last.</small>" if plan.scheme == "voltage" else "")
                + "</div>")

    def _show_run(self) -> None:
        """The timeline, the run's numbers and the bytes it counted for the current plan (a measured run shows
        while the settings are those it ran with)."""
        plan = self.plan
        if plan is None:                                  # a later change found no plan: said in its figures
            return
        key = self.plan_key(plan)
        run = self.runs.get(key)
        result = run.result if run else None
        self.show_if_changed("timeline", (key, id(result)),
                             lambda: timeline_figure(plan, result.timeline if result else None,
                                                     result.latency_s if result else None,
                                                     run.note if run else ""))
        if result is None:
            self.run_info.value = self.bytes_info.value = ""
            return
        how = {"measured": "each held to its device's speed by a CPU limit",
               "unlimited": "at this host's full speed, not the devices'",
               "replay": "padded to the prediction"}[result.mode]
        links = "links shaped by tc" if result.shaped else "links emulated in the processes"
        said = "Replayed" if result.mode == "replay" else "Measured"
        self.run_info.value = (
            f"<span class='wb-run-info'>{said} {1e3 * result.latency_s:.1f} ms vs predicted "
            f"{1e3 * plan.predicted_s:.1f} ms ({html.escape(scheme_label(plan.scheme))} on {plan.K} worker "
            f"processes, {how}; {links})</span>"
            + (f"<br><span class='wb-warn wb-limits'>{html.escape(result.note)}.</span>"
               if result.note else "")
            + (f"<br><span class='wb-warn wb-miss'>{html.escape(run.note)}.</span>"
               if run.note else ""))
        self.bytes_info.value = self._bytes_html(plan, result)

    def _bytes_html(self, plan: PartitionPlan, result) -> str:
        """Bytes each device sent and received per layer as the run counted them, beside the plan's; and
        Voltage's bytes against tensor parallelism's when both ran on these devices, model and length."""
        counted, predicted, total = result.traffic(), plan.traffic(), result.total_traffic()
        rows = []
        for i, d in enumerate(plan.devices):
            received = (min(layer[i].received for layer in counted), max(layer[i].received for layer in counted))
            rows.append(table_row((f"{i} ({d.name})", bytes_text(*traffic_per_layer(counted, i)),
                                   bytes_text(*received), bytes_text(*traffic_per_layer(predicted, i)),
                                   f"{total[i].sent:,}"), device=i))
        head = ("device", "sent per layer (counted)", "received per layer (counted)", "sent per layer (planned)",
                "sent in all (the input too)")
        return (f"<div class='wb-bytes-info'><b>Bytes counted by the run</b> ({html.escape(scheme_label(plan.scheme))},"
                f" {plan.shape.num_layers} layers){html_table(head, rows, 'wb-small', 'wb-bytes')}"
                f"{self._ratio_html(plan)}</div>")

    def _ratio_html(self, plan: PartitionPlan) -> str:
        """Voltage : tensor parallel bytes, from the last real run of each on the current devices, model and
        length, beside the cost model's ratio."""
        def sent_per_device_layer(scheme):
            for run in self.runs.latest_first():
                p = run.made_with
                if (p.scheme, p.shape.name, p.seq_len, p.devices) == (scheme, plan.shape.name, plan.seq_len,
                                                                       plan.devices):
                    table = run.result.traffic()
                    if scheme == "voltage":          # its All-Gather layers: the last one goes to the terminal only
                        table = table[:-1]
                    return sum(t.sent for layer in table for t in layer) / (p.K * len(table))
            return None

        voltage = sent_per_device_layer("voltage")
        tp = next((v for v in (sent_per_device_layer("tensor_parallel"), sent_per_device_layer("torch_tp"))
                   if v is not None), None)
        if voltage is None or tp is None:
            missing = "tensor parallel" if voltage is not None else "Voltage"
            return (f"<div class='wb-note wb-ratio'>Run {missing} too at these settings to see Voltage's "
                    f"bytes against tensor parallelism's.</div>") if plan.K > 1 else ""
        if voltage == 0:
            return ""
        F, N, K = plan.shape.hidden, plan.seq_len, plan.K
        model = comm_bytes("tensor_parallel", N, F, K) / comm_bytes("voltage", N, F, K)
        return (f"<div class='wb-ratio'>Voltage : tensor parallel bytes sent per device per layer = "
                f"{voltage:,.0f} : {tp:,.0f} = <b>1 : {tp / voltage:.2f}</b> (counted; the cost model says "
                f"1 : {model:.2f})</div>")

    # -- the real run

    def _run_for_real(self, handle) -> RunOutcome | None:
        """Worker thread: the current plan on one worker process per device, each held to its device's speed
        by a CPU limit and its link shaped (root; else at full speed, and the page says why)."""
        plan = self.plan
        if plan is None:
            raise WorkbenchError("nothing to run: the settings above give no plan (see the message above)")
        if not limits.ranks.accepts(plan.K):
            raise WorkbenchError(
                f"Run for real starts one worker process per device and this machine takes at most "
                f"{int(limits.ranks.maximum)} ({limits.ranks.at_most.why}); {plan.K} devices is more. The figures "
                f"above come from the cost model, which takes up to {MAX_DEVICES}: set Devices to "
                f"{int(limits.ranks.maximum)} or fewer to run.")
        from workbench.partition.runtime import RunFailed, run_partition

        handle.progress(0, len(plan.steps))
        try:
            result = run_partition(plan, mode="measured", progress=handle.progress, should_stop=handle.should_stop)
        except RunFailed:
            if handle.should_stop():
                return None
            raise
        return RunOutcome(self.plan_key(plan), result, made_with=plan, note=result.check().note())

    def _show_measured(self, outcome: RunOutcome | None, cancelled: bool) -> None:
        """Kernel loop: keep the run with its plan; draw it if that plan is still the page's."""
        if outcome is None:
            self.run_info.value = "<span class='wb-run-info'>cancelled: its worker processes were stopped</span>"
            return
        self.runs.keep(outcome)
        if self.plan is not None and self.plan_key(self.plan) == outcome.key:
            self._show_run()
        else:
            self.run_info.value = ("<span class='wb-run-info'>the settings changed during the run; its timeline "
                                   "shows when they are set back</span>")
