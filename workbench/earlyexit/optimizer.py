"""E3's split optimizer: where to cut an early-exit model, how many replicas of which GPU type each split gets,
so that every replica runs full batches.

The paper (E3, SOSP '24, §3.2) prints its recurrence garbled; this module implements its stated intent: a
constant batch per GPU. Every replica of every split runs batches of ``batch_size`` (b) samples; the survivors
of a split's replicas are merged into full batches of b for the next split, as in the paper's example (two
batches of 16 enter the first split on two replicas, half exit, the two halves of 8 merge into one batch of 16
for the second split on one replica). The optimizer chooses split points, per-split replica counts and GPU types
so that every request meets ``SLO x (1 - slack)``, the GPUs of each type stay within the counts given, the cost
within ``alpha x`` a baseline's, and goodput is the largest possible.

The model (steady state)
------------------------
- ``batch_profile[k]`` is the fraction of the input still present after layer k's exit ramp; ``f_k`` (the
  fraction entering layer k) is ``batch_profile[k-1]``, ``f_0 = 1``.
- A split of layers ``[s, e)`` runs batches of b at its first layer; inside it the batch shrinks as samples
  exit: layer k sees ``b f_k / f_s`` samples in expectation. A fractional expected count costs the layer time
  interpolated between the whole batches around it (``t(0) = 0``), which is exact at batch 1, where a sample
  is either there or gone. A replica's time for one batch is the split's *stage time* ``T``.
- Per input sample the split receives ``f_s`` samples, so with ``r`` replicas it keeps up with
  ``r b / (f_s T)`` input samples per second. A transfer into a split moves one merged batch of b to one of
  its replicas in ``transfer_s`` seconds (a number, or ``transfer_s(boundary, b)``), each replica over its own
  link, overlapped with its compute: ``r b / (f_s x)`` input samples per second. Goodput is the smallest of these
  over the splits and transfers (pipelined, §3.2.2).
- ``input_batches`` (n) input batches of b enter per *cycle*, one for each replica of the first split; split i
  then receives ``n f_s`` batches per cycle (``batches_per_cycle``), spread over its replicas; the cycle lasts
  ``n b / goodput``, which is at least every split's busy time. In the paper's example n = 2 and the second
  split receives one batch per cycle.
- A request's latency is the sum along its path of: the wait for its batch to fill (with a ``request_rate`` R,
  ``b / (R f_s)`` at the split starting at layer s: survivors arrive at ``R f_s``; without one, no wait is
  counted), the transfer in, and the stage time. The worst case, a request that reaches the last layer, must
  be within the budget ``SLO x (1 - slack)``. So the rate and the SLO bound the batch, as §3.2 derives B_0
  from R: see :func:`largest_batch`.
- With a ``request_rate``, goodput beyond R earns nothing: among plans that sustain R the cheapest wins.
- Not pipelined (``pipelined=False``, §5.8.7, no model parallelism): every split runs on the same P GPUs of one
  type, in rounds; a round takes P input batches, and each split waits for all of its copies before the next
  split starts, so a round lasts the sum of the stage times (and transfers), and goodput is ``P b / round``.
- Cost is the per-second price of the GPUs a plan uses (``prices``); with ``alpha`` a plan may cost at most
  ``alpha x baseline_cost_per_s`` (by default the price of all the GPUs given).

The baseline (``SplitPlan.baseline``, :func:`data_parallel`) is the early-exit model as is, data parallel on all
the same GPUs: every replica runs a batch of b through the whole model, the batch shrinking as samples exit,
every type whose replica meets the SLO taking part. With no exits, E3's goodput cannot exceed it on one type
(the stage times add up to the whole model's); at b = 1 neither can it (a sample's expected work is the same).

Where this differs from the paper: the per-replica batch is given (:func:`largest_batch` finds the largest one
a request rate and SLO allow), and the paper's constraint that a plan's throughput be at least the baseline's
is not imposed: the objective maximises goodput, and callers compare the plan with ``baseline``.

Among plans with the same goodput the optimizer prefers the lowest cost, then the fewest GPUs, then the lowest
worst-case latency; :func:`brute_force_splits` enumerates every plan and breaks ties the same way.

The dynamic program
-------------------
Labels over (layer boundary, GPUs used per type): a label at boundary e is a way to run layers ``[0, e)``, kept
only when no other label at e uses no more GPUs of any type and has no more latency (a dense box over the
used-GPU vectors finds the dominated ones with a running minimum along each type's axis). Pipelined, the
smallest feasible time per input sample (the inverse of goodput) is searched for among the candidates (every
split's and transfer's time per input sample), upwards in growing steps from two lower bounds (with every GPU
type unlimited: the smallest, and the smallest at which some plan meets the budget), then by bisection: first
each split gets only the fewest replicas that keep up and latency is not tracked (do the GPUs and the cost bound
suffice?), then every replica count with latency tracked (does every request meet the SLO too?); that pass at
the smallest feasible candidate also breaks the ties. Not pipelined, a shortest path over the cuts per type.
Labels are kept sorted by latency, so an option is tried only with those that can still meet the budget; a
replica count no better than a smaller one is never tried; lower bounds on the latency, GPUs and cost still to
come drop labels that cannot complete. The box has ``prod(count + 1)`` cells over the GPU types; more than
``MAX_CELLS`` is refused as bad input.
"""
from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Callable, Mapping, Sequence

import numpy as np

from workbench.errors import WorkbenchError

_EPS = 1e-9          # slack for rounding an expected count of samples to a whole one
_TOL = 1e-9          # relative slack of the lower bounds that prune labels (they sum in another order)

MAX_CELLS = 1 << 22   # the largest box of GPUs-used-per-type vectors (product of count + 1 over the types)
MAX_TABLE = 1 << 24   # the largest table of split times: (layers + 1)^2 x GPU types x replica counts
MAX_BATCH = 1 << 20   # the largest batch per replica
MAX_GPUS_PER_TYPE = 4096
MAX_RATE = 1e9        # requests per second

LayerLatency = Callable[[int, int, str], float]


@dataclass(frozen=True)
class DataParallelPlan:
    """A model run as is, data parallel: every replica runs batches of ``batch_size`` through every layer.

    ``replicas`` per GPU type taking part (a type whose replica misses the SLO takes none); ``batch_s`` a
    replica's time for one batch per type; ``goodput`` in input samples per second (0 when no type meets the
    SLO, and ``reason`` says why)."""
    replicas: dict[str, int]
    batch_s: dict[str, float]
    goodput: float
    latency_s: float
    cost_per_s: float
    batch_size: int
    reason: str = ""

    def __bool__(self) -> bool:
        return self.goodput > 0

    def to_dict(self) -> dict:
        return {"replicas": dict(self.replicas), "batch_s": dict(self.batch_s), "goodput": self.goodput,
                "latency_s": self.latency_s, "cost_per_s": self.cost_per_s, "batch_size": self.batch_size,
                "reason": self.reason}


@dataclass(frozen=True)
class Stage:
    """One split of a :class:`SplitPlan` as a whole: layers ``start`` to ``end`` (exclusive) on ``replicas``
    GPUs of ``gpu_type``, each running batches of ``batch_size`` in ``stage_s``; ``batches_per_cycle`` batches
    reach it per cycle, ``fill_s`` is its wait for a batch to fill, ``transfer_in_s`` the hand-over from the
    split before (0 for the first). Figures, tables and labs read these instead of zipping the plan's lists."""
    index: int
    start: int
    end: int
    replicas: int
    gpu_type: str
    batch_size: int
    stage_s: float = math.nan
    batches_per_cycle: float = math.nan
    fill_s: float = 0.0
    transfer_in_s: float = 0.0

    @property
    def layers(self) -> range:
        return range(self.start, self.end)


@dataclass(frozen=True)
class SplitPlan:
    """The optimizer's answer: splits, their replicas and GPU types, and why.

    ``splits`` are ``(start, end)`` layer ranges (end exclusive) covering every layer; ``replicas``,
    ``gpu_types``, ``batch_sizes`` (the batch every replica of the split runs: ``batch_size``, constant through
    the model), ``batches_per_cycle`` (batches of b the split receives per cycle) and ``stage_s`` (a replica's
    time for one batch) are per split; ``transfers_s`` per boundary between consecutive splits.
    ``input_batches`` batches of b enter per cycle of ``cycle_s``. ``goodput`` is in input samples per second
    (0 for an empty plan, whose ``reason`` says why there is none). ``fill_s`` per split: the wait for a batch to
    fill at the request rate (0 without one). ``binding`` names what sets goodput; ``reason`` says why this plan;
    ``baseline`` is the early-exit model as is, data parallel on all the GPUs; ``table`` is the dynamic program per
    boundary; ``probes`` the candidates it tried and whether a plan met each. ``bottlenecks`` lists what sets
    goodput as ("compute", split index) or ("transfer", index of the split it feeds) (pipelined only)."""
    splits: list[tuple[int, int]]
    replicas: list[int]
    gpu_types: list[str]
    batch_sizes: list[int]
    goodput: float
    stage_s: list[float] = field(default_factory=list)
    transfers_s: list[float] = field(default_factory=list)
    batches_per_cycle: list[float] = field(default_factory=list)
    fill_s: list[float] = field(default_factory=list)
    input_batches: int = 0
    cycle_s: float = math.inf
    latency_s: float = math.inf
    budget_s: float = 0.0
    cost_per_s: float = 0.0
    cost_limit_per_s: float = math.inf
    gpus_used: dict[str, int] = field(default_factory=dict)
    batch_size: int = 0
    request_rate: float | None = None
    pipelined: bool = True
    binding: str = ""
    bottlenecks: list[tuple[str, int]] = field(default_factory=list)
    reason: str = ""
    baseline: DataParallelPlan | None = None
    table: list[dict] = field(default_factory=list)
    probes: list[dict] = field(default_factory=list)
    solve_s: float = 0.0

    def __bool__(self) -> bool:
        return bool(self.splits)

    @property
    def stages(self) -> tuple[Stage, ...]:
        """The splits as typed :class:`Stage` records (the per-split lists above, read together)."""
        def at(values, i, default):
            return values[i] if i < len(values) else default

        return tuple(Stage(i, s, e, self.replicas[i], self.gpu_types[i], self.batch_sizes[i],
                           at(self.stage_s, i, math.nan), at(self.batches_per_cycle, i, math.nan),
                           at(self.fill_s, i, 0.0), at(self.transfers_s, i - 1, 0.0) if i else 0.0)
                     for i, (s, e) in enumerate(self.splits))

    @property
    def unsplit(self) -> dict | None:
        """The baseline as a dict (the early-exit model as is, data parallel on all the GPUs), or None."""
        return self.baseline.to_dict() if self.baseline else None

    @property
    def gain(self) -> float:
        """Goodput over the baseline's (nan when either has none)."""
        return self.goodput / self.baseline.goodput if self and self.baseline else math.nan

    @property
    def objective(self) -> tuple[float, float, int, float]:
        """What the optimizer minimises, in order: seconds per input sample (the inverse of goodput, no lower
        than the request rate's), cost, GPUs, worst-case latency."""
        per = 1.0 / self.goodput if self.goodput > 0 else math.inf
        if self.request_rate:
            per = max(per, 1.0 / self.request_rate)
        return (per, self.cost_per_s, sum(self.gpus_used.values()), self.latency_s)

    def throughputs(self) -> list[float]:
        """Each split's throughput in input samples per second, then each transfer's."""
        out = []
        for t, r, n in zip(self.stage_s, self.replicas, self.batches_per_cycle):
            f = n / self.input_batches if self.input_batches else 0.0
            out.append(r * self.batch_size / (f * t) if f * t > 0 else math.inf)
        for t, r, n in zip(self.transfers_s, self.replicas[1:], self.batches_per_cycle[1:]):
            f = n / self.input_batches if self.input_batches else 0.0
            out.append(r * self.batch_size / (f * t) if f * t > 0 else math.inf)
        return out

    def rows(self) -> list[dict]:
        """One row per split, for a table."""
        tput = self.throughputs()
        return [{"split": st.index + 1, "layers": _layers(st.start, st.end), "gpu_type": st.gpu_type,
                 "replicas": st.replicas, "batch": st.batch_size, "batches_per_cycle": st.batches_per_cycle,
                 "stage_ms": 1e3 * st.stage_s, "throughput": tput[st.index], "transfer_in_ms": 1e3 * st.transfer_in_s}
                for st in self.stages[:min(len(self.stage_s), len(self.batches_per_cycle))]]

    def explain(self) -> str:
        """A few lines a dashboard can show: the plan, what binds it, why it was chosen."""
        if not self.splits:
            return f"no plan: {self.reason}"
        lines = [f"{len(self.splits)} split(s), goodput {self.goodput:,.4g} samples/s, {self.input_batches} "
                 f"input batch(es) of {self.batch_size} per cycle of {_ms(self.cycle_s)}, worst-case latency "
                 f"{_ms(self.latency_s)} of {_ms(self.budget_s)}"]
        for row in self.rows():
            lines.append(f"  split {row['split']}: {row['layers']} on {row['replicas']} x {row['gpu_type']}, "
                         f"batch {row['batch']}, {row['batches_per_cycle']:.3g} batch(es) a cycle, "
                         f"{_ms(row['stage_ms'] / 1e3)} each"
                         + (f" (after a {_ms(row['transfer_in_ms'] / 1e3)} transfer)" if row["split"] > 1 else ""))
        lines.append(f"binding: {self.binding}")
        lines.append(f"why: {self.reason}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"splits": [list(s) for s in self.splits], "replicas": list(self.replicas),
                "gpu_types": list(self.gpu_types), "batch_sizes": list(self.batch_sizes), "goodput": self.goodput,
                "stage_s": list(self.stage_s), "transfers_s": list(self.transfers_s),
                "batches_per_cycle": list(self.batches_per_cycle), "fill_s": list(self.fill_s),
                "input_batches": self.input_batches, "cycle_s": self.cycle_s,
                "latency_s": self.latency_s, "budget_s": self.budget_s, "cost_per_s": self.cost_per_s,
                "cost_limit_per_s": self.cost_limit_per_s, "gpus_used": dict(self.gpus_used),
                "batch_size": self.batch_size, "request_rate": self.request_rate, "pipelined": self.pipelined,
                "binding": self.binding, "bottlenecks": [list(b) for b in self.bottlenecks],
                "reason": self.reason, "baseline": self.unsplit, "table": list(self.table),
                "probes": list(self.probes), "solve_s": self.solve_s}


# ---------------------------------------------------------------------------------------------- validation

def _real(name: str, value, *, low: float | None = None, low_open: bool = False, high: float | None = None,
          high_open: bool = False, fix: str = "") -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise WorkbenchError(f"{name} must be a finite number, got {value!r}{fix}")
    v = float(value)
    if low is not None and (v <= low if low_open else v < low):
        raise WorkbenchError(f"{name} must be {'>' if low_open else '>='} {low:g}, got {value!r}{fix}")
    if high is not None and (v >= high if high_open else v > high):
        raise WorkbenchError(f"{name} must be {'<' if high_open else '<='} {high:g}, got {value!r}{fix}")
    return v


def _validate(layer_latency, batch_profile, gpus, slo_s, pipelined, transfer_s, slack, batch_size, num_layers,
              prices, alpha, baseline_cost_per_s, request_rate=None):
    if not callable(layer_latency):
        raise WorkbenchError(f"layer_latency must be a function (layer, batch, gpu_type) -> seconds, "
                             f"got {type(layer_latency).__name__}")
    if hasattr(batch_profile, "remaining"):          # a BatchProfile
        batch_profile = list(batch_profile.remaining)
    if isinstance(batch_profile, (str, bytes, Mapping)) or not isinstance(batch_profile, (Sequence, np.ndarray)):
        raise WorkbenchError("batch_profile must be a sequence: the fraction of the batch left after each layer's "
                             f"exit ramp, one entry per layer; got {type(batch_profile).__name__}")
    profile = list(np.asarray(batch_profile, dtype=object).ravel()) if isinstance(batch_profile, np.ndarray) \
        else list(batch_profile)
    if not profile:
        raise WorkbenchError("batch_profile is empty: give one entry per layer (the fraction of the batch left "
                             "after that layer's exit ramp)")
    if num_layers is not None:
        if isinstance(num_layers, bool) or not isinstance(num_layers, Integral) or num_layers < 1:
            raise WorkbenchError(f"num_layers must be a positive integer, got {num_layers!r}")
        if len(profile) != num_layers:
            raise WorkbenchError(
                f"batch_profile has {len(profile)} entries but the model has {num_layers} layers: give one entry "
                f"per layer, the fraction of the batch left after that layer's exit ramp "
                f"({'drop the extra ones' if len(profile) > num_layers else 'add the missing ones'})")
    fracs = []
    for k, p in enumerate(profile):
        if isinstance(p, bool) or not isinstance(p, Real) or not math.isfinite(float(p)):
            raise WorkbenchError(f"batch_profile[{k}] must be a number in [0, 1], got {p!r}")
        if not 0.0 <= float(p) <= 1.0:
            raise WorkbenchError(f"batch_profile[{k}] = {p!r} is outside [0, 1]: it is the fraction of the input "
                                 "batch still present after that layer's exit ramp")
        if fracs and float(p) > fracs[-1]:
            raise WorkbenchError(f"batch_profile increases at layer {k} ({fracs[-1]!r} -> {p!r}): samples that "
                                 "exited do not come back, so it must be non-increasing")
        fracs.append(float(p))
    if not isinstance(gpus, Mapping):
        raise WorkbenchError(f"gpus must be a mapping gpu_type -> count, got {type(gpus).__name__}")
    counts = {}
    for name, n in gpus.items():
        if not isinstance(name, str) or not name:
            raise WorkbenchError(f"GPU types must be named by non-empty strings, got {name!r}")
        if isinstance(n, bool) or not isinstance(n, Integral) or not 0 <= n <= MAX_GPUS_PER_TYPE:
            raise WorkbenchError(f"gpus[{name!r}] must be a whole number in 0..{MAX_GPUS_PER_TYPE}, got {n!r}")
        counts[name] = int(n)
    cells = math.prod(n + 1 for n in counts.values())
    if cells > MAX_CELLS:
        raise WorkbenchError(f"gpus {counts} make {cells:,} combinations of GPUs used per type, more than the "
                             f"{MAX_CELLS:,} the exact optimizer tabulates; group similar types or give fewer GPUs "
                             "of a type")
    if sum(counts.values()) == 0:
        raise WorkbenchError("no GPUs: gpus gives none of any type"
                             + (f" ({', '.join(f'{k}: 0' for k in counts)})" if counts else "")
                             + "; give at least one, e.g. {'v100': 4}")
    slo = _real("slo_s", slo_s, low=0.0, low_open=True, fix=" (the latency SLO in seconds)")
    if not isinstance(pipelined, bool):
        raise WorkbenchError(f"pipelined must be True or False, got {pipelined!r}")
    if not callable(transfer_s):
        _real("transfer_s", transfer_s, low=0.0, fix=" (seconds to move a split's output to the next split; "
                                                    "it cannot be negative)")
    sl = _real("slack", slack, low=0.0, high=1.0, high_open=True,
               fix=" (the fraction of the SLO kept in reserve; in [0, 1))")
    if isinstance(batch_size, bool) or not isinstance(batch_size, Integral) or batch_size < 1:
        raise WorkbenchError(f"batch_size must be a whole number >= 1 (the batch every replica runs), "
                             f"got {batch_size!r}")
    if batch_size > MAX_BATCH:
        raise WorkbenchError(f"batch_size {batch_size:,} is beyond {MAX_BATCH:,} samples per replica's batch")
    rate = None
    if request_rate is not None:
        rate = _real("request_rate", request_rate, low=0.0, low_open=True, high=MAX_RATE,
                     fix=f" (input requests per second, in (0, {MAX_RATE:g}])")
    kinds = sum(1 for n in counts.values() if n > 0)
    table = (len(fracs) + 1) ** 2 * kinds * max(counts.values())
    if table > MAX_TABLE:
        raise WorkbenchError(f"{len(fracs)} layers x {kinds} GPU types x up to {max(counts.values()):,} replicas "
                             f"per split make a table of {table:,} split times, beyond {MAX_TABLE:,}: use fewer "
                             "layers or fewer GPUs of a type")
    used = [g for g, n in counts.items() if n > 0]
    price = None
    if prices is not None:
        if not isinstance(prices, Mapping):
            raise WorkbenchError(f"prices must be a mapping gpu_type -> dollars per second, got {type(prices).__name__}")
        missing = [g for g in used if g not in prices]
        if missing:
            raise WorkbenchError(f"prices has no price for {', '.join(map(repr, missing))}: give every GPU type "
                                 "in gpus a price per second (e.g. workbench.devices.PRESETS[name].price_per_s)")
        price = {g: _real(f"prices[{g!r}]", prices[g], low=0.0) for g in used}
    a = None
    if alpha is not None:
        a = _real("alpha", alpha, low=0.0, low_open=True, fix=" (the cost multiplier over the baseline)")
        if price is None:
            raise WorkbenchError("alpha bounds the cost, which needs prices: give prices={gpu_type: dollars per "
                                 "second} too")
    base = None
    if baseline_cost_per_s is not None:
        base = _real("baseline_cost_per_s", baseline_cost_per_s, low=0.0, low_open=True)
        if a is None:
            raise WorkbenchError("baseline_cost_per_s sets a bound only with alpha: give alpha too "
                                 "(cost <= alpha x baseline_cost_per_s)")
    return fracs, counts, slo, sl, int(batch_size), price, a, base, rate


# ------------------------------------------------------------------------------------------------- tables

class _Problem:
    """The validated instance and its tables: every split's stage time per type, its time per input sample per
    replica count, and its latency."""

    def __init__(self, layer_latency, fracs, counts, slo, pipelined, transfer_s, slack, batch_size, price, alpha,
                 baseline, rate):
        self.L = L = len(fracs)
        self.fracs = fracs
        self.f_in = f_in = np.array([1.0] + fracs[:-1])                # fraction of the input entering layer k
        self.types = [g for g, n in counts.items() if n > 0]
        self.all_counts = dict(counts)
        self.counts = np.array([counts[g] for g in self.types], dtype=np.int64)
        self.G = G = len(self.types)
        self.B = b = batch_size
        self.rate = rate
        self.slo, self.slack, self.pipelined = slo, slack, pipelined
        self.budget = slo * (1.0 - slack)
        self.priced = price is not None
        self.prices = np.array([price[g] for g in self.types] if price else [0.0] * G, dtype=np.float64)
        if alpha is None:
            self.cost_limit = math.inf
            self.baseline = None
        else:
            self.baseline = baseline if baseline is not None else self.cost_of(self.counts)
            self.cost_limit = alpha * self.baseline * (1.0 + _TOL)
        self.alpha = alpha

        memo: dict[tuple[int, int, int], float] = {}

        def whole(k: int, n: int, g: int) -> float:
            if n == 0:
                return 0.0
            if (k, n, g) not in memo:
                memo[k, n, g] = _call_latency(layer_latency, k, n, self.types[g], L)
            return memo[k, n, g]

        def expected(k: int, q: float, g: int) -> float:
            lo = math.floor(q + _EPS)
            frac = q - lo
            if frac <= _EPS:
                return whole(k, lo, g)
            return (1.0 - frac) * whole(k, lo, g) + frac * whole(k, lo + 1, g)

        T3 = np.full((L + 1, L + 1, G), np.inf)                         # a replica's time for one batch of b
        for s in range(L):
            acc = np.zeros(G)
            for e in range(s + 1, L + 1):
                q = b * f_in[e - 1] / f_in[s] if f_in[s] > 0 else 0.0
                acc = acc + np.array([expected(e - 1, min(float(b), q), g) for g in range(G)])
                T3[s, e] = acc
        self.T3 = T3
        x = np.zeros(L + 1)
        for s in range(1, L):
            x[s] = _call_transfer(transfer_s, s, b) if f_in[s] > 0 else 0.0
        self.x = x
        fill = np.zeros(L + 1)
        if rate is not None:
            live = f_in > 0
            with np.errstate(over="ignore"):
                fill[:L][live] = b / (rate * f_in[live])
        self.fill = fill
        self.E3 = x[:, None, None] + T3 + fill[:, None, None]          # latency: fill, transfer in, compute
        self.R = R = int(self.counts.max())
        rr = np.arange(1, R + 1)
        self.rr = rr
        valid = rr[None, :] <= self.counts[:, None]                                          # (G, R)
        w = np.append(f_in, 0.0)[:, None, None, None] / b                                    # f_s per start
        with np.errstate(invalid="ignore"):
            per = w * np.maximum(T3, x[:, None, None])[..., None] / rr                        # s per input sample
        self.C = np.where(valid[None, None] & np.isfinite(T3)[..., None], per, np.inf)
        self.E = np.where(valid[None, None], self.E3[..., None], np.inf)
        # more replicas no faster than fewer of the same type only waste GPUs
        dominated = np.zeros(self.C.shape, dtype=bool)
        dominated[..., 1:] = self.C[..., 1:] >= np.minimum.accumulate(self.C, axis=3)[..., :-1]
        self.useful = np.isfinite(self.C) & ~dominated
        # the box of used-GPU vectors
        self.shape = tuple(int(n) + 1 for n in self.counts)
        self.size = int(np.prod(self.shape))
        self.stride = np.array([int(np.prod(self.shape[g + 1:])) for g in range(G)], dtype=np.int64)
        self.U = np.stack(np.unravel_index(np.arange(self.size), self.shape), axis=1).astype(np.int64)  # (size, G)
        self.gpus_box = self.U.sum(axis=1)
        self.cost_box = self.cost_of(self.U)
        self.total = int(self.counts.sum())
        self.rep_cost = rr[None, :] * self.prices[:, None]                 # (G, R): r replicas of type g
        # without latency: a box over the other types, the busiest type's count as the value to minimise
        v = int(np.argmax(self.counts))
        rest = [g for g in range(G) if g != v]
        self.rshape = tuple(self.shape[g] for g in rest)
        rstride = np.array([int(np.prod(self.rshape[i + 1:])) for i in range(len(rest))], dtype=np.int64)
        self.rkey = (self.U[:, rest] * rstride).sum(axis=1) if rest else np.zeros(self.size, np.int64)
        self.rval = self.U[:, v].astype(np.float64)

    @property
    def floor_per(self) -> float:
        """Below this time per input sample (the request rate's) more goodput earns nothing."""
        return 1.0 / self.rate if self.rate else 0.0

    def variant(self, **changes) -> _Problem:
        """The same tables under other settings (``budget``, ``cost_limit``, ``pipelined``)."""
        other = object.__new__(_Problem)
        other.__dict__.update(self.__dict__, **changes)
        return other

    def cost_of(self, u) -> np.ndarray | float:
        """Dollars per second of used-GPU vector(s) ``u``, summed type by type in one fixed order."""
        u = np.asarray(u)
        cost = np.zeros(u.shape[:-1]) if u.ndim > 1 else 0.0
        for g in range(self.G):
            cost = cost + u[..., g] * self.prices[g]
        return cost if u.ndim > 1 else float(cost)

    # the key of a plan, computed the same way for the dynamic program and brute force
    def evaluate(self, plan: Sequence[tuple[int, int, int, int]]) -> tuple[float, float, int, float, np.ndarray]:
        """(time per input sample as ranked, cost, GPUs, latency, used) of a plan given as (start, end, type
        index, replicas); the time per input sample is ranked no lower than the request rate's."""
        per, lam, used = self.measure(plan)
        return max(per, self.floor_per), self.cost_of(used), int(used.sum()), lam, used

    def measure(self, plan: Sequence[tuple[int, int, int, int]]) -> tuple[float, float, np.ndarray]:
        """(seconds per input sample, worst-case latency, GPUs used per type) of a plan."""
        used = np.zeros(self.G, dtype=np.int64)
        if not self.pipelined:                          # one pool of P GPUs of one type runs every split in turn
            g, pool = plan[0][2], plan[0][3]
            rnd = sum(float(self.T3[s, e, g] + self.x[s]) for s, e, _, _ in plan)
            used[g] = pool
            return rnd / (pool * self.B), rnd + self.round_fill(pool), used
        lam, per = 0.0, 0.0
        for s, e, g, r in plan:
            lam = lam + float(self.E[s, e, g, r - 1])
            per = max(per, float(self.C[s, e, g, r - 1]))
            used[g] += r
        return per, lam, used

    def round_fill(self, pool: int) -> float:
        """Not pipelined: the wait for a round's ``pool`` input batches to fill at the request rate."""
        return pool * self.B / self.rate if self.rate else 0.0

    def feasible(self, lam: float, cost: float, used) -> bool:
        return lam <= self.budget and cost <= self.cost_limit and bool(np.all(np.asarray(used) <= self.counts))


def _call_latency(fn, k: int, b: int, gpu: str, L: int) -> float:
    try:
        v = fn(k, b, gpu)
    except Exception as exc:                                           # the user's function: name the call
        hint = (f"; does the model have {L} layers, as batch_profile's {L} entries say?"
                if isinstance(exc, (IndexError, KeyError)) else "")
        raise WorkbenchError(f"layer_latency({k}, {b}, {gpu!r}) raised {type(exc).__name__}: {exc}{hint}") from exc
    if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(float(v)) or not float(v) > 0:
        raise WorkbenchError(f"layer_latency({k}, {b}, {gpu!r}) returned {v!r}: it must be a positive, finite "
                             "number of seconds (a layer on a non-empty batch takes some time)")
    return float(v)


def _call_transfer(fn, boundary: int, batch: int) -> float:
    if not callable(fn):
        return float(fn)
    try:
        v = fn(boundary, batch)
    except Exception as exc:
        raise WorkbenchError(f"transfer_s({boundary}, {batch}) raised {type(exc).__name__}: {exc}") from exc
    if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(float(v)) or float(v) < 0:
        raise WorkbenchError(f"transfer_s({boundary}, {batch}) returned {v!r}: it must be a finite number of "
                             "seconds >= 0")
    return float(v)


# ------------------------------------------------------------------------------------------ dynamic program

@dataclass
class _Result:
    plan: list[tuple[int, int, int, int]] | None      # (start, end, type index, replicas)
    labels: list[int]                                 # labels kept per boundary
    best_lat: list[float]
    fewest: list[int]
    min_cycle: float = math.inf                       # the smallest cycle among the plans found


@functools.lru_cache(maxsize=64)
def _box_steps(shape: tuple[int, ...]) -> tuple[tuple, tuple]:
    """Index pairs for running minima along each axis of a box (large boxes: a loop over slices beats
    ``np.minimum.accumulate`` on non-contiguous axes) and for the cells one step below along each axis."""
    run = []
    for ax, n in enumerate(shape):
        for i in range(1, n):
            run.append(((slice(None),) * ax + (i,), (slice(None),) * ax + (i - 1,)))
    step = tuple(((slice(None),) * ax + (slice(1, None),), (slice(None),) * ax + (slice(None, -1),))
                 for ax, n in enumerate(shape) if n > 1)
    return tuple(run), step


def _pareto(shape: tuple[int, ...], key: np.ndarray, val: np.ndarray, tie: np.ndarray | None = None) -> np.ndarray:
    """The candidates to keep: for each box cell ``key`` the one with the least ``val``, unless a cell below it
    (no larger along any axis, not the same) has a ``val`` no larger. A running minimum along each axis of the
    box gives every cell the least value below it."""
    size = int(np.prod(shape)) if shape else 1
    V = np.full(size, np.inf)
    np.minimum.at(V, key, val)
    best = V[key]
    if shape:
        D = V.reshape(shape).copy()
        run, step = _box_steps(shape)
        if size <= 4096 or len(shape) == 1:
            for ax in range(len(shape)):
                np.minimum.accumulate(D, axis=ax, out=D)
        else:
            for a, b in run:
                np.minimum(D[a], D[b], out=D[a])
        M = np.full(shape, np.inf)
        for a, b in step:
            np.minimum(M[a], D[b], out=M[a])
        win = np.nonzero((val == best) & (best < M.ravel()[key]))[0]
    else:
        win = np.nonzero(val == best)[0]
    ptr = np.full(size, -1, np.int64)
    if tie is not None:                         # equal values in a cell: the smallest tie is assigned last, wins
        win = win[np.argsort(-tie[win], kind="stable")]
    ptr[key[win]] = win                                        # one candidate per cell
    return ptr[ptr >= 0]


def _dp(P: _Problem, tau: float, mode: str) -> _Result:
    """Labels over (boundary, GPUs used per type) with every split's stage and transfer within ``tau``.

    ``mode`` "resources": each split gets only the fewest replicas that meet ``tau`` and latency is not tracked
    (do the GPUs and the cost bound suffice?); the plan returned is the one with the smallest cycle found.
    "full": every replica count, latency tracked; the plan returned is the best by cost, then GPUs, then
    latency (not pipelined: by latency, then cost, then GPUs)."""
    L = P.L
    fits = P.C <= tau                                                          # (L+1, L+1, G, R); inf: invalid
    track = mode == "full"
    allowed = fits & P.useful if track else fits & (np.cumsum(fits, axis=3) == 1)   # or the fewest replicas only
    rr = P.rr
    lb_lat = np.zeros(L + 1)                   # lower bounds on what finishing from each boundary takes
    min_gpus = np.zeros(L + 1)
    min_cost = np.zeros(L + 1)
    lat_fit = np.where(fits, P.E, np.inf)
    gpus_fit = np.where(allowed, rr[None, None, None, :].astype(np.float64), np.inf)
    cost_fit = np.where(allowed, P.rep_cost[None, None], np.inf)
    for s in range(L - 1, -1, -1):
        if track:
            lb_lat[s] = np.min(lat_fit[s, s + 1:] + lb_lat[s + 1:, None, None])
        min_gpus[s] = np.min(gpus_fit[s, s + 1:] + min_gpus[s + 1:, None, None])
        min_cost[s] = np.min(cost_fit[s, s + 1:] + min_cost[s + 1:, None, None])
    stats = _Result(None, [1] + [0] * L, [0.0] + [math.inf] * L, [0] * (L + 1))
    lat_cap = P.budget * (1 + _TOL) + 1e-300
    cost_cap = P.cost_limit * (1 + _TOL)
    if (track and lb_lat[0] > lat_cap) or min_gpus[0] > P.total or min_cost[0] > cost_cap:
        return stats

    oe, os_, og, orr = np.nonzero(allowed.transpose(1, 0, 2, 3))             # sorted by end, then start
    ev = P.E[os_, oe, og, orr] if track else np.zeros(oe.size)
    oc = P.C[os_, oe, og, orr]
    orr = orr + 1
    ostep = orr * P.stride[og]
    bounds = np.searchsorted(oe, np.arange(L + 2))
    cap = 1024
    all_idx = np.zeros(cap, np.int64)           # every boundary's labels one after another
    all_lam = np.zeros(cap)
    all_ns = np.zeros(cap, np.int64)            # splits so far: fewer wins a tie (the paper minimises splits)
    all_cyc = np.zeros(cap)
    all_key = np.zeros(cap)                     # boundary x spread + latency: sorted, for searching
    spread = 4.0 * lat_cap + 1.0 if math.isfinite(lat_cap) else 0.0
    bounded = math.isfinite(P.cost_limit)
    offsets = np.zeros(L + 2, np.int64)
    offsets[1] = 1
    counts = np.zeros(L + 1, np.int64)
    counts[0] = 1
    back: list[tuple[np.ndarray, ...] | None] = [None] * (L + 1)
    for e in range(1, L + 1):
        offsets[e + 1] = offsets[e]
        lo, hi = bounds[e], bounds[e + 1]
        s_o = os_[lo:hi]
        if track and spread:    # labels are sorted by latency: the ones that can still meet the budget come first
            room = (lat_cap - lb_lat[e]) - ev[lo:hi]
            k = np.searchsorted(all_key[:offsets[e]], s_o * spread + room, side="right") - offsets[s_o]
            k = np.minimum(np.maximum(k, 0), counts[s_o])
        else:
            k = counts[s_o]
        live = np.nonzero(k)[0]
        if live.size == 0:
            continue
        k = k[live]
        total = int(k.sum())
        opt = np.repeat(lo + live, k)                                            # option of each candidate
        rows = offsets[os_[opt]] + np.arange(total) - np.repeat(np.cumsum(k) - k, k)
        parent = all_idx[rows]
        go, ro = og[opt], orr[opt]
        ok = P.U[parent, go] + ro <= P.counts[go]
        if not ok.all():
            sel = np.nonzero(ok)[0]
            parent, opt, rows = parent[sel], opt[sel], rows[sel]
        cand = parent + ostep[opt]
        ok = P.gpus_box[cand] + min_gpus[e] <= P.total
        if bounded:
            ok &= P.cost_box[cand] + min_cost[e] <= cost_cap
        if not ok.all():
            sel = np.nonzero(ok)[0]
            cand, opt, rows = cand[sel], opt[sel], rows[sel]
        if cand.size == 0:
            continue
        lam = all_lam[rows] + ev[opt]
        if track:                   # on the smallest box that holds the candidates
            u = P.U[cand]
            low = u.min(axis=0)
            sub = tuple(int(n) for n in u.max(axis=0) - low + 1)
            substride = np.array([int(np.prod(sub[g + 1:])) for g in range(len(sub))], dtype=np.int64)
            ns = all_ns[rows] + 1
            who = _pareto(sub, (u - low) @ substride, lam, ns)
            who = who[np.argsort(lam[who], kind="stable")]
        else:                       # latency not tracked: the busiest type's count is the value, a smaller box
            who = _pareto(P.rshape, P.rkey[cand], P.rval[cand])
        n = who.size
        o, r_ = opt[who], rows[who]
        s_par = os_[o]
        back[e] = (s_par, r_ - offsets[s_par], og[o], orr[o])
        start = offsets[e]
        if start + n > cap:
            cap = max(2 * cap, start + n)
            all_idx, all_lam, all_cyc, all_key, all_ns = (np.resize(a, cap) for a in
                                                          (all_idx, all_lam, all_cyc, all_key, all_ns))
        all_idx[start:start + n] = cand[who]
        all_lam[start:start + n] = lam[who]
        all_ns[start:start + n] = (ns[who] if track else all_ns[rows[who]] + 1)
        all_key[start:start + n] = e * spread + lam[who]
        all_cyc[start:start + n] = np.maximum(all_cyc[r_], oc[o])
        counts[e] = n
        offsets[e + 1] = start + n
        stats.labels[e] = n
        stats.best_lat[e] = float(lam[who].min()) if track else 0.0
        stats.fewest[e] = int(P.gpus_box[cand[who]].min())
    if counts[L] == 0:
        return stats
    at = slice(offsets[L], offsets[L + 1])
    cells, lam, cyc, nsp = all_idx[at], all_lam[at], all_cyc[at], all_ns[at]
    cost = P.cost_box[cells]
    ok = cost <= P.cost_limit
    if track:
        ok &= lam <= P.budget
    idx = np.nonzero(ok)[0]
    if idx.size == 0:
        return stats
    stats.min_cycle = float(cyc[idx].min())
    gp = P.gpus_box[cells[idx]]
    if not track:
        keys = (gp, cost[idx], cyc[idx])
    elif P.pipelined:
        keys = (nsp[idx], lam[idx], gp, cost[idx])
    else:
        keys = (nsp[idx], gp, cost[idx], lam[idx])
    j = int(idx[np.lexsort(keys)[0]])
    plan = []
    e = L
    while e > 0:
        s_par, j_par, g_par, r_par = back[e]
        plan.append((int(s_par[j]), e, int(g_par[j]), int(r_par[j])))
        e, j = int(s_par[j]), int(j_par[j])
    stats.plan = plan[::-1]
    return stats


# ------------------------------------------------------------------------------------------------- search

def _bottleneck_floor(P: _Problem) -> float:
    """The smallest cycle any plan could have with every GPU type unlimited (a lower bound)."""
    lbc = np.zeros(P.L + 1)
    for s in range(P.L - 1, -1, -1):
        lbc[s] = np.min(np.maximum(P.C[s, s + 1:], lbc[s + 1:, None, None]))
    return float(lbc[0])


def _latency_floor(P: _Problem, cands: np.ndarray) -> int:
    """The index of the smallest candidate cycle at which some plan, with every GPU type unlimited, meets the
    latency budget (a lower bound; ``cands.size`` when none does)."""
    def fastest(tau: float) -> float:
        lat = np.where(P.C <= tau, P.E, np.inf)
        lb = np.zeros(P.L + 1)
        for s in range(P.L - 1, -1, -1):
            lb[s] = np.min(lat[s, s + 1:] + lb[s + 1:, None, None])
        return lb[0]

    lo, hi = 0, cands.size
    while lo < hi:
        mid = (lo + hi) // 2
        if fastest(float(cands[mid])) <= P.budget * (1 + _TOL):     # summed in another order: some slack
            hi = mid
        else:
            lo = mid + 1
    return lo


def _solve(P: _Problem) -> tuple[list | None, list[dict], _Result | None]:
    """The best plan as (start, end, type index, replicas) tuples, the probes tried and the final DP's table."""
    if not P.pipelined:
        plan = _solve_serial(P)
        return plan, [{"per_sample_s": math.nan, "check": "shortest path per type and pool",
                       "feasible": plan is not None}], None
    cands = np.unique(P.C[np.isfinite(P.C) & (P.E <= P.budget)])   # a split over the budget breaks the SLO
    cands = cands[cands >= _bottleneck_floor(P)]
    cands = cands[_latency_floor(P, cands):]
    probes: list[dict] = []
    memo: dict[tuple[int, str], _Result] = {}

    def run(i: int, mode: str) -> _Result:
        if (i, mode) not in memo:
            memo[i, mode] = _dp(P, float(cands[i]), mode)
            probes.append({"per_sample_s": float(cands[i]), "check": mode,
                           "feasible": memo[i, mode].plan is not None})
        return memo[i, mode]

    def smallest(lo: int, mode: str) -> int | None:
        """The smallest index from ``lo`` on at which ``mode`` finds a plan (None: none up to the last). The
        answer is usually near the lower bounds: search upwards in growing steps, then bisect; a plan found
        at a cycle has a cycle of its own, perhaps smaller, which narrows the search at once."""
        last = cands.size - 1
        if run(lo, mode).plan is not None:
            return lo
        step, hi = 0.02, None
        while hi is None:                                    # lo: none
            j = min(last, max(lo + 1, int(np.searchsorted(cands, cands[lo] * (1 + step)))))
            res = run(j, mode)
            if res.plan is not None:
                hi = min(j, int(np.searchsorted(cands, res.min_cycle)))
            elif j == last:
                return None
            else:
                lo, step = j, 2 * step
        while hi - lo > 1:                                   # lo: none, hi: one
            mid = (lo + hi) // 2
            res = run(mid, mode)
            if res.plan is None:
                lo = mid
            else:
                hi = min(mid, int(np.searchsorted(cands, res.min_cycle)))
        return hi

    if cands.size == 0:
        return None, probes, None
    i = smallest(0, "resources")                            # the smallest cycle at which the GPUs (and cost) do
    if i is None:
        return None, probes, memo[cands.size - 1, "resources"]
    j = smallest(i, "full")                                 # then at which every request also meets the SLO
    if j is None:
        return None, probes, memo[cands.size - 1, "full"]
    final = run(j, "full")
    if cands[j] < P.floor_per:                  # more than the request rate: the cheapest plan that sustains it
        final = _dp(P, P.floor_per, "full")
        probes.append({"per_sample_s": P.floor_per, "check": "full at the request rate",
                       "feasible": final.plan is not None})
    return final.plan, probes, final


def _serial_paths(P: _Problem) -> list[list[tuple[float, list[tuple[int, int]]]]]:
    """Per GPU type, for each number of splits that can cut the layers, the cuts with the shortest round (stage
    times and transfers summed in plan order, as :meth:`_Problem.measure` sums them): a shortest path per split
    count. Per count and not overall, because the plan key rounds the round into a latency and time per input
    (a fill wait added, a floor), where a round an ulp longer over fewer splits ties and fewer splits win."""
    out = []
    for g in range(P.G):
        best = np.full((P.L + 1, P.L + 1), np.inf)      # [boundary, splits so far]
        prev = np.zeros((P.L + 1, P.L + 1), np.int64)
        best[0, 0] = 0.0
        for e in range(1, P.L + 1):
            for n in range(1, e + 1):
                for s in range(n - 1, e):
                    v = best[s, n - 1] + float(P.T3[s, e, g] + P.x[s])
                    if v < best[e, n]:
                        best[e, n], prev[e, n] = v, s
        paths = []
        for n in range(1, P.L + 1):
            if not np.isfinite(best[P.L, n]):
                continue
            cuts, e, k = [], P.L, n
            while e > 0:
                cuts.append((int(prev[e, k]), e))
                e, k = int(prev[e, k]), k - 1
            paths.append((float(best[P.L, n]), cuts[::-1]))
        out.append(paths)
    return out


def _solve_serial(P: _Problem) -> list | None:
    """Not pipelined: per type and split count the shortest round, on every pool size that fits; the best by the
    plan key (fewer splits on a tie)."""
    best = None
    for g, paths in enumerate(_serial_paths(P)):
        for _, cuts in paths:
            for pool in range(1, int(P.counts[g]) + 1):
                plan = [(s, e, g, pool) for s, e in cuts]
                per, cost, gpus, lam, used = P.evaluate(plan)
                key = (per, cost, gpus, lam, len(plan))
                if P.feasible(lam, cost, used) and (best is None or key < best[0]):
                    best = (key, plan)
    return best[1] if best else None


def _data_parallel(P: _Problem) -> DataParallelPlan:
    """The early-exit model as is on all the GPUs: each replica runs a batch of b through every layer."""
    replicas, batch_s, served, worst = {}, {}, 0.0, 0.0
    fill = P.B / P.rate if P.rate else 0.0
    for g, name in enumerate(P.types):
        t = float(P.T3[0, P.L, g])
        batch_s[name] = t
        if t + fill <= P.budget * (1 + _TOL):
            replicas[name] = int(P.counts[g])
            served += P.counts[g] * P.B / t
            worst = max(worst, t + fill)
    if not replicas:
        fastest = min(batch_s, key=batch_s.get)
        return DataParallelPlan({}, batch_s, 0.0, math.inf, 0.0, P.B,
                                f"no GPU type runs a batch of {P.B} through the model within the {_ms(P.budget)} "
                                f"budget (the fastest, {fastest}, takes {_ms(batch_s[fastest] + fill)})")
    cost = float(sum(P.prices[P.types.index(g)] * n for g, n in replicas.items()))
    return DataParallelPlan(replicas, batch_s, float(served), worst, cost, P.B)


def _brute(P: _Problem) -> tuple[list | None, int]:
    L, G = P.L, P.G
    best: list = [None, None]
    seen = [0]

    def consider(plan):
        seen[0] += 1
        per, cost, gpus, lam, u = P.evaluate(plan)
        if P.feasible(lam, cost, u):
            key = (per, cost, gpus, lam, len(plan))
            if best[0] is None or key < best[0]:
                best[0], best[1] = key, list(plan)

    if not P.pipelined:
        for cuts in itertools.product((False, True), repeat=L - 1):
            bounds = [0] + [k + 1 for k, c in enumerate(cuts) if c] + [L]
            for g in range(G):
                for pool in range(1, int(P.counts[g]) + 1):
                    consider([(s, e, g, pool) for s, e in zip(bounds, bounds[1:])])
        return best[1], seen[0]

    def rec(s: int, used: list[int], plan: list):
        if s == L:
            consider(plan)
            return
        for e in range(s + 1, L + 1):
            for g in range(G):
                for r in range(1, int(P.counts[g]) + 1):
                    if used[g] + r > P.counts[g]:
                        break
                    used[g] += r
                    plan.append((s, e, g, r))
                    rec(e, used, plan)
                    plan.pop()
                    used[g] -= r

    rec(0, [0] * G, [])
    return best[1], seen[0]


# ------------------------------------------------------------------------------------------------- the plan

def _ms(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds >= 1 else f"{1e3 * seconds:.3g} ms"


def _empty_reason(P: _Problem) -> str:
    budget = (f"the budget is {_ms(P.budget)} (SLO {_ms(P.slo)} less {100 * P.slack:g}% slack"
              + (f", batches filling at {P.rate:,.4g} requests/s" if P.rate else "") + ")")
    if not P.pipelined:
        rounds = [(min(rnd for rnd, _ in paths) + P.round_fill(1), g) for g, paths in enumerate(_serial_paths(P))]
        lam, g = min(rounds)
        if lam > P.budget * (1 + _TOL):
            return (f"no plan meets the SLO: not pipelined, the shortest round (one GPU of the fastest type, "
                    f"{P.types[g]}) takes {_ms(lam)}, and {budget}; raise the SLO, lower the slack or the batch "
                    f"size ({P.B}), or give faster GPUs")
        cheapest = min(float(P.prices[g]) for lam_g, g in rounds if lam_g <= P.budget * (1 + _TOL))
        return (f"no plan meets the cost bound: the cheapest plan that meets the SLO costs ${cheapest:.4g}/s, above "
                f"alpha x baseline = {P.alpha:g} x ${P.baseline:.4g}/s; raise alpha or give cheaper GPUs")
    free = np.zeros(P.L + 1)                       # the lowest latency with every type unlimited
    for s in range(P.L - 1, -1, -1):
        free[s] = np.min(P.E[s, s + 1:] + free[s + 1:, None, None])
    if free[0] > P.budget * (1 + _TOL):
        return (f"no plan meets the SLO: even with every split on its fastest GPU type, a request that reaches "
                f"the last layer takes at least {_ms(free[0])}, and {budget}; raise the SLO, lower the slack or "
                f"the batch size ({P.B})" + (", raise the request rate" if P.rate else "")
                + ", or give faster GPUs")
    unbounded = P.variant(cost_limit=math.inf, pipelined=False, budget=math.inf)   # ranks by latency first
    fastest = _dp(unbounded, math.inf, "full")
    lam = sum(float(P.E[s, e, g, r - 1]) for s, e, g, r in fastest.plan) if fastest.plan else math.inf
    if lam > P.budget:
        return (f"no plan meets the SLO with the GPUs given ({_counts(P)}): the lowest worst-case latency they "
                f"allow is {_ms(lam)}, and {budget}; give more or faster GPUs or a smaller batch ({P.B})")
    if P.alpha is None:                                          # (not reached: the fastest plan would do)
        return f"no plan meets the SLO with the GPUs given ({_counts(P)}), and {budget}"
    cheapest = P.variant(cost_limit=math.inf)                    # at any goodput, the cheapest within the SLO
    plan = _dp(cheapest, math.inf, "full").plan
    cost = cheapest.evaluate(plan)[1] if plan else math.inf
    return (f"no plan meets the cost bound: the cheapest plan that meets the SLO with these GPUs costs "
            f"${cost:.4g}/s, above alpha x baseline = {P.alpha:g} x ${P.baseline:.4g}/s; raise alpha or give "
            f"cheaper GPUs")


def _counts(P: _Problem) -> str:
    return ", ".join(f"{n} x {g}" for g, n in P.all_counts.items() if n)


def _build(P: _Problem, plan: list | None, probes: list[dict], res: _Result | None, started: float) -> SplitPlan:
    table = []
    if res is not None:
        for e in range(P.L + 1):
            table.append({"boundary": e, "fraction_in": float(P.f_in[e]) if e < P.L else float(P.fracs[-1]),
                          "labels": int(res.labels[e]), "best_latency_s": float(res.best_lat[e]),
                          "fewest_gpus": int(res.fewest[e])})
    baseline = _data_parallel(P)
    common = dict(budget_s=P.budget, cost_limit_per_s=P.cost_limit / (1 + _TOL), batch_size=P.B,
                  request_rate=P.rate, pipelined=P.pipelined, baseline=baseline, table=table, probes=probes)
    if plan is None:
        return SplitPlan([], [], [], [], 0.0, reason=_empty_reason(P), solve_s=time.perf_counter() - started,
                         **common)
    per, lam, used = P.measure(plan)
    cost = P.cost_of(used)
    splits = [(s, e) for s, e, _, _ in plan]
    replicas = [r for *_, r in plan]
    types = [P.types[g] for _, _, g, _ in plan]
    stages = [float(P.T3[s, e, g]) for s, e, g, _ in plan]
    transfers = [float(P.x[s]) for s, *_ in plan[1:]]
    n = replicas[0]
    per_cycle = [n * float(P.f_in[s]) for s, *_ in plan]
    fills = ([float(P.fill[s]) for s, *_ in plan] if P.pipelined
             else [P.round_fill(n)] + [0.0] * (len(plan) - 1))
    goodput = 1.0 / per
    bottlenecks = _bottlenecks(P, plan, per)
    binding = _binding(P, splits, bottlenecks, per)
    reason = _reason(P, plan, per, lam, cost, baseline)
    return SplitPlan(splits, replicas, types, [P.B] * len(plan), goodput, stage_s=stages, transfers_s=transfers,
                     batches_per_cycle=per_cycle, fill_s=fills, input_batches=n, cycle_s=n * P.B * per,
                     latency_s=lam, cost_per_s=cost, gpus_used=used_of(plan, P),
                     binding=binding, bottlenecks=bottlenecks, reason=reason,
                     solve_s=time.perf_counter() - started, **common)


def _layers(s: int, e: int) -> str:
    return f"layer {s}" if e == s + 1 else f"layers {s}-{e - 1}"


def _bottlenecks(P: _Problem, plan, per) -> list[tuple[str, int]]:
    if not P.pipelined:
        return []
    tol = per * 1e-12
    compute = [("compute", i) for i, (s, e, g, r) in enumerate(plan)
               if P.f_in[s] * P.T3[s, e, g] / (r * P.B) >= per - tol]
    sends = [("transfer", i) for i, (s, _, _, r) in enumerate(plan)
             if i and P.f_in[s] * P.x[s] / (r * P.B) >= per - tol]
    return compute + sends


def _binding(P: _Problem, splits, bottlenecks, per) -> str:
    if not P.pipelined:
        return (f"not pipelined: a round is the sum of every split's stage time and every transfer; the next round "
                f"enters when the last split is done ({_ms(per)} per input sample)")
    found = [f"split {i + 1}'s compute ({_layers(*splits[i])})" if kind == "compute"
             else f"the transfer into split {i + 1} (after layer {splits[i][0] - 1})" for kind, i in bottlenecks]
    return (f"{' and '.join(found)} set{'s' if len(found) == 1 else ''} goodput, "
            f"{1 / per:,.4g} input samples/s")


def used_of(plan, P: _Problem) -> dict[str, int]:
    """GPUs per type a plan (as (start, end, type index, replicas)) uses."""
    return {P.types[g]: int(n) for g, n in enumerate(P.measure(plan)[2]) if n}


def _reason(P: _Problem, plan, per, lam, cost, baseline: DataParallelPlan) -> str:
    parts = []
    goodput = 1.0 / per
    if not P.pipelined:
        g, pool = plan[0][2], plan[0][3]
        cuts = [s for s, *_ in plan[1:]]
        parts.append(f"not pipelined: every split in turn on the same {pool} x {P.types[g]}"
                     + (f", cut after layer(s) {', '.join(str(c - 1) for c in cuts)}" if cuts else ", no cut"))
    elif len(plan) == 1:
        s, e, g, r = plan[0]
        parts.append(f"no cut: the whole model on {r} x {P.types[g]} at a batch of {P.B} has the best goodput; no "
                     "plan with a cut beats it within the SLO, the GPUs and the cost bound"
                     + (f" (a transfer costs {_ms(float(P.x[1:P.L].max()))})" if P.L > 1 and P.x[1:P.L].max() > 0
                        else ""))
    else:
        cuts = [s for s, *_ in plan[1:]]
        falls = ", ".join(f"{100 * P.f_in[c]:.3g}% after layer {c - 1}" for c in cuts)
        where = ", ".join(str(c - 1) for c in cuts)
        if min(P.f_in[c] for c in cuts) >= 0.995:
            parts.append(f"cut after layer(s) {where}, where the batch has not shrunk ({falls}): the cuts spread the "
                         "layers over GPU types and pipeline them, they do not follow exits")
        else:
            parts.append(f"cut after layer(s) {where}, where the batch has fallen to {falls}")
        n = plan[0][3]
        reps = "; ".join(f"split {i + 1} ({_layers(s, e)}) on {r} x {P.types[g]} receives "
                         f"{n * P.f_in[s]:.3g} batch(es) of {P.B} a cycle"
                         for i, (s, e, g, r) in enumerate(plan))
        parts.append(f"{n} input batch(es) of {P.B} a cycle; survivors merge into full batches: {reps}")
    parts.append(f"worst-case latency {_ms(lam)} within the {_ms(P.budget)} budget")
    if P.rate:
        parts.append(f"batches fill at {P.rate:,.4g} requests/s" + ("" if goodput >= P.rate * (1 - 1e-9) else
                     f", more than the {goodput:,.4g} samples/s this plan sustains"))
    if P.priced:
        parts.append(f"cost ${cost:.4g}/s" + (f" of at most ${P.cost_limit / (1 + _TOL):.4g}/s"
                                              if math.isfinite(P.cost_limit) else ""))
    if not baseline:
        parts.append("the early-exit model as is, data parallel on these GPUs, meets no SLO: " + baseline.reason)
    elif P.rate and goodput >= P.rate * (1 - 1e-9):
        on = ", ".join(f"{n} x {g}" for g, n in baseline.replicas.items())
        parts.append(f"sustains the request rate on {sum(used_of(plan, P).values())} GPU(s); the early-exit "
                     f"model as is, data parallel on {on}, sustains {baseline.goodput:,.4g} samples/s")
    else:
        on = ", ".join(f"{n} x {g}" for g, n in baseline.replicas.items())
        parts.append(f"{goodput / baseline.goodput:.3g}x the goodput of the early-exit model as is, data parallel "
                     f"on {on} ({baseline.goodput:,.4g} samples/s)")
    return "; ".join(parts)


# ------------------------------------------------------------------------------------------------- public

def _problem(layer_latency, batch_profile, gpus, slo_s, pipelined, transfer_s, slack, batch_size, num_layers,
             prices, alpha, baseline_cost_per_s, request_rate) -> _Problem:
    fracs, counts, slo, sl, b, price, a, base, rate = _validate(
        layer_latency, batch_profile, gpus, slo_s, pipelined, transfer_s, slack, batch_size, num_layers, prices,
        alpha, baseline_cost_per_s, request_rate)
    return _Problem(layer_latency, fracs, counts, slo, pipelined, transfer_s, sl, b, price, a, base, rate)


def optimize_splits(layer_latency: LayerLatency, batch_profile: Sequence[float], gpus: Mapping[str, int],
                    slo_s: float, pipelined: bool = True, transfer_s: float | Callable[[int, int], float] = 0.0,
                    slack: float = 0.2, *, batch_size: int = 16, num_layers: int | None = None,
                    prices: Mapping[str, float] | None = None, alpha: float | None = None,
                    baseline_cost_per_s: float | None = None, request_rate: float | None = None) -> SplitPlan:
    """The plan with the highest goodput whose every request meets ``slo_s x (1 - slack)`` (see the module's
    docstring for the model).

    ``layer_latency(layer, batch, gpu_type)``: seconds for one replica to run ``layer`` on ``batch`` samples
    (called with whole batches >= 1, each once). ``batch_profile[k]``: the fraction of the input still present
    after layer k's exit ramp (non-increasing, in [0, 1], one entry per layer; ``num_layers``, when given,
    checks its length). ``gpus``: gpu_type -> count. ``batch_size``: the batch b every replica runs.
    ``transfer_s``: seconds to move a batch of b between consecutive splits, or ``transfer_s(boundary, b)``.
    ``prices``: gpu_type -> dollars per second (e.g. ``workbench.devices.PRESETS[t].price_per_s``);
    ``alpha``: plans may cost at most ``alpha x baseline_cost_per_s`` (default: the price of all ``gpus``).
    ``request_rate``: input requests per second; batches then take time to fill, which counts in the latency,
    and goodput beyond it earns nothing (the cheapest plan that sustains it wins).

    Returns a :class:`SplitPlan`; when no plan meets the SLO (or the cost bound) it has no splits, goodput 0
    and a ``reason``. Bad input raises :class:`~workbench.errors.WorkbenchError` before any work."""
    started = time.perf_counter()
    P = _problem(layer_latency, batch_profile, gpus, slo_s, pipelined, transfer_s, slack, batch_size, num_layers,
                 prices, alpha, baseline_cost_per_s, request_rate)
    plan, probes, res = _solve(P)
    return _build(P, plan, probes, res, started)


def brute_force_splits(layer_latency: LayerLatency, batch_profile: Sequence[float], gpus: Mapping[str, int],
                       slo_s: float, pipelined: bool = True, transfer_s: float | Callable[[int, int], float] = 0.0,
                       slack: float = 0.2, *, batch_size: int = 16, num_layers: int | None = None,
                       prices: Mapping[str, float] | None = None, alpha: float | None = None,
                       baseline_cost_per_s: float | None = None, request_rate: float | None = None) -> SplitPlan:
    """:func:`optimize_splits` by enumerating every plan (every cut, type and replica count): the same model,
    objective and tie-breaking, for checking the dynamic program on small cases (it grows exponentially)."""
    started = time.perf_counter()
    P = _problem(layer_latency, batch_profile, gpus, slo_s, pipelined, transfer_s, slack, batch_size, num_layers,
                 prices, alpha, baseline_cost_per_s, request_rate)
    plan, seen = _brute(P)
    return _build(P, plan, [{"per_sample_s": math.nan, "check": f"brute force over {seen} plans",
                             "feasible": plan is not None}], None, started)


def data_parallel(layer_latency: LayerLatency, batch_profile: Sequence[float], gpus: Mapping[str, int],
                  slo_s: float, slack: float = 0.2, *, batch_size: int = 16, num_layers: int | None = None,
                  prices: Mapping[str, float] | None = None, request_rate: float | None = None) -> DataParallelPlan:
    """A model run as is, data parallel on all ``gpus``, every replica at a batch of ``batch_size``: the early-exit
    model (its ``batch_profile``) or, with a profile of all ones and the latency of the model without ramps, the
    stock model. A type whose replica misses the SLO takes no part."""
    P = _problem(layer_latency, batch_profile, gpus, slo_s, True, 0.0, slack, batch_size, num_layers, prices,
                 None, None, request_rate)
    return _data_parallel(P)


def largest_batch(layer_latency: LayerLatency, batch_profile: Sequence[float], gpus: Mapping[str, int],
                  slo_s: float, request_rate: float, *, batches: Sequence[int] = tuple(range(1, 65)),
                  **options) -> tuple[int, SplitPlan] | None:
    """E3's B_0 (§3.2): the largest per-replica batch among ``batches`` whose plan sustains ``request_rate``
    with every request, batch filling included, within the SLO; with that plan. None when no batch does.
    ``options``: the rest of :func:`optimize_splits`'s keywords."""
    if not batches:
        raise WorkbenchError("batches is empty: give the per-replica batch sizes to try, e.g. range(1, 65)")
    for b in sorted(set(batches), reverse=True):
        plan = optimize_splits(layer_latency, batch_profile, gpus, slo_s, batch_size=b,
                               request_rate=request_rate, **options)
        if plan and plan.goodput >= request_rate * (1 - 1e-9):
            return b, plan
    return None
