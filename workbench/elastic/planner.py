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
AIB >= 0: then no layer waits for its shards beyond the deadline. The first pass
gives all shards that are not preloaded the highest uniform bitwidth that keeps
the AIBs valid (the lowest is taken even when it does not fit, and allocation
stops there); the second pass, in importance order, raises each shard to the
highest bitwidth that keeps every AIB >= 0.

The preload buffer holds the first shards in layer order that fit its size, all at
one bitwidth. The paper leaves that bitwidth open, and no single choice is best: a
preloaded shard's bonus is its load time, proportional to its bytes at any
bitwidth, so every choice buys the same IO budget, but a low bitwidth covers more
shards (all of layer 0 removes the compulsory stall when the slack is small) while
locking them at low fidelity, and a high one does the opposite. The planner
therefore plans once per candidate bitwidth and keeps the valid plan whose
bitwidths, read in importance order, are greatest (lexicographically): the same
priority its second pass follows. The alternatives stay in ``extra["preload_options"]``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from workbench.elastic.costmodel import CostModel
from workbench.errors import WorkbenchError
from workbench.timeline import Span, Timeline

EPS = 1e-12


class PlanningError(WorkbenchError, ValueError):
    """The planner's input is invalid (the message names the problem)."""


# ----------------------------------------------------------------------------- compute planning


@dataclass(frozen=True)
class Candidate:
    """One n x m submodel considered by compute planning."""
    n: int
    m: int
    time_s: float          # its time under the method's model of time (compute only for WRX)
    fits: bool             # time_s <= target
    similar: bool = False  # fits and within one shard per layer of the largest fitting size
    chosen: bool = False

    @property
    def shards(self) -> int:
        return self.n * self.m


@dataclass(frozen=True, eq=False)
class ComputePlan:
    """The chosen submodel and the candidate table behind it.

    It behaves as the pair ``(n, m)`` too (unpacking, indexing, ``== (n, m)``), the
    shape DESIGN.md gives ``plan_compute``'s result."""
    n: int
    m: int
    target_s: float
    candidates: tuple[Candidate, ...]
    rule: str = "most shards; among fitting sizes within one shard per layer of the largest, the deepest"

    def __iter__(self):
        return iter((self.n, self.m))

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index):
        return (self.n, self.m)[index]

    def __eq__(self, other) -> bool:
        if isinstance(other, ComputePlan):
            return (self.n, self.m, self.target_s, self.candidates) == (other.n, other.m, other.target_s,
                                                                       other.candidates)
        if isinstance(other, (tuple, list)):
            return (self.n, self.m) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.n, self.m, self.target_s))

    @property
    def found(self) -> bool:
        return self.n > 0

    def table(self) -> list[dict]:
        return [{"n": c.n, "m": c.m, "shards": c.shards, "time_ms": 1e3 * c.time_s, "fits": c.fits,
                 "similar": c.similar, "chosen": c.chosen} for c in self.candidates]


def _check_target(target_s: float) -> float:
    try:
        target = float(target_s)
    except (TypeError, ValueError):
        raise PlanningError(f"target latency must be a number of seconds, got {target_s!r}") from None
    if not np.isfinite(target) or target <= 0:
        raise PlanningError(f"target latency must be positive, got {target_s!r} s")
    return target


def choose_submodel(time_fn, target_s: float, n_layers: int, n_shards: int, min_width: int = 1,
                    exclude=frozenset()) -> ComputePlan:
    """The preferred n x m whose ``time_fn(n, m)`` fits ``target_s`` (n = 0 when none fits)."""
    target = _check_target(target_s)
    if n_layers < 1 or n_shards < 1:
        raise PlanningError(f"a submodel needs at least 1 layer and 1 shard, got {n_layers} x {n_shards}")
    min_width = max(1, min(int(min_width), n_shards))
    raw = [(n, m, float(time_fn(n, m))) for n in range(1, n_layers + 1) for m in range(min_width, n_shards + 1)]
    fitting = [(n, m) for n, m, t in raw if t <= target + EPS and (n, m) not in exclude]
    best = max((n * m for n, m in fitting), default=0)
    similar = {(n, m) for n, m in fitting if n * m >= best - n}
    choice = max(similar, key=lambda nm: (nm[0], nm[0] * nm[1]), default=(0, 0))
    cands = tuple(Candidate(n, m, t, t <= target + EPS, (n, m) in similar, (n, m) == choice) for n, m, t in raw)
    return ComputePlan(choice[0], choice[1], target, cands)


def plan_compute(cost_model: CostModel, target_s: float, n_layers: int | None = None,
                 n_shards: int | None = None, min_width: int = 3) -> ComputePlan:
    """WRX compute planning: the largest (then deepest) n x m with n * t_comp(m) <= target."""
    n_layers = cost_model.num_layers if n_layers is None else int(n_layers)
    n_shards = cost_model.num_shards if n_shards is None else int(n_shards)
    if n_layers > cost_model.num_layers or n_shards > cost_model.num_shards:
        raise PlanningError(f"the cost model covers {cost_model.num_layers} x {cost_model.num_shards}, "
                            f"not {n_layers} x {n_shards}")
    return choose_submodel(lambda n, m: n * cost_model.t_comp(m), target_s, n_layers, n_shards, min_width)


# ----------------------------------------------------------------------------- IO planning


@dataclass(frozen=True)
class AllocationStep:
    """The AIBs after one allocation (``kind``: init, preload, uniform, forced, upgrade)."""
    kind: str
    aib: tuple[float, ...]
    layer: int = -1
    shard: int = -1
    bits: int = 0
    from_bits: int = 0
    cost_s: float = 0.0
    note: str = ""


@dataclass
class IOPlan:
    """Per-shard bitwidths of an n x m submodel and the AIB trace that justifies them."""
    n: int
    m: int
    target_s: float
    compute_s: float               # n * t_comp(m)
    slack_s: float                 # target - compute_s, the IO time before layer 0 starts
    bits: np.ndarray               # (n, m) ints: the bitwidth of every shard (preloaded ones included)
    preloaded: np.ndarray          # (n, m) bools
    aib: np.ndarray                # (n,) final AIB per layer, seconds
    steps: list[AllocationStep]
    uniform_bits: int              # the first pass's choice
    valid: bool
    reason: str = ""
    ignored_preload: tuple = ()    # preload entries outside the submodel

    def layer_io_s(self, cost_model: CostModel) -> np.ndarray:
        """Seconds of IO each layer needs (shards not preloaded)."""
        return np.array([sum(cost_model.t_io(int(b)) for b, p in zip(self.bits[k], self.preloaded[k]) if not p)
                         for k in range(self.n)])

    def load_bytes(self, cost_model: CostModel) -> int:
        return int(sum(cost_model.shard_bytes[int(b)] for b, p in zip(self.bits.ravel(), self.preloaded.ravel())
                       if not p))


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
    imp = np.asarray(importance, dtype=float)
    if imp.ndim != 2 or imp.shape[0] < n or imp.shape[1] < m:
        raise PlanningError(f"importance must be a 2-D array with at least {n} rows and {m} columns, "
                            f"got shape {imp.shape}")
    if not np.isfinite(imp[:n, :m]).all():
        raise PlanningError("importance holds non-finite values")
    return sorted(((k, i) for k in range(n) for i in range(m)), key=lambda ki: (-imp[ki], ki))


def plan_io(cost_model: CostModel, target_s: float, n: int, m: int, importance, preload=()) -> IOPlan:
    """WRX IO planning (section 5.4) for the n x m submodel; see the module docstring."""
    target = _check_target(target_s)
    if not (1 <= n <= cost_model.num_layers and 1 <= m <= cost_model.num_shards):
        raise PlanningError(f"submodel {n} x {m} is outside the {cost_model.num_layers} x {cost_model.num_shards} model")
    levels = cost_model.bitwidths
    if not levels:
        raise PlanningError(f"cost model {cost_model.device!r} has no bitwidths")
    order = _importance_order(importance, n, m)
    pre, outside = _normalize_preload(cost_model, preload, n, m)
    tc = cost_model.t_comp(m)
    compute = n * tc
    slack = target - compute
    bits = np.zeros((n, m), dtype=int)
    preloaded = np.zeros((n, m), dtype=bool)
    steps: list[AllocationStep] = []
    if slack < -EPS:
        return IOPlan(n, m, target, compute, slack, bits, preloaded, np.full(n, slack), steps, 0, False,
                      f"the {n} x {m} submodel computes in {1e3 * compute:.1f} ms, over the "
                      f"{1e3 * target:.1f} ms target", outside)
    tio = cost_model.io_s
    bonus = [0.0] * n
    per_layer_pre: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for (k, i), b in sorted(pre.items()):
        bonus[k] += tio[b]
        per_layer_pre[k].append((i, b))
        bits[k, i], preloaded[k, i] = b, True
    aib, run = [], 0.0
    for k in range(n):
        run += bonus[k]
        aib.append(slack + tc * k + run)

    def charge(k: int, cost: float) -> None:
        for j in range(k, n):
            aib[j] -= cost

    steps.append(AllocationStep("init", tuple(aib), note="slack + compute of earlier layers + preload bonus"))
    for k in range(n):
        if per_layer_pre[k]:
            charge(k, bonus[k])
            steps.append(AllocationStep("preload", tuple(aib), k, -1, per_layer_pre[k][0][1], 0, bonus[k],
                                        f"{len(per_layer_pre[k])} shards of layer {k} already in memory"))

    free_per_layer = [m - len(per_layer_pre[k]) for k in range(n)]

    def fits_uniform(b: int) -> bool:
        used = 0.0
        for k in range(n):
            used += free_per_layer[k] * tio[b]
            if aib[k] - used < -EPS:
                return False
        return True

    first_ok = fits_uniform(levels[0])
    uniform = levels[0]
    if first_ok:
        for b in levels:
            if not fits_uniform(b):
                break
            uniform = b
    kind = "uniform" if first_ok else "forced"
    for k in range(n):
        if free_per_layer[k]:
            cost = free_per_layer[k] * tio[uniform]
            bits[k][~preloaded[k]] = uniform
            charge(k, cost)
            steps.append(AllocationStep(kind, tuple(aib), k, -1, uniform, 0, cost,
                                        f"{free_per_layer[k]} shards of layer {k} at {uniform} bits"))
    valid, reason = True, ""
    if not first_ok:
        worst = int(np.argmin(aib))
        valid = False
        reason = (f"even {levels[0]}-bit shards overrun the IO budget (AIB of layer {worst} is "
                  f"{1e3 * aib[worst]:.1f} ms); they are taken anyway and allocation stops")
    else:
        higher = sorted(levels, reverse=True)
        for k, i in order:
            if preloaded[k, i]:
                continue
            cur = int(bits[k, i])
            room = min(aib[k:])
            for b in higher:
                if b <= cur:
                    break
                extra = tio[b] - tio[cur]
                if room - extra >= -EPS:
                    charge(k, extra)
                    bits[k, i] = b
                    steps.append(AllocationStep("upgrade", tuple(aib), k, i, b, cur, extra))
                    break
    aib = np.array(aib)
    return IOPlan(n, m, target, compute, slack, bits, preloaded, aib.copy(), steps, uniform, valid, reason, outside)


# ----------------------------------------------------------------------------- preload buffer


def select_preload(cost_model: CostModel, n: int, m: int, buffer_bytes: float,
                   bits: int | None = None) -> list[tuple[int, int, int]]:
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


# ----------------------------------------------------------------------------- whole plans and timelines


def simulate(cost_model: CostModel, bits: np.ndarray, preloaded: np.ndarray, sequential: bool = False,
             name: str = "") -> Timeline:
    """Predicted timeline: one IO lane reading layer after layer, one compute lane; stalls where compute waits.

    ``sequential`` loads everything before computing (Load&Exec).
    """
    n, m = bits.shape
    spans, t_io, io_end = [], 0.0, []
    for k in range(n):
        loads = [int(b) for b, p in zip(bits[k], preloaded[k]) if not p]
        dur = sum(cost_model.t_io(b) for b in loads)
        if dur > 0:
            spans.append(Span("io", "io", t_io, t_io + dur, f"layer {k}",
                              {"shards": len(loads), "bytes": sum(cost_model.shard_bytes[b] for b in loads)}))
        t_io += dur
        io_end.append(t_io)
    if sequential:
        io_end = [t_io] * n
    t = 0.0
    tc = cost_model.t_comp(m)
    for k in range(n):
        if io_end[k] > t + EPS:
            spans.append(Span("compute", "stall", t, io_end[k], f"wait for layer {k}"))
            t = io_end[k]
        spans.append(Span("compute", "compute", t, t + tc, f"layer {k}", {"shards": m}))
        t += tc
    return Timeline(tuple(spans), "predicted", name=name)


@dataclass
class ElasticPlan:
    """A method's decision for one target: submodel, per-shard bitwidths, preload, predicted timeline."""
    method: str
    target_s: float
    n: int
    m: int
    bits: np.ndarray                   # (n, m)
    preloaded: np.ndarray              # (n, m) bools
    preload: list                      # (layer, shard, bits) held in the buffer before the run
    mode: str                          # "pipeline", "sequential" (load, then execute) or "memory"
    timeline: Timeline
    compute: ComputePlan | None = None
    io: IOPlan | None = None
    memory_bytes: int = 0              # shard bytes held in memory before the run (buffer / whole model)
    valid: bool = True
    reason: str = ""
    plan_s: float = 0.0                # seconds the planner took
    extra: dict = field(default_factory=dict)

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
               mode: str = "pipeline") -> ElasticPlan:
    z = np.zeros((0, 0), dtype=int)
    return ElasticPlan(method, target_s, 0, 0, z, z.astype(bool), [], mode, Timeline((), "predicted"),
                       compute, None, 0, False, reason)


def plan_elastic(cost_model: CostModel, target_s: float, importance, preload_bytes: float = 0.0,
                 cached=None, min_width: int = 3, preload_bits: int | None = None,
                 method: str = "Ours") -> ElasticPlan:
    """WRX's whole plan: compute planning, preload selection, IO planning, predicted timeline.

    ``cached`` (``(layer, shard, bits)`` entries already in the buffer, e.g. after a
    previous run) replaces the preload selection. If the preferred submodel cannot be
    loaded even at the lowest bitwidth in time, the next candidate is tried; the
    rejected ones are listed in ``extra["rejected"]``.
    """
    t0 = time.perf_counter()
    target = _check_target(target_s)
    if preload_bytes is None or not np.isfinite(preload_bytes) or preload_bytes < 0:
        raise PlanningError(f"preload buffer size must be >= 0 bytes, got {preload_bytes!r}")
    rejected: list[tuple[int, int, str]] = []
    first = None
    while True:
        cp = choose_submodel(lambda n, m: n * cost_model.t_comp(m), target, cost_model.num_layers, cost_model.num_shards,
                             min_width, exclude=frozenset((n, m) for n, m, _ in rejected))
        first = first or cp
        if not cp.found:
            fastest = cost_model.t_comp(max(1, min(min_width, cost_model.num_shards)))
            reason = (f"no submodel fits {1e3 * target:.1f} ms: one layer of {max(1, min_width)} shards alone "
                      f"computes in {1e3 * fastest:.1f} ms" if not rejected else
                      f"no submodel can load its shards in time (tried {len(rejected)})")
            plan = empty_plan(method, target, reason, first)
            plan.extra["rejected"] = rejected
            plan.plan_s = time.perf_counter() - t0
            return plan
        n, m = cp
        if cached is not None:
            options = {None: list(cached)}
        elif preload_bits is not None or preload_bytes <= 0:
            options = {preload_bits: select_preload(cost_model, n, m, preload_bytes, preload_bits)}
        else:
            options = {b: select_preload(cost_model, n, m, preload_bytes, b) for b in cost_model.bitwidths}
        order = _importance_order(importance, n, m)
        tried = {b: (pre, plan_io(cost_model, target, n, m, importance, pre)) for b, pre in options.items()}
        valid = {b: po for b, po in tried.items() if po[1].valid}
        if valid:
            best = max(valid, key=lambda b: ([int(valid[b][1].bits[ki]) for ki in order], -(b or 0)))
            pre, io = valid[best]
            break
        rejected.append((n, m, next(iter(tried.values()))[1].reason))
    preload_options = [{"bits": b, "shards": len(p), "valid": po.valid,
                        "mean_bits": float(po.bits.mean()) if po.valid else None}
                       for b, (p, po) in tried.items()]
    in_buffer = list(pre)
    memory = int(sum(cost_model.shard_bytes[int(b)] for _, _, b in in_buffer))
    timeline = simulate(cost_model, io.bits, io.preloaded, name=f"{method} {n}x{m}")
    plan = ElasticPlan(method, target, n, m, io.bits, io.preloaded, in_buffer, "pipeline", timeline, cp, io,
                       memory, True, "", extra={"rejected": rejected, "first_choice": (first.n, first.m),
                                                "preload_bits": best, "preload_options": preload_options})
    plan.plan_s = time.perf_counter() - t0
    return plan
