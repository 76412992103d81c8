"""The two-stage WRX planner (section 5): compute planning, then IO planning with AIBs.

Compute planning enumerates every n x m submodel, keeps those whose compute fits the
target latency T, and picks the one with most shards; among candidates of *similar*
size it prefers the deeper. "Similar" is defined here as "at most one shard per
layer fewer than the largest": a candidate with n*m >= best - n is similar.

IO planning tracks an *accumulated IO budget* per layer. AIB(k) starts as the
deadline's slack (T minus the submodel's compute time, DESIGN.md's reading note)
plus the compute time of the layers before k, plus the load time of every
preloaded shard of layers <= k (the preload *bonus*); loading a shard of layer k
deducts its load time from AIB(k) and every later AIB. A plan is valid iff every
AIB >= 0: then no layer waits for its shards beyond the deadline. The steps of
section 5.4 are :func:`initial_aibs`, :func:`uniform_pass` (all shards that are
not preloaded get the highest uniform bitwidth that keeps the AIBs valid; the
lowest is taken even when it does not fit, and allocation stops there) and
:func:`upgrade_pass` (in importance order, each shard is raised to the highest
bitwidth that keeps every AIB >= 0); :func:`plan_io` composes them. Importance
order is :func:`workbench.elastic.importance.importance_order`: importance
descending, equal importance by layer, then shard.

The preload buffer holds the first shards in layer order that fit its size, all at
one bitwidth. The paper leaves that bitwidth open, and no single choice is best: a
preloaded shard's bonus is its load time, proportional to its bytes at any
bitwidth, so every choice buys the same IO budget, but a low bitwidth covers more
shards (all of layer 0 removes the compulsory stall when the slack is small) while
locking them at low fidelity, and a high one does the opposite. The planner
therefore plans once per candidate bitwidth and keeps the valid plan whose
bitwidths, read in importance order, are greatest (lexicographically), the same
priority the upgrade pass follows (:func:`choose_preload_bits`); the plan keeps
every alternative in ``preload_options``.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from workbench.elastic.costmodel import CostModel
from workbench.elastic.importance import importance_order
from workbench.errors import WorkbenchError
from workbench.timeline import Span, Timeline

EPS = 1e-12

StepKind = Literal["init", "preload", "uniform", "forced", "upgrade"]
PlanMode = Literal["pipeline", "sequential", "memory"]
PreloadEntry = tuple[int, int, int]
"""A shard held in the preload buffer: (layer, shard, bits)."""

SELECTION_RULE = "most shards; among fitting sizes within one shard per layer of the largest, the deepest"


class PlanningError(WorkbenchError, ValueError):
    """The planner's input is invalid (the message names the problem)."""


# ----------------------------------------------------------------------------- compute planning


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One n x m submodel that compute planning considered."""
    n: int                  # layers (depth)
    m: int                  # shards per layer (width)
    time_s: float           # seconds under the method's model of time (compute only for WRX)
    fits: bool              # time_s <= the target
    similar: bool = False   # fits, and within one shard per layer of the largest fitting size
    chosen: bool = False    # the candidate compute planning picked

    @property
    def shards(self) -> int:
        """Shards of the submodel, n * m."""
        return self.n * self.m


@dataclass(frozen=True, kw_only=True)
class ComputePlan:
    """The chosen submodel (n = m = 0 when none fits) and the candidate table behind it."""
    n: int                              # chosen depth
    m: int                              # chosen width
    target_s: float                     # target latency, seconds
    candidates: tuple[Candidate, ...]   # every n x m considered, in (n, m) order
    rule: str = SELECTION_RULE          # the preference among fitting candidates, in words

    @property
    def found(self) -> bool:
        return self.n > 0

    def table(self) -> list[dict]:
        """The candidates as rows (times in ms), for tables and figures."""
        return [{"n": c.n, "m": c.m, "shards": c.shards, "time_ms": 1e3 * c.time_s, "fits": c.fits,
                 "similar": c.similar, "chosen": c.chosen} for c in self.candidates]


def _check_target(target_s: float) -> float:
    try:
        target = float(target_s)
    except (TypeError, ValueError):
        raise PlanningError(f"target latency must be a number of seconds, got {target_s!r}") from None
    if not np.isfinite(target) or target <= 0:
        raise PlanningError(f"target latency must be positive, got {target_s!r} s")
    return _within("target latency", target, "target_s")


def _within(name: str, value: float, bound: str) -> float:
    """``value`` checked against the range the commands state (``workbench.elastic.limits``), as a PlanningError."""
    from workbench.argtypes import OutOfRangeError
    from workbench.elastic import limits

    try:
        return getattr(limits, bound).check(name, value)
    except OutOfRangeError as exc:
        raise PlanningError(str(exc)) from None


def choose_submodel(time_fn, target_s: float, num_layers: int, num_shards: int, min_width: int = 1,
                    exclude=frozenset()) -> ComputePlan:
    """The preferred n x m (see the module notes) whose ``time_fn(n, m)`` seconds fit ``target_s``.

    Sizes in ``exclude`` ((n, m) pairs) are never chosen; n = 0 when nothing fits."""
    target = _check_target(target_s)
    if num_layers < 1 or num_shards < 1:
        raise PlanningError(f"a submodel needs at least 1 layer and 1 shard, got {num_layers} x {num_shards}")
    min_width = max(1, min(int(min_width), num_shards))
    timed = [(n, m, float(time_fn(n, m))) for n in range(1, num_layers + 1) for m in range(min_width, num_shards + 1)]
    fitting = [(n, m) for n, m, t in timed if t <= target + EPS and (n, m) not in exclude]
    largest = max((n * m for n, m in fitting), default=0)
    similar = {(n, m) for n, m in fitting if n * m >= largest - n}
    choice = max(similar, key=lambda nm: (nm[0], nm[0] * nm[1]), default=(0, 0))
    candidates = tuple(Candidate(n=n, m=m, time_s=t, fits=t <= target + EPS, similar=(n, m) in similar,
                                 chosen=(n, m) == choice) for n, m, t in timed)
    return ComputePlan(n=choice[0], m=choice[1], target_s=target, candidates=candidates)


def plan_compute(cost_model: CostModel, target_s: float, num_layers: int | None = None,
                 num_shards: int | None = None, min_width: int = 3, exclude=frozenset()) -> ComputePlan:
    """WRX compute planning: the largest (then deepest) n x m with n * t_comp(m) <= target, not in ``exclude``."""
    num_layers = cost_model.num_layers if num_layers is None else int(num_layers)
    num_shards = cost_model.num_shards if num_shards is None else int(num_shards)
    if num_layers > cost_model.num_layers or num_shards > cost_model.num_shards:
        raise PlanningError(f"the cost model covers {cost_model.num_layers} x {cost_model.num_shards}, "
                            f"not {num_layers} x {num_shards}")
    return choose_submodel(lambda n, m: n * cost_model.t_comp(m), target_s, num_layers, num_shards, min_width,
                           exclude)


# ----------------------------------------------------------------------------- IO planning


@dataclass(frozen=True, kw_only=True)
class AllocationStep:
    """The AIBs after one allocation of IO planning."""
    kind: StepKind              # init; preload (a layer's buffered shards); uniform or forced (first pass); upgrade
    aib: tuple[float, ...]      # AIB of every layer after this step, seconds
    layer: int = -1             # the layer allocated (-1: none, for init)
    shard: int = -1             # the shard upgraded (-1: every free shard of the layer)
    bits: int = 0               # the bitwidth allocated
    from_bits: int = 0          # the bitwidth an upgrade started from
    cost_s: float = 0.0         # seconds deducted from this layer's AIB and every later one
    note: str = ""              # the step in words


@dataclass(frozen=True, kw_only=True, eq=False)
class IOPlan:
    """Per-shard bitwidths of an n x m submodel and the AIB trace that justifies them.

    Compares by identity (``eq=False``): ``bits``, ``preloaded`` and ``aib`` are arrays."""
    n: int                                        # layers of the submodel
    m: int                                        # shards per layer
    target_s: float                               # target latency, seconds
    compute_s: float                              # n * t_comp(m), seconds
    slack_s: float                                # target - compute_s: IO seconds before layer 0 starts
    bits: np.ndarray                              # (n, m) ints: every shard's bitwidth, preloaded ones included
    preloaded: np.ndarray                         # (n, m) bools: held in the buffer before the run
    aib: np.ndarray                               # (n,) final AIB per layer, seconds
    steps: tuple[AllocationStep, ...]             # AIBs after each allocation, init first
    uniform_bits: int                             # the first pass's bitwidth (0: not reached)
    valid: bool                                   # every AIB >= 0
    reason: str = ""                              # why the plan is not valid
    ignored_preload: tuple[PreloadEntry, ...] = ()  # preload entries outside the submodel


def _normalize_preload(cost_model: CostModel, preload, n: int, m: int):
    inside, outside = {}, []
    for entry in preload or ():
        try:
            layer, shard, bits = (int(v) for v in entry)
        except (TypeError, ValueError):
            raise PlanningError(f"preload entries are (layer, shard, bits) triples, got {entry!r}") from None
        if bits not in cost_model.io_s:
            raise PlanningError(f"preloaded shard ({layer}, {shard}) is at {bits} bits, which the cost model lacks "
                                f"(it has {', '.join(map(str, cost_model.bitwidths))})")
        if not 0 <= layer < cost_model.num_layers or not 0 <= shard < cost_model.num_shards:
            raise PlanningError(f"preloaded shard ({layer}, {shard}) is outside the "
                                f"{cost_model.num_layers} x {cost_model.num_shards} model")
        if (layer, shard) in inside:
            raise PlanningError(f"shard ({layer}, {shard}) is preloaded twice")
        if layer < n and shard < m:
            inside[(layer, shard)] = bits
        else:
            outside.append((layer, shard, bits))
    return inside, tuple(outside)


def _importance_order(importance, n: int, m: int) -> list[tuple[int, int]]:
    try:
        return importance_order(importance, n, m)
    except ValueError as exc:
        raise PlanningError(str(exc)) from None


def _deduct(aib: tuple[float, ...], layer: int, cost_s: float) -> tuple[float, ...]:
    """The AIBs after ``cost_s`` seconds of loads for ``layer``: its AIB and every later one shrink."""
    return tuple(budget - cost_s if k >= layer else budget for k, budget in enumerate(aib))


def initial_aibs(cost_model: CostModel, slack_s: float, n: int, m: int,
                 preload: Mapping[tuple[int, int], int]) -> list[AllocationStep]:
    """Section 5.4, initial AIBs: an ``init`` step, then one ``preload`` step per layer holding preloaded shards.

    AIB(k) starts as ``slack_s`` + the compute seconds of layers 0..k-1 + the load
    seconds of the preloaded shards (``preload``: (layer, shard) -> bits) of layers
    <= k, the preload bonus. Each layer's preloaded shards are then charged like
    loads, so the bonus pays exactly for them. The current AIBs are ``steps[-1].aib``.
    """
    layer_compute_s = cost_model.t_comp(m)
    bonus_s = [0.0] * n
    preloaded_bits: list[list[int]] = [[] for _ in range(n)]
    for (layer, _), bits in sorted(preload.items()):
        bonus_s[layer] += cost_model.t_io(bits)
        preloaded_bits[layer].append(bits)
    aib, bonus_so_far_s = [], 0.0
    for layer in range(n):
        bonus_so_far_s += bonus_s[layer]
        aib.append(slack_s + layer_compute_s * layer + bonus_so_far_s)
    steps = [AllocationStep(kind="init", aib=tuple(aib), note="slack + compute of earlier layers + preload bonus")]
    for layer in range(n):
        if preloaded_bits[layer]:
            steps.append(AllocationStep(kind="preload", aib=_deduct(steps[-1].aib, layer, bonus_s[layer]), layer=layer,
                                        bits=preloaded_bits[layer][0], cost_s=bonus_s[layer],
                                        note=f"{len(preloaded_bits[layer])} shards of layer {layer} already in memory"))
    return steps


def uniform_pass(cost_model: CostModel, aib: tuple[float, ...],
                 free_per_layer: Sequence[int]) -> tuple[int, bool, list[AllocationStep]]:
    """Section 5.4, first pass: one bitwidth for every shard not preloaded, the highest that keeps all AIBs >= 0.

    ``free_per_layer[k]`` counts layer k's shards that are not preloaded. Returns the
    bitwidth, whether it fits, and one step per layer with free shards. When even the
    lowest bitwidth overruns an AIB it is taken anyway (steps of kind ``forced``).
    """
    def fits(bits: int) -> bool:
        used_s = 0.0
        for layer, free in enumerate(free_per_layer):
            used_s += free * cost_model.t_io(bits)
            if aib[layer] - used_s < -EPS:
                return False
        return True

    levels = cost_model.bitwidths
    uniform, lowest_fits = levels[0], fits(levels[0])
    if lowest_fits:
        for bits in levels:
            if not fits(bits):
                break
            uniform = bits
    steps = []
    for layer, free in enumerate(free_per_layer):
        if free:
            cost_s = free * cost_model.t_io(uniform)
            aib = _deduct(aib, layer, cost_s)
            steps.append(AllocationStep(kind="uniform" if lowest_fits else "forced", aib=aib, layer=layer,
                                        bits=uniform, cost_s=cost_s,
                                        note=f"{free} shards of layer {layer} at {uniform} bits"))
    return uniform, lowest_fits, steps


def upgrade_pass(cost_model: CostModel, aib: tuple[float, ...], bits: np.ndarray, preloaded: np.ndarray,
                 order: Sequence[tuple[int, int]]) -> tuple[np.ndarray, list[AllocationStep]]:
    """Section 5.4, second pass: in importance ``order``, each shard not preloaded goes to the highest bitwidth
    whose extra load seconds its layer's AIB and every later one can still pay.

    Returns the new (n, m) bitwidths (``bits`` is not modified) and one ``upgrade`` step per raised shard."""
    bits = np.array(bits, dtype=int)
    highest_first = sorted(cost_model.bitwidths, reverse=True)
    steps = []
    for layer, shard in order:
        if preloaded[layer, shard]:
            continue
        current = int(bits[layer, shard])
        room_s = min(aib[layer:])
        for candidate in highest_first:
            if candidate <= current:
                break
            extra_s = cost_model.t_io(candidate) - cost_model.t_io(current)
            if room_s - extra_s >= -EPS:
                aib = _deduct(aib, layer, extra_s)
                bits[layer, shard] = candidate
                steps.append(AllocationStep(kind="upgrade", aib=aib, layer=layer, shard=shard, bits=candidate,
                                            from_bits=current, cost_s=extra_s))
                break
    return bits, steps


def plan_io(cost_model: CostModel, target_s: float, n: int, m: int, importance, preload=()) -> IOPlan:
    """WRX IO planning (section 5.4) of the n x m submodel: initial AIBs, uniform pass, upgrade pass.

    ``importance`` is an (N, M) matrix (higher: upgraded first); ``preload`` lists
    (layer, shard, bits) held in the buffer (entries outside the submodel are ignored
    and reported in ``ignored_preload``)."""
    target = _check_target(target_s)
    if not (1 <= n <= cost_model.num_layers and 1 <= m <= cost_model.num_shards):
        raise PlanningError(f"submodel {n} x {m} is outside the {cost_model.num_layers} x {cost_model.num_shards} model")
    if not cost_model.bitwidths:
        raise PlanningError(f"cost model {cost_model.device!r} has no bitwidths")
    order = _importance_order(importance, n, m)
    inside, outside = _normalize_preload(cost_model, preload, n, m)
    compute_s = n * cost_model.t_comp(m)
    slack_s = target - compute_s
    bits = np.zeros((n, m), dtype=int)
    preloaded = np.zeros((n, m), dtype=bool)
    if slack_s < -EPS:
        return IOPlan(n=n, m=m, target_s=target, compute_s=compute_s, slack_s=slack_s, bits=bits, preloaded=preloaded,
                      aib=np.full(n, slack_s), steps=(), uniform_bits=0, valid=False,
                      reason=f"the {n} x {m} submodel computes in {1e3 * compute_s:.1f} ms, over the "
                             f"{1e3 * target:.1f} ms target", ignored_preload=outside)
    for (layer, shard), shard_bits in inside.items():
        bits[layer, shard], preloaded[layer, shard] = shard_bits, True
    steps = initial_aibs(cost_model, slack_s, n, m, inside)
    free_per_layer = [m - int(preloaded[layer].sum()) for layer in range(n)]
    uniform, fits, uniform_steps = uniform_pass(cost_model, steps[-1].aib, free_per_layer)
    bits[~preloaded] = uniform
    steps += uniform_steps
    reason = ""
    if fits:
        bits, upgrade_steps = upgrade_pass(cost_model, steps[-1].aib, bits, preloaded, order)
        steps += upgrade_steps
    else:
        worst = int(np.argmin(steps[-1].aib))
        reason = (f"even {cost_model.bitwidths[0]}-bit shards overrun the IO budget (AIB of layer {worst} is "
                  f"{1e3 * steps[-1].aib[worst]:.1f} ms); they are taken anyway and allocation stops")
    return IOPlan(n=n, m=m, target_s=target, compute_s=compute_s, slack_s=slack_s, bits=bits, preloaded=preloaded,
                  aib=np.array(steps[-1].aib), steps=tuple(steps), uniform_bits=uniform, valid=fits, reason=reason,
                  ignored_preload=outside)


# ----------------------------------------------------------------------------- preload buffer


def select_preload(cost_model: CostModel, n: int, m: int, buffer_bytes: float,
                   bits: int | None = None) -> list[PreloadEntry]:
    """The first shards of the n x m submodel in layer order that fit ``buffer_bytes`` (see module notes)."""
    if buffer_bytes is None or not np.isfinite(buffer_bytes) or buffer_bytes < 0:
        raise PlanningError(f"preload buffer size must be >= 0 bytes, got {buffer_bytes!r}")
    levels = cost_model.bitwidths
    if bits is None:
        covering = [b for b in levels if m * cost_model.shard_bytes[b] <= buffer_bytes]
        bits = max(covering) if covering else levels[0]
    elif bits not in cost_model.shard_bytes:
        raise PlanningError(f"cannot preload at {bits} bits: the cost model has {', '.join(map(str, levels))}")
    size = cost_model.shard_bytes[bits]
    count = min(n * m, int(buffer_bytes // size))
    return [(j // m, j % m, int(bits)) for j in range(count)]


@dataclass(frozen=True, kw_only=True)
class PreloadOption:
    """IO planning of one submodel with one candidate preload."""
    bits: int | None                     # the preload's bitwidth (None: entries given as they are, or no buffer)
    preload: tuple[PreloadEntry, ...]    # what the buffer holds
    io: IOPlan                           # IO planning with that preload

    @property
    def valid(self) -> bool:
        return self.io.valid

    @property
    def mean_bits(self) -> float | None:
        """Mean bitwidth over the submodel's shards (None when the plan is not valid)."""
        return float(self.io.bits.mean()) if self.io.valid else None


def choose_preload_bits(cost_model: CostModel, target_s: float, n: int, m: int, importance,
                        candidates: Mapping[int | None, Sequence[PreloadEntry]]
                        ) -> tuple[PreloadOption | None, tuple[PreloadOption, ...]]:
    """Plan IO once per candidate preload (bitwidth -> entries) and keep the best valid plan.

    Best: the bitwidths read in importance order are lexicographically greatest, the
    priority of the upgrade pass; among equal plans the lower preload bitwidth wins.
    Returns the winner (None when no candidate gives a valid plan) and every option tried.
    """
    order = _importance_order(importance, n, m)
    options = tuple(PreloadOption(bits=bits, preload=tuple(preload),
                                  io=plan_io(cost_model, target_s, n, m, importance, preload))
                    for bits, preload in candidates.items())
    valid = [option for option in options if option.valid]
    if not valid:
        return None, options
    best = max(valid, key=lambda option: ([int(option.io.bits[shard]) for shard in order], -(option.bits or 0)))
    return best, options


def _preload_candidates(cost_model: CostModel, n: int, m: int, preload_bytes: float, preload_bits: int | None,
                        cached) -> dict[int | None, list[PreloadEntry]]:
    """The preloads ``plan_elastic`` tries: the cached entries, one fixed bitwidth, or every bitwidth."""
    if cached is not None:
        return {None: list(cached)}
    if preload_bits is not None or preload_bytes <= 0:
        return {preload_bits: select_preload(cost_model, n, m, preload_bytes, preload_bits)}
    return {bits: select_preload(cost_model, n, m, preload_bytes, bits) for bits in cost_model.bitwidths}


# ----------------------------------------------------------------------------- whole plans and timelines


def simulate(cost_model: CostModel, bits: np.ndarray, preloaded: np.ndarray, sequential: bool = False,
             name: str = "") -> Timeline:
    """Predicted timeline: one IO lane reading layer after layer, one compute lane; stalls where compute waits.

    ``sequential`` loads everything before computing (Load&Exec). The spans are on the device a run of the
    plan is measured on ("<preset> emulated on this host", or "host"), so prediction and measurement share rows.
    """
    from workbench.devices import emulated_name

    device = "host" if cost_model.device == "host" else emulated_name(cost_model.device)
    n, m = bits.shape
    spans, t_io, io_end = [], 0.0, []
    for k in range(n):
        loads = [int(b) for b, p in zip(bits[k], preloaded[k]) if not p]
        dur = sum(cost_model.t_io(b) for b in loads)
        if dur > 0:
            spans.append(Span("io", "io", t_io, t_io + dur, f"layer {k}", {"shards": len(loads)}, device,
                              nbytes=sum(cost_model.shard_bytes[b] for b in loads), layer=k))
        t_io += dur
        io_end.append(t_io)
    if sequential:
        io_end = [t_io] * n
    t = 0.0
    tc = cost_model.t_comp(m)
    for k in range(n):
        if io_end[k] > t + EPS:
            spans.append(Span("compute", "stall", t, io_end[k], f"wait for layer {k}", device=device, layer=k))
            t = io_end[k]
        spans.append(Span("compute", "compute", t, t + tc, f"layer {k}", {"shards": m}, device, layer=k))
        t += tc
    return Timeline(tuple(spans), "predicted", name=name)


@dataclass(frozen=True, kw_only=True)
class Rejection:
    """A submodel compute planning chose whose shards cannot be loaded in time even at the lowest bitwidth."""
    n: int          # its layers
    m: int          # its shards per layer
    reason: str     # IO planning's explanation


@dataclass(frozen=True, kw_only=True, eq=False)
class ElasticPlan:
    """A method's decision for one target: submodel, per-shard bitwidths, preload, predicted timeline.

    Compares by identity (``eq=False``): ``bits`` and ``preloaded`` are arrays."""
    method: str                                      # the planning method (see baselines.METHODS)
    target_s: float                                  # target latency, seconds
    n: int                                           # layers of the submodel (0: no plan)
    m: int                                           # shards per layer
    bits: np.ndarray                                 # (n, m) ints: every shard's bitwidth
    preloaded: np.ndarray                            # (n, m) bools: in memory before the run
    preload: tuple[PreloadEntry, ...]                # what the buffer holds before the run
    mode: PlanMode                                   # pipelined, sequential (load, then execute) or all in memory
    timeline: Timeline                               # predicted
    compute: ComputePlan | None = None               # the compute planning behind n x m
    io: IOPlan | None = None                         # WRX's IO planning (None for the baselines)
    memory_bytes: int = 0                            # shard bytes in memory before the run (buffer / whole model)
    valid: bool = True                               # the plan meets its method's model of time
    reason: str = ""                                 # why there is no valid plan
    plan_s: float = 0.0                              # seconds the planner took
    rejected: tuple[Rejection, ...] = ()             # earlier choices whose shards could not load in time
    first_choice: ComputePlan | None = None          # compute planning's choice before any rejection
    preload_bits: int | None = None                  # the bitwidth of the kept preload (None: given or empty)
    preload_options: tuple[PreloadOption, ...] = ()  # IO planning with every preload tried

    @property
    def predicted_s(self) -> float:
        return self.timeline.end

    @property
    def found(self) -> bool:
        return self.n > 0

    def describe(self) -> str:
        if not self.found:
            return f"{self.method}: no plan ({self.reason})"
        return (f"{self.method}: {self.n}x{self.m} submodel, predicted {1e3 * self.predicted_s:.1f} ms "
                f"(target {1e3 * self.target_s:.0f} ms), preload {self.memory_bytes / 1e6:.2f} MB")


def empty_plan(method: str, target_s: float, reason: str, compute: ComputePlan | None = None,
               mode: PlanMode = "pipeline", **fields) -> ElasticPlan:
    """A plan with no submodel (``found`` is False) that says why; ``fields`` sets further ElasticPlan fields."""
    no_shards = np.zeros((0, 0), dtype=int)
    return ElasticPlan(method=method, target_s=target_s, n=0, m=0, bits=no_shards, preloaded=no_shards.astype(bool),
                       preload=(), mode=mode, timeline=Timeline((), "predicted"), compute=compute, valid=False,
                       reason=reason, **fields)


def plan_elastic(cost_model: CostModel, target_s: float, importance, preload_bytes: float = 0.0,
                 cached=None, min_width: int = 3, preload_bits: int | None = None,
                 method: str = "Ours") -> ElasticPlan:
    """WRX's whole plan: compute planning, preload selection, IO planning, predicted timeline.

    ``cached`` (``(layer, shard, bits)`` entries already in the buffer, e.g. after a
    previous run) replaces the preload selection; ``preload_bits`` fixes the preload's
    bitwidth instead of :func:`choose_preload_bits` trying each. If the preferred
    submodel cannot be loaded in time even at the lowest bitwidth, compute planning
    runs again without it; the plan lists such submodels in ``rejected``.
    """
    started = time.perf_counter()
    target = _check_target(target_s)
    if preload_bytes is None or not np.isfinite(preload_bytes) or preload_bytes < 0:
        raise PlanningError(f"preload buffer size must be >= 0 bytes, got {preload_bytes!r}")
    _within("preload buffer (MB)", preload_bytes / 1e6, "preload_mb")
    rejected: list[Rejection] = []
    first_choice = None
    while True:
        compute = plan_compute(cost_model, target, min_width=min_width,
                               exclude=frozenset((r.n, r.m) for r in rejected))
        if first_choice is None:
            first_choice = compute
        if not compute.found:
            fastest_s = cost_model.t_comp(max(1, min(min_width, cost_model.num_shards)))
            reason = (f"no submodel fits {1e3 * target:.1f} ms: one layer of {max(1, min_width)} shards alone "
                      f"computes in {1e3 * fastest_s:.1f} ms" if not rejected else
                      f"no submodel can load its shards in time (tried {len(rejected)})")
            return empty_plan(method, target, reason, first_choice, rejected=tuple(rejected),
                              first_choice=first_choice, plan_s=time.perf_counter() - started)
        n, m = compute.n, compute.m
        chosen, options = choose_preload_bits(cost_model, target, n, m, importance,
                                              _preload_candidates(cost_model, n, m, preload_bytes, preload_bits, cached))
        if chosen is not None:
            break
        rejected.append(Rejection(n=n, m=m, reason=options[0].io.reason))
    timeline = simulate(cost_model, chosen.io.bits, chosen.io.preloaded, name=f"{method} {n}x{m}")
    return ElasticPlan(method=method, target_s=target, n=n, m=m, bits=chosen.io.bits, preloaded=chosen.io.preloaded,
                       preload=chosen.preload, mode="pipeline", timeline=timeline, compute=compute, io=chosen.io,
                       memory_bytes=int(sum(cost_model.shard_bytes[int(b)] for _, _, b in chosen.preload)),
                       plan_s=time.perf_counter() - started, rejected=tuple(rejected), first_choice=first_choice,
                       preload_bits=chosen.bits, preload_options=options)
