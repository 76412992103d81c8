"""`workbench bench hepti`: Hepti's partitioner and its runs on unequal devices.

Every number is measured on this machine or computed by the engine (:func:`~workbench.hepti.plan.hepti_partition`,
the executed schedule of :mod:`workbench.hepti.run`); none is typed in. Tables:

- ``lp``: how long :func:`hepti_partition` takes (the mixed-integer P2 for WS and 1D-tiled, the 2D split
  as an LP once per axis) for 4, 16 and 64 heterogeneous devices drawn from ``--seed`` (varied speeds,
  memories and links): ``ample`` memory (every device holds what WS needs: WS is solved) and ``short`` (every
  fourth secondary cannot: 1D-tiled below 16 devices, 2D-tiled from 16); the median and p95 of
  ``--lp-repeats`` calls after one untimed call, beside one bare LP over the same devices (target: within
  3x of it at 16 devices) and the old heuristic (the LP with a greedy participation search), with the
  latency each predicts and that of the LP relaxation over every device.
- ``modes``: each mode (WS, 1D- and 2D-tiled, forced with ``mode=``) on one process per device, the devices
  unequal (``--speeds-gflops``, ``--bandwidths-mbit``) and, with ``--runs measured`` (the default), each rank
  under its device's CPU limit on a tc-shaped link (``replay``: compute and links padded to the profiles;
  the ``run`` column says which), ``adapt=False`` so the first decision holds: Hepti's prediction (Eq. 7 of its shares),
  the executed split's schedule (heads and sizes as run, link latency included), the measured latency
  (median of ``--repeats`` runs) and the errors; the bytes counted by the ranks beside the schedule's;
  the largest difference of the outputs from the model in one process.
- ``shares``: Hepti's shares against even shares and shares in proportion to speed (Voltage's) in the
  same mode, on the same devices (``unequal``), with one fast device short of memory (``memory-short``:
  the mode becomes 1D-tiled and the LP caps that device's share) and with one slow link (``slow-link``):
  predicted and measured latency, bytes moved (every byte the ranks counted sending). A baseline the
  engine refuses (a device that cannot hold its share) is a row with the engine's reason.
- ``switch``: a device's free memory falls below what WS needs at ``--fall-layer``: the run switches
  mode there; its latency against the same run without the fall, beside the schedule's difference (the
  layers after the switch in the new mode) and the difference in the primary's report gathers and
  decisions; what the decision at the switch itself took on the slowest rank.
- ``fault``: a device's process is killed (SIGKILL) at ``--kill-layer``: the run's latency against the
  same run without the fault, the time lost; from the kill to the fault being handled (detection: the
  progress report that killed it to the fault mark in the measured timeline) and from the fault mark to
  the resumed run's first span (restart: new processes, the model loaded, the re-partition).

Process start-up (several seconds a run on a 2-core host) is not in any latency; each run starts its own
processes. ``--quick`` (the tests) makes every table in about a minute.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import replace

from workbench.argtypes import Bound, Parser, count, positive, seed
from workbench.bench import add_quick_argument, parse_with_quick
from workbench.distributed import limits

TABLES = ("lp", "modes", "shares", "switch", "fault")
RUN_MODES = ("ws", "1d", "2d")
SHARES = ("hepti", "even", "proportional")
SCENARIOS = ("unequal", "memory-short", "slow-link")
LP_CASES = ("ample", "short")
SOLVE_TARGET_X = 3.0
"""The mixed-integer program should solve within 3x a bare LP of the same size at 16 devices."""
MODEL = "encoder"
SEED = 0
"""The input tokens' seed: the runs and the model in one process read the same input."""

QUICK = {"seq_len": 64, "repeats": 1, "lp_repeats": 3, "lp_ks": [4, 16], "scenarios": ["unequal"], "runs": "replay"}
"""--quick: a shorter input, one run per point, three timed solves at 4 and 16 devices (64 take seconds a
solve), the shares on the unequal devices only,
the runs replayed (a measured run calibrates its CPU limits first: tens of seconds a run)."""
RUNS = ("measured", "replay")

LAYER = count(1, unit="layer", at_most=Bound(5, "the encoder's last layer (6 layers, from 0)"))
DEVICE = count(1, unit="device index", at_most=Bound(limits.ranks.maximum - 1, "the last worker process"))
SHORT_MB = positive("MB", Bound(1e7, "10 TB, beyond any edge device"))


def parser() -> Parser:
    p = Parser(prog="workbench bench hepti",
               description="Hepti's partitioner: LP solve time for 4-64 devices; each mode, Hepti's shares against "
                           "even and proportional ones, a mode switch and a re-partition after a fault, measured on "
                           "emulated unequal devices beside the cost model")
    p.add_argument("--seq-len", type=limits.seq_len, default=128, help="input positions T of the runs")
    p.add_argument("--speeds-gflops", nargs="+", type=limits.speed_gflops, default=[3.0, 6.0, 4.0, 2.0],
                   help="the run devices' speeds, one per device (the first the primary); slow enough that this "
                        "host keeps up with the emulation")
    p.add_argument("--bandwidths-mbit", nargs="+", type=limits.bandwidth_mbit, default=[1000.0, 1000.0, 500.0, 300.0],
                   help="the run devices' links, one per device")
    p.add_argument("--memory-gb", type=limits.memory_gb, default=4.0, help="the run devices' free memory")
    p.add_argument("--short-device", type=DEVICE, default=1,
                   help="memory-short scenario: the device (index) short of memory")
    p.add_argument("--short-memory-mb", type=SHORT_MB, default=12.0,
                   help="memory-short scenario: its free memory (below what WS needs, so 1D-tiled)")
    p.add_argument("--slow-device", type=DEVICE, default=3, help="slow-link scenario: the device (index) on a slow link")
    p.add_argument("--slow-link-mbit", type=limits.bandwidth_mbit, default=10.0, help="slow-link scenario: its link")
    p.add_argument("--modes", nargs="+", choices=RUN_MODES, default=list(RUN_MODES), help="modes run for real")
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS),
                   help="devices on which the shares are compared")
    p.add_argument("--fall-device", type=DEVICE, default=2, help="the device (index) whose free memory falls")
    p.add_argument("--fall-layer", type=LAYER, default=3, help="the layer from which its memory is lower")
    p.add_argument("--kill-device", type=DEVICE, default=2, help="the device (index) whose process is killed")
    p.add_argument("--kill-layer", type=LAYER, default=3, help="the layer at whose start it is killed")
    p.add_argument("--repeats", type=limits.repeats, default=3, help="runs per point (the median is kept)")
    p.add_argument("--runs", choices=RUNS, default="measured",
                   help="measured: each rank under its device's CPU limit on a tc-shaped link (root needed; "
                        "otherwise at this host's speed, and the rows say so); replay: padded to the profiles")
    p.add_argument("--lp-ks", nargs="+", type=limits.devices, default=[4, 16, 64],
                   help="device counts whose partition is timed")
    p.add_argument("--lp-repeats", type=limits.repeats, default=50, help="timed calls per LP point")
    p.add_argument("--seed", type=seed, default=0,
                   help="the LP table's devices are drawn from this seed")
    p.add_argument("--tables", nargs="+", choices=TABLES, default=list(TABLES), help="tables to make")
    add_quick_argument(p, QUICK)
    return p


def options(args: list[str]):
    p = parser()
    opts = parse_with_quick(p, args, QUICK)
    K = len(opts.speeds_gflops)
    if len(opts.bandwidths_mbit) != K:
        p.error(f"--bandwidths-mbit: one per device, {K} as --speeds-gflops gives, got {len(opts.bandwidths_mbit)}")
    if K < 2:
        p.error("--speeds-gflops: at least two devices (the primary and one more)")
    if K > limits.ranks.maximum:
        p.error(f"--speeds-gflops: at most {limits.ranks.maximum:.0f} devices ({limits.ranks.at_most.why}), got {K}")
    for name in ("short_device", "slow_device", "fall_device", "kill_device"):
        if getattr(opts, name) >= K:
            p.error(f"--{name.replace('_', '-')}: a secondary device, 1 to {K - 1}, got {getattr(opts, name)}")
    if opts.seq_len < K:
        p.error(f"--seq-len {opts.seq_len} is shorter than the {K} devices it would be split over")
    return opts


# ----------------------------------------------------------------------------- devices

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


def lp_devices(K: int, case: str, seed: int, shape, num_layers: int) -> list:
    """K heterogeneous devices drawn from ``seed``: 1 to 12 GFLOP/s, 0.5 to 4 GB, 50 to 1000 Mbit/s; in the
    ``short`` case every fourth secondary (1, 5, 9, ...) has 30-90 % of what WS needs."""
    import numpy as np

    from workbench.devices import GB, PRESETS
    from workbench.hepti.plan import ws_fixed_bytes

    rng = np.random.default_rng([seed, K])
    ws_needs = ws_fixed_bytes(shape, num_layers)
    devices = []
    for i in range(K):
        speed, memory, link = rng.uniform(1e9, 12e9), rng.uniform(0.5, 4) * GB, rng.uniform(50, 1000) * 1e6 / 8
        short = rng.uniform(0.3, 0.9) * ws_needs
        if case == "short" and i % 4 == 1:
            memory = short
        devices.append(replace(PRESETS["rpi4"], name=f"dev{i}", title=f"device {i}", flops_per_s=float(speed),
                               memory_bytes=float(memory), net_bytes_per_s=float(link)))
    return devices


def _ms(seconds: float) -> float:
    return 1e3 * seconds


def _error_pct(measured: float, predicted: float) -> float:
    return 100.0 * (measured - predicted) / predicted if predicted > 0 else math.inf


def _shares_text(shares) -> str:
    return "/".join(f"{s + 0.0:.3f}" for s in shares)


# ----------------------------------------------------------------------------- lp

def _timed(call, repeats: int) -> tuple[object, list[float]]:
    """``call()`` once untimed (imports, warm-up), then ``repeats`` timed calls; (its result, the times)."""
    first = call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return first, times


def relaxation_ms(devices, shape, num_layers: int, mode: str) -> float:
    """Eq. 7 of the LP relaxation over every device, its shares rounded to whole units (no participation
    search): what the bare LP alone would give; "" where the mode has no single axis."""
    from workbench.hepti.plan import largest_remainder, layer_latency, solve_shares, split_units

    if mode not in ("ws", "1d"):
        return ""
    solved = solve_shares(mode, shape, devices, num_layers)
    if solved is None:
        return ""
    U = split_units(mode, shape)
    units = largest_remainder(U, list(solved[0]))
    return _ms(layer_latency(mode, shape, [a / U for a in units], devices)[0] * num_layers)


def lp_table(opts) -> list[dict]:
    """Per device count and memory case: :func:`hepti_partition` with the mixed-integer program (the default),
    with the old heuristic (``solver="lp"``), and one bare LP over every device (:func:`solve_shares`), timed
    in the same run; the latency each predicts."""
    import numpy as np

    from workbench.models.shapes import get_shape
    from workbench.hepti.plan import hepti_partition, solve_shares
    from workbench.hepti.run import shape_of

    model = get_shape(MODEL)
    shape = shape_of(model, opts.seq_len)
    L = model.num_layers
    rows = []
    for K in opts.lp_ks:
        for case in LP_CASES:
            devices = lp_devices(K, case, opts.seed, shape, L)
            part, times = _timed(lambda: hepti_partition(devices, shape, num_layers=L), opts.lp_repeats)
            old, old_times = _timed(lambda: hepti_partition(devices, shape, num_layers=L, solver="lp"), opts.lp_repeats)
            bare_mode = part.mode if part.mode in ("ws", "1d") else "1d"
            _, bare_times = _timed(lambda: solve_shares(bare_mode, shape, devices, L), opts.lp_repeats)
            median, bare = statistics.median(times), statistics.median(bare_times)
            rows.append({"K": K, "case": case, "mode": part.mode, "grid": f"{part.grid[0]}x{part.grid[1]}",
                         "participants": len(part.participants),
                         "dropped": sum("dropped" in r for r in part.reasons),
                         "repeats": opts.lp_repeats, "median_ms": _ms(median),
                         "p95_ms": _ms(float(np.percentile(times, 95))),
                         "min_ms": _ms(min(times)), "max_ms": _ms(max(times)),
                         "bare_lp_ms": _ms(bare), "over_bare_lp": median / bare,
                         "within_target": median <= SOLVE_TARGET_X * bare,
                         "heuristic_ms": _ms(statistics.median(old_times)),
                         "predicted_ms": _ms(part.predicted_latency_s),
                         "heuristic_predicted_ms": _ms(old.predicted_latency_s),
                         "heuristic_participants": len(old.participants),
                         "relaxation_predicted_ms": relaxation_ms(devices, shape, L, part.mode),
                         "primary_share": part.shares[0] + 0.0})
            r = rows[-1]
            relaxed = r["relaxation_predicted_ms"]
            print(f"  K={K:3d} {case:6s} -> {part.mode:2s} over {r['participants']:2d} devices: solve median "
                  f"{r['median_ms']:.2f} ms ({r['over_bare_lp']:.1f}x a bare LP's {r['bare_lp_ms']:.2f} ms; the old "
                  f"heuristic {r['heuristic_ms']:.2f} ms); predicts {r['predicted_ms']:.1f} ms (heuristic "
                  f"{r['heuristic_predicted_ms']:.1f} ms over {r['heuristic_participants']}"
                  + (f", LP relaxation over all {relaxed:.1f} ms" if relaxed != "" else "") + ")", flush=True)
    return rows


# ----------------------------------------------------------------------------- runs

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


# ----------------------------------------------------------------------------- summary

def print_summary(tables: dict[str, list[dict]], runs: Runs) -> None:
    opts = runs.opts
    for r in tables.get("lp", []):
        if r["K"] == 16:
            print(f"P2 solve, 16 devices ({r['case']} memory -> {r['mode']}): median {r['median_ms']:.2f} ms, "
                  f"{r['over_bare_lp']:.1f}x a bare LP ({r['bare_lp_ms']:.2f} ms); target {SOLVE_TARGET_X:g}x: "
                  f"{'met' if r['within_target'] else 'MISSED'}")
    lp = tables.get("lp", [])
    if lp:
        print("P2 solve medians (MILP / old heuristic / bare LP): " + ", ".join(
            f"K={r['K']} {r['case']} {r['median_ms']:.1f}/{r['heuristic_ms']:.1f}/{r['bare_lp_ms']:.1f} ms" for r in lp))
        print("predicted latency (MILP / old heuristic / LP relaxation over all): " + ", ".join(
            f"K={r['K']} {r['case']} {r['predicted_ms']:.0f}/{r['heuristic_predicted_ms']:.0f}/"
            + (f"{r['relaxation_predicted_ms']:.0f}" if r["relaxation_predicted_ms"] != "" else "-") + " ms" for r in lp))
    for r in lp:
        if r["primary_share"] <= 0:
            print(f"  K={r['K']} {r['case']}: the primary gets a share of 0 ({r['mode']} over "
                  f"{r['participants']} other devices): the primary takes no part")
    for r in tables.get("modes", []):
        print(f"{r['mode']:2s} on {r['K']} unequal devices, T={r['T']}: {r['run']} {r['measured_ms']:.1f} ms, Hepti predicts "
              f"{r['predicted_ms']:.1f} ms ({r['error_pct']:+.1f} %), the executed split's schedule "
              f"{r['schedule_ms']:.1f} ms ({r['schedule_error_pct']:+.1f} %; {r['error_without_runtime_pct']:+.1f} % without "
              f"the primary's {r['reports_ms']:.1f} ms of report gathers and {r['decide_ms']:.1f} ms of decisions); bytes counted equal the schedule: "
              f"{'yes' if r['counted_equal_schedule'] else 'NO'}; outputs within {r['max_abs_diff']:.1e} of the model")
    by = {(r["scenario"], r["shares_kind"]): r for r in tables.get("shares", [])}
    for scenario in opts.scenarios:
        parts = []
        for kind in SHARES:
            r = by.get((scenario, kind))
            if r is None:
                continue
            if r["measured_ms"] == "":
                parts.append(f"{kind}: {r['note'] or 'not run'}")
            else:
                parts.append(f"{kind} {r['measured_ms']:.1f} ms measured / {r['predicted_ms']:.1f} predicted, "
                             f"{r['sent_B'] / 1e3:.0f} kB sent")
        if parts:
            mode = next(r["mode"] for (s, _), r in by.items() if s == scenario)
            print(f"shares, {scenario} devices ({mode}): " + "; ".join(parts))
        hepti, prop = by.get((scenario, "hepti")), by.get((scenario, "proportional"))
        if hepti and prop and hepti["shares"] and hepti["shares"] == prop["shares"]:
            print(f"  {scenario}: Hepti's MILP shares equal the proportional ones (memory does not bind, links fast "
                  f"enough that compute balance wins)")
        bad = [r for r in by.values() if r["scenario"] == scenario and r["max_abs_diff"] != "" and r["max_abs_diff"] >= 1e-3]
        for r in bad:
            print(f"  {scenario} {r['shares_kind']}: outputs DIFFER from the model in one process by "
                  f"{r['max_abs_diff']:.3g} (shares {r['shares']}" + (f"; {r['faults']} faults without a kill: "
                  f"{r['note']}" if r["faults"] else "") + ")")
    for r in tables.get("switch", []):
        if r["switched"]:
            print(f"mode switch: {r['device']}'s memory fell to {r['free_MB']:.1f} MB at layer {r['fall_layer']} -> "
                  f"{r['from_mode']} to {r['to_mode']} at layer {r['switch_layer']}; measured {r['switched_ms']:.1f} ms "
                  f"against {r['baseline_ms']:.1f} ms without the fall ({r['cost_ms']:+.1f} ms; the schedule says "
                  f"{r['schedule_cost_ms']:+.1f} ms, the primary's report gathers and decisions {r['runtime_cost_ms']:+.1f} ms, "
                  f"unexplained {r['unexplained_ms']:+.1f} ms); the decision at the "
                  f"switch took {r['decide_ms']:.2f} ms on the slowest rank")
        else:
            print(f"mode switch: NO switch recorded after {r['device']}'s memory fell at layer {r['fall_layer']}")
    for r in tables.get("fault", []):
        print(f"fault: {r['device']} killed at layer {r['kill_layer']} ({r['mode']}): latency {r['fault_latency_ms']:.1f} ms "
              f"against {r['baseline_ms']:.1f} ms without ({r['time_lost_ms']:+.1f} ms lost); resumed at layer "
              f"{r['resumed_layer']} over {r['devices_after']} devices; detection {r['detection_ms']:.0f} ms, restart "
              f"(new processes, model, re-partition) {r['restart_ms']:.0f} ms, not in the latency; of the latency "
              f"{r['charged_to_cut_run_ms']:.0f} ms is charged to the cut run, whose inference before the kill took "
              f"{r['inference_before_kill_ms']:.0f} ms")
    if runs.failures:
        print(f"{len(runs.failures)} runs failed: " + "; ".join(runs.failures))


# ----------------------------------------------------------------------------- the run

def run(args: list[str]) -> dict[str, list[dict]]:
    from workbench.prediction import host_load

    opts = options(args)
    t0 = time.perf_counter()
    load = host_load()
    command = f"$ workbench bench hepti {' '.join(args)}".rstrip()
    print(command)
    devices = run_devices(opts)
    print(f"host: {load.cores} cores, load {load.load_1min:.2f}; runs: {len(devices)} emulated devices "
          + ", ".join(f"{d.name} {d.flops_per_s / 1e9:g} GFLOP/s {d.net_bytes_per_s * 8 / 1e6:g} Mbit/s" for d in devices)
          + f"; {MODEL} T = {opts.seq_len}; {opts.repeats} runs per point (medians)", flush=True)
    tables: dict[str, list[dict]] = {}
    if "lp" in opts.tables:
        tables["lp"] = lp_table(opts)
    runs = Runs(opts)
    makers = {"modes": modes_table, "shares": shares_table, "switch": switch_table, "fault": fault_table}
    for name, make in makers.items():
        if name in opts.tables:
            tables[name] = make(runs)
    print(f"\n== summary ({time.perf_counter() - t0:.0f} s)\n{command}")
    print_summary(tables, runs)
    return tables
