"""Self-checks of the early-exit serving (E3) lab: every expected answer comes from the engine's own split
optimizer (:func:`~workbench.earlyexit.optimizer.optimize_splits`, checked against
:func:`~workbench.earlyexit.optimizer.brute_force_splits`) and batch profile
(:class:`~workbench.earlyexit.batchprofile.BatchProfile`), so the lab follows the engine wherever it changes;
the feedback quotes the engine's figures. Pure Python and NumPy: no torch, nothing prepared. The shared
reading of answers and the feedback live in :mod:`workbench.labs`.

The lab's set-up is small enough to work by hand: a 6-layer early-exit model (the shipped encoder's depth)
whose batch profile is :data:`PROFILE`, identical GPUs on which a layer (its ramp included) takes
``FIXED_MS + PER_SAMPLE_MS x batch`` milliseconds, :data:`TRANSFER_MS` to move survivors between splits, an
SLO of :data:`SLO_MS` with E3's 20 % slack.
"""
from __future__ import annotations

import math

from workbench.earlyexit.batchprofile import BatchProfile
from workbench.earlyexit.optimizer import SplitPlan, brute_force_splits, optimize_splits
from workbench.labs import Feedback, check_choice, check_number

PROFILE = (0.75, 0.5, 0.5, 0.25, 0.25, 0.0)
"""Share of the input batch still present after each layer's ramp (a quarter leaves at ramp 0, another quarter
at ramp 1, a quarter at ramp 3, the last quarter runs to the end)."""
FIXED_MS = 1.0                 # a layer's cost whatever its batch (kernel launches, the ramp's exit test)
PER_SAMPLE_MS = 0.25           # and per sample in the batch
TRANSFER_MS = 0.5              # survivors from one split to the next, per cycle
SLO_MS = 100.0
SLACK = 0.2
GPU = "gpu"

REPLICA_PROBLEM = (4, 32)      # exercises 1 and 2: GPUs, input batch per cycle
CYCLE_PROBLEM = (3, 32)        # exercise 3
CUT_PROBLEM = (2, 16)          # exercises 4, 5 and 6
TIGHT_SLO_MS = 20.0            # exercise 5
PLAN_CHOICES = ("split", "unsplit", "none")
STAGE_TOLERANCE_MS = 0.05
CYCLE_TOLERANCE_MS = 0.05
SLO_TOLERANCE_MS = 0.5


def profile() -> BatchProfile:
    return BatchProfile(PROFILE)


def layer_latency(layer: int, batch: int, gpu: str = GPU) -> float:
    """Seconds of one layer (and its ramp) on ``batch`` samples: the lab's linear cost."""
    return 1e-3 * (FIXED_MS + PER_SAMPLE_MS * batch)


def problem(gpus: int, batch_size: int, slo_ms: float = SLO_MS) -> dict:
    """The optimizer's keyword arguments for ``gpus`` identical GPUs taking ``batch_size`` samples a cycle."""
    return dict(layer_latency=layer_latency, batch_profile=list(PROFILE), gpus={GPU: gpus}, slo_s=slo_ms / 1e3,
                transfer_s=TRANSFER_MS / 1e3, slack=SLACK, batch_size=batch_size, num_layers=len(PROFILE))


def plan(gpus: int, batch_size: int, slo_ms: float = SLO_MS) -> SplitPlan:
    """E3's plan (the dynamic program) for the lab's model on ``gpus`` GPUs."""
    return optimize_splits(**problem(gpus, batch_size, slo_ms))


def brute_plan(gpus: int, batch_size: int, slo_ms: float = SLO_MS) -> SplitPlan:
    """The same problem solved by trying every plan."""
    return brute_force_splits(**problem(gpus, batch_size, slo_ms))


def _ms(seconds: float) -> float:
    return 1e3 * seconds


def _layers(split: tuple[int, int]) -> str:
    s, e = split
    return f"layer {s}" if e == s + 1 else f"layers {s}-{e - 1}"


def describe(p: SplitPlan) -> str:
    """A plan in one line: its splits, replicas and per-replica batches."""
    if not p:
        return f"no plan ({p.reason})"
    return "; ".join(f"split {i + 1}: {_layers(s)} on {r} GPU{'s' if r > 1 else ''}, batch {b}"
                     for i, (s, r, b) in enumerate(zip(p.splits, p.replicas, p.batch_sizes)))


def replica_batches(p: SplitPlan, index: int) -> list[int]:
    """A replica's batch at each layer of split ``index`` of ``p``: ceil(B x entering share / replicas)."""
    s, e = p.splits[index]
    sizes = profile().batch_sizes(p.batch_size)
    return [math.ceil(sizes[k] / p.replicas[index] - 1e-9) for k in range(s, e)]


# ----------------------------------------------------------------------------- exercise 1: a replica's batch


def replica_plan() -> SplitPlan:
    return plan(*REPLICA_PROBLEM)


def replica_batch() -> int:
    """The batch a replica of the second split of :func:`replica_plan` is served with."""
    return replica_plan().batch_sizes[1]


def check_replica_batch(answer) -> Feedback:
    """Exercise 1: the batch one replica of split 2 receives per cycle (at its first layer)."""
    p = replica_plan()
    B, (start, _), r = p.batch_size, p.splits[1], p.replicas[1]
    share = profile().entering(start)
    arriving = B * share
    return check_number(
        "Exercise 1", answer, replica_batch(), whole=True, minimum=0, maximum=B, quantity="a replica's batch",
        hint=f"{B} samples enter layer 0 each cycle; look up how many are still there when layer {start} starts "
             f"(the profile's entry after ramp {start - 1}), then share them among the split's replicas.",
        why_high=f"the samples that left at ramps 0..{start - 1} never reach split 2, and the survivors are shared "
                 f"among its {r} replicas: each gets a part of them, not all.",
        why_low=f"the share still present when layer {start} starts is the profile's entry after ramp {start - 1} "
                f"({share:g}), not a later one; exits inside split 2 happen after its replicas took their batch.",
        right=f"{B} x {share:g} = {arriving:g} samples reach layer {start}; over {r} replicas that is "
              f"ceil({arriving:g} / {r}) = {replica_batch()} each. This is how E3 keeps batches full: the split "
              f"after the shrink gets fewer replicas, and each replica still runs a sizeable batch.")


# ----------------------------------------------------------------------------- exercise 2: a split's stage time


def stage_ms() -> float:
    return _ms(replica_plan().stage_s[1])


def check_stage_time(answer) -> Feedback:
    """Exercise 2: how long a replica of split 2 of :func:`replica_plan` computes per cycle, in ms."""
    p = replica_plan()
    start, end = p.splits[1]
    batches = replica_batches(p, 1)
    terms = " + ".join(f"({FIXED_MS:g} + {PER_SAMPLE_MS:g} x {b})" for b in batches)
    return check_number(
        "Exercise 2", answer, stage_ms(), unit="ms", tolerance=STAGE_TOLERANCE_MS, minimum=0,
        quantity="a compute time",
        hint=f"add up layers {start}..{end - 1}, each at FIXED_MS + PER_SAMPLE_MS x its batch; the batch at a "
             "layer is the replica's share of what is left of the input batch at that layer.",
        why_high="samples leave at the ramps inside the split too, so its later layers run on smaller batches than "
                 "its first; and the replicas run side by side, so count one replica's batch, not the split's.",
        why_low=f"every layer pays its fixed {FIXED_MS:g} ms, whatever its batch, and all "
                f"{end - start} layers of the split count.",
        right=f"batches {batches} at layers {start}..{end - 1}: {terms} = {stage_ms():g} ms. The split's replicas "
              "each take this long for their share, in parallel.")


# ----------------------------------------------------------------------------- exercise 3: the cycle time


def cycle_plan() -> SplitPlan:
    return plan(*CYCLE_PROBLEM)


def cycle_ms() -> float:
    return _ms(cycle_plan().cycle_s)


def check_cycle_time(answer) -> Feedback:
    """Exercise 3: the pipelined cycle time of :func:`cycle_plan`, in ms."""
    p = cycle_plan()
    stages = [_ms(t) for t in p.stage_s]
    transfers = [_ms(t) for t in p.transfers_s]
    each = ", ".join(f"split {i + 1} {t:g} ms (batches {replica_batches(p, i)})" for i, t in enumerate(stages))
    return check_number(
        "Exercise 3", answer, cycle_ms(), unit="ms", tolerance=CYCLE_TOLERANCE_MS, minimum=0,
        quantity="a cycle time",
        hint="work out each split's stage time as in exercise 2; pipelined, the splits and the transfer work on "
             "different batches at the same time.",
        why_high="pipelined, a new batch enters as soon as the slowest stage is free: the cycle is the largest "
                 "stage (or transfer) time, not their sum (the sum is the worst-case latency).",
        why_low="every stage must finish its batch before it takes the next: the slowest one sets the pace; check "
                "the batches of the first split's layers.",
        right=f"{each}, the transfer {', '.join(f'{t:g}' for t in transfers)} ms: the cycle is the largest, "
              f"{cycle_ms():g} ms ({p.binding}). Goodput = {p.batch_size} / {cycle_ms():g} ms = "
              f"{p.goodput:,.0f} samples/s; a request that runs every layer takes the sum, {_ms(p.latency_s):g} ms.")


# ----------------------------------------------------------------------------- exercise 4: where to cut


def cut_plan() -> SplitPlan:
    return plan(*CUT_PROBLEM)


def two_split_cycles() -> dict[int, float]:
    """For each cut after layer c (one replica per split, the cut problem's GPUs and batch): the cycle, ms."""
    gpus, B = CUT_PROBLEM
    sizes = profile().batch_sizes(B)
    L = len(PROFILE)
    out = {}
    for c in range(L - 1):
        first = sum(_ms(layer_latency(k, math.ceil(sizes[k] - 1e-9))) for k in range(c + 1))
        second = sum(_ms(layer_latency(k, math.ceil(sizes[k] - 1e-9))) for k in range(c + 1, L))
        out[c] = max(first, second, TRANSFER_MS)
    return out


def unsplit_cycle_ms() -> float:
    """The whole model on every GPU, the batch shared among them (data parallel)."""
    gpus, B = CUT_PROBLEM
    sizes = profile().batch_sizes(B)
    return sum(_ms(layer_latency(k, math.ceil(sizes[k] / gpus - 1e-9))) for k in range(len(PROFILE)))


def cut_layer() -> int | None:
    """The layer after which the optimizer cuts the cut problem (None: no cut); brute force must agree."""
    p, q = cut_plan(), brute_plan(*CUT_PROBLEM)
    if (p.splits, p.replicas) != (q.splits, q.replicas):
        raise AssertionError(f"the optimizer ({describe(p)}) and brute force ({describe(q)}) disagree")
    return p.splits[0][1] - 1 if len(p.splits) > 1 else None


def check_cut(answer) -> Feedback:
    """Exercise 4: after which layer E3 cuts the model into two splits on CUT_PROBLEM's GPUs."""
    cycles, layer = two_split_cycles(), cut_layer()
    best = min(cycles, key=cycles.get)
    table = ", ".join(f"after {c}: {t:g} ms" for c, t in cycles.items())
    return check_number(
        "Exercise 4", answer, layer, whole=True, minimum=0, maximum=len(PROFILE) - 2, quantity="a cut",
        hint="for each possible cut, one GPU per split: the cycle is the larger of the two splits' stage times; "
             "pick the cut with the smallest cycle.",
        why_high="a late cut leaves the first split with most of the layers at the largest batches: its stage "
                 "time sets a long cycle while the second split idles.",
        why_low="an early cut leaves the second split with most of the layers; the batch has not shrunk enough "
                "yet for it to keep up.",
        right=f"one GPU per split, the cycle for each cut: {table}. The smallest is after layer {best} "
              f"({cycles[best]:g} ms), better than the whole model on both GPUs ({unsplit_cycle_ms():g} ms at a "
              f"batch of {CUT_PROBLEM[1] // CUT_PROBLEM[0]} each): the cut sits where the batch has halved, so "
              f"both splits take about as long. The dynamic program and brute force both choose it: "
              f"{describe(cut_plan())}.")


# ----------------------------------------------------------------------------- exercise 5: a tighter SLO


def tight_plan() -> SplitPlan:
    return plan(*CUT_PROBLEM, slo_ms=TIGHT_SLO_MS)


def tight_choice() -> str:
    p = tight_plan()
    return "none" if not p else "split" if len(p.splits) > 1 else "unsplit"


def check_tight_slo(answer) -> Feedback:
    """Exercise 5: with the SLO at TIGHT_SLO_MS, does the optimizer keep a cut ("split"), run the whole model on
    every GPU ("unsplit"), or find nothing ("none")?"""
    loose, tight = cut_plan(), tight_plan()
    budget = TIGHT_SLO_MS * (1 - SLACK)
    return check_choice(
        "Exercise 5", answer, tight_choice(), PLAN_CHOICES,
        why=f"every request must finish within the SLO less its slack, {TIGHT_SLO_MS:g} x {1 - SLACK:g} = "
            f"{budget:g} ms. The split plan's worst case is its stages and the transfer in a row: "
            f"{_ms(loose.latency_s):g} ms, too long. The whole model on each GPU takes {unsplit_cycle_ms():g} ms "
            f"for a batch, which fits: the optimizer picks {describe(tight)}, {tight.goodput:,.0f} samples/s "
            f"instead of {loose.goodput:,.0f}. Pipelining buys goodput with latency.",
        hint="compare each plan's worst-case latency (a request that runs every layer) with the SLO less 20 % "
             "slack; goodput only counts among the plans that fit.")


# ----------------------------------------------------------------------------- exercise 6: the tightest SLO


def split_kept(slo_ms: float) -> bool:
    return len(plan(*CUT_PROBLEM, slo_ms=slo_ms).splits) > 1


def tightest_split_slo_ms(low: float = 1.0, high: float = SLO_MS) -> float:
    """The smallest SLO (ms) at which the optimizer still cuts the cut problem, by bisection on the optimizer
    (to 0.001 ms)."""
    if not split_kept(high):
        raise ValueError(f"the optimizer does not cut even at an SLO of {high:g} ms")
    while high - low > 1e-3:
        mid = (low + high) / 2
        low, high = (low, mid) if split_kept(mid) else (mid, high)
    return (low + high) / 2


def check_tightest_slo(answer) -> Feedback:
    """Exercise 6: the smallest SLO, in ms, at which the optimizer still splits the cut problem."""
    p = cut_plan()
    slo = tightest_split_slo_ms()
    return check_number(
        "Exercise 6", answer, slo, unit="ms", tolerance=SLO_TOLERANCE_MS, minimum=0, quantity="an SLO",
        hint="the split plan fits while its worst-case latency is within the SLO less the slack; solve for the SLO.",
        why_high="the split plan still fits at that SLO: its worst case only has to be within the SLO less "
                 f"{100 * SLACK:g} %, not the SLO itself minus something more.",
        why_low=f"the budget is the SLO less its {100 * SLACK:g} % slack: divide the worst-case latency by "
                f"{1 - SLACK:g}; and count the transfer between the splits.",
        right=f"the split plan's worst case is {' + '.join(f'{_ms(t):g}' for t in p.stage_s)} + "
              f"{_ms(sum(p.transfers_s)):g} (transfer) = {_ms(p.latency_s):g} ms; it fits while "
              f"{_ms(p.latency_s):g} <= SLO x {1 - SLACK:g}, i.e. from {_ms(p.latency_s) / (1 - SLACK):g} ms "
              f"(the optimizer, bisected: {slo:.2f} ms). Below that it runs the whole model on each GPU.")


def answers() -> dict[str, object]:
    """The right answers, by the lab's variable names, for its tests."""
    return {"my_replica_batch": replica_batch(), "my_stage_ms": round(stage_ms(), 2), "my_cycle_ms": round(cycle_ms(), 2),
            "my_cut": cut_layer(), "my_tight_plan": tight_choice(), "my_tightest_slo_ms": round(tightest_split_slo_ms(), 1)}
