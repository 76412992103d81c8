"""E3's split optimizer: the dynamic program against brute force, hand-worked plans, the explained empty plan, the
errors bad input gets before any work, and every plan's invariants checked against the latency function itself."""
from __future__ import annotations

import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.earlyexit import SplitPlan, bert_problem, brute_force_splits, optimize_splits, time_optimizer
from workbench.earlyexit.optimizer import data_parallel, largest_batch
from workbench.errors import WorkbenchError


def unit_layer(k, b, g):
    """Every layer on every GPU: 1 s of overhead plus 1 s per sample."""
    return 1.0 + b


def expected_time(lat, k, q, g):
    """A layer's time on an expected ``q`` samples: interpolated between the whole batches around it."""
    lo = math.floor(q + 1e-9)
    frac = q - lo
    t = (lambda n: lat(k, n, g) if n else 0.0)
    return t(lo) if frac <= 1e-9 else (1 - frac) * t(lo) + frac * t(lo + 1)


def check_plan(plan: SplitPlan, lat, profile, gpus, slo_s, *, batch_size, transfer_s=0.0, slack=0.2,
               pipelined=True, request_rate=None):
    """The plan's invariants, recomputed from ``layer_latency`` and the model in the optimizer's docstring."""
    L = len(profile)
    b = batch_size
    f_in = [1.0] + list(profile[:-1])
    n = len(plan.splits)
    assert len(plan.replicas) == len(plan.gpu_types) == len(plan.batch_sizes) == len(plan.stage_s) == n
    assert len(plan.batches_per_cycle) == len(plan.fill_s) == n
    assert len(plan.transfers_s) == max(0, n - 1)
    if not plan:
        assert plan.goodput == 0 and plan.reason
        return
    assert plan.splits[0][0] == 0 and plan.splits[-1][1] == L                   # every layer, in order, once
    assert all(a[1] == b_[0] for a, b_ in zip(plan.splits, plan.splits[1:]))
    assert all(s < e for s, e in plan.splits)
    assert plan.batch_sizes == [b] * n                                          # the same batch on every replica
    used = {}
    if pipelined:
        for g, r in zip(plan.gpu_types, plan.replicas):
            used[g] = used.get(g, 0) + r
    else:                                                      # one pool of one type runs every split in turn
        assert len(set(plan.gpu_types)) == 1 and len(set(plan.replicas)) == 1
        used = {plan.gpu_types[0]: plan.replicas[0]}
    assert all(used[g] <= gpus[g] for g in used) and used == plan.gpus_used
    stages = []
    for (s, e), g in zip(plan.splits, plan.gpu_types):
        stages.append(sum(expected_time(lat, k, b * f_in[k] / f_in[s] if f_in[s] else 0.0, g) for k in range(s, e)))
    assert plan.stage_s == pytest.approx(stages)
    transfers = [(transfer_s(s, b) if callable(transfer_s) else transfer_s) if f_in[s] else 0.0
                 for s, _ in plan.splits[1:]]
    assert plan.transfers_s == pytest.approx(transfers)
    nb = plan.input_batches
    assert nb == plan.replicas[0]
    assert plan.batches_per_cycle == pytest.approx([nb * f_in[s] for s, _ in plan.splits])
    if pipelined:
        fills = [b / (request_rate * f_in[s]) if request_rate and f_in[s] else 0.0 for s, _ in plan.splits]
        latency = sum(stages) + sum(transfers) + sum(fills)
        per = max([f_in[s] * t / (r * b) for (s, _), t, r in zip(plan.splits, stages, plan.replicas)]
                  + [f_in[s] * x / (r * b) for (s, _), x, r in zip(plan.splits[1:], transfers, plan.replicas[1:])])
    else:
        fills = [nb * b / request_rate if request_rate else 0.0] + [0.0] * (n - 1)
        latency = sum(stages) + sum(transfers) + fills[0]
        per = (sum(stages) + sum(transfers)) / (nb * b)
    assert plan.fill_s == pytest.approx(fills)
    assert plan.latency_s == pytest.approx(latency)
    assert latency <= slo_s * (1 - slack) * (1 + 1e-9)
    assert plan.goodput == pytest.approx(1 / per)
    assert plan.cycle_s == pytest.approx(nb * b * per)
    if pipelined:                     # every replica's busy time per cycle fits in the cycle
        for t, r, k in zip(stages, plan.replicas, plan.batches_per_cycle):
            assert t * k / r <= plan.cycle_s * (1 + 1e-9)


# ---------------------------------------------------------------------------------------------- hand-worked

def test_a_batch_that_halves_after_the_first_layer_gets_two_replicas_of_the_first_split():
    # Two layers of 1 s + 1 s per sample, a batch of 4 on every replica, half exit after layer 0, 3 GPUs.
    # As is, a replica's batch takes (1+4) + (1+2) = 8 s: 3 replicas serve 12 samples per 8 s, 1.5/s.
    # Cut after layer 0: two replicas of layer 0 (5 s a batch) take 8 inputs per 5 s; their survivors, 4,
    # merge into one full batch for the one replica of layer 1 (5 s): 1.6 inputs/s. (1, 2) or (1, 1): 0.8/s.
    plan = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, batch_size=4)
    check_plan(plan, unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, batch_size=4)
    assert plan.splits == [(0, 1), (1, 2)]
    assert plan.replicas == [2, 1] and plan.gpu_types == ["v100", "v100"] and plan.batch_sizes == [4, 4]
    assert plan.input_batches == 2 and plan.batches_per_cycle == [2.0, 1.0] and plan.cycle_s == pytest.approx(5.0)
    assert plan.goodput == pytest.approx(1.6) and plan.latency_s == pytest.approx(10.0)
    assert plan.baseline.replicas == {"v100": 3} and plan.baseline.goodput == pytest.approx(1.5)
    assert plan.gain == pytest.approx(1.6 / 1.5)
    assert plan.bottlenecks == [("compute", 0), ("compute", 1)]
    assert "after layer(s) 0" in plan.reason and "1.07x" in plan.reason and "as is" in plan.reason


def test_e3s_own_example_merges_two_halves_into_one_full_batch():
    # E3 §3.2: 12 layers, half the batch leaves at the middle, a batch of 16 on every replica, three equal GPUs:
    # two replicas of the first split each take a batch of 16, the two halves of 8 merge into one batch of 16 for
    # the one replica of the second split. (Three splits on one GPU each reach the same goodput with the same
    # latency: the paper's formulation minimises the number of splits.)
    def lat(k, b, g):
        return 1.0 + b / 64                                 # a GPU far from saturation: the batch costs little

    profile = [1.0] * 5 + [0.5] * 7
    plan = optimize_splits(lat, profile, {"v100": 3}, 1000.0, batch_size=16)
    check_plan(plan, lat, profile, {"v100": 3}, 1000.0, batch_size=16)
    assert plan.splits == [(0, 6), (6, 12)] and plan.replicas == [2, 1] and plan.batch_sizes == [16, 16]
    assert plan.input_batches == 2 and plan.batches_per_cycle == [2.0, 1.0]
    assert plan.goodput > plan.baseline.goodput


def test_the_latency_budget_can_forbid_the_cut():
    # The cut plan above takes 5 + 5 = 10 s per request; with a 9 s budget only the model as is (8 s) fits.
    plan = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 9.0, slack=0.0, batch_size=4)
    check_plan(plan, unit_layer, [0.5, 0.0], {"v100": 3}, 9.0, slack=0.0, batch_size=4)
    assert plan.splits == [(0, 2)] and plan.replicas == [3]
    assert plan.goodput == pytest.approx(1.5) and plan.latency_s == pytest.approx(8.0)
    # the slack counts: 10 s fits a 12.5 s SLO with 20% slack, not a 12 s one
    assert optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 12.5, batch_size=4).replicas == [2, 1]
    assert optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 12.0, batch_size=4).replicas == [3]


@pytest.mark.parametrize("transfer, cut", [(5.2, True), (6.0, False)])
def test_a_transfer_is_a_stage_of_the_pipeline(transfer, cut):
    # Moving a merged batch of 4 to the one replica of split 2 takes `transfer` s and carries the survivors of 8
    # inputs: per input sample 0.5 x transfer / 4 s. At 5.2 s that is 0.65 s, still below the 2/3 s as is; at
    # 6 s, 0.75: no cut.
    plan = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, batch_size=4, transfer_s=transfer)
    check_plan(plan, unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, batch_size=4, transfer_s=transfer)
    if cut:
        assert plan.replicas == [2, 1] and plan.goodput == pytest.approx(1 / 0.65)
        assert plan.bottlenecks == [("transfer", 1)] and "transfer into split 2" in plan.binding
        assert plan.latency_s == pytest.approx(5 + 5.2 + 5)
        first, second = plan.stages                  # the same plan, one typed record per split
        assert (first.index, first.layers, first.replicas, first.gpu_type, first.batch_size) == \
            (0, range(0, 1), 2, "v100", 4)
        assert (second.index, second.layers, second.replicas, second.transfer_in_s) == (1, range(1, 2), 1, 5.2)
        assert first.transfer_in_s == 0 and [s.stage_s for s in plan.stages] == plan.stage_s
        assert [s.batches_per_cycle for s in plan.stages] == plan.batches_per_cycle
    else:
        assert plan.splits == [(0, 2)] and plan.goodput == pytest.approx(1.5)


def test_each_replica_receives_over_its_own_link():
    # A GPU that takes 1 s a layer whatever the batch; half leave after layer 0; a batch of 4; 5 GPUs; a merged
    # batch takes 1.5 s to move. Layer 0 on 3 replicas takes 12 inputs/s; layer 1's 2 replicas each receive a
    # merged batch of 4 (the survivors of 8 inputs) per 1.5 s over their own link: 2 x 4 / (0.5 x 1.5) = 10.67
    # inputs/s, above the model as is on all 5 (5 x 4 inputs per 2 s = 10/s). Over one shared link the
    # transfer would carry only 5.33 inputs/s and the model as is would win.
    def flat(k, b, g):
        return 1.0

    plan = optimize_splits(flat, [0.5, 0.0], {"g": 5}, 1e6, batch_size=4, transfer_s=1.5)
    check_plan(plan, flat, [0.5, 0.0], {"g": 5}, 1e6, batch_size=4, transfer_s=1.5)
    assert plan.replicas == [3, 2] and plan.goodput == pytest.approx(32 / 3)
    assert plan.bottlenecks == [("transfer", 1)] and plan.baseline.goodput == pytest.approx(10.0)


def test_a_transfer_function_gets_the_boundary_and_the_merged_batch():
    calls = []

    def transfer(boundary, batch):
        calls.append((boundary, batch))
        return 0.5 * batch

    plan = optimize_splits(unit_layer, [0.75, 0.25, 0.0], {"v100": 4}, 100.0, batch_size=8, transfer_s=transfer)
    assert sorted(calls) == [(1, 8), (2, 8)]                    # a full batch of 8 crosses every boundary
    check_plan(plan, unit_layer, [0.75, 0.25, 0.0], {"v100": 4}, 100.0, batch_size=8, transfer_s=transfer)


def test_each_split_gets_the_gpu_type_its_batch_suits():
    # "big": 0.5 s + 0.1 s per sample; "small": 0.2 s + 0.5 s per sample; one of each; a quarter go on; b = 8.
    # As is, a batch takes (0.5+0.8) + (0.5+0.2) = 2.0 s on big, 4.2 + 1.2 = 5.4 s on small: both together
    # serve 8/2 + 8/5.4 = 5.48/s. Cut with big first: layer 0 at 8 on big, 1.3 s per 8 inputs; layer 1 at a
    # merged 8 on small, 4.2 s per 32 inputs: 1/0.1625 = 6.15/s. Small first: 8/4.2 = 1.9/s.
    def lat(k, b, g):
        return {"big": 0.5 + 0.1 * b, "small": 0.2 + 0.5 * b}[g]

    gpus = {"big": 1, "small": 1}
    plan = optimize_splits(lat, [0.25, 0.0], gpus, 100.0, batch_size=8)
    check_plan(plan, lat, [0.25, 0.0], gpus, 100.0, batch_size=8)
    assert plan.splits == [(0, 1), (1, 2)] and plan.gpu_types == ["big", "small"] and plan.replicas == [1, 1]
    assert plan.goodput == pytest.approx(8 / 1.3)
    assert plan.baseline.replicas == {"big": 1, "small": 1}
    assert plan.baseline.goodput == pytest.approx(8 / 2.0 + 8 / 5.4)


def test_equal_goodput_goes_to_the_plan_with_fewer_splits_then_fewer_gpus():
    # No exits, two equal layers, 4 GPUs: as is on 4 (10 s a batch of 4) and two splits on 2 + 2 (5 s each)
    # reach the same goodput with the same GPUs and latency: the paper's formulation keeps fewer splits.
    plan = optimize_splits(unit_layer, [1.0, 1.0], {"v100": 4}, 100.0, batch_size=4)
    assert plan.splits == [(0, 2)] and plan.replicas == [4] and plan.goodput == pytest.approx(1.6)
    # Half exit, 4 GPUs, 1.5 requests/s: the model as is on 3 GPUs sustains exactly that; the fourth is not bought.
    plan = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 4}, 100.0, batch_size=4, request_rate=1.5)
    assert plan.splits == [(0, 2)] and plan.replicas == [3] and plan.gpus_used == {"v100": 3}
    assert "sustains the request rate" in plan.reason


def test_the_cost_bound_limits_the_gpus_bought():
    # Prices 1 $/s: the cluster costs 3 $/s. alpha = 2/3 allows 2 GPUs: as is on 2, 8 s per 8 inputs, beats
    # the cut (1, 1) (5 s per 4 inputs); alpha = 1/2 allows 1: as is on 1, 8 s per 4 inputs.
    kw = dict(batch_size=4, prices={"v100": 1.0})
    two = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, alpha=2 / 3, **kw)
    assert two.splits == [(0, 2)] and two.replicas == [2] and two.goodput == pytest.approx(1.0)
    assert two.cost_per_s == pytest.approx(2.0) and "at most $2/s" in two.reason
    one = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, alpha=0.5, **kw)
    assert one.replicas == [1] and one.goodput == pytest.approx(0.5)
    baseline = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, alpha=1.0, baseline_cost_per_s=2.0, **kw)
    assert baseline.replicas == [2]


def test_not_pipelined_every_split_runs_in_turn_on_one_pool():
    # Not pipelined (no model parallelism) a round runs every split on the same GPUs: the cut's round is
    # 5 + 5 = 10 s against 8 s as is, so the model as is on all 3 wins.
    plan = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, pipelined=False, batch_size=4)
    check_plan(plan, unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, pipelined=False, batch_size=4)
    assert plan.splits == [(0, 2)] and plan.replicas == [3] and plan.cycle_s == pytest.approx(8.0)
    assert plan.goodput == pytest.approx(1.5)
    assert plan.bottlenecks == [] and "not pipelined" in plan.binding


def test_not_pipelined_a_round_an_ulp_shorter_over_more_splits_loses_to_fewer_splits():
    # Found by the brute-force comparison below: cut after layer 0, the summed round is an ulp shorter than the
    # whole model's; the 2 s wait for a batch at 0.5 requests/s rounds that away in the latency and the time
    # per input is the rate's floor, so the plans tie and the paper's fewer splits must win.
    table = {(0, "a"): 1.504, (0, "b"): 0.05, (1, "a"): 2.248, (1, "b"): 0.05, (2, "a"): 3.0, (2, "b"): 1.203,
             (3, "a"): 2.546, (3, "b"): 2.076, (4, "a"): 3.0, (4, "b"): 0.069}
    kwargs = dict(batch_profile=[1.0, 0.25, 0.0, 0.0, 0.0], gpus={"a": 1, "b": 1}, slo_s=4.0, batch_size=1,
                  pipelined=False, slack=0.0, transfer_s=0.0, request_rate=0.5)
    lat = lambda k, b, g: table[k, g]
    plan, brute = optimize_splits(lat, **kwargs), brute_force_splits(lat, **kwargs)
    assert plan.objective == brute.objective and plan.splits == brute.splits == [(0, 5)]
    assert plan.gpu_types == ["b"]


def test_a_split_after_every_sample_has_left_still_holds_its_layers():
    plan = optimize_splits(unit_layer, [0.0, 0.0, 0.0], {"v100": 2}, 100.0, batch_size=4)
    check_plan(plan, unit_layer, [0.0, 0.0, 0.0], {"v100": 2}, 100.0, batch_size=4)
    assert plan.splits == [(0, 3)] and plan.stage_s == [pytest.approx(1 + 4)]      # layers 1-2 see nobody


def test_a_request_rate_makes_batches_wait_to_fill_and_the_cheapest_plan_that_sustains_it_wins():
    # At 1 request/s a batch of 4 fills in 4 s; after half exit, survivors of a batch fill in 8 s. As is on 2
    # GPUs sustains exactly 1/s (8 s per 8 inputs) with latency 4 + 8 = 12 s; the cut plan would wait
    # 4 + 5 + 8 + 5 = 22 s and use 3 GPUs.
    plan = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, batch_size=4, request_rate=1.0)
    check_plan(plan, unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, batch_size=4, request_rate=1.0)
    assert plan.splits == [(0, 2)] and plan.replicas == [2] and plan.goodput == pytest.approx(1.0)
    assert plan.fill_s == [pytest.approx(4.0)] and plan.latency_s == pytest.approx(12.0)
    # a budget of 20 s rules the cut out even without a rate cap: its batches wait too long to fill
    cut = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, batch_size=4, request_rate=3.0)
    check_plan(cut, unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, batch_size=4, request_rate=3.0)
    assert cut.replicas == [2, 1] and cut.latency_s == pytest.approx(4 / 3 + 5 + 8 / 3 + 5)
    assert "more than the 1.6 samples/s" in cut.reason


def test_the_largest_batch_a_rate_and_an_slo_allow():
    # E3 §3.2's B_0: the largest per-replica batch whose plan sustains the rate within the SLO.
    got = largest_batch(unit_layer, [0.5, 0.0], {"v100": 3}, 30.0, 1.0, batches=range(1, 17))
    assert got is not None
    b, plan = got
    assert plan.batch_size == b and plan.goodput >= 1.0 and plan.latency_s <= 30.0 * 0.8
    for bigger in range(b + 1, 17):
        other = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 30.0, batch_size=bigger, request_rate=1.0)
        assert not other or other.goodput < 1.0
    assert largest_batch(unit_layer, [0.5, 0.0], {"v100": 1}, 30.0, 1e6, batches=range(1, 5)) is None


# -------------------------------------------------------------------------------------- fair baselines

@st.composite
def latency_tables(draw, layers=(2, 5), batch=(1, 8)):
    L = draw(st.integers(*layers))
    B = draw(st.integers(*batch))
    table = {}
    for k in range(L):
        level = draw(st.floats(0.05, 3.0))
        row = [level]
        for _ in range(B - 1):
            level += draw(st.sampled_from([0.0, 0.1, 0.5, draw(st.floats(0.0, 2.0))]))
            row.append(level)
        table[k] = row
    return L, B, table


@settings(max_examples=80, deadline=None)
@given(latency_tables(), st.integers(1, 6), st.floats(0.0, 3.0), st.floats(0.3, 4.0))
def test_without_exits_e3_never_beats_the_model_data_parallel_on_the_same_gpus(tables, gpus, transfer, speed):
    # A batch profile of all ones: every split's stage times add up to the whole model's, so no plan's
    # replicas serve more inputs than the same GPUs running the model as is. Two types whose layer times are
    # proportional make no difference.
    L, B, table = tables

    def lat(k, b, g):
        return table[k][b - 1] * (speed if g == "b" else 1.0)

    for cluster in ({"a": gpus}, {"a": gpus, "b": 2}):
        kw = dict(batch_size=B, transfer_s=transfer)
        plan = optimize_splits(lat, [1.0] * L, cluster, 1e6, **kw)
        dp = data_parallel(lat, [1.0] * L, cluster, 1e6, batch_size=B)
        assert plan.baseline == dp
        assert plan.goodput <= dp.goodput * (1 + 1e-9)


@settings(max_examples=80, deadline=None)
@given(latency_tables(batch=(1, 1)), st.integers(1, 6), st.lists(st.sampled_from([1.0, 0.8, 0.5, 0.3, 0.1, 0.0]),
                                                                    min_size=5, max_size=5))
def test_at_batch_one_e3_is_not_above_the_early_exit_model_as_is(tables, gpus, drops):
    # At batch 1 a sample is either present or gone: the model as is already does no work for samples that
    # left, so splitting cannot add goodput.
    L, _, table = tables
    profile = sorted(drops[:L], reverse=True)

    def lat(k, b, g):
        return table[k][0] * b

    plan = optimize_splits(lat, profile, {"v100": gpus}, 1e6, batch_size=1)
    assert plan.goodput <= plan.baseline.goodput * (1 + 1e-9)
    assert plan.baseline.goodput == pytest.approx(
        gpus / sum(f * table[k][0] for k, f in enumerate([1.0] + profile[:-1])))


def test_the_stock_model_is_the_same_baseline_with_no_exits_and_its_own_latency():
    stock = data_parallel(lambda k, b, g: 2.0 + b, [1.0, 1.0], {"v100": 3}, 100.0, batch_size=4)
    assert stock.replicas == {"v100": 3} and stock.batch_s == {"v100": 12.0} and stock.goodput == pytest.approx(1.0)
    slow = data_parallel(lambda k, b, g: 2.0 + b, [1.0, 1.0], {"v100": 3, "k80": 2}, 100.0, batch_size=4)
    assert slow.replicas == {"v100": 3, "k80": 2} and slow.goodput == pytest.approx(5 / 3)
    none = data_parallel(lambda k, b, g: 2.0 + b, [1.0, 1.0], {"v100": 3}, 10.0, batch_size=4)
    assert not none and "12 s" in none.reason


# ----------------------------------------------------------------------------------------- the empty plan

def test_no_plan_meets_the_slo_and_the_plan_says_why():
    plan = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 1.0, batch_size=4)
    assert not plan and plan.splits == [] and plan.replicas == [] and plan.goodput == 0.0
    # the fastest any plan can be: the model as is, (1+4) + (1+2) = 8 s, against a budget of 0.8 s
    assert "at least 8 s" in plan.reason and "800 ms" in plan.reason and "SLO" in plan.reason
    assert plan.explain().startswith("no plan: ")
    assert brute_force_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 1.0, batch_size=4).reason == plan.reason
    serial = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 1.0, batch_size=4, pipelined=False)
    assert not serial and "shortest round" in serial.reason and "8 s" in serial.reason


def test_no_plan_meets_the_cost_bound_and_the_plan_says_why():
    for pipelined in (True, False):
        plan = optimize_splits(unit_layer, [0.5, 0.0], {"v100": 3}, 100.0, batch_size=4, prices={"v100": 1.0},
                               alpha=0.2, pipelined=pipelined)
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
    (dict(request_rate=0.0), "request_rate must be > 0"),
    (dict(request_rate=1e12), "request_rate must be <= 1e+09"),
    (dict(request_rate=float("nan")), "request_rate must be a finite number"),
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
    with pytest.raises(WorkbenchError, match=r"transfer_s\(1, 8\) returned -1"):
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
    if draw(st.integers(0, 3)) == 0:
        kwargs["request_rate"] = draw(st.sampled_from([0.5, 2.0, draw(st.floats(0.05, 20.0))]))
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
    # the same objective (time per input, cost, GPUs, latency), exactly, and as few splits
    assert dp.objective == bf.objective and len(dp.splits) == len(bf.splits)
    check_plan(dp, lat, kwargs["batch_profile"], kwargs["gpus"], kwargs["slo_s"], batch_size=kwargs["batch_size"],
               transfer_s=kwargs["transfer_s"], slack=kwargs["slack"], pipelined=kwargs["pipelined"],
               request_rate=kwargs.get("request_rate"))
    if "alpha" in kwargs and dp:
        full = sum(n * kwargs["prices"][t] for t, n in kwargs["gpus"].items())
        assert dp.cost_per_s <= kwargs["alpha"] * full * (1 + 1e-9)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.floats(0.0, 0.999))
def test_when_the_latency_budget_binds_the_dynamic_program_still_finds_the_optimum(instance, squeeze):
    # A budget below the latency of the plan that wins without an SLO: goodput must fall past the best the GPUs
    # allow, which the search reaches by its latency-tracking passes.
    lat, kwargs = instance
    kwargs = {**kwargs, "pipelined": True}
    free = brute_force_splits(lat, **{**kwargs, "slo_s": 1e9})
    if not free:
        return
    budget = free.latency_s * (0.5 + 0.5 * squeeze)
    kwargs["slo_s"] = budget / (1 - kwargs["slack"])
    dp = optimize_splits(lat, **kwargs)
    bf = brute_force_splits(lat, **kwargs)
    assert dp.objective == bf.objective
    check_plan(dp, lat, kwargs["batch_profile"], kwargs["gpus"], kwargs["slo_s"], batch_size=kwargs["batch_size"],
               transfer_s=kwargs["transfer_s"], slack=kwargs["slack"], pipelined=kwargs["pipelined"],
               request_rate=kwargs.get("request_rate"))


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
    kwargs = bert_problem("bert-large", "heterogeneous")
    plan = optimize_splits(**kwargs)
    check_plan(plan, kwargs["layer_latency"], kwargs["batch_profile"], kwargs["gpus"], kwargs["slo_s"],
               batch_size=kwargs["batch_size"], transfer_s=kwargs["transfer_s"])
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
