"""E3's split optimizer: the dynamic program against brute force, hand-worked plans, the explained empty plan, the
errors bad input gets before any work, and every plan's invariants checked against the latency function itself."""
from __future__ import annotations

import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.earlyexit import SplitPlan, bert_problem, brute_force_splits, optimize_splits, time_optimizer
from workbench.errors import WorkbenchError


def unit_layer(k, b, g):
    """Every layer on every GPU: 1 s of overhead plus 1 s per sample."""
    return 1.0 + b


def check_plan(plan: SplitPlan, lat, profile, gpus, slo_s, *, batch_size, transfer_s=0.0, slack=0.2,
               pipelined=True):
    """The plan's invariants, recomputed from ``layer_latency`` and the model in the optimizer's docstring."""
    L = len(profile)
    f_in = [1.0] + list(profile[:-1])
    n = len(plan.splits)
    assert len(plan.replicas) == len(plan.gpu_types) == len(plan.batch_sizes) == len(plan.stage_s) == n
    assert len(plan.transfers_s) == max(0, n - 1)
    if not plan:
        assert plan.goodput == 0 and plan.reason
        return
    assert plan.splits[0][0] == 0 and plan.splits[-1][1] == L                   # every layer, in order, once
    assert all(a[1] == b[0] for a, b in zip(plan.splits, plan.splits[1:]))
    assert all(s < e for s, e in plan.splits)
    used = {}
    for g, r in zip(plan.gpu_types, plan.replicas):
        used[g] = used.get(g, 0) + r
    assert all(used[g] <= gpus[g] for g in used) and used == plan.gpus_used
    stages = []
    for (s, e), g, r, b in zip(plan.splits, plan.gpu_types, plan.replicas, plan.batch_sizes):
        assert 1 <= r <= max(1, math.floor(batch_size * f_in[s] + 1e-9))
        assert b == math.ceil(batch_size * f_in[s] / r - 1e-9)
        t = 0.0
        for k in range(s, e):
            per_replica = math.ceil(batch_size * f_in[k] / r - 1e-9)
            t += lat(k, per_replica, g) if per_replica else 0.0
        stages.append(t)
    assert plan.stage_s == pytest.approx(stages)
    transfers = [transfer_s(s, math.ceil(batch_size * f_in[s] - 1e-9)) if callable(transfer_s) else transfer_s
                 for s, _ in plan.splits[1:]]
    assert plan.transfers_s == pytest.approx(transfers)
    latency = sum(stages) + sum(transfers)
    assert plan.latency_s == pytest.approx(latency)
    assert latency <= slo_s * (1 - slack) * (1 + 1e-9)
    cycle = max(stages + transfers) if pipelined else latency
    assert plan.cycle_s == pytest.approx(cycle)
    assert plan.goodput == pytest.approx(batch_size / cycle)
    if pipelined:             # goodput: the slowest split or transfer, each moving B input samples per its time
        assert plan.goodput == pytest.approx(min(batch_size / t for t in stages + transfers if t > 0))
    for (s, _), r, b in zip(plan.splits, plan.replicas, plan.batch_sizes):
        assert r * b >= batch_size * f_in[s] - 1e-9            # replicas x batch covers what the split receives


# ---------------------------------------------------------------------------------------------- hand-worked

def test_a_batch_that_halves_after_the_first_layer_gets_two_replicas_of_the_first_split():
    # Two identical layers (1 s + 1 s per sample), 8 samples per cycle, half exit after layer 0, 3 GPUs.
    # Unsplit, 3 replicas see ceil(8/3) = 3 then ceil(4/3) = 2 samples: (1+3) + (1+2) = 7 s a cycle.
    # Cut after layer 0: 2 replicas of layer 0 at 4 samples (5 s), 1 replica of layer 1 at 4 samples (5 s):
    # pipelined, a cycle is 5 s, the batch per replica stays at 4 (E3's point). (1, 2) or (1, 1) take 9 s.
    plan = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, batch_size=8)
    check_plan(plan, unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, batch_size=8)
    assert plan.splits == [(0, 1), (1, 2)]
    assert plan.replicas == [2, 1] and plan.gpu_types == ["v100", "v100"] and plan.batch_sizes == [4, 4]
    assert plan.goodput == pytest.approx(8 / 5) and plan.latency_s == pytest.approx(10.0)
    assert plan.unsplit["replicas"] == 3 and plan.unsplit["goodput"] == pytest.approx(8 / 7)
    assert plan.bottlenecks == [("compute", 0), ("compute", 1)]
    assert "after layer(s) 0" in plan.reason and "1.4x" in plan.reason


def test_e3s_own_example_merges_two_halves_into_one_full_batch():
    # E3 §3.2: 16 inputs on each of two replicas of the first split, half exit, the two halves of 8 merge into
    # one batch of 16 for the second split: a cycle takes 32 inputs.
    plan = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 1000.0, batch_size=32)
    assert plan.replicas == [2, 1] and plan.batch_sizes == [16, 16]


def test_the_latency_budget_can_forbid_the_cut():
    # The cut plan above takes 5 + 5 = 10 s per request; with a 9 s budget only the unsplit 3 replicas (7 s) fit,
    # and every other cut plan takes longer still ((1,1): 14 s, (1,2): 12 s).
    plan = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 9.0, slack=0.0, batch_size=8)
    check_plan(plan, unit_layer, [0.5, 0.0], {"v100": 3}, 9.0, slack=0.0, batch_size=8)
    assert plan.splits == [(0, 2)] and plan.replicas == [3]
    assert plan.goodput == pytest.approx(8 / 7) and plan.latency_s == pytest.approx(7.0)
    # the slack counts: 10 s fits a 12.6 s SLO with 20% slack, not a 12 s one
    assert optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 12.6, batch_size=8).replicas == [2, 1]
    assert optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 12.0, batch_size=8).replicas == [3]


@pytest.mark.parametrize("transfer, cut", [(6.0, True), (7.5, False)])
def test_a_transfer_is_a_stage_of_the_pipeline(transfer, cut):
    # A 6 s transfer makes the cut plan's cycle 6 s (still below the unsplit 7 s); at 7.5 s no cut pays.
    plan = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, batch_size=8, transfer_s=transfer)
    check_plan(plan, unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, batch_size=8, transfer_s=transfer)
    if cut:
        assert plan.replicas == [2, 1] and plan.cycle_s == pytest.approx(6.0)
        assert plan.bottlenecks == [("transfer", 1)] and "transfer into split 2" in plan.binding
        assert plan.latency_s == pytest.approx(5 + 6 + 5)
    else:
        assert plan.splits == [(0, 2)] and plan.cycle_s == pytest.approx(7.0)


def test_a_transfer_function_gets_the_boundary_and_the_samples_crossing():
    calls = []

    def transfer(boundary, batch):
        calls.append((boundary, batch))
        return 0.5 * batch

    plan = optimize_splits(unit_layer, [0.75, 0.25, 0.0], {"v100": 4}, 100.0, batch_size=8, transfer_s=transfer)
    assert sorted(calls) == [(1, 6), (2, 2)]                    # into layer 1: 8 x 0.75; into layer 2: 8 x 0.25
    check_plan(plan, unit_layer, [0.75, 0.25, 0.0], {"v100": 4}, 100.0, batch_size=8, transfer_s=transfer)


def test_each_split_gets_the_gpu_type_its_batch_suits():
    # "big": 0.5 s + 0.1 s per sample; "small": 0.2 s + 0.5 s per sample; one of each; a quarter go on.
    # Unsplit on big: (0.5+0.8) + (0.5+0.2) = 2.0 s; on small: 4.2 + 1.2 = 5.4 s. Cut with big first: layer 0
    # at 8 samples 1.3 s, layer 1 at 2 samples on small 1.2 s: cycle 1.3 s. Small first: 4.2 s.
    def lat(k, b, g):
        return {"big": 0.5 + 0.1 * b, "small": 0.2 + 0.5 * b}[g]

    gpus = {"big": 1, "small": 1}
    plan = optimize_splits(lat, [0.25, 0.0], gpus, 100.0, batch_size=8)
    check_plan(plan, lat, [0.25, 0.0], gpus, 100.0, batch_size=8)
    assert plan.splits == [(0, 1), (1, 2)] and plan.gpu_types == ["big", "small"] and plan.replicas == [1, 1]
    assert plan.cycle_s == pytest.approx(1.3) and plan.unsplit["gpu_type"] == "big"
    assert plan.unsplit["cycle_s"] == pytest.approx(2.0)


def test_equal_goodput_goes_to_the_plan_with_fewer_gpus():
    # With 4 GPUs no plan beats a 5 s cycle (a 4 s one needs layer 0 on 3 replicas and layer 1 on 2): the cut
    # (2, 1) reaches it with 3 GPUs, unsplit on 4 replicas ((1+2) + (1+1) = 5 s) with 4, (3, 1) and (2, 2)
    # with 4 too. Fewer GPUs win; with prices, the cheaper plan.
    plan = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 4}, 100.0, batch_size=8)
    assert plan.replicas == [2, 1] and plan.cycle_s == pytest.approx(5.0) and plan.gpus_used == {"v100": 3}
    priced = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 4}, 100.0, batch_size=8, prices={"v100": 2.0})
    assert priced.replicas == [2, 1] and priced.cost_per_s == pytest.approx(6.0)


def test_the_cost_bound_limits_the_gpus_bought():
    # Prices 1 $/s: the cluster costs 3 $/s. alpha = 2/3 allows 2 GPUs: unsplit on 2, (1+4) + (1+2) = 8 s,
    # beats the cut (1, 1) (9 s); alpha = 1/2 allows 1: unsplit on 1, (1+8) + (1+4) = 14 s.
    kw = dict(batch_size=8, prices={"v100": 1.0})
    two = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, alpha=2 / 3, **kw)
    assert two.splits == [(0, 2)] and two.replicas == [2] and two.cycle_s == pytest.approx(8.0)
    assert two.cost_per_s == pytest.approx(2.0) and "at most $2/s" in two.reason
    one = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, alpha=0.5, **kw)
    assert one.replicas == [1] and one.cycle_s == pytest.approx(14.0)
    baseline = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, alpha=1.0, baseline_cost_per_s=2.0, **kw)
    assert baseline.replicas == [2]


def test_not_pipelined_the_cycle_is_the_sum():
    # Not pipelined the cut plan's cycle is 5 + 5 = 10 s; unsplit on 3 replicas takes 7 s.
    plan = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, pipelined=False, batch_size=8)
    check_plan(plan, unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, pipelined=False, batch_size=8)
    assert plan.splits == [(0, 2)] and plan.replicas == [3] and plan.cycle_s == pytest.approx(7.0)
    assert plan.bottlenecks == [] and "not pipelined" in plan.binding


def test_a_split_after_every_sample_has_left_still_holds_its_layers():
    plan = optimize_splits(unit_layer, [0.0, 0.0, 0.0], {"v100": 2}, 100.0, batch_size=4)
    check_plan(plan, unit_layer, [0.0, 0.0, 0.0], {"v100": 2}, 100.0, batch_size=4)
    assert plan.splits[0][0] == 0 and plan.stage_s[0] == pytest.approx(1 + 2)     # 2 replicas of layer 0


# ----------------------------------------------------------------------------------------- the empty plan

def test_no_plan_meets_the_slo_and_the_plan_says_why():
    plan = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 1.0, batch_size=8)
    assert not plan and plan.splits == [] and plan.replicas == [] and plan.goodput == 0.0
    # the fastest any plan can be: 3 replicas, (1+3) + (1+2) = 7 s, against a budget of 0.8 s
    assert "at least 7 s" in plan.reason and "800 ms" in plan.reason and "SLO" in plan.reason
    assert plan.explain().startswith("no plan: ")
    assert brute_force_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 1.0, batch_size=8).reason == plan.reason


def test_no_plan_meets_the_cost_bound_and_the_plan_says_why():
    plan = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, batch_size=8, prices={"v100": 1.0},
                           alpha=0.2)
    assert not plan and "cost bound" in plan.reason and "$1/s" in plan.reason and "alpha" in plan.reason


# ------------------------------------------------------------------------------------------------ bad input

GOOD = dict(layer_latency=unit_layer, batch_profile=[0.5, 0.0], gpus={"v100": 2}, slo_s=10.0)


@pytest.mark.parametrize("change, message", [
    (dict(gpus={}), "no GPUs"),
    (dict(gpus={"v100": 0, "k80": 0}), "no GPUs"),
    (dict(gpus={"v100": -1}), "gpus['v100']"),
    (dict(gpus={"v100": 1.5}), "whole number"),
    (dict(gpus={t: 64 for t in "abcd"}), "17,850,625 combinations of GPUs used per type"),
    (dict(batch_profile=[0.5, 0.0, 0.0], num_layers=2), "3 entries but the model has 2 layers"),
    (dict(batch_profile=[0.5], num_layers=2), "1 entries but the model has 2 layers"),
    (dict(batch_profile=[]), "empty"),
    (dict(batch_profile=[0.5, 0.6]), "increases at layer 1"),
    (dict(batch_profile=[1.5, 0.0]), "outside [0, 1]"),
    (dict(batch_profile=[0.5, -0.1]), "outside [0, 1]"),
    (dict(batch_profile=[0.5, float("nan")]), "batch_profile[1]"),
    (dict(slo_s=0.0), "slo_s must be > 0"),
    (dict(slo_s=-1.0), "slo_s must be > 0"),
    (dict(slo_s=float("inf")), "slo_s must be a finite number"),
    (dict(transfer_s=-0.1), "transfer_s must be >= 0"),
    (dict(slack=1.0), "slack must be < 1"),
    (dict(slack=-0.1), "slack must be >= 0"),
    (dict(batch_size=0), "batch_size must be a whole number >= 1"),
    (dict(pipelined="yes"), "pipelined must be True or False"),
    (dict(prices={"k80": 1.0}), "no price for 'v100'"),
    (dict(alpha=1.0), "needs prices"),
    (dict(prices={"v100": 1.0}, alpha=0.0), "alpha must be > 0"),
    (dict(prices={"v100": 1.0}, baseline_cost_per_s=1.0), "give alpha too"),
    (dict(layer_latency="fast"), "layer_latency must be a function"),
])
def test_bad_input_is_refused_before_any_work(change, message):
    calls = []

    def spy(k, b, g):
        calls.append((k, b, g))
        return 1.0

    kwargs = {**GOOD, "layer_latency": spy, **change}
    for fn in (optimize_splits, brute_force_splits):
        with pytest.raises(WorkbenchError, match=re.escape(message)):
            fn(**kwargs)
    assert calls == []


def test_a_latency_function_that_fails_is_named_in_the_error():
    table = [[1.0] * 9, [2.0] * 9]                      # a two-layer model, batches 0..8

    def lat(k, b, g):
        return table[k][b]

    with pytest.raises(WorkbenchError, match=r"layer_latency\(2, .*IndexError.*3 layers"):
        optimize_splits(lat, [0.5, 0.5, 0.0], {"v100": 1}, 10.0, batch_size=8)      # a profile too long
    with pytest.raises(WorkbenchError, match="must be a positive, finite number"):
        optimize_splits(lambda k, b, g: 0.0, [0.5, 0.0], {"v100": 1}, 10.0)
    with pytest.raises(WorkbenchError, match=r"transfer_s\(1, 4\) returned -1"):
        optimize_splits(unit_layer, [0.5, 0.0], {"v100": 1}, 10.0, batch_size=8, transfer_s=lambda s, b: -1)


# --------------------------------------------------------------------------------- against brute force

@st.composite
def instances(draw):
    L = draw(st.integers(2, 5))
    G = draw(st.integers(1, 3))
    types = ["a", "b", "c"][:G]
    gpus = {t: draw(st.integers(1, 4)) for t in types}
    B = draw(st.integers(1, 8))
    # a monotone latency table per (layer, type): an overhead, then non-negative steps per extra sample
    table = {}
    for k in range(L):
        for t in types:
            level = draw(st.floats(0.05, 3.0))
            row = [level]
            for _ in range(B - 1):
                level += draw(st.sampled_from([0.0, 0.1, 0.5, draw(st.floats(0.0, 2.0))]))
                row.append(level)
            table[k, t] = row
    cuts = sorted(draw(st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0, draw(st.floats(0.0, 1.0))]),
                                min_size=L, max_size=L)), reverse=True)
    # an SLO near what the model takes makes the latency budget, not the GPUs, decide the cycle; some are too short
    whole = sum(max(table[k, t][-1] for t in types) for k in range(L))
    slo = draw(st.one_of(st.floats(0.1, 40.0), st.floats(0.1, 1.5).map(lambda x: x * whole)))
    kwargs = dict(batch_profile=cuts, gpus=gpus, slo_s=slo, batch_size=B,
                  pipelined=draw(st.booleans()), slack=draw(st.sampled_from([0.0, 0.2, 0.5])),
                  transfer_s=draw(st.sampled_from([0.0, 0.0, 0.3, draw(st.floats(0.0, 5.0))])))
    if draw(st.booleans()):
        kwargs["prices"] = {t: draw(st.sampled_from([0.0, 1.0, 2.0, 3.5])) for t in types}
        if draw(st.booleans()):
            kwargs["alpha"] = draw(st.floats(0.1, 1.0))
    return (lambda k, b, g: table[k, g][b - 1]), kwargs


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_the_dynamic_program_finds_what_brute_force_finds(instance):
    lat, kwargs = instance
    dp = optimize_splits(lat, **kwargs)
    bf = brute_force_splits(lat, **kwargs)
    assert bool(dp) == bool(bf)
    # the same objective (cycle, cost, GPUs, latency), exactly: the DP's plan is one brute force finds optimal
    assert dp.objective == bf.objective
    check_plan(dp, lat, kwargs["batch_profile"], kwargs["gpus"], kwargs["slo_s"], batch_size=kwargs["batch_size"],
               transfer_s=kwargs["transfer_s"], slack=kwargs["slack"], pipelined=kwargs["pipelined"])
    if "alpha" in kwargs and dp:
        full = sum(n * kwargs["prices"][t] for t, n in kwargs["gpus"].items())
        assert dp.cost_per_s <= kwargs["alpha"] * full * (1 + 1e-9)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.floats(0.0, 0.999))
def test_when_the_latency_budget_binds_the_dynamic_program_still_finds_the_optimum(instance, squeeze):
    # A budget between the lowest worst-case latency any plan has (not pipelined, the cycle is the latency)
    # and that of the plan that wins without an SLO: the cycle must grow past the smallest one the GPUs allow,
    # which the search reaches by its latency-tracking passes.
    lat, kwargs = instance
    kwargs = {**kwargs, "pipelined": True}
    free = brute_force_splits(lat, **{**kwargs, "slo_s": 1e9})
    fastest = brute_force_splits(lat, **{**kwargs, "slo_s": 1e9, "pipelined": False})
    if not free or fastest.latency_s >= free.latency_s:
        return
    budget = fastest.latency_s + squeeze * (free.latency_s - fastest.latency_s)
    kwargs["slo_s"] = budget / (1 - kwargs["slack"])
    dp = optimize_splits(lat, **kwargs)
    bf = brute_force_splits(lat, **kwargs)
    assert dp.objective == bf.objective
    check_plan(dp, lat, kwargs["batch_profile"], kwargs["gpus"], kwargs["slo_s"], batch_size=kwargs["batch_size"],
               transfer_s=kwargs["transfer_s"], slack=kwargs["slack"], pipelined=kwargs["pipelined"])


@settings(max_examples=40, deadline=None)
@given(instances(), st.integers(0, 10**6))
def test_a_latency_that_is_not_monotone_is_still_solved_exactly(instance, seed):
    import random

    _, kwargs = instance
    rng = random.Random(seed)
    bumpy = {}

    def lat(k, b, g):                                   # any positive numbers, batch by batch
        return bumpy.setdefault((k, b, g), rng.uniform(0.05, 3.0))

    dp = optimize_splits(lat, **kwargs)
    bf = brute_force_splits(lat, **kwargs)
    assert dp.objective == bf.objective


# -------------------------------------------------------------------------------------------- the benchmark

def test_bert_shaped_problems_solve_and_can_be_timed():
    rows = time_optimizer(repeats=1)
    assert [(r["model"], r["cluster"], r["gpus"], r["types"]) for r in rows] == [
        ("bert-base", "homogeneous", 16, 1), ("bert-base", "heterogeneous", 46, 4),
        ("bert-large", "homogeneous", 16, 1), ("bert-large", "heterogeneous", 46, 4)]
    assert all(r["median_s"] > 0 and r["goodput"] > 0 for r in rows)
    assert max(r["median_s"] for r in rows) < 1.0          # ~10-40 ms here; an exponential blow-up would show
    kwargs = bert_problem("bert-large", "heterogeneous")
    plan = optimize_splits(**kwargs)
    check_plan(plan, kwargs["layer_latency"], kwargs["batch_profile"], kwargs["gpus"], kwargs["slo_s"],
               batch_size=kwargs["batch_size"], transfer_s=kwargs["transfer_s"])
    assert plan.goodput > plan.unsplit["goodput"]          # early exits pay once the splits keep batches full
    assert len(plan.table) == 25 and plan.probes and plan.to_dict()["splits"][0][0] == 0


def test_a_plan_exactly_at_the_budget_is_found_whatever_order_the_bounds_sum_in():
    # One GPU type per layer is fast (0.3, 0.2, 0.1 s), the others slow: the only plan within 0.6 s cuts after
    # every layer. Its latency sums forwards, (0.3 + 0.2) + 0.1 == 0.6; a bound that sums backwards gets
    # 0.3 + (0.2 + 0.1) == 0.6000000000000001 > 0.6, and would wrongly rule the plan out.
    fast = {0: "a", 1: "b", 2: "c"}
    own = {0: 0.3, 1: 0.2, 2: 0.1}

    def lat(k, b, g):
        return own[k] if fast[k] == g else 10.0

    assert (0.3 + 0.2) + 0.1 == 0.6 and 0.3 + (0.2 + 0.1) > 0.6
    gpus = {"a": 1, "b": 1, "c": 1}
    plan = optimize_splits(lat, [1.0, 1.0, 1.0], gpus, 0.6, slack=0.0, batch_size=1)
    assert plan.gpu_types == ["a", "b", "c"] and plan.latency_s == 0.6 and plan.cycle_s == 0.3
    assert plan.objective == brute_force_splits(lat, [1.0, 1.0, 1.0], gpus, 0.6, slack=0.0, batch_size=1).objective


def test_huge_problems_are_refused_before_any_table_is_built():
    from workbench.earlyexit.optimizer import optimize_splits

    def lat(k, b, g):
        return 1e-3 * b

    with pytest.raises(WorkbenchError, match=r"batch_size 1,000,000,000,000,000,000,000 is beyond"):
        optimize_splits(lat, [0.5, 0.0], {"v100": 2}, 1.0, batch_size=10**21)
    with pytest.raises(WorkbenchError, match=r"gpus\['v100'\] must be a whole number in 0..4096"):
        optimize_splits(lat, [0.5, 0.0], {"v100": 300_000}, 1.0, batch_size=300_000)
    with pytest.raises(WorkbenchError, match="beyond 16,777,216"):
        optimize_splits(lat, [1.0] * 99 + [0.0], {"v100": 4096}, 1.0, batch_size=4096)
    with pytest.raises(WorkbenchError, match="3000 layers"):
        optimize_splits(lat, [1.0] * 2999 + [0.0], {"v100": 4}, 1.0, batch_size=16)
