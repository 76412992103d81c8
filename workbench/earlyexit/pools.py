"""E3's deployments as pools of replicas, and their sustained goodput in the SimPy simulator
(:mod:`workbench.earlyexit.simulator`): what the evaluation's tables (:mod:`workbench.earlyexit.evaluation`) and
the page deploy and measure.

A :class:`Pool` is one pipeline: splits of layers, each with its replicas, batch size and GPU type. Its analytic
capacity (:func:`pool_capacity`) weighs each split's batch time by the survivors an exit profile leaves it;
that only says where to start looking, the simulator gives the goodput.

Data-parallel deployments on mixed GPUs are one pool per GPU type, each fed a share of the arrivals in
proportion to its capacity (a weighted load balancer), simulated apart and summed, with the subset of types
that sustains the most (:func:`best_pools`: a slow type can cost more than it adds); a GPU type whose batch of
``b`` cannot finish within ``SLO x (1 - slack)`` is left out. Every replica keeps its own queue and a router picks
one of two replicas by their queued and running requests (:data:`QUEUES`), as Ray Serve routes them: the mode the
real runs serve in and the out-of-sample check validates (one shared queue per split, ideal balancing, fills
batches twice as fast with two replicas and predicted p95s 35-57 % below the served ones). A request that can no
longer make the SLO is dropped (``drop="budget"``), as the serving drops it.

Sustained goodput: arrivals are uniform (the paper's production-like constant rate) at a fraction of the
deployment's analytic capacity, from :data:`RATE_FRACTIONS` downwards; the first rate at which at least
``attainment`` (99%) of the requests meet the SLO gives the goodput, the simulator's requests-meeting-the-SLO
per second at that rate. Each simulation has ``requests`` requests (2000 by default).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from workbench.earlyexit.batchprofile import BatchProfile
from workbench.errors import WorkbenchError

QUEUES = "replica"
"""How the tables' and the page's simulations queue requests at a split: one queue per replica, routed as Ray
Serve routes (the served runs' mode); "split" is the ideal shared queue."""

RATE_FRACTIONS = (1.2, 1.0, 0.9, 0.8, 0.65, 0.5, 0.35, 0.2, 0.1)
WARM_UP_SHARE = 0.25


@dataclass(frozen=True)
class EvalSettings:
    """What every table shares: the model shape, SLO and slack, the simulated requests and seed."""
    shape: str = "bert-base"
    slo_s: float = 0.1
    slack: float = 0.2
    requests: int = 2000
    seed: int = 0
    attainment: float = 0.99
    min_span_slos: float = 4.0         # arrivals span at least this many SLOs, so an overload shows as misses

    def __post_init__(self):
        if not (self.slo_s > 0 and 0 <= self.slack < 1 and self.requests >= 1 and 0 < self.attainment <= 1):
            raise WorkbenchError(f"a scenario needs slo_s > 0, slack in [0, 1), requests >= 1 and attainment in "
                                 f"(0, 1]; got {self}")

    @property
    def budget_s(self) -> float:
        return self.slo_s * (1 - self.slack)



@dataclass(frozen=True)
class Pool:
    """One pipeline: splits, their replicas, batch sizes and GPU types, transfers, and which ramps run: every
    one (True), none but the classifier (False: the stock model, nobody leaves early) or the layers of a set
    (a sample that would leave by a disabled ramp rides on to the next enabled one)."""
    splits: tuple[tuple[int, int], ...]
    replicas: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    gpu_types: tuple[str, ...]
    transfers_s: tuple[float, ...] = ()
    ramps: Any = True

    @property
    def num_layers(self) -> int:
        return self.splits[-1][1]

    @property
    def gpus(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g, r in zip(self.gpu_types, self.replicas):
            out[g] = out.get(g, 0) + r
        return out

    def exit_map(self) -> np.ndarray:
        """Where a sample whose own exit layer is k leaves in this pool, for each k."""
        L = self.num_layers
        if self.ramps is True:
            return np.arange(L)
        enabled = sorted({L - 1} | (set(self.ramps) if self.ramps else set()))
        return np.array([min(e for e in enabled if e >= k) for k in range(L)])

    def exit_layers(self, layers: np.ndarray) -> np.ndarray:
        return self.exit_map()[np.asarray(layers, dtype=int)]

    def describe(self) -> str:
        return "; ".join(f"{s}-{e - 1} on {r} x {g} @ {b}" for (s, e), r, g, b in
                         zip(self.splits, self.replicas, self.gpu_types, self.batch_sizes))


def _profile_of(pool: Pool, profile: BatchProfile) -> np.ndarray:
    """The fraction entering each layer in this pool (exits moved to the enabled ramps)."""
    L = pool.num_layers
    mass = np.zeros(L)
    np.add.at(mass, pool.exit_map(), np.asarray(profile.exit_fractions(), dtype=float))
    return np.concatenate([[1.0], 1.0 - np.cumsum(mass)[:-1]])


def _binomial(n: int, p: float) -> np.ndarray:
    """P(k of n) for k = 0..n, each present with probability p independently."""
    from math import comb

    p = min(1.0, max(0.0, p))
    return np.array([comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(n + 1)])


def pool_capacity(pool: Pool, profile: BatchProfile, latency: Callable[[int, int, str], float]) -> float:
    """Input samples per second the pool can take: the smallest over its splits of replicas x batch / the
    expected time of a batch, which enters the split full and shrinks inside it as the profile says (each
    sample present at a layer independently; a layer nobody reaches costs nothing). Transfers overlap with
    compute and do not limit it."""
    entering = _profile_of(pool, profile)
    best = math.inf
    for (s, e), r, b, g in zip(pool.splits, pool.replicas, pool.batch_sizes, pool.gpu_types):
        if entering[s] <= 0:
            continue
        t = 0.0
        for k in range(s, e):
            p = _binomial(b, entering[k] / entering[s])
            t += sum(p[n] * latency(k, n, g) for n in range(1, b + 1) if p[n] > 1e-12)
        best = min(best, r * b / t / entering[s])
    return best


def worst_latency(pool: Pool, latency: Callable[[int, int, str], float]) -> float:
    """Seconds a sample that runs every layer takes at full batches, plus the transfers."""
    return sum(latency(k, b, g) for (s, e), b, g in zip(pool.splits, pool.batch_sizes, pool.gpu_types)
               for k in range(s, e)) + sum(pool.transfers_s)


def data_parallel(batch: int, gpus: Mapping[str, int], num_layers: int, *, exits: bool) -> list[Pool]:
    """One pool per GPU type: the whole model on each GPU at ``batch`` (ramps at every layer with exits, only
    the classifier without)."""
    return [Pool(((0, num_layers),), (n,), (batch,), (g,), (), ramps=exits) for g, n in gpus.items() if n]


def latency_for(profiles: Mapping[str, Any], ramps) -> Callable[[int, int, str], float]:
    from workbench.earlyexit.profiles import latency_by_type

    return latency_by_type(profiles, ramps=ramps)


def transfer_fn(shape: str, per_link: int | None = None) -> Callable[[int, int], float]:
    """Seconds to send ``batch`` samples' activations (fp32, sequence x hidden) over E3's 10 Gbps Ethernet
    (``per_link``: at most that many samples in one send)."""
    from workbench.devices import PRESETS
    from workbench.earlyexit.profiles import model_shape

    layer_shape, _ = model_shape(shape)
    link = PRESETS["v100"]

    def transfer_s(boundary: int, batch: int) -> float:
        n = batch if per_link is None else min(batch, per_link)
        return link.send_s(n * layer_shape.seq_len * layer_shape.hidden * 4) if n else 0.0

    return transfer_s


@dataclass(frozen=True)
class Sustained:
    """The sustained goodput of a deployment and the run that showed it."""
    goodput: float                 # requests meeting the SLO per second (simulated), 0 if no rate passed
    rate: float                    # the offered rate that gave it
    capacity: float                # the analytic capacity the rates were fractions of
    attainment: float              # share of requests meeting the SLO at that rate
    p50_latency_s: float
    p95_latency_s: float
    drop_rate: float
    simulations: int
    batch_counts: tuple = ()


def simulate_pools(pools: Sequence[Pool], rate: float, profile: BatchProfile, profiles: Mapping[str, Any],
                   scenario: EvalSettings, *, seed_offset: int = 0) -> list:
    """Simulate each pool on its share of ``rate`` (by capacity), uniform arrivals, at least
    ``scenario.requests`` requests in all and enough for ``scenario.min_span_slos`` SLOs of arrivals."""
    from workbench.earlyexit.simulator import ArrivalProcess, simulate

    caps = [pool_capacity(p, profile, latency_for(profiles, p.ramps)) for p in pools]
    total = sum(caps)
    requests = max(scenario.requests, math.ceil(rate * scenario.min_span_slos * scenario.slo_s))
    runs = []
    for j, (pool, cap) in enumerate(zip(pools, caps)):
        n = max(1, round(requests * cap / total))
        rng = np.random.default_rng([scenario.seed, seed_offset, j])
        layers = pool.exit_layers(profile.sample_exit_layers(n, rng))
        lat = latency_for(profiles, pool.ramps)
        gpu_types = pool.gpu_types

        def layer_s(i, k, b, lat=lat, gpu_types=gpu_types):
            return lat(k, b, gpu_types[i])

        runs.append(simulate(pool.splits, pool.replicas, pool.batch_sizes, slo_s=scenario.slo_s,
                             arrivals=ArrivalProcess("uniform", rate=rate * cap / total, count=n), layer_s=layer_s,
                             transfer_s=list(pool.transfers_s) if len(pool.splits) > 1 else 0.0,
                             exits=[int(x) for x in layers], slack=scenario.slack, seed=scenario.seed,
                             devices=list(gpu_types), drop="budget", queues=QUEUES))
    return runs


def window_goodput(run, skip: float = WARM_UP_SHARE) -> float:
    """Requests meeting the SLO per second, counting those that complete between ``skip`` of the arrival
    span (the pipeline filled) and the last arrival (before the drain, where the last batches wait for
    samples that never come): the rate a run sustains, without its start and end."""
    arrivals = [r.arrival_s for r in run.requests]
    if len(arrivals) < 2:
        return run.goodput
    t1 = max(arrivals)
    t0 = skip * t1
    done = [r for r in run.requests if r.met_slo and t0 <= r.completion_s <= t1]
    return len(done) / (t1 - t0) if t1 > t0 else run.goodput


def sustained_goodput(pools: Sequence[Pool], profile: BatchProfile, profiles: Mapping[str, Any],
                      scenario: EvalSettings, *, fractions: Sequence[float] = RATE_FRACTIONS,
                      seed_offset: int = 0) -> Sustained:
    """The most goodput (:func:`window_goodput`, summed over pools) among offered rates, fractions of the
    analytic capacity tried from the highest, at which at least ``scenario.attainment`` of the requests meet
    the SLO; the search stops at the first rate that passes and is not above the capacity."""
    if not pools:
        return Sustained(0.0, 0.0, 0.0, 0.0, math.nan, math.nan, 0.0, 0)
    capacity = sum(pool_capacity(p, profile, latency_for(profiles, p.ramps)) for p in pools)
    best, tried = None, 0
    for f in fractions:
        runs = simulate_pools(pools, f * capacity, profile, profiles, scenario, seed_offset=seed_offset)
        tried += 1
        n = sum(len(r.requests) for r in runs)
        met = sum(r.met for r in runs)
        if met >= scenario.attainment * n:
            goodput = sum(window_goodput(r) for r in runs)
            if best is None or goodput > best.goodput:
                lat = np.concatenate([[q.latency_s for q in r.requests if q.latency_s is not None] for r in runs])
                counts = tuple(tuple(sorted(s.batch_counts.items())) for r in runs for s in r.splits)
                best = Sustained(goodput, f * capacity, capacity, met / n, float(np.percentile(lat, 50)),
                                 float(np.percentile(lat, 95)), sum(r.dropped for r in runs) / n, tried, counts)
            if f <= 1:
                break
    if best is None:
        return Sustained(0.0, 0.0, capacity, 0.0, math.nan, math.nan, 1.0, tried)
    return replace(best, simulations=tried)


def best_pools(pools: Sequence[Pool], profile: BatchProfile, profiles: Mapping[str, Any],
               scenario: EvalSettings) -> tuple[list[Pool], Sustained]:
    """A data-parallel deployment as a fair operator runs it: every subset of its pools (one per GPU type),
    each given :func:`sustained_goodput`, and the one with the most kept (all of them on ties). With a queue
    per replica a slow type's replicas each see a small share of the arrivals, wait long for their batches and
    drop what can no longer make the SLO, so using every GPU can sustain less than leaving a type idle."""
    from itertools import combinations

    pools = list(pools)
    best_pools_, best = pools, sustained_goodput(pools, profile, profiles, scenario)
    for k in range(len(pools) - 1, 0, -1):
        for subset in combinations(pools, k):
            got = sustained_goodput(list(subset), profile, profiles, scenario)
            if got.goodput > best.goodput * (1 + 1e-9):
                best_pools_, best = list(subset), got
    return best_pools_, best
