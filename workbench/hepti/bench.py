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
The four tables of real runs, and the runs they share, are made in :mod:`workbench.hepti.bench_runs`.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import replace

from workbench.argtypes import Bound, Parser, count, positive, seed
from workbench.bench import add_quick_argument, parse_with_quick
from workbench.distributed import limits
from workbench.hepti.bench_runs import (MODEL, RUN_MODES, SHARES, Runs, _ms, fault_table, modes_table, run_devices,
                                         shares_table, switch_table)

TABLES = ("lp", "modes", "shares", "switch", "fault")
SCENARIOS = ("unequal", "memory-short", "slow-link")
LP_CASES = ("ample", "short")
SOLVE_TARGET_X = 3.0
"""The mixed-integer program should solve within 3x a bare LP of the same size at 16 devices."""

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
