"""Self-checks of the early-exit serving (E3) lab: every expected answer comes from the engine's own split
optimizer (:func:`~workbench.earlyexit.optimizer.optimize_splits`, checked against
:func:`~workbench.earlyexit.optimizer.brute_force_splits`) and batch profile
(:class:`~workbench.earlyexit.batchprofile.BatchProfile`), so the lab follows the engine wherever it changes;
the feedback quotes the engine's figures. Pure Python and NumPy: no torch, nothing prepared. The shared
reading of answers and the feedback live in :mod:`workbench.labs`.

The lab's set-up is small enough to work by hand: a 6-layer early-exit model (the shipped encoder's depth)
whose batch profile is :data:`PROFILE`, identical GPUs on which a layer (its ramp included) takes
``FIXED_MS + PER_SAMPLE_MS x batch`` milliseconds, every replica at a batch of :data:`BATCH`, :data:`TRANSFER_MS`
to move a merged batch between splits, an SLO of :data:`SLO_MS` with E3's 20 % slack.
"""
from __future__ import annotations

from workbench.earlyexit.batchprofile import BatchProfile
from workbench.earlyexit.optimizer import SplitPlan, brute_force_splits, optimize_splits
from workbench.labs import Feedback, check_choice, check_number

PROFILE = (0.75, 0.5, 0.5, 0.25, 0.25, 0.0)
"""Share of the input still present after each layer's ramp (a quarter leaves at ramp 0, another quarter at
ramp 1, a quarter at ramp 3, the last quarter runs to the end)."""
FIXED_MS = 1.0                 # a layer's cost whatever its batch (kernel launches, the ramp's exit test)
PER_SAMPLE_MS = 0.25           # and per sample in the batch
TRANSFER_MS = 0.5              # a merged batch from one split to the next
SLO_MS = 100.0
SLACK = 0.2
GPU = "gpu"
BATCH = 8                      # every replica's batch

MERGE_PROBLEM = (3, BATCH)     # exercises 1, 2 and 3: GPUs, batch per replica
CUT_PROBLEM = (2, BATCH)       # exercises 4, 5 and 6
TIGHT_SLO_MS = 18.0            # exercise 5
PLAN_CHOICES = ("split", "unsplit", "none")
BATCHES_TOLERANCE = 0.01
STAGE_TOLERANCE_MS = 0.05
GOODPUT_TOLERANCE = 5.0
SLO_TOLERANCE_MS = 0.5


def profile() -> BatchProfile:
    return BatchProfile(PROFILE)


def layer_latency(layer: int, batch: int, gpu: str = GPU) -> float:
    """Seconds of one layer (and its ramp) on ``batch`` samples: the lab's linear cost."""
    return 1e-3 * (FIXED_MS + PER_SAMPLE_MS * batch)


def problem(gpus: int, batch_size: int, slo_ms: float = SLO_MS) -> dict:
    """The optimizer's keyword arguments for ``gpus`` identical GPUs, every replica at ``batch_size``."""
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
    """A plan in one line: its splits, replicas and batches per cycle."""
    if not p:
        return f"no plan ({p.reason})"
    return "; ".join(f"split {st.index + 1}: {_layers((st.start, st.end))} on {st.replicas} "
                     f"GPU{'s' if st.replicas > 1 else ''}, {st.batches_per_cycle:g} batch(es) of {st.batch_size} a cycle"
                     for st in p.stages[:len(p.batches_per_cycle)])


def replica_batches(p: SplitPlan, index: int) -> list[float]:
    """A replica's batch at each layer of split ``index`` of ``p``: b at the split's first layer, then b times
    the share of its samples still present."""
    s, e = p.splits[index]
    prof = profile()
    return [p.batch_size * prof.entering(k) / prof.entering(s) for k in range(s, e)]


# ----------------------------------------------------------------------------- exercise 1: merged batches


def merge_plan() -> SplitPlan:
    return plan(*MERGE_PROBLEM)


def merged_batches() -> float:
    """Full batches split 2 of :func:`merge_plan` receives per cycle."""
    return merge_plan().batches_per_cycle[1]


def check_merged_batches(answer) -> Feedback:
    """Exercise 1: how many full batches of 8 split 2 receives per cycle."""
    p = merge_plan()
    n, (start, _), r = p.input_batches, p.splits[1], p.replicas[1]
    share = profile().entering(start)
    return check_number(
        "Exercise 1", answer, merged_batches(), tolerance=BATCHES_TOLERANCE, minimum=0, maximum=n,
        quantity="a number of batches",
        hint=f"each of split 1's {n} replicas takes one batch of {p.batch_size} per cycle: count the samples still "
             f"there when layer {start} starts (the profile's entry after ramp {start - 1}), then how many full "
             f"batches of {p.batch_size} they make.",
        why_high=f"the samples that left at ramps 0..{start - 1} never reach split 2: only a share of the "
                 f"{n} x {p.batch_size} inputs arrive there.",
        why_low=f"the share still present when layer {start} starts is the profile's entry after ramp {start - 1} "
                f"({share:g}), not a later one; exits inside split 2 happen after its batch was formed.",
        right=f"{n} x {p.batch_size} = {n * p.batch_size} samples enter split 1 per cycle; {share:g} of them reach "
              f"layer {start}: {n * p.batch_size * share:g} samples, {merged_batches():g} full batch(es) of "
              f"{p.batch_size} for split 2's {r} replica(s). The survivors of two half-empty batches merge into one "
              "full one: every replica runs the same batch, which is how E3 keeps the GPUs busy.")


# ----------------------------------------------------------------------------- exercise 2: a split's stage time


def stage_ms() -> float:
    return _ms(merge_plan().stage_s[1])


def check_stage_time(answer) -> Feedback:
    """Exercise 2: how long a replica of split 2 of :func:`merge_plan` takes for one batch, in ms."""
    p = merge_plan()
    start, end = p.splits[1]
    batches = replica_batches(p, 1)
    terms = " + ".join(f"({FIXED_MS:g} + {PER_SAMPLE_MS:g} x {b:g})" for b in batches)
    return check_number(
        "Exercise 2", answer, stage_ms(), unit="ms", tolerance=STAGE_TOLERANCE_MS, minimum=0,
        quantity="a compute time",
        hint=f"add up layers {start}..{end - 1}, each at FIXED_MS + PER_SAMPLE_MS x its batch; the batch is "
             f"{p.batch_size} at layer {start}, then shrinks as the profile says.",
        why_high="samples leave at the ramps inside the split too, so its later layers run on smaller batches than "
                 "its first.",
        why_low=f"every layer pays its fixed {FIXED_MS:g} ms, whatever its batch, and all "
                f"{end - start} layers of the split count; the batch starts full ({p.batch_size}).",
        right=f"batches {[round(b, 3) for b in batches]} at layers {start}..{end - 1}: {terms} = {stage_ms():g} ms.")


# ----------------------------------------------------------------------------- exercise 3: goodput


def goodput() -> float:
    return merge_plan().goodput


def check_goodput(answer) -> Feedback:
    """Exercise 3: the goodput of :func:`merge_plan`, in input samples per second."""
    p = merge_plan()
    tputs = p.throughputs()
    each = "; ".join(f"split {i + 1}: {r} x {p.batch_size} samples per {_ms(t):g} ms, reached by {100 * n / p.input_batches:g}"
                     f" % of the inputs: {tputs[i]:,.0f} inputs/s"
                     for i, (r, t, n) in enumerate(zip(p.replicas, p.stage_s, p.batches_per_cycle)))
    return check_number(
        "Exercise 3", answer, goodput(), unit="samples/s", tolerance=GOODPUT_TOLERANCE, minimum=0,
        quantity="a goodput",
        hint="pipelined, every split works on its own batches at the same time: find how many inputs per second "
             "each split keeps up with (its replicas x batch / stage time, over the share of inputs that reach "
             "it); the slowest sets the pace.",
        why_high="the slowest split sets the pace: a faster split waits for it. Check split 1, which every input "
                 "goes through.",
        why_low="a split that only a share of the inputs reach keeps up with more inputs than it runs samples: "
                "divide by that share; and the replicas work side by side.",
        right=f"{each}; the transfer {tputs[-1]:,.0f} inputs/s. The smallest is {goodput():,.0f} samples/s "
              f"({p.binding}); a request that runs every layer takes {_ms(p.latency_s):g} ms.")


# ----------------------------------------------------------------------------- exercise 4: where to cut


def cut_plan() -> SplitPlan:
    return plan(*CUT_PROBLEM)


def two_split_goodputs() -> dict[int, float]:
    """For each cut after layer c (one replica per split, the cut problem's batch): goodput, samples/s."""
    _, b = CUT_PROBLEM
    prof = profile()
    L = len(PROFILE)
    out = {}
    for c in range(L - 1):
        f = prof.entering(c + 1)
        first = sum(layer_latency(k, b * prof.entering(k)) for k in range(c + 1))
        second = sum(layer_latency(k, b * prof.entering(k) / f) for k in range(c + 1, L))
        out[c] = min(b / first, b / (f * second), b / (f * TRANSFER_MS / 1e3))
    return out


def as_is_goodput() -> float:
    """The whole model on every GPU, each replica's batch shrinking as samples leave (data parallel)."""
    gpus, b = CUT_PROBLEM
    prof = profile()
    return gpus * b / sum(layer_latency(k, b * prof.entering(k)) for k in range(len(PROFILE)))


def cut_layer() -> int | None:
    """The layer after which the optimizer cuts the cut problem (None: no cut); brute force must agree."""
    p, q = cut_plan(), brute_plan(*CUT_PROBLEM)
    if (p.splits, p.replicas) != (q.splits, q.replicas):
        raise AssertionError(f"the optimizer ({describe(p)}) and brute force ({describe(q)}) disagree")
    return p.splits[0][1] - 1 if len(p.splits) > 1 else None


def check_cut(answer) -> Feedback:
    """Exercise 4: after which layer E3 cuts the model into two splits on CUT_PROBLEM's GPUs."""
    goodputs, layer = two_split_goodputs(), cut_layer()
    best = max(goodputs, key=goodputs.get)
    table = ", ".join(f"after {c}: {g:,.0f}/s" for c, g in goodputs.items())
    return check_number(
        "Exercise 4", answer, layer, whole=True, minimum=0, maximum=len(PROFILE) - 2, quantity="a cut",
        hint="for each possible cut, one GPU per split: the goodput is the smaller of what the two splits keep up "
             "with; pick the cut with the largest.",
        why_high="a late cut leaves the first split, which every input runs, with most of the layers: it sets a "
                 "slow pace while the second split idles.",
        why_low="an early cut leaves the second split with most of the layers while few inputs have left yet: it "
                "cannot keep up.",
        right=f"one GPU per split: {table}. The best is after layer {best} ({goodputs[best]:,.0f} samples/s), "
              f"better than the whole model on both GPUs ({as_is_goodput():,.0f}/s, batches shrinking from "
              f"{CUT_PROBLEM[1]}): the cut sits where the batch has halved, so both splits take about as long per "
              f"input. The dynamic program and brute force both choose it: {describe(cut_plan())}.")


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
            f"{_ms(loose.latency_s):g} ms, too long. The whole model on each GPU takes "
            f"{_ms(loose.baseline.batch_s[GPU]):g} ms for a batch, which fits: the optimizer picks {describe(tight)}, "
            f"{tight.goodput:,.0f} samples/s instead of {loose.goodput:,.0f}. Pipelining buys goodput with latency.",
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
    return {"my_merged_batches": merged_batches(), "my_stage_ms": round(stage_ms(), 2),
            "my_goodput": round(goodput()), "my_cut": cut_layer(), "my_tight_plan": tight_choice(),
            "my_tightest_slo_ms": round(tightest_split_slo_ms(), 1)}
