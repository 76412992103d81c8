"""The tables of `workbench bench hepti` made of real runs (``modes``, ``shares``, ``switch``, ``fault``): the
runs they share (:class:`Runs`, each configuration run once), the devices they run on, and what each table
takes from the runs beside the engine's schedule. What each table measures is in :mod:`workbench.hepti.bench`,
which parses the options, times the partitioner (``lp``) and prints the summary."""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import replace

RUN_MODES = ("ws", "1d", "2d")
SHARES = ("hepti", "even", "proportional")
MODEL = "encoder"
SEED = 0
"""The input tokens' seed: the runs and the model in one process read the same input."""


def run_devices(opts, scenario: str = "unequal") -> list:
    """The devices of the runs: the Raspberry Pi 4B's profile at the given speeds, links and memory, named
    d0, d1, ...; ``memory-short`` and ``slow-link`` change one device."""
    from workbench.devices import GB, PRESETS

    devices = [replace(PRESETS["rpi4"], name=f"d{i}", title=f"emulated device {i}", flops_per_s=s * 1e9,
                       net_bytes_per_s=b * 1e6 / 8, memory_bytes=opts.memory_gb * GB)
               for i, (s, b) in enumerate(zip(opts.speeds_gflops, opts.bandwidths_mbit))]
    if scenario == "memory-short":
        i = opts.short_device
        devices[i] = replace(devices[i], memory_bytes=opts.short_memory_mb * 1e6)
    elif scenario == "slow-link":
        i = opts.slow_device
        devices[i] = replace(devices[i], net_bytes_per_s=opts.slow_link_mbit * 1e6 / 8)
    return devices


def _ms(seconds: float) -> float:
    return 1e3 * seconds


def _error_pct(measured: float, predicted: float) -> float:
    return 100.0 * (measured - predicted) / predicted if predicted > 0 else math.inf


def _shares_text(shares) -> str:
    return "/".join(f"{s + 0.0:.3f}" for s in shares)


class Runs:
    """Real Hepti runs, each configuration measured once (``--repeats`` runs) and kept for every table."""

    def __init__(self, opts):
        self.opts = opts
        self.done: dict[tuple, dict] = {}
        self.failures: list[str] = []
        self._reference = None

    def reference(self):
        """(hidden, logits) of the model in this process on the runs' input."""
        if self._reference is None:
            from workbench.models.split import PartitionModel

            model = PartitionModel(MODEL)
            hidden, logits = model.reference(model.inputs(model.token_ids(self.opts.seq_len, SEED)))
            self._reference = hidden.numpy(), logits.numpy()
        return self._reference

    def measure(self, label: str, devices, *, mode=None, shares=None, memory_falls=None, kill_at=None) -> dict | None:
        """``--repeats`` runs of one configuration: the runs, their median latency, the largest output
        difference from the model in one process; None when a run failed (named in ``failures``)."""
        import numpy as np

        from workbench.errors import WorkbenchError

        key = (tuple(devices), mode, None if shares is None else tuple(shares),
               tuple(sorted((memory_falls or {}).items())), kill_at)
        if key in self.done:
            return self.done[key]
        from workbench.hepti.run import run_hepti

        hidden, logits = self.reference()
        runs, kills, calls = [], [], []
        for _ in range(self.opts.repeats):
            stamps: list[float] = []
            called = time.perf_counter()
            try:
                run = run_hepti(devices, MODEL, self.opts.seq_len, memory_falls=memory_falls, emulate=True,
                                measured=self.opts.runs == "measured",
                                kill_at=kill_at, seed=SEED, mode=mode, adapt=False, shares=shares,
                                progress=lambda done, total, stamps=stamps: stamps.append(time.perf_counter()))
            except WorkbenchError as exc:          # RunFailed included: a run that could not finish
                self.failures.append(f"{label}: {exc}")
                print(f"  FAILED {self.failures[-1]}", flush=True)
                return None
            runs.append(run)
            calls.append(called)
            kills.append(stamps)
        latencies = [r.latency_s for r in runs]
        diff = max(max(float(np.abs(r.hidden - hidden).max()), float(np.abs(r.logits - logits).max())) for r in runs)
        out = {"runs": runs, "calls": calls, "stamps": kills, "measured_s": statistics.median(latencies),
               "min_s": min(latencies), "max_s": max(latencies), "max_abs_diff": diff}
        self.done[key] = out
        last = runs[-1]
        print(f"  {label:34s} {last.label} {_ms(out['measured_s']):8.1f} ms (median of {len(runs)}), first decision "
              f"{last.partition.mode} {_shares_text(last.partition.shares)} predicted "
              f"{_ms(last.partition.predicted_latency_s):8.1f} ms; outputs within {diff:.1e} of the model"
              + (f"; switches at layers {[d.layer for d in last.switches()]}" if last.switches() else "")
              + (f"; faults: {len(last.faults)}" if last.faults else ""), flush=True)
        return out


def runtime_overhead_s(run) -> tuple[float, float]:
    """(reports, decisions): the primary's seconds in the layers' report gathers (waits included) and in
    Hepti's decisions, which the cost model and the schedule leave out."""
    lane = "device 0"                                   # the primary's lane in a run's timeline
    mine = [s for s in run.timeline.spans if s.lane == lane]
    reports = sum(s.duration for s in mine if s.event == "report")
    decide = sum(s.duration for s in mine if s.event == "decision")
    return reports, decide


def counted_sent(run, kinds=None) -> int:
    """Bytes every rank counted sending, over every segment of the run (``kinds``: only those collectives)."""
    return sum(c["sent"] for segment in run.counts for rank in segment for c in rank
               if kinds is None or c["kind"] in kinds)


COLLECTIVES = ("all_gather", "all_reduce", "send")


def scheduled_sent(partition, shape, num_layers: int) -> int:
    """Bytes the executed split's schedule sends over every layer (:func:`predicted_steps`)."""
    from workbench.hepti.run import predicted_steps

    return sum(t.sent for step in predicted_steps(partition, shape, num_layers) for t in step.traffic)


def schedule_s(run, devices, shape, num_layers: int) -> float:
    """The executed schedule's end for a run without faults, each layer in the split its latest decision
    chose (the first decision's for a run that never switches: ``run.predicted``)."""
    from workbench.errors import WorkbenchError
    from workbench.hepti.plan import hepti_partition
    from workbench.hepti.run import layer_steps, split_of
    from workbench.distributed.steps import steps_timeline

    decisions = sorted(run.decisions, key=lambda d: d.layer)
    splits = {}
    for d in decisions:
        now = [replace(dev, memory_bytes=free) for dev, free in zip(devices, d.free_bytes)]
        try:                                         # the decision's own shares (2D solves its axes itself)
            part = hepti_partition(now, shape, num_layers=num_layers, mode=d.mode,
                                   fixed_shares=None if d.mode == "2d" else d.shares)
        except WorkbenchError:                       # shares at a memory bound, a rounding over it
            part = hepti_partition(now, shape, num_layers=num_layers, mode=d.mode)
        splits[d.layer] = split_of(part, list(range(len(devices))), shape)
    steps, split = [], None
    for layer in range(num_layers):
        split = splits.get(layer, split)
        steps.extend(layer_steps(split, layer, shape, devices))
    return steps_timeline(steps, [d.name for d in devices], "schedule").end


def _shape(opts):
    from workbench.models.shapes import get_shape
    from workbench.hepti.run import shape_of

    model = get_shape(MODEL)
    return shape_of(model, opts.seq_len), model.num_layers


def modes_table(runs: Runs) -> list[dict]:
    opts = runs.opts
    shape, L = _shape(opts)
    devices = run_devices(opts)
    rows = []
    for mode in opts.modes:
        got = runs.measure(f"mode {mode}", devices, mode=mode)
        if got is None:
            continue
        run = got["runs"][-1]
        part = run.partition
        predicted, schedule = part.predicted_latency_s, run.predicted.end
        sent = counted_sent(run, COLLECTIVES)
        planned = scheduled_sent(part, shape, L)
        overheads = [runtime_overhead_s(r) for r in got["runs"]]
        reports = statistics.median(o[0] for o in overheads)
        decide = statistics.median(o[1] for o in overheads)
        rows.append({"mode": mode, "run": run.label, "K": len(devices), "T": opts.seq_len,
                     "grid": f"{part.grid[0]}x{part.grid[1]}",
                     "shares": _shares_text(part.shares), "repeats": len(got["runs"]),
                     "predicted_ms": _ms(predicted), "schedule_ms": _ms(schedule), "measured_ms": _ms(got["measured_s"]),
                     "min_ms": _ms(got["min_s"]), "max_ms": _ms(got["max_s"]),
                     "error_pct": _error_pct(got["measured_s"], predicted),
                     "schedule_error_pct": _error_pct(got["measured_s"], schedule),
                     "reports_ms": _ms(reports), "decide_ms": _ms(decide),
                     "error_without_runtime_pct": _error_pct(got["measured_s"] - reports - decide, schedule),
                     "sent_B": counted_sent(run), "collective_sent_B": sent, "scheduled_sent_B": planned,
                     "counted_equal_schedule": sent == planned,
                     "decisions": len(run.decisions), "faults": len(run.faults), "max_abs_diff": got["max_abs_diff"]})
    return rows


def shares_table(runs: Runs) -> list[dict]:
    from workbench.errors import WorkbenchError
    from workbench.hepti.plan import hepti_partition
    from workbench.distributed.shares import proportional_shares

    opts = runs.opts
    shape, L = _shape(opts)
    rows = []
    for scenario in opts.scenarios:
        devices = run_devices(opts, scenario)
        mode = hepti_partition(devices, shape, num_layers=L).mode
        fixed = {"hepti": None, "even": [1 / len(devices)] * len(devices),
                 "proportional": list(proportional_shares(devices))}
        for kind in SHARES:
            row = {"scenario": scenario, "mode": mode, "shares_kind": kind, "shares": "", "repeats": 0,
                   "predicted_ms": "", "schedule_ms": "", "measured_ms": "", "error_pct": "", "sent_B": "",
                   "scheduled_sent_B": "", "counted_equal_schedule": "", "faults": "", "max_abs_diff": "", "note": ""}
            try:
                part = hepti_partition(devices, shape, num_layers=L, mode=mode, fixed_shares=fixed[kind])
            except WorkbenchError as exc:
                row["note"] = f"refused by the engine: {exc}"
                rows.append(row)
                print(f"  shares {scenario} {kind}: {row['note']}", flush=True)
                continue
            got = runs.measure(f"shares {scenario} {kind}", devices, mode=mode, shares=fixed[kind])
            row.update({"shares": _shares_text(part.shares), "predicted_ms": _ms(part.predicted_latency_s),
                        "scheduled_sent_B": scheduled_sent(part, shape, L)})
            if got is None:
                row["note"] = "the run failed"
            else:
                run = got["runs"][-1]
                row.update({"repeats": len(got["runs"]), "schedule_ms": _ms(run.predicted.end),
                            "measured_ms": _ms(got["measured_s"]),
                            "error_pct": _error_pct(got["measured_s"], part.predicted_latency_s),
                            "sent_B": counted_sent(run),
                            "counted_equal_schedule": counted_sent(run, COLLECTIVES) == row["scheduled_sent_B"],
                            "faults": len(run.faults), "max_abs_diff": got["max_abs_diff"]})
                if run.faults:
                    row["note"] = "; ".join(run.faults)
            rows.append(row)
    return rows


def switch_table(runs: Runs) -> list[dict]:
    from workbench.hepti.plan import ws_fixed_bytes

    opts = runs.opts
    shape, L = _shape(opts)
    devices = run_devices(opts)
    name = devices[opts.fall_device].name
    free = ws_fixed_bytes(shape, L) / 2
    base = runs.measure("no fall (Hepti's mode)", devices)
    fell = runs.measure(f"{name}'s memory falls at layer {opts.fall_layer}", devices,
                        memory_falls={name: (opts.fall_layer, free)})
    if base is None or fell is None:
        return []
    run = fell["runs"][-1]
    switches = run.switches()
    first = switches[0] if switches else None
    before = [d for d in run.decisions if first is not None and d.layer < first.layer]
    predicted_base = schedule_s(base["runs"][-1], devices, shape, L)
    predicted_fell = schedule_s(run, devices, shape, L)
    decide = [s.duration for s in run.timeline.spans
              if first is not None and s.layer == first.layer and s.event == "decision"]
    cost, predicted_cost = fell["measured_s"] - base["measured_s"], predicted_fell - predicted_base
    overhead = lambda got: statistics.median(sum(runtime_overhead_s(r)) for r in got["runs"])
    runtime_cost = overhead(fell) - overhead(base)
    return [{"device": name, "fall_layer": opts.fall_layer, "free_MB": free / 1e6,
             "ws_needs_MB": ws_fixed_bytes(shape, L) / 1e6, "switched": bool(switches),
             "switch_layer": first.layer if first else "", "from_mode": before[-1].mode if before else "",
             "to_mode": first.mode if first else "", "why": first.changed if first else "",
             "repeats": len(fell["runs"]), "baseline_ms": _ms(base["measured_s"]), "switched_ms": _ms(fell["measured_s"]),
             "cost_ms": _ms(cost), "schedule_baseline_ms": _ms(predicted_base), "schedule_switched_ms": _ms(predicted_fell),
             "schedule_cost_ms": _ms(predicted_cost), "runtime_cost_ms": _ms(runtime_cost),
             "unexplained_ms": _ms(cost - predicted_cost - runtime_cost),
             "decide_ms": _ms(max(decide)) if decide else "",
             "max_abs_diff": max(base["max_abs_diff"], fell["max_abs_diff"])}]


def fault_table(runs: Runs) -> list[dict]:
    opts = runs.opts
    shape, L = _shape(opts)
    devices = run_devices(opts)
    name = devices[opts.kill_device].name
    base = runs.measure("no fault (Hepti's mode)", devices)
    hit = runs.measure(f"{name} killed at layer {opts.kill_layer}", devices, kill_at=(name, opts.kill_layer))
    if base is None or hit is None:
        return []
    detection, restart, resumed, before_kill = [], [], [], []
    for run, called, stamps in zip(hit["runs"], hit["calls"], hit["stamps"]):
        marks = [s for s in run.timeline.spans if s.event == "fault"]
        if not marks:
            continue
        mark = marks[0].start                         # on the run's clock (0 at the primary's first report)
        after = [s for s in run.timeline.spans if s.start > mark and s.event != "fault"]
        cut = [t - run.started_at for t in stamps if t - run.started_at <= mark]
        if cut:                                      # the last progress report before the fault killed the device
            detection.append(mark - cut[-1])
            before_kill.append(cut[-1] - cut[0])
        if after:
            first = min(s.start for s in after)
            restart.append(first - mark)
            resumed.append(max(s.end for s in after) - first)
    run = hit["runs"][-1]
    med = lambda xs: _ms(statistics.median(xs)) if xs else ""
    resumed_at = run.decisions[-1].layer if run.faults else ""
    return [{"device": name, "kill_layer": opts.kill_layer, "mode": run.partition.mode,
             "faults": len(run.faults), "fault": run.faults[0] if run.faults else "",
             "named_device": bool(run.faults) and f"({name})" in run.faults[0],
             "resumed_layer": resumed_at, "devices_after": len(run.decisions[-1].shares),
             "redecision": run.decisions[-1].changed, "repeats": len(hit["runs"]),
             "baseline_ms": _ms(base["measured_s"]), "fault_latency_ms": _ms(hit["measured_s"]),
             "time_lost_ms": _ms(hit["measured_s"] - base["measured_s"]),
             "inference_before_kill_ms": med(before_kill), "detection_ms": med(detection),
             "restart_ms": med(restart), "resumed_run_ms": med(resumed),
             "charged_to_cut_run_ms": _ms(hit["measured_s"]) - med(resumed) if resumed else "",
             "max_abs_diff": max(base["max_abs_diff"], hit["max_abs_diff"])}]
