"""The simulator checked against real Ray Serve runs: the same plan, arrivals and exits served and simulated
(:func:`validate_simulator`), the replicas' slowdown and Ray Serve's own costs measured from a run
(:func:`measured_slowdown`, :func:`measured_overheads`), and a run predicted out of sample from another run's
calibration (:func:`calibrate`, :func:`predict_run`, :func:`validate_out_of_sample`). Errors are relative,
``(simulated - real) / real``, and held to :data:`VALIDATION_TARGET`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from workbench.earlyexit.pools import QUEUES
from workbench.errors import WorkbenchError

VALIDATION_TARGET = 0.2
"""The largest relative error of goodput and latency the simulator is held to against a real run."""


@dataclass(frozen=True)
class Validation:
    """A real Ray Serve run and the simulator on the same plan, arrivals and exits: the figures of each and
    the simulator's relative errors ``(simulated - real) / real``."""
    real_goodput: float
    sim_goodput: float
    real_p50_s: float
    sim_p50_s: float
    real_p95_s: float
    sim_p95_s: float
    requests: int
    target: float = VALIDATION_TARGET
    real_batch_counts: tuple = ()
    sim_batch_counts: tuple = ()
    note: str = ""
    sim: Any = field(default=None, repr=False, compare=False)
    real: Any = field(default=None, repr=False, compare=False)
    slowdown: dict = field(default_factory=dict)      # (split, replica) -> measured / profiled compute
    profile_only: Any = field(default=None, repr=False, compare=False)   # the simulation without it
    overheads: Any = None                               # ServingOverheads measured in the run

    @staticmethod
    def _error(sim: float, real: float) -> float:
        return (sim - real) / real if real else math.nan

    @property
    def goodput_error(self) -> float:
        return self._error(self.sim_goodput, self.real_goodput)

    @property
    def p50_error(self) -> float:
        return self._error(self.sim_p50_s, self.real_p50_s)

    @property
    def p95_error(self) -> float:
        return self._error(self.sim_p95_s, self.real_p95_s)

    @property
    def within_target(self) -> bool:
        return all(abs(e) <= self.target for e in (self.goodput_error, self.p50_error, self.p95_error))

    def row(self) -> dict:
        return {"requests": self.requests, "real_goodput": self.real_goodput, "sim_goodput": self.sim_goodput,
                "goodput_error_pct": 100 * self.goodput_error, "real_p50_ms": 1e3 * self.real_p50_s,
                "sim_p50_ms": 1e3 * self.sim_p50_s, "p50_error_pct": 100 * self.p50_error,
                "real_p95_ms": 1e3 * self.real_p95_s, "sim_p95_ms": 1e3 * self.sim_p95_s,
                "p95_error_pct": 100 * self.p95_error, "within_target": self.within_target,
                "target_pct": 100 * self.target, "note": self.note,
                "slowdown": " ".join(f"{i}.{r}:{f:.2f}" for (i, r), f in sorted(self.slowdown.items())),
                **({"entry_ms": 1e3 * self.overheads.entry_s, "hop_ms": 1e3 * self.overheads.hop_s,
                    "back_ms": 1e3 * self.overheads.back_s} if self.overheads is not None else {}),
                **({"profile_only_goodput_error_pct": 100 * self._error(self.profile_only.goodput, self.real_goodput),
                    "profile_only_p50_error_pct": 100 * self._error(self.profile_only.p50_latency_s, self.real_p50_s),
                    "profile_only_p95_error_pct": 100 * self._error(self.profile_only.p95_latency_s, self.real_p95_s)}
                   if self.profile_only is not None else {})}


def _arrivals_of(real, workload, arrival_s) -> np.ndarray:
    if arrival_s is not None:
        return np.asarray(list(arrival_s), dtype=float)
    if real.requests and hasattr(real.requests[0], "arrival_s"):
        return np.array([r.arrival_s for r in real.requests], dtype=float)
    if hasattr(workload, "arrival_s"):
        return np.asarray(workload.arrival_s, dtype=float)
    raise WorkbenchError("no arrival times: the real run's requests carry none and the workload has no "
                         "arrival_s; pass arrival_s=")


def measured_slowdown(real, layer_latency, gpu_types=None) -> dict[tuple[int, int], float]:
    """Per replica of a served run: the median over its batches of measured compute time / the layer profile's
    time for the same rows at each layer (E3 §3.3's straggler ratio). On a shared host it measures contention:
    replicas time-sharing cores with each other, with Ray and with whatever else runs."""
    ratios: dict[tuple[int, int], list[float]] = {}
    for span in real.timeline.spans:
        if span.kind != "compute" or "rows" not in span.meta:
            continue
        i, r = int(span.meta["split"]), int(span.meta["replica"])
        first = span.meta["layers"][0]
        gpu = gpu_types[i] if gpu_types else "host"
        profiled = sum(layer_latency(first + j, rows, gpu) for j, rows in enumerate(span.meta["rows"]) if rows)
        if profiled > 0:
            ratios.setdefault((i, r), []).append((span.end - span.start) / profiled)
    return {key: float(np.median(v)) for key, v in ratios.items()}


@dataclass(frozen=True)
class ServingOverheads:
    """What a served run spends outside the layers, medians over its requests: from arrival to the first
    split's replica, from a batch's end to the next split's replica, and from the exit to the driver.
    ``entry_samples`` and ``back_samples`` keep every request's own entry and return costs (seconds), so a
    prediction can draw them and carry Ray Serve's tail, not only its median, into the p95."""
    entry_s: float
    hop_s: float
    back_s: float
    entry_samples: tuple[float, ...] = field(default=(), repr=False)
    back_samples: tuple[float, ...] = field(default=(), repr=False)

    def draw(self, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Entry and return costs for ``n`` requests, drawn from the measured ones (the medians when none)."""
        rng = np.random.default_rng(seed)

        def one(samples, median):
            if not samples:
                return np.full(n, median)
            return rng.choice(np.asarray(samples, dtype=float), size=n, replace=True)
        return one(self.entry_samples, self.entry_s), one(self.back_samples, self.back_s)


def measured_overheads(real) -> ServingOverheads:
    """Ray Serve's own costs in a served run (:class:`ServingOverheads`), read from its timeline (each batch's
    spans name its requests and, per request, when it reached the replica) and its requests."""
    entered: dict[tuple[int, int], float] = {}
    ended: dict[tuple[int, int], float] = {}
    for span in real.timeline.spans:
        ids = [int(rid) for rid in span.meta.get("requests", ())]
        split = int(span.meta.get("split", 0))
        if span.kind == "queue":
            own = span.meta.get("entered") or [span.start] * len(ids)
            for rid, t in zip(ids, own):
                entered[(split, rid)] = float(t)
        elif span.kind == "compute":
            for rid in ids:
                ended[(split, rid)] = span.end
    by_id = {r.id: r for r in real.requests}
    entry = [max(0.0, entered[(0, i)] - r.arrival_s) for i, r in by_id.items() if (0, i) in entered]
    hops = [max(0.0, t - ended[(s - 1, i)]) for (s, i), t in entered.items() if s > 0 and (s - 1, i) in ended]
    back = [max(0.0, r.completion_s - r.exited_s) for r in real.requests
            if getattr(r, "exited_s", 0) and not getattr(r, "dropped", False)
            and math.isfinite(r.completion_s - r.exited_s)]

    def med(values):
        return float(np.median(values)) if values else 0.0
    return ServingOverheads(med(entry), med(hops), med(back), tuple(entry), tuple(back))


def _with_overheads(sim, overheads: ServingOverheads, slo_s: float, entry: np.ndarray | None = None,
                    back: np.ndarray | None = None) -> tuple[float, float, float]:
    """Goodput, p50 and p95 of a simulation run on arrivals shifted by the entry cost, with the entry and return
    costs added to every latency (the hops are in its transfers). ``entry``, ``back``: per request (by id), as
    :meth:`ServingOverheads.draw` gives them; default: the medians."""
    done = [r for r in sim.requests if r.latency_s is not None]
    if not done:
        return 0.0, math.nan, math.nan

    def cost(values, r, median):
        return float(values[r.id]) if values is not None else median
    lat = np.array([r.latency_s + cost(entry, r, overheads.entry_s) + cost(back, r, overheads.back_s)
                    for r in done])
    end = max(r.completion_s + cost(back, r, overheads.back_s) for r in done)
    return (float(np.sum(lat <= slo_s)) / end if end > 0 else 0.0, float(np.percentile(lat, 50)),
            float(np.percentile(lat, 95)))


def validate_simulator(model, plan, workload, layer_profile, slo_s: float, *,
                       serve: Callable[..., Any] | None = None, transfer_s: float | Sequence[float] = 0.0,
                       slack: float = 0.2, arrival_s: Sequence[float] | None = None, disabled: Iterable[int] = (),
                       target: float = VALIDATION_TARGET, cores: int | None = None,
                       batch_wait_s: float | None = None, **serve_kwargs) -> Validation:
    """Serve ``workload`` through ``plan`` for real (``serve``, by default
    :func:`workbench.earlyexit.serve.serve_plan`, called as ``serve(model, plan, workload, slo_s=slo_s,
    **serve_kwargs)``), then simulate the same plan on the same arrivals with each request's real exit layer
    and ``layer_profile``'s per-layer times (:class:`~workbench.earlyexit.profiles.LayerProfile`, the ramps of
    ``disabled`` layers left out), and compare goodput and the p50 and p95 latencies (target: within
    ``target``, 20%). Nothing is dropped in the simulation either (the real serving drops nothing).

    ``batch_wait_s``: the real replicas' longest wait for a full batch (passed on to ``serve``; None: its
    default); the simulated replicas wait as long (``simulate``'s ``batch_wait_s``), as Ray Serve's batcher does,
    and a simulated exit answers when its batch leaves the split, as the deployments answer. What still differs:
    Ray Serve queues per replica (its router picks one), the simulator keeps one queue per split, which
    matters only for splits with several replicas.

    Two costs outside the simulator's model are measured in the run and given to it: each replica's slowdown
    (:func:`measured_slowdown`: its compute spans against the profile, the paper's straggler ratio) as
    ``replica_slowdown``, since on a shared host replicas compute slower than the single-thread profile; and Ray
    Serve's own per-request costs (:func:`measured_overheads`: into the first queue, between splits, back to the
    driver) as shifted arrivals, transfers and a constant added to each latency. The simulator is then judged on
    what it models (batching, queues, exits and their timing); ``profile_only`` is the simulation with the
    profile alone, reported beside.

    ``note`` says when the comparison cannot hold: more replicas than ``cores`` (default: this machine's) compute
    at once on a real host while the profile is per core."""
    from workbench.earlyexit.simulator import simulate_plan

    if serve is None:
        from workbench.earlyexit.serve import serve_plan as serve
    if batch_wait_s is not None:
        serve_kwargs["batch_wait_s"] = batch_wait_s
    real = serve(model, plan, workload, slo_s=slo_s, **serve_kwargs)
    times = _arrivals_of(real, workload, arrival_s)
    L = plan.splits[-1][1]
    exits = [int(r.exit_layer) if getattr(r, "exit_layer", None) is not None else L - 1 for r in real.requests]
    if len(exits) != times.size:
        raise WorkbenchError(f"the real run answered {len(exits)} requests for {times.size} arrivals")
    off = frozenset(int(k) for k in disabled)
    lat = layer_profile.adapter(ramps=[k for k in range(L) if k not in off])
    if batch_wait_s is None:
        from workbench.earlyexit.serve import DEFAULT_BATCH_WAIT_S as batch_wait_s
    gpu_types = list(getattr(plan, "gpu_types", None) or ["host"] * len(plan.splits))
    slowdown = measured_slowdown(real, lat, gpu_types) if hasattr(real, "timeline") else {}
    common = dict(slo_s=slo_s, arrivals=times, layer_latency=lat, exits=exits, transfer_s=transfer_s, slack=slack,
                  drop="never", batch_wait_s=min(batch_wait_s, slo_s), exit_at_split_end=True)
    profile_only = simulate_plan(plan, **common)
    over = measured_overheads(real) if hasattr(real, "timeline") else ServingOverheads(0.0, 0.0, 0.0)
    n_links = len(plan.splits) - 1
    base_links = [float(transfer_s)] * n_links if not isinstance(transfer_s, Sequence) else list(transfer_s)
    calibrated = dict(common, arrivals=np.asarray(times) + over.entry_s,
                      transfer_s=[t + over.hop_s for t in base_links] or 0.0)
    sim = simulate_plan(plan, replica_slowdown=slowdown, **calibrated)
    sim_goodput, sim_p50, sim_p95 = _with_overheads(sim, over, slo_s)
    if cores is None:
        from workbench.argtypes import machine_cores

        cores = machine_cores()
    replicas = sum(plan.replicas)
    note = (f"{replicas} replicas on {cores} cores: more may compute at once than there are cores, and the "
            f"single-thread profile does not count their contention" if replicas > cores else "")
    real_counts = tuple(tuple(sorted(dict(c).items())) for c in getattr(real, "batch_counts", ()))
    sim_counts = tuple(tuple(sorted(s.batch_counts.items())) for s in sim.splits)
    return Validation(float(real.goodput), sim_goodput, float(real.p50_latency_s), sim_p50,
                      float(real.p95_latency_s), sim_p95, len(exits), target, real_counts, sim_counts,
                      note, sim, real, slowdown, profile_only, over)


# ------------------------------------------------------------------------------ out-of-sample prediction

@dataclass(frozen=True)
class Calibration:
    """What one served run says about serving on this host beyond the layer profile: the replicas' median
    slowdown against the profile (contention for cores, Ray's own threads) and Ray Serve's per-request costs.
    ``source`` describes the run it came from."""
    slowdown: float
    overheads: ServingOverheads
    source: str = ""


def calibrate(real, layer_profile, *, disabled: Iterable[int] = (), source: str = "") -> Calibration:
    """A :class:`Calibration` from a served run (:func:`measured_slowdown`'s median over the replicas,
    :func:`measured_overheads`)."""
    L = real.splits[-1][1]
    off = frozenset(int(k) for k in disabled)
    lat = layer_profile.adapter(ramps=[k for k in range(L) if k not in off])
    gpu_types = [g if g else "host" for g in (getattr(real, "gpu_types", None) or ["host"] * len(real.splits))]
    ratios = list(measured_slowdown(real, lat, gpu_types).values())
    return Calibration(float(np.median(ratios)) if ratios else 1.0, measured_overheads(real), source)


@dataclass(frozen=True)
class Prediction:
    """The simulator's forecast of a served run: goodput, p50 and p95 latency of the served requests, the share
    dropped, and the simulation itself."""
    goodput: float
    p50_s: float
    p95_s: float
    drop_rate: float
    sim: Any = field(default=None, repr=False, compare=False)


def predict_run(plan, arrival_s: Sequence[float], exits: Sequence[int], layer_profile, slo_s: float,
                calibration: Calibration, *, slack: float = 0.2, transfer_s: float | Sequence[float] = 0.0,
                disabled: Iterable[int] = (), queues: str = QUEUES, seed: int = 0) -> Prediction:
    """A served run of ``plan`` predicted before it happens, in the mode of the evaluation tables and of the
    serving: E3's deadline batching (a batch leaves full or when its oldest request's slack runs out), requests
    that can no longer make the SLO dropped (``drop="budget"``), exits answered when their split's batch is done;
    ``queues``: "replica" (default, the tables' :data:`QUEUES`), a queue per replica as Ray Serve routes
    requests, or "split", one ideal queue per split. Each replica computes ``calibration.slowdown`` times the profile; Ray Serve's
    entry and return costs, drawn per request from those the calibration run measured (``seed``), and its
    median hop are added where they fall."""
    from workbench.earlyexit.simulator import simulate_plan

    L = plan.splits[-1][1]
    off = frozenset(int(k) for k in disabled)
    lat = layer_profile.adapter(ramps=[k for k in range(L) if k not in off])
    over = calibration.overheads
    links = len(plan.splits) - 1
    base = [float(transfer_s)] * links if not isinstance(transfer_s, Sequence) else [float(t) for t in transfer_s]
    slow = {(i, r): calibration.slowdown for i, n in enumerate(plan.replicas) for r in range(n)}
    times = np.asarray(arrival_s, dtype=float)
    entry, back = over.draw(times.size, seed)
    sim = simulate_plan(plan, slo_s=slo_s, arrivals=times + entry,
                        layer_latency=lat, exits=[int(e) for e in exits],
                        transfer_s=[t + over.hop_s for t in base] or 0.0, slack=slack, drop="budget",
                        replica_slowdown=slow, exit_at_split_end=True, queues=queues)
    goodput, p50, p95 = _with_overheads(sim, over, slo_s, entry, back)
    n = len(sim.requests)
    return Prediction(goodput, p50, p95, sum(1 for r in sim.requests if r.dropped) / n if n else 0.0, sim)


def validate_out_of_sample(calibration: Calibration, target, plan, layer_profile, slo_s: float, *,
                           slack: float = 0.2, transfer_s: float | Sequence[float] = 0.0,
                           disabled: Iterable[int] = (), target_error: float = VALIDATION_TARGET,
                           exits: Sequence[int] | None = None, note: str = "", queues: str = "replica") -> Validation:
    """The simulator judged out of sample: ``calibration`` from one served run, the prediction
    (:func:`predict_run`) of another, ``target`` (a served run of ``plan`` on other arrivals, rate, mix or
    plan), against what that run measured. ``exits``: each request's exit layer (a property of its input: the
    model run in one process gives it for dropped requests too); default: the served ones, the last layer for
    a request that has none."""
    times = np.array([r.arrival_s for r in target.requests], dtype=float)
    L = plan.splits[-1][1]
    if exits is None:
        exits = [int(r.exit_layer) if getattr(r, "exit_layer", None) is not None and r.exit_layer >= 0 else L - 1
                 for r in target.requests]
    exits = [int(e) for e in exits]
    if len(exits) != times.size:
        raise WorkbenchError(f"{len(exits)} exit layers for {times.size} requests")
    got = predict_run(plan, times, exits, layer_profile, slo_s, calibration, slack=slack, transfer_s=transfer_s,
                      disabled=disabled, queues=queues)
    real_counts = tuple(tuple(sorted(dict(c).items())) for c in getattr(target, "batch_counts", ()))
    sim_counts = tuple(tuple(sorted(s.batch_counts.items())) for s in got.sim.splits)
    return Validation(float(target.goodput), got.goodput, float(target.p50_latency_s), got.p50_s,
                      float(target.p95_latency_s), got.p95_s, len(exits), target_error, real_counts, sim_counts,
                      note or f"calibrated on {calibration.source or 'another run'}", got.sim, target,
                      {}, None, calibration.overheads)
