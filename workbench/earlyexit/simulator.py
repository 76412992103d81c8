"""A discrete-event simulation (SimPy) of E3's pipelined early-exit serving (E3 §3.3, §4).

A split plan cuts the model into contiguous layer ranges ("splits"); each split runs on its own
replicas, each replica serving batches of up to the split's batch size from the split's queue. Samples
whose exit layer lies inside a split leave when their batch is done with them; the survivors travel
to the next split, where the replicas re-form full batches out of the survivors of several upstream
batches. This is what keeps the batch size constant through an early-exit model, and what the
simulator lets one watch: per-replica busy periods (pipeline bubbles are the gaps), queue lengths over
time, how often each batch size was served, and per request whether it met its SLO.

The simulator takes plain inputs so that it does not depend on the optimizer's classes:
``simulate(splits, replicas, batch_sizes, service_s=..., slo_s=..., ...)``; :func:`simulate_plan` reads a
``SplitPlan``-like object (``.splits``, ``.replicas``, ``.batch_sizes``, ``.gpu_types``).

Rules (the paper names them; where it is silent, the choice is ours and stated here):

- **Dynamic batching** (§4): a replica serves as soon as its split's queue holds a full batch, or once
  waiting longer would break the SLO minus its slack (slack 20% in the paper) for the oldest queued
  sample: it dispatches at ``min(arrival + SLO * (1 - slack)) - rest``, where ``rest`` is this split and
  every later one at full batch size, plus the transfers between them (no downstream queueing assumed;
  the slack is there for that). Replicas of a split share one FIFO queue (ideal load balancing).
- **Drops** (§3.1, "like Clockwork"): whenever a replica looks at its queue (when it is free, and each
  time the queue grows while it waits), it drops every queued sample that cannot return by its deadline
  (arrival + SLO) even if served alone right now: ``now + earliest return > deadline``. With
  ``drop="hopeless"`` (default) the earliest return is this split at batch size 1 (per-split service
  times) or its first layer at batch size 1 (per-layer times): the sample would miss even if it exited
  at its next ramp. ``drop="worst_case"`` uses the rest of the model at batch size 1 plus the transfers
  (a sample that might miss if it runs to the end is dropped). ``drop="budget"`` uses the rest of the plan at
  its full batch sizes plus the transfers (what the batching rule plans with): a sample that has spent its
  slack waiting is dropped, so that under overload the replicas serve samples that can still make it
  instead of those about to expire (FIFO with the milder rules collapses to a fraction of the plan's goodput).
  None of the rules knows where a sample will exit. ``drop="never"`` serves everyone.
- **Stragglers**: a request that completes after its SLO is marked a straggler (served, not counted in
  goodput). A *replica* is marked a straggler (§3.3) when its observed service times exceed the profile's
  by more than ``straggler_tolerance`` (20%): set ``replica_slowdown`` to simulate a slow GPU. With
  ``exclude_stragglers_after=n`` a replica so marked after n batches stops taking batches (§3.3's remedy);
  the rest of its split serves its share.
- **Exits inside a split** return at once: with per-split service times (``service_s``) at the end of
  the batch's run of that split; with per-layer times (``layer_s``) right after their layer, the batch
  running each later layer of the split with only the samples still in it.
- **Transfers** between splits take ``transfer_s[i]`` seconds per batch of survivors. Pipelined (the
  default, §3.2.2) the replica starts its next batch at once and transfers do not contend; unpipelined,
  the replica is busy until its send is done.
- **Goodput** is the number of requests meeting the SLO per second of simulated time, from 0 to the last
  request's completion or drop. Latency percentiles are over completed requests (NumPy's linear
  interpolation); the drop rate over all requests.

Arrivals are uniform, Poisson or bursty (an on/off Poisson process with the same mean rate), seeded.
"""
from __future__ import annotations

import math
import numbers
from collections import Counter as _Tally
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import simpy

from workbench.earlyexit.batchprofile import BatchProfile
from workbench.errors import WorkbenchError
from workbench.timeline import Counter, Span, Timeline

PATTERNS = ("uniform", "poisson", "bursty")
MAX_REQUESTS = 1_000_000
"""The most requests one simulation takes (about a minute of SimPy on one core)."""
DROP_RULES = ("hopeless", "worst_case", "budget", "never")
EPS = 1e-12
DEFAULT_SLACK = 0.2
"""E3's SLO slack in its evaluation (§4): the optimizer and the batcher plan for 80% of the SLO."""


# -- arrivals ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ArrivalProcess:
    """Request arrivals at ``rate`` per second on average, for ``duration_s`` seconds or ``count`` requests.

    ``uniform``: one every ``1 / rate`` s from 0. ``poisson``: exponential gaps. ``bursty``: on/off
    periods (exponential, mean ``burst_s`` on and ``burst_s * (burst_factor - 1)`` off), Poisson at
    ``rate * burst_factor`` while on and silent while off, so the mean rate is still ``rate``."""
    pattern: str = "poisson"
    rate: float = 100.0
    duration_s: float | None = None
    count: int | None = None
    burst_factor: float = 4.0
    burst_s: float = 0.5

    def __post_init__(self):
        if self.pattern not in PATTERNS:
            raise WorkbenchError(f"arrival pattern {self.pattern!r} is not one of {', '.join(PATTERNS)}")
        if not (_real(self.rate) and math.isfinite(self.rate) and self.rate > 0):
            raise WorkbenchError(f"arrival rate {self.rate!r} must be a number of requests per second > 0")
        if (self.duration_s is None) == (self.count is None):
            raise WorkbenchError("give exactly one of duration_s (seconds of arrivals) or count (requests)")
        if self.duration_s is not None and not (_real(self.duration_s) and math.isfinite(self.duration_s)
                                                and self.duration_s > 0):
            raise WorkbenchError(f"duration_s {self.duration_s!r} must be > 0 seconds")
        if self.count is not None and not (_real(self.count) and math.isfinite(self.count)
                                           and int(self.count) == self.count and 0 <= self.count <= MAX_REQUESTS):
            raise WorkbenchError(f"count {self.count!r} must be a whole number of requests in 0..{MAX_REQUESTS:,}")
        if self.duration_s is not None and self.rate * self.duration_s > MAX_REQUESTS:
            raise WorkbenchError(f"{self.rate:g} requests/s for {self.duration_s:g} s is about "
                                 f"{self.rate * self.duration_s:,.0f} requests; a simulation takes at most "
                                 f"{MAX_REQUESTS:,}: lower the rate or the duration")
        if not self.burst_factor >= 1:
            raise WorkbenchError(f"burst_factor {self.burst_factor} must be >= 1 (1: plain Poisson)")
        if not self.burst_s > 0:
            raise WorkbenchError(f"burst_s {self.burst_s} must be > 0 seconds")

    def times(self, seed: int | np.random.Generator | None = 0) -> np.ndarray:
        """The arrival times (seconds, sorted), drawn with ``seed``."""
        rng = np.random.default_rng(seed)
        limit = math.inf if self.duration_s is None else float(self.duration_s)
        count = math.inf if self.count is None else int(self.count)
        if self.pattern == "uniform":
            n = count if self.count is not None else math.ceil(limit * self.rate - EPS)
            t = np.arange(int(n)) / float(self.rate)
            return t[t < limit]
        out: list[float] = []
        now, on = 0.0, True
        if self.pattern == "poisson" or self.burst_factor == 1:
            period_end, fast = math.inf, float(self.rate)
        else:
            period_end, fast = rng.exponential(self.burst_s), float(self.rate) * self.burst_factor
        while len(out) < count:
            if on:
                step = rng.exponential(1.0 / fast)
                if now + step < period_end:
                    now += step
                    if now >= limit:
                        break
                    out.append(now)
                    continue
                now, on = period_end, False
                period_end = now + rng.exponential(self.burst_s * (self.burst_factor - 1))
            else:
                now, on = period_end, True
                period_end = now + rng.exponential(self.burst_s)
            if now >= limit:
                break
        return np.asarray(out, dtype=float)


# -- results ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RequestResult:
    """One request: when it came, where it left the model, and what became of it."""
    id: int
    arrival_s: float
    exit_layer: int                   # the layer whose ramp it leaves at (num_layers - 1: ran it all)
    exit_split: int                   # the split holding that layer
    completion_s: float | None        # None if dropped
    latency_s: float | None           # completion - arrival; None if dropped
    met_slo: bool                     # completed within the SLO
    dropped: bool
    dropped_at_s: float | None = None
    dropped_split: int | None = None  # the split whose queue it was dropped from
    straggler: bool = False           # completed, but after its SLO


@dataclass(frozen=True)
class BusyPeriod:
    """A replica serving one batch (or a link carrying one batch's survivors) from ``start_s`` to ``end_s``."""
    start_s: float
    end_s: float
    batch_size: int

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class ReplicaResult:
    """One replica of one split: its busy periods (the gaps between them are pipeline bubbles)."""
    split: int
    replica: int
    device: str
    busy: tuple[BusyPeriod, ...]
    slowdown: float                   # observed / profiled service time, mean over its batches (1 if none)
    straggler: bool                   # slowdown above 1 + straggler_tolerance
    excluded_s: float | None = None   # when it stopped taking batches as a straggler (exclude_stragglers)

    @property
    def lane(self) -> str:
        return f"split {self.split} · replica {self.replica}"

    @property
    def busy_s(self) -> float:
        return sum(p.duration_s for p in self.busy)


@dataclass(frozen=True)
class SplitResult:
    """One split: its layers, resources, queue length over time, and the batch sizes it served."""
    index: int
    layers: tuple[int, int]           # (start, end), end exclusive
    replicas: int
    batch_size: int
    device: str
    queue: tuple[tuple[float, int], ...]       # (time, length after the change), a step function
    batch_counts: Mapping[int, int]            # batch size served -> how many times
    transfers: tuple[BusyPeriod, ...] = ()     # sends of survivors to the next split

    @property
    def max_queue(self) -> int:
        return max((n for _, n in self.queue), default=0)


class RequestTally:
    """Counts over ``self.requests`` that a simulated run and a served one (``served.ServeRun``) both give."""
    requests: tuple

    @property
    def met(self) -> int:
        return sum(r.met_slo for r in self.requests)

    @property
    def dropped(self) -> int:
        return sum(r.dropped for r in self.requests)


@dataclass(frozen=True)
class SimulationResult(RequestTally):
    """Everything a run produced: per request, per replica, per split, the summary figures and a Timeline."""
    requests: tuple[RequestResult, ...]
    splits: tuple[SplitResult, ...]
    replicas: tuple[ReplicaResult, ...]
    slo_s: float
    slack: float
    duration_s: float                 # 0 to the last completion or drop
    goodput: float                    # requests meeting the SLO per second
    throughput: float                 # requests completed (in time or not) per second
    p50_latency_s: float              # NaN if none completed
    p95_latency_s: float
    drop_rate: float
    straggler_rate: float             # completed past the SLO, over all requests
    timeline: Timeline = field(compare=False, repr=False)

    def replica(self, split: int, replica: int) -> ReplicaResult:
        for r in self.replicas:
            if (r.split, r.replica) == (split, replica):
                return r
        raise WorkbenchError(f"no replica {replica} of split {split} in this run")


# -- the simulation ----------------------------------------------------------------------------------

class _Sample:
    __slots__ = ("id", "arrival", "exit", "deadline", "plan_deadline", "completion", "dropped_at", "dropped_split",
                 "entered")

    def __init__(self, id_: int, arrival: float, exit_layer: int, slo: float, budget: float):
        self.id, self.arrival, self.exit = id_, arrival, exit_layer
        self.deadline, self.plan_deadline = arrival + slo, arrival + budget
        self.completion = self.dropped_at = self.dropped_split = None
        self.entered = arrival


class _Run:
    """The SimPy model: an arrival process, one process per replica, one process per transfer."""

    def __init__(self, cfg: _Config, samples: list[_Sample]):
        self.cfg = cfg
        self.samples = samples
        self.env = simpy.Environment()
        n = len(cfg.splits)
        self.busy = {(i, r): [] for i in range(n) for r in range(cfg.replicas[i])}
        keys = list(self.busy) if cfg.per_replica else list(range(n))
        self.queues: dict = {k: [] for k in keys}
        self.changed = {k: self.env.event() for k in keys}
        self.queue_log: list[list[tuple[float, int]]] = [[(0.0, 0)] for _ in range(n)]
        self.route = np.random.default_rng(cfg.route_seed)
        self.running = dict.fromkeys(self.busy, 0)          # samples in the batch a replica is computing
        self.ratios = {key: [] for key in self.busy}
        self.active = list(cfg.replicas)
        self.excluded: dict[tuple[int, int], float] = {}
        self.sends: list[list[BusyPeriod]] = [[] for _ in range(n)]
        self.counts = [_Tally() for _ in range(n)]

    def run(self) -> None:
        self.env.process(self._arrivals())
        for (i, r) in self.busy:
            self.env.process(self._replica(i, r))
        self.env.run()

    # queue bookkeeping
    def _key(self, i: int, r: int):
        return (i, r) if self.cfg.per_replica else i

    def _log_queue(self, i: int) -> None:
        n = (sum(len(self.queues[i, r]) for r in range(self.cfg.replicas[i])) if self.cfg.per_replica
             else len(self.queues[i]))
        log, now = self.queue_log[i], self.env.now
        if log[-1][0] == now:
            log[-1] = (now, n)
        else:
            log.append((now, n))

    def _enqueue(self, i: int, samples: list[_Sample]) -> None:
        touched = set()
        for s in samples:
            s.entered = self.env.now
            key = self._pick(i) if self.cfg.per_replica else i
            self.queues[key].append(s)
            touched.add(key)
        self._log_queue(i)
        for key in touched:
            event, self.changed[key] = self.changed[key], self.env.event()
            event.succeed()

    def _pick(self, i: int) -> tuple[int, int]:
        """Ray Serve's router: two replicas at random (of those not excluded), the one with fewer requests queued
        or running (Serve counts a replica's ongoing requests)."""
        live = [r for r in range(self.cfg.replicas[i]) if (i, r) not in self.excluded]
        two = self.route.choice(live, size=min(2, len(live)), replace=False)
        return min(((i, int(r)) for r in two), key=lambda k: len(self.queues[k]) + self.running[k])

    def _arrivals(self):
        for s in sorted(self.samples, key=lambda s: (s.arrival, s.id)):
            if s.arrival > self.env.now:
                yield self.env.timeout(s.arrival - self.env.now)
            self._enqueue(0, [s])

    def _drop_hopeless(self, key) -> None:
        if self.cfg.drop == "never":
            return
        i = key[0] if isinstance(key, tuple) else key
        q, now = self.queues[key], self.env.now
        earliest = now + self.cfg.earliest_return[i]
        keep = [s for s in q if earliest <= s.deadline + EPS]
        if len(keep) != len(q):
            for s in q:
                if earliest > s.deadline + EPS:
                    s.dropped_at, s.dropped_split = now, i
            self.queues[key] = keep
            self._log_queue(i)

    def _replica(self, i: int, r: int):
        cfg, env = self.cfg, self.env
        size = cfg.batch_sizes[i]
        slow = cfg.slowdown.get((i, r), 1.0)
        key = self._key(i, r)
        while True:
            self._drop_hopeless(key)
            q = self.queues[key]
            if not q:
                yield self.changed[key]
                continue
            if len(q) < size:
                if cfg.batch_wait is None:
                    wait = min(s.plan_deadline for s in q) - cfg.rest[i] - env.now
                else:
                    wait = min(s.entered for s in q) + cfg.batch_wait - env.now
                if wait > EPS:
                    yield self.changed[key] | env.timeout(wait)
                    continue
            batch, self.queues[key] = q[:size], q[size:]
            self._log_queue(i)
            start = env.now
            offsets, profiled = cfg.run_batch(i, batch)
            took = profiled * slow
            self.running[(i, r)] = len(batch)
            yield env.timeout(took)
            self.running[(i, r)] = 0
            for s, t in offsets.items():
                s.completion = start + t * slow
            self.busy[(i, r)].append(BusyPeriod(start, env.now, len(batch)))
            self.ratios[(i, r)].append(slow)
            self.counts[i][len(batch)] += 1
            seen = self.ratios[(i, r)]
            if (cfg.exclude_after and len(seen) >= cfg.exclude_after and self.active[i] > 1
                    and float(np.mean(seen)) > 1 + cfg.tolerance + EPS):
                self.active[i] -= 1             # the others of its split take its share from now on
                self.excluded[(i, r)] = env.now
                if cfg.per_replica and self.queues[key]:       # what waited for it goes to the others
                    left, self.queues[key] = self.queues[key], []
                    self._enqueue(i, left)
                if survivors := [s for s in batch if s.exit >= cfg.splits[i][1]]:
                    env.process(self._transfer(i, survivors))
                return
            survivors = [s for s in batch if s.exit >= cfg.splits[i][1]]
            if survivors:
                if cfg.pipelined:
                    env.process(self._transfer(i, survivors))
                else:
                    yield from self._transfer(i, survivors)

    def _transfer(self, i: int, survivors: list[_Sample]):
        start = self.env.now
        if self.cfg.transfer[i] > 0:
            yield self.env.timeout(self.cfg.transfer[i])
        self.sends[i].append(BusyPeriod(start, self.env.now, len(survivors)))
        self._enqueue(i + 1, survivors)


@dataclass(frozen=True)
class _Config:
    splits: tuple[tuple[int, int], ...]
    replicas: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    devices: tuple[str, ...]
    transfer: tuple[float, ...]       # per boundary
    slo: float
    slack: float
    drop: str
    pipelined: bool
    slowdown: Mapping[tuple[int, int], float]
    split_s: Callable[[int, int], float]                      # (split, batch) -> s, validated, cached
    layer_s: Callable[[int, int, int], float] | None           # (split, layer, batch) -> s, or None
    rest: tuple[float, ...] = ()
    earliest_return: tuple[float, ...] = ()
    batch_wait: float | None = None   # Ray Serve's batch_wait_timeout_s instead of the SLO rule
    exit_at_split_end: bool = False   # per-layer compute, but exits answer when the batch leaves the split
    exclude_after: int | None = None  # batches after which a straggling replica stops taking batches
    tolerance: float = 0.2
    per_replica: bool = False         # a queue per replica, requests routed to them as Ray Serve's router does
    route_seed: int = 0

    def run_batch(self, i: int, batch: list[_Sample]) -> tuple[dict, float]:
        """When each exiting sample of ``batch`` returns (seconds after the start) and the batch's service time
        (with ``exit_at_split_end``, every exiting sample returns when the batch is done with the split)."""
        start, end = self.splits[i]
        exiting = [s for s in batch if s.exit < end]
        if self.layer_s is None:
            took = self.split_s(i, len(batch))
            return {s: took for s in exiting}, took
        t, offsets, left = 0.0, {}, list(batch)
        for k in range(start, end):
            if not left:
                break
            t += self.layer_s(i, k, len(left))
            for s in left:
                if s.exit == k:
                    offsets[s] = t
            left = [s for s in left if s.exit > k]
        if self.exit_at_split_end:
            offsets = dict.fromkeys(offsets, t)
        return offsets, t


def _real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _checked(fn: Callable[..., Any], name: str) -> Callable[..., float]:
    """``fn`` cached on its arguments, each value checked to be seconds >= 0."""
    cache: dict[tuple, float] = {}

    def wrapped(*args):
        if args not in cache:
            value = fn(*args)
            try:
                value = float(value)
            except (TypeError, ValueError):
                value = math.nan
            if not (math.isfinite(value) and value >= 0):
                raise WorkbenchError(f"{name}{args} returned {value!r}: service times are finite seconds >= 0")
            cache[args] = value
        return cache[args]

    return wrapped


def _whole_positive(values, what: str, n: int) -> tuple[int, ...]:
    values = list(values)
    if len(values) != n:
        raise WorkbenchError(f"{len(values)} {what} for {n} splits: give one per split")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise WorkbenchError(f"split {i} has {what} {v!r}: every split needs a whole number >= 1")
    return tuple(int(v) for v in values)


def _check_splits(splits) -> tuple[tuple[int, int], ...]:
    try:
        out = [(int(a), int(b)) for a, b in splits]
    except (TypeError, ValueError):
        raise WorkbenchError("splits are (start, end) layer ranges, end exclusive, e.g. [(0, 4), (4, 12)]") from None
    if not out:
        raise WorkbenchError("no splits: give at least one (start, end) layer range")
    expected = 0
    for i, (a, b) in enumerate(out):
        if a != expected:
            raise WorkbenchError(f"split {i} starts at layer {a}, expected {expected}: "
                                 f"splits must be contiguous from layer 0")
        if b <= a:
            raise WorkbenchError(f"split {i} ({a}, {b}) holds no layers: end (exclusive) must exceed start")
        expected = b
    return tuple(out)


def simulate(splits: Sequence[tuple[int, int]], replicas: Sequence[int], batch_sizes: Sequence[int], *,
             slo_s: float, arrivals: ArrivalProcess | Sequence[float],
             service_s: Callable[[int, int], float] | None = None,
             layer_s: Callable[[int, int, int], float] | None = None,
             transfer_s: float | Sequence[float] = 0.0,
             exits: Sequence[int] | BatchProfile | None = None,
             slack: float = DEFAULT_SLACK, seed: int = 0, drop: str = "hopeless", pipelined: bool = True,
             replica_slowdown: Mapping[tuple[int, int], float] | None = None, straggler_tolerance: float = 0.2,
             devices: Sequence[str] | None = None, name: str = "E3 serving simulation",
             batch_wait_s: float | None = None, exit_at_split_end: bool = False,
             exclude_stragglers_after: int | None = None, queues: str = "split") -> SimulationResult:
    """Simulate serving ``arrivals`` through the split plan; see the module docstring for the rules.

    - ``batch_wait_s``: a replica dispatches a batch that is not full once its oldest sample has waited this
      long in the split's queue (what Ray Serve's ``batch_wait_timeout_s`` does), instead of E3's rule of
      waiting as long as the SLO's budget allows. None: E3's rule.
    - ``exclude_stragglers_after``: E3 §3.3's remedy. A replica whose mean slowdown over its first this many
      batches (or any later point) exceeds ``1 + straggler_tolerance`` stops taking batches; the other replicas
      of its split take its share. The last replica of a split is never excluded. None: stragglers are only
      marked.
    - ``queues``: "split" (one FIFO queue per split, ideal load balancing) or "replica": a queue per replica,
      each request routed to the shorter queue of two replicas drawn at random (Ray Serve's router), each
      replica batching its own queue (each ``@serve.batch`` replica does).
    - ``exit_at_split_end``: with ``layer_s``, the batch still shrinks inside a split, but its exiting samples
      answer when the batch is done with the split (what the Ray Serve deployments do), not right after
      their own layer.

    - ``splits``: contiguous (start, end) layer ranges from layer 0, end exclusive; ``replicas`` and
      ``batch_sizes``: one whole number >= 1 per split.
    - Service time, exactly one of: ``service_s(split_index, batch) -> seconds`` for a whole split, or
      ``layer_s(split_index, layer, batch) -> seconds`` per layer (samples then return right after
      their layer, and the batch shrinks inside the split).
    - ``transfer_s``: seconds to send a batch's survivors across each split boundary (one number for all,
      or one per boundary).
    - ``arrivals``: an :class:`ArrivalProcess` (drawn with ``seed``) or explicit times in seconds.
    - ``exits``: each request's exit layer (in the order of ``arrivals``), or a :class:`BatchProfile` to
      draw them from with ``seed``; None: every request runs the whole model.
    - ``replica_slowdown``: {(split, replica): factor} multiplying that replica's service times.
    - ``devices``: a name per split for the timeline (e.g. the plan's GPU types).
    """
    splits = _check_splits(splits)
    n = len(splits)
    num_layers = splits[-1][1]
    replicas = _whole_positive(replicas, "replicas", n)
    batch_sizes = _whole_positive(batch_sizes, "batch size", n)
    if not (_real(slo_s) and math.isfinite(slo_s) and slo_s > 0):
        raise WorkbenchError(f"slo_s {slo_s!r} must be > 0 seconds")
    if not (_real(slack) and 0 <= slack < 1):
        raise WorkbenchError(f"slack {slack!r} is a fraction of the SLO in [0, 1)")
    if drop not in DROP_RULES:
        raise WorkbenchError(f"drop rule {drop!r} is not one of {', '.join(DROP_RULES)}")
    if (service_s is None) == (layer_s is None):
        raise WorkbenchError("give exactly one of service_s(split, batch) or layer_s(split, layer, batch)")
    for fn, what in ((service_s, "service_s"), (layer_s, "layer_s")):
        if fn is not None and not callable(fn):
            raise WorkbenchError(f"{what} must be a function returning seconds")
    if _real(transfer_s):
        transfer = (float(transfer_s),) * (n - 1)
    else:
        transfer = tuple(float(t) for t in transfer_s)
        if len(transfer) != n - 1:
            raise WorkbenchError(f"{len(transfer)} transfer times for {n - 1} split boundaries: give one per boundary")
    if any(not (math.isfinite(t) and t >= 0) for t in transfer):
        raise WorkbenchError(f"transfer times {transfer} must be seconds >= 0")
    transfer = transfer + (0.0,)  # nothing leaves the last split
    slowdown = dict(replica_slowdown or {})
    for key, factor in slowdown.items():
        if not (isinstance(key, tuple) and len(key) == 2 and 0 <= key[0] < n and 0 <= key[1] < replicas[key[0]]):
            raise WorkbenchError(f"replica_slowdown key {key!r} is not a (split, replica) of this plan")
        if not (_real(factor) and math.isfinite(factor) and factor > 0):
            raise WorkbenchError(f"replica_slowdown {factor!r} for {key} must be a factor > 0")
    if not (_real(straggler_tolerance) and straggler_tolerance >= 0):
        raise WorkbenchError(f"straggler_tolerance {straggler_tolerance} must be >= 0")
    if exclude_stragglers_after is not None and not (
            isinstance(exclude_stragglers_after, numbers.Integral) and not isinstance(exclude_stragglers_after, bool)
            and 1 <= exclude_stragglers_after <= MAX_REQUESTS):
        raise WorkbenchError(f"exclude_stragglers_after {exclude_stragglers_after!r} is a number of batches >= 1 "
                             "(or None: stragglers are only marked)")
    devices = tuple(str(d) for d in devices) if devices is not None else ("simulated",) * n
    if len(devices) != n:
        raise WorkbenchError(f"{len(devices)} devices for {n} splits: give one per split")

    seeds = np.random.SeedSequence(seed).spawn(2)
    if isinstance(arrivals, ArrivalProcess):
        times = arrivals.times(np.random.default_rng(seeds[0]))
    else:
        times = np.asarray(list(arrivals), dtype=float)
        if times.ndim != 1 or np.any(~np.isfinite(times)) or np.any(times < 0):
            raise WorkbenchError("arrival times are seconds >= 0, one per request")
    if exits is None:
        exit_layers = np.full(times.size, num_layers - 1, dtype=int)
    elif isinstance(exits, BatchProfile):
        if exits.num_layers != num_layers:
            raise WorkbenchError(f"the batch profile has {exits.num_layers} layers but the splits cover {num_layers}")
        exit_layers = exits.sample_exit_layers(times.size, np.random.default_rng(seeds[1]))
    else:
        exit_layers = np.asarray(list(exits))
        if exit_layers.shape != times.shape:
            raise WorkbenchError(f"{exit_layers.size} exit layers for {times.size} requests: give one per request")
        if exit_layers.size and (not np.issubdtype(exit_layers.dtype, np.integer)
                                 or exit_layers.min() < 0 or exit_layers.max() >= num_layers):
            raise WorkbenchError(f"exit layers are whole layer numbers in 0..{num_layers - 1}")

    split_s = _checked(service_s, "service_s") if service_s is not None else None
    per_layer = _checked(layer_s, "layer_s") if layer_s is not None else None
    if split_s is None:
        def split_s(i: int, b: int) -> float:
            return sum(per_layer(i, k, b) for k in range(*splits[i]))
    rest, acc = [0.0] * n, 0.0
    for i in reversed(range(n)):
        acc += split_s(i, batch_sizes[i]) + transfer[i]
        rest[i] = acc
    if drop == "budget":
        earliest = tuple(rest)
    elif drop == "worst_case":
        earliest = tuple(sum(split_s(j, 1) for j in range(i, n)) + sum(transfer[i:n - 1]) for i in range(n))
    else:
        earliest = tuple(split_s(i, 1) if per_layer is None else per_layer(i, splits[i][0], 1) for i in range(n))
    if batch_wait_s is not None and not (_real(batch_wait_s) and 0 <= batch_wait_s <= slo_s):
        raise WorkbenchError(f"batch_wait_s {batch_wait_s!r} is seconds in 0..the SLO ({slo_s:g} s)")
    if queues not in ("split", "replica"):
        raise WorkbenchError(f"queues is 'split' or 'replica', got {queues!r}")
    cfg = _Config(splits, replicas, batch_sizes, devices, transfer, float(slo_s), float(slack), drop,
                  bool(pipelined), slowdown, split_s, per_layer, tuple(rest), earliest,
                  None if batch_wait_s is None else float(batch_wait_s), bool(exit_at_split_end),
                  exclude_stragglers_after, float(straggler_tolerance), queues == "replica",
                  int(np.random.SeedSequence(seed).generate_state(1)[0]))

    budget = float(slo_s) * (1 - float(slack))
    samples = [_Sample(j, float(t), int(e), float(slo_s), budget) for j, (t, e) in enumerate(zip(times, exit_layers))]
    sim = _Run(cfg, samples)
    sim.run()
    return _results(cfg, sim, straggler_tolerance, name)


def _split_of(splits, layer: int) -> int:
    for i, (a, b) in enumerate(splits):
        if a <= layer < b:
            return i
    raise AssertionError(layer)


def _results(cfg: _Config, sim: _Run, tolerance: float, name: str) -> SimulationResult:
    requests = []
    for s in sim.samples:
        done = s.completion is not None
        if not done and s.dropped_at is None:
            raise AssertionError(f"request {s.id} neither completed nor was dropped")  # a simulator bug
        latency = s.completion - s.arrival if done else None
        met = done and latency <= cfg.slo + EPS
        requests.append(RequestResult(s.id, s.arrival, s.exit, _split_of(cfg.splits, s.exit), s.completion, latency,
                                      met, not done, s.dropped_at, s.dropped_split, done and not met))
    ends = [r.completion_s if r.completion_s is not None else r.dropped_at_s for r in requests]
    duration = max(ends, default=0.0)
    latencies = np.array([r.latency_s for r in requests if r.latency_s is not None])
    total = len(requests)
    met = sum(r.met_slo for r in requests)

    replica_results = []
    for (i, r), busy in sim.busy.items():
        ratio = float(np.mean(sim.ratios[(i, r)])) if sim.ratios[(i, r)] else 1.0
        replica_results.append(ReplicaResult(i, r, cfg.devices[i], tuple(busy), ratio, ratio > 1 + tolerance + EPS,
                                             sim.excluded.get((i, r))))
    split_results = tuple(
        SplitResult(i, cfg.splits[i], cfg.replicas[i], cfg.batch_sizes[i], cfg.devices[i], tuple(sim.queue_log[i]),
                    dict(sorted(sim.counts[i].items())), tuple(sim.sends[i]))
        for i in range(len(cfg.splits)))
    timeline = _timeline(split_results, replica_results, duration, name)
    return SimulationResult(
        requests=tuple(requests), splits=split_results, replicas=tuple(replica_results), slo_s=cfg.slo,
        slack=cfg.slack, duration_s=duration,
        goodput=met / duration if duration > 0 else 0.0,
        throughput=latencies.size / duration if duration > 0 else 0.0,
        p50_latency_s=float(np.percentile(latencies, 50)) if latencies.size else math.nan,
        p95_latency_s=float(np.percentile(latencies, 95)) if latencies.size else math.nan,
        drop_rate=(total - latencies.size) / total if total else 0.0,
        straggler_rate=sum(r.straggler for r in requests) / total if total else 0.0,
        timeline=timeline)


def _timeline(splits: Sequence[SplitResult], replicas: Sequence[ReplicaResult], end: float, name: str) -> Timeline:
    """Compute spans per replica, queue spans (and counters) per split, comm spans per boundary."""
    spans: list[Span] = []
    counters: list[Counter] = []
    for rep in replicas:
        a, b = splits[rep.split].layers
        for k, p in enumerate(rep.busy):
            spans.append(Span(rep.lane, "compute", p.start_s, p.end_s, f"batch of {p.batch_size}",
                              {"split": rep.split, "replica": rep.replica, "batch": p.batch_size,
                               "layers": [a, b - 1], "index": k}, rep.device))
    for sp in splits:
        lane = f"split {sp.index} queue"
        steps = list(sp.queue) + [(max(end, sp.queue[-1][0]), 0)]
        for (t0, length), (t1, _) in zip(steps, steps[1:]):
            if length > 0 and t1 > t0:
                spans.append(Span(lane, "queue", t0, t1, f"{length} waiting", {"split": sp.index, "length": length},
                                  sp.device))
        counters.extend(Counter(f"queue split {sp.index}", t, float(length), sp.device) for t, length in sp.queue)
        for p in sp.transfers:
            spans.append(Span(f"link {sp.index}->{sp.index + 1}", "comm", p.start_s, p.end_s,
                              f"{p.batch_size} to split {sp.index + 1}", {"batch": p.batch_size}, sp.device))
    spans.sort(key=lambda s: s.start)
    return Timeline(tuple(spans), "predicted", tuple(sorted(counters, key=lambda c: c.time)), name)


def simulate_plan(plan: Any, *, slo_s: float, arrivals: ArrivalProcess | Sequence[float],
                  layer_latency: Callable[[int, int, str], float] | None = None,
                  service_s: Callable[[int, int], float] | None = None, **kwargs) -> SimulationResult:
    """Simulate a ``SplitPlan`` (anything with ``.splits``, ``.replicas``, ``.batch_sizes`` and, optionally,
    ``.gpu_types``). Service times come from ``layer_latency(layer, batch, gpu_type)`` (the optimizer's own
    cost function, run per layer on the split's GPU type) or from ``service_s(split, batch)``; the other
    keyword arguments are :func:`simulate`'s."""
    for attr in ("splits", "replicas", "batch_sizes"):
        if not hasattr(plan, attr):
            raise WorkbenchError(f"the plan has no .{attr}: simulate_plan needs a SplitPlan-like object")
    gpu_types = list(getattr(plan, "gpu_types", None) or ["simulated"] * len(plan.splits))
    if (layer_latency is None) == (service_s is None):
        raise WorkbenchError("give exactly one of layer_latency(layer, batch, gpu_type) or service_s(split, batch)")
    if len(gpu_types) != len(plan.splits):
        raise WorkbenchError(f"the plan has {len(gpu_types)} GPU types for {len(plan.splits)} splits")
    layer_s = None
    if layer_latency is not None:
        def layer_s(i: int, k: int, b: int) -> float:
            return layer_latency(k, b, gpu_types[i])
    kwargs.setdefault("devices", [str(g) for g in gpu_types])
    return simulate(plan.splits, plan.replicas, plan.batch_sizes, slo_s=slo_s, arrivals=arrivals,
                    service_s=service_s, layer_s=layer_s, **kwargs)
