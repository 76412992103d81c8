"""The evaluation notebook's tables and the statements its prose makes, computed here so the notebook only calls
and displays, and a test checks every statement against the engine.

The devices are the ``hepti`` cluster's four boards; predictions take the shipped encoder at T = 128, live runs
T = 32 on the same boards at a quarter of their speed (:data:`RUN_T`, :func:`run_boards`). Each table is a list
of plain dicts (one a row), which the notebook turns into a DataFrame.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from workbench.devices import GB, PRESETS, DeviceProfile, get_cluster
from workbench.distributed.shares import proportional_shares
from workbench.errors import WorkbenchError
from workbench.hepti.plan import Partition, hepti_partition, ws_fixed_bytes
from workbench.models.shapes import get_shape

PREDICT_T = 128
RUN_T = 32
"""Live runs: a few seconds each on a shared host, process start included."""
RUN_SLOWDOWN = 4
"""Live runs take the boards at a quarter of their speed, so that four processes on a 2-core host keep up."""
COUNTS = (1, 2, 4, 8, 15, 16, 17, 32, 64)
MEMORY_ROWS_MB = (8, 16, 24, "ws", 34, 48, 4000)
"""The mode map's rows: secondaries' free MB ("ws": exactly what WS needs)."""
KILL_LAYER, FALL_LAYER = 1, 3


def encoder():
    return get_shape("encoder")


def workload(T: int = PREDICT_T):
    from workbench.hepti.run import shape_of

    return shape_of(encoder(), T)


def boards() -> list[DeviceProfile]:
    return list(get_cluster("hepti").devices)


def run_boards() -> list[DeviceProfile]:
    return [replace(d, flops_per_s=d.flops_per_s / RUN_SLOWDOWN) for d in boards()]


def baselines(devices: Sequence[DeviceProfile]) -> dict[str, list[float] | None]:
    """Hepti's program and the two baselines in the same mode: even shares, shares in proportion to speed."""
    return {"Hepti": None, "even": [1 / len(devices)] * len(devices),
            "proportional": list(proportional_shares(devices))}


def solve(devices: Sequence[DeviceProfile], shape=None, shares=None, **options) -> Partition | str:
    """The engine's partition, or its reason for refusing one (a device that cannot hold its share)."""
    try:
        return hepti_partition(devices, shape or workload(), num_layers=encoder().num_layers, fixed_shares=shares,
                               **options)
    except WorkbenchError as exc:
        return str(exc)


def split_text(p: Partition) -> str:
    return ", ".join(f"{d.name} {s:.3f}" for d, s in zip(p.devices, p.shares) if s > 0)


def changed(name: str, **changes) -> list[DeviceProfile]:
    return [replace(d, **changes) if d.name == name else d for d in boards()]


def scenarios() -> dict[str, list[DeviceProfile]]:
    return {"the four boards": boards(), "rpi4-b with 12 MB free": changed("rpi4-b", memory_bytes=12e6),
            "rpi3's link at 10 Mbit/s": changed("rpi3", net_bytes_per_s=10e6 / 8)}


def shares_table() -> list[dict]:
    """Hepti against even and proportional shares, predicted, per scenario; the last row the three boards of the
    slow-link scenario set by hand."""
    rows = []
    for scenario, devices in scenarios().items():
        for name, shares in baselines(devices).items():
            p = solve(devices, shares=shares)
            rows.append({"devices": scenario, "shares": name} | (
                {"mode": p.mode, "split": split_text(p), "predicted ms": round(1e3 * p.predicted_latency_s, 1),
                 "binding / reason": p.binding if name == "Hepti" else ""} if not isinstance(p, str) else
                {"mode": "refused", "split": "", "predicted ms": float("nan"), "binding / reason": p}))
    by_hand = solve(scenarios()["rpi3's link at 10 Mbit/s"][:3])
    rows.append({"devices": "rpi3's link at 10 Mbit/s", "shares": "Hepti, rpi3 left out by hand", "mode": by_hand.mode,
                 "split": split_text(by_hand), "predicted ms": round(1e3 * by_hand.predicted_latency_s, 1),
                 "binding / reason": by_hand.binding})
    return rows


def lookup(rows: list[dict], devices: str, shares: str) -> dict:
    return next(r for r in rows if r["devices"] == devices and r["shares"] == shares)


def predicted_gain(rows: list[dict]) -> float:
    """Even shares' predicted latency over Hepti's on the four boards."""
    return lookup(rows, "the four boards", "even")["predicted ms"] / lookup(rows, "the four boards", "Hepti")["predicted ms"]


# -- live runs of the three share rules

def counted_bytes(run, kinds=("all_gather", "all_reduce", "send")) -> int:
    return sum(c["sent"] for segment in run.counts for rank in segment for c in rank if c["kind"] in kinds)


def scheduled_bytes(partition: Partition, T: int) -> int:
    from workbench.hepti.run import predicted_steps

    return sum(t.sent for step in predicted_steps(partition, workload(T), encoder().num_layers) for t in step.traffic)


def own_overhead_ms(run) -> float:
    """The primary's time gathering the layers' reports and in Hepti's decisions."""
    lane = f"device {run.partition.devices[0].name}"
    return 1e3 * sum(s.end - s.start for s in run.timeline.spans if s.lane == lane
                     and s.event in ("report", "decision"))


def run_plans() -> dict[str, Partition]:
    devices = run_boards()
    return {name: solve(devices, workload(RUN_T), shares) for name, shares in baselines(devices).items()}


def live_runs(run=None) -> dict:
    """One replayed run per share rule on the slowed boards at T = 32 (proportional reuses Hepti's run where
    the two give the same integer split)."""
    from workbench.hepti.run import run_hepti

    run = run or run_hepti
    plans, runs = run_plans(), {}
    same = (plans["proportional"].sizes, plans["proportional"].heads) == (plans["Hepti"].sizes, plans["Hepti"].heads)
    for name, shares in baselines(run_boards()).items():
        if name == "proportional" and same:
            runs[name] = runs["Hepti"]
            continue
        runs[name] = run(run_boards(), seq_len=RUN_T, adapt=False, shares=shares)
    return runs


def live_table(runs: dict) -> list[dict]:
    return [{"shares": name, "split (rows)": dict(zip((d.name for d in run_boards()), run.partition.sizes)),
             "cost model ms": round(1e3 * run.partition.predicted_latency_s, 1),
             "schedule ms": round(1e3 * run.predicted.end, 1), "measured ms": round(1e3 * run.latency_s, 1),
             "run": run.label, "reports + decisions ms": round(own_overhead_ms(run), 1),
             "bytes counted": counted_bytes(run), "bytes scheduled": scheduled_bytes(run.partition, RUN_T),
             "report bytes": counted_bytes(run, ("report",))} for name, run in runs.items()]


# -- the mode by device count and memory

def ws_needs_mb() -> float:
    return ws_fixed_bytes(workload(), encoder().num_layers) / 1e6


def memory_rows() -> dict[str, float]:
    """Row label -> the secondaries' free MB."""
    return {(f"{ws_needs_mb():.2f} (what WS needs)" if mb == "ws" else str(mb)): (ws_needs_mb() if mb == "ws" else mb)
            for mb in MEMORY_ROWS_MB}


def copies(K: int, memory_mb: float) -> list[DeviceProfile]:
    """K copies of the four boards in turn, the primary with its own memory, every secondary ``memory_mb``."""
    b = boards()
    return [replace(b[i % 4], name=f"{b[i % 4].name}-{i}",
                    memory_bytes=b[0].memory_bytes if i == 0 else memory_mb * 1e6) for i in range(K)]


def mode_cell(p: Partition | str) -> str:
    if isinstance(p, str):
        return "none fits"
    text = p.mode + (f" {p.grid[0]}x{p.grid[1]}" if p.mode == "2d" else "")
    taking = len(p.participants)
    return text + (f" ({taking} of {len(p.devices)})" if taking < len(p.devices) else "")


def mode_map() -> dict[str, dict[int, str]]:
    """Row label -> {device count: cell}."""
    return {label: {K: mode_cell(solve(copies(K, mb))) for K in COUNTS} for label, mb in memory_rows().items()}


def latency_by_count(memory_mb: float = 4000) -> dict[int, float]:
    """Device count -> predicted ms with every secondary holding ``memory_mb``."""
    return {K: round(1e3 * solve(copies(K, memory_mb)).predicted_latency_s, 1) for K in COUNTS}


# -- solve times

def drawn(K: int, case: str, seed: int = 0) -> list[DeviceProfile]:
    """K devices at random (1 to 12 GFLOP/s, 0.5 to 4 GB, 50 to 1000 Mbit/s); ``short``: every fourth secondary
    holds 30-90 % of what WS needs."""
    import numpy as np

    rng = np.random.default_rng([seed, K])
    devices = []
    for i in range(K):
        speed, memory, mbit = rng.uniform(1e9, 12e9), rng.uniform(0.5, 4) * GB, rng.uniform(50, 1000)
        if case == "short" and i % 4 == 1:
            memory = rng.uniform(0.3, 0.9) * ws_fixed_bytes(workload(), encoder().num_layers)
        devices.append(replace(PRESETS["rpi4"], name=f"dev{i}", flops_per_s=float(speed), memory_bytes=float(memory),
                               net_bytes_per_s=float(mbit * 1e6 / 8)))
    return devices


SOLVE_REPEATS = {"full": 15, "quick": 3}
"""Timed solves per point of :func:`solve_times` by preset: 64 devices take about a second a solve."""


def solve_times(repeats: int | None = None, counts: Sequence[int] = (4, 16, 64),
                clock: Callable[[], float] = time.perf_counter) -> list[dict]:
    """Per device count and memory case: the mode, the median and 95th percentile of ``repeats`` timed calls
    after one untimed (by default :data:`SOLVE_REPEATS` of the preset), beside a layer's predicted time."""
    import numpy as np

    from workbench.presets import default_preset

    repeats = SOLVE_REPEATS[default_preset()] if repeats is None else repeats
    rows = []
    for K in counts:
        for case in ("ample", "short"):
            devices = drawn(K, case)
            p = solve(devices)
            times = []
            for _ in range(repeats):
                start = clock()
                solve(devices)
                times.append(1e3 * (clock() - start))
            rows.append({"devices": K, "memory": case, "mode": mode_cell(p),
                         "median ms": round(statistics.median(times), 2),
                         "p95 ms": round(float(np.percentile(times, 95)), 2),
                         "a layer's predicted ms": round(1e3 * p.predicted_latency_s / encoder().num_layers, 1)})
    return rows


# -- a device lost, then memory falling

def fault_run(run=None):
    """The Jetson killed at layer 1, rpi4-b's memory falling to half what WS needs at layer 3 (slowed boards)."""
    from workbench.hepti.run import run_hepti

    fall = ws_fixed_bytes(workload(RUN_T), encoder().num_layers) / 2
    return (run or run_hepti)(run_boards(), seq_len=RUN_T, adapt=False, kill_at=("jetson-nano-cpu", KILL_LAYER),
                              memory_falls={"rpi4-b": (FALL_LAYER, fall)})


def decisions_table(run) -> list[dict]:
    return [{"layer": d.layer, "mode": d.mode, "devices": len(d.shares),
             "shares": ", ".join(f"{s:.3f}" for s in d.shares), "why": d.changed,
             "free MB": ", ".join(f"{b / 1e6:.1f}" for b in d.free_bytes)} for d in run.decisions]


def aligned(run):
    """(prediction, measurement) of ``run`` on one time axis, lanes named by device: the measured spans shifted
    so the resumed run starts where the prediction has that layer, the fault marked there."""
    spans = [s for s in run.timeline.spans if s.layer is not None and s.event != "fault"]
    first_layer = min(s.layer for s in spans)
    shift = min(s.start for s in run.predicted.spans if s.layer == first_layer) - min(s.start for s in spans)
    resumed = min(s.start for s in spans) + shift
    at = lambda s: (replace(s, start=s.start + shift, end=s.end + shift) if s.event != "fault"
                    else replace(s, lane=f"device {s.device}", rank=0, start=resumed, end=resumed))
    return (replace(run.predicted, spans=tuple(replace(s, lane=f"device {s.device}") for s in run.predicted.spans)),
            replace(run.timeline, spans=tuple(at(s) for s in run.timeline.spans)))


# -- the statements of the notebook's prose

@dataclass(frozen=True)
class Statement:
    text: str               # as the prose says it
    holds: bool
    found: str              # what the engine gave


def statements(rows: list[dict] | None = None, modes: dict | None = None,
               latencies: dict | None = None) -> list[Statement]:
    """Every statement the notebook's prose makes about the predictions, each checked on the engine."""
    rows = rows if rows is not None else shares_table()
    modes = modes if modes is not None else mode_map()
    latencies = latencies if latencies is not None else latency_by_count()
    four, tight, slow = (lookup(rows, s, "Hepti") for s in scenarios())
    by_hand = lookup(rows, "rpi3's link at 10 Mbit/s", "Hepti, rpi3 left out by hand")
    ws_row = next(label for label in modes if "what WS needs" in label)
    big = [K for K in COUNTS if K >= 16]
    steps = list(latencies.values())
    out = [
        Statement("on the four boards the program leaves the rpi3 out", "rpi3" not in four["split"], four["split"]),
        Statement("even shares and shares by speed predict worse than Hepti's on the four boards",
                  min(lookup(rows, "the four boards", b)["predicted ms"] for b in ("even", "proportional"))
                  > four["predicted ms"], f"{predicted_gain(rows):.2f}x even / Hepti"),
        Statement("with rpi4-b at 12 MB free the mode is 1D-tiled and rpi4-b takes no part",
                  tight["mode"] == "1d" and "rpi4-b" not in tight["split"], f"{tight['mode']}: {tight['split']}"),
        Statement("with rpi4-b at 12 MB free both baselines are refused",
                  all(lookup(rows, "rpi4-b with 12 MB free", b)["mode"] == "refused" for b in ("even", "proportional")),
                  ", ".join(lookup(rows, "rpi4-b with 12 MB free", b)["mode"] for b in ("even", "proportional"))),
        Statement("with the rpi3's link at 10 Mbit/s the program's split is the three-board split set by hand",
                  slow["split"] == by_hand["split"] and slow["predicted ms"] == by_hand["predicted ms"],
                  f"{slow['split']} vs {by_hand['split']}"),
        Statement("at exactly what WS needs (and at 34 MB) the secondaries run 1D-tiled, at 48 MB WS",
                  all(modes[ws_row][K].startswith("1d") and modes["34"][K].startswith("1d") for K in COUNTS if K > 1)
                  and all(modes["48"][K].startswith("ws") for K in COUNTS if K > 1),
                  f"4 devices: {modes[ws_row][4]}, {modes['34'][4]}, {modes['48'][4]}"),
        Statement("1D-tiled holds at 16 and more devices, as the optimum never has 16 taking part",
                  all(not modes["24"][K].startswith("2d") for K in big),
                  ", ".join(f"{K}: {modes['24'][K]}" for K in big)),
        Statement("at 4000 MB free the predicted latency never rises with more devices",
                  all(b <= a + 1e-9 for a, b in zip(steps, steps[1:])), ", ".join(f"{v:g}" for v in steps)),
    ]
    return out
