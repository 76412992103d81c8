import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from workbench.elastic.baselines import plan_load_exec, plan_method, plan_preload_model, plan_stdpl
from workbench.elastic.planner import (PlanningError, choose_preload_bits, initial_aibs, plan_compute,
                                       plan_elastic, plan_io, select_preload, simulate, uniform_pass, upgrade_pass)
from workbench.elastic.costmodel import CostModel
from workbench.errors import UnknownNameError, WorkbenchError

BITS = (2, 3, 4, 5, 6, 32)


def profile(io=None, comp=None, layers=6, shards=12, nbytes=None):
    io = io or {b: 0.001 * b for b in BITS}
    comp = comp or [0.010 + 0.002 * m for m in range(1, shards + 1)]
    nbytes = nbytes or {b: 1000 * b for b in io}
    return CostModel(device="test", seq_len=64, num_layers=layers, num_shards=shards, io_s=io, comp_s=comp,
                     shard_bytes=nbytes, source="emulated")


def figure6_profile():
    """WRX Figure 6: t_comp = 1 s for the 3-shard layer; 2-bit shards load in 0.2 s."""
    return CostModel(device="fig6", seq_len=64, num_layers=2, num_shards=3, io_s={2: 0.2, 3: 0.3, 4: 0.4, 32: 1.6},
                     comp_s=[1.0, 1.0, 1.0], shard_bytes={2: 2, 3: 3, 4: 4, 32: 32})


def test_paper_figure6_aibs():
    imp = np.array([[0.1, 0.1, 0.1], [0.5, 0.9, 0.7]])
    plan = plan_io(figure6_profile(), 2.0, 2, 3, imp, preload=[(0, 0, 2), (0, 1, 2), (0, 2, 2)])
    init, *rest = plan.steps
    assert init.aib == pytest.approx((0.6, 1.6))                     # AIB(0) = 0.6 s from the three 2-bit shards
    assert rest[0].kind == "preload" and rest[0].aib == pytest.approx((0.0, 1.0))
    assert plan.uniform_bits == 3                                      # 3 x 0.3 s fits the 1.0 s of AIB(1)
    assert plan.bits.tolist() == [[2, 2, 2], [3, 4, 3]]                # the last 0.1 s upgrades the top shard
    assert plan.aib == pytest.approx([0.0, 0.0]) and plan.valid
    assert plan.steps[-1].kind == "upgrade" and (plan.steps[-1].layer, plan.steps[-1].shard) == (1, 1)


def test_slack_before_layer_zero_counts_in_every_aib():
    plan = plan_io(figure6_profile(), 2.6, 2, 3, np.ones((2, 3)))
    assert plan.slack_s == pytest.approx(0.6) and plan.steps[0].aib == pytest.approx((0.6, 1.6))
    assert plan.valid and plan.uniform_bits == 2
    assert plan.bits.tolist() == [[2, 2, 2], [4, 4, 2]]               # layer 1's 0.4 s left pays two upgrades
    assert plan.aib == pytest.approx([0.0, 0.0])


def test_forced_lowest_bits_when_nothing_fits():
    plan = plan_io(figure6_profile(), 2.0, 2, 3, np.ones((2, 3)))
    assert not plan.valid and plan.bits.tolist() == [[2, 2, 2], [2, 2, 2]]
    assert "even 2-bit shards overrun the IO budget (AIB of layer 0 is -600.0 ms)" in plan.reason
    assert all(s.kind in ("init", "forced") for s in plan.steps)


def test_initial_aibs_add_the_preload_bonus_then_charge_it():
    steps = initial_aibs(figure6_profile(), 0.5, 2, 3, {(0, 0): 2, (1, 2): 4})
    assert [s.kind for s in steps] == ["init", "preload", "preload"]
    assert steps[0].aib == pytest.approx((0.7, 2.1))            # 0.5 + 0.2 bonus; 0.5 + 1 s compute + 0.2 + 0.4
    assert (steps[1].layer, steps[1].bits, steps[1].cost_s) == (0, 2, pytest.approx(0.2))
    assert steps[1].aib == pytest.approx((0.5, 1.9))
    assert (steps[2].layer, steps[2].bits, steps[2].cost_s) == (1, 4, pytest.approx(0.4))
    assert steps[2].aib == pytest.approx((0.5, 1.5))
    assert initial_aibs(figure6_profile(), 0.5, 2, 3, {})[-1].aib == pytest.approx((0.5, 1.5))


def test_uniform_pass_takes_the_highest_bitwidth_every_aib_can_pay():
    prof = figure6_profile()
    bits, fits, steps = uniform_pass(prof, (0.5, 1.5), [2, 2])
    assert (bits, fits) == (2, True)                             # 3 bits: 2 x 0.3 s > AIB(0) = 0.5 s
    assert [s.aib for s in steps] == [pytest.approx((0.1, 1.1)), pytest.approx((0.1, 0.7))]
    bits, fits, steps = uniform_pass(prof, (1.0, 2.0), [2, 2])
    assert (bits, fits) == (4, True)                             # 32 bits: 2 x 1.6 s > 1.0 s
    assert steps[-1].aib == pytest.approx((0.2, 0.4)) and [s.cost_s for s in steps] == pytest.approx([0.8, 0.8])
    bits, fits, steps = uniform_pass(prof, (0.3, 1.0), [2, 0])
    assert (bits, fits) == (2, False) and [s.kind for s in steps] == ["forced"]
    assert steps[-1].aib == pytest.approx((-0.1, 0.6))


def test_upgrade_pass_follows_the_order_and_is_bounded_by_every_later_aib():
    bits = np.array([[2, 2, 2], [2, 2, 4]])
    preloaded = np.array([[True, False, False], [False, False, True]])
    order = [(1, 1), (0, 1), (1, 0), (0, 2), (0, 0), (1, 2)]
    upgraded, steps = upgrade_pass(figure6_profile(), (0.1, 0.7), bits, preloaded, order)
    assert upgraded.tolist() == [[2, 3, 2], [4, 4, 4]] and bits.tolist() == [[2, 2, 2], [2, 2, 4]]
    assert [(s.layer, s.shard, s.from_bits, s.bits) for s in steps] == [(1, 1, 2, 4), (0, 1, 2, 3), (1, 0, 2, 4)]
    assert [s.cost_s for s in steps] == pytest.approx([0.2, 0.1, 0.2])
    assert steps[-1].aib == pytest.approx((0.0, 0.2))           # (0, 2) stays: AIB(0) is spent though AIB(1) is not


@pytest.mark.parametrize("importance, winner, bits", [
    ([[0.1, 0.2, 0.3], [0.9, 0.8, 0.7]], 2, [[2, 2, 2], [4, 4, 4]]),   # layer 1 first: all of layer 0 at 2 bits
    ([[0.9, 0.2, 0.3], [0.1, 0.8, 0.7]], 3, [[3, 3, 2], [2, 4, 4]]),   # shard (0, 0) first: preloaded at 3 bits
])
def test_preload_bitwidth_gives_the_greatest_bits_in_importance_order(importance, winner, bits):
    prof = figure6_profile()
    candidates = {b: select_preload(prof, 2, 3, 6, b) for b in prof.bitwidths}   # 6 bytes: 3 x 2, 2 x 3, 1 x 4 bits
    best, options = choose_preload_bits(prof, 2.2, 2, 3, np.array(importance), candidates)
    assert [(o.bits, o.valid) for o in options] == [(2, True), (3, True), (4, False), (32, False)]
    assert best.bits == winner and best.io.bits.tolist() == bits
    assert best.preload == tuple(candidates[winner])


def test_no_valid_preload_gives_no_choice():
    best, options = choose_preload_bits(figure6_profile(), 2.0, 2, 3, np.ones((2, 3)), {32: []})
    assert best is None and len(options) == 1 and "overrun the IO budget" in options[0].io.reason


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), target=st.floats(0.02, 0.5), buffer=st.floats(0, 60000),
       read_scale=st.floats(0.1, 20))
def test_every_valid_plan_keeps_aibs_and_fits_the_target(seed, target, buffer, read_scale):
    rng = np.random.default_rng(seed)
    prof = profile(io={b: 0.0005 * b * read_scale for b in BITS})
    imp = rng.random((6, 12))
    plan = plan_elastic(prof, target, imp, buffer)
    if not plan.found:
        assert plan.reason
        return
    io = plan.io
    assert io.valid and (io.aib >= -1e-9).all()
    assert all(min(s.aib) >= -1e-9 for s in io.steps if s.kind in ("uniform", "upgrade"))
    assert plan.predicted_s <= target + 1e-9
    assert np.allclose(io.steps[-1].aib, io.aib)
    free = ~io.preloaded
    assert (io.bits[free] >= io.uniform_bits).all()
    for (k, i) in zip(*np.nonzero(free)):                  # maximal: no shard can take one more level
        cur = int(io.bits[k, i])
        higher = [b for b in BITS if b > cur]
        if higher:
            assert min(io.aib[k:]) < prof.t_io(higher[0]) - prof.t_io(cur) + 1e-12
    for k in range(plan.n):                                 # within a layer, more important => no fewer bits
        for a in range(plan.m):
            for b in range(plan.m):
                if free[k, a] and free[k, b] and imp[k, a] > imp[k, b]:
                    assert io.bits[k, a] >= io.bits[k, b]


def test_compute_planning_prefers_deeper_among_similar_sizes():
    flat = profile(comp=[0.05] * 12)                        # a GPU: width is free
    wide = plan_compute(flat, 0.16)
    assert (wide.n, wide.m) == (3, 12)
    cpu = profile(comp=[0.01 * m for m in range(1, 13)])   # a CPU: time proportional to width
    plan = plan_compute(cpu, 0.12)
    best = max(c.shards for c in plan.candidates if c.fits)
    chosen = [c for c in plan.candidates if c.chosen]
    assert len(chosen) == 1 and chosen[0].shards >= best - chosen[0].n
    assert chosen[0].n == max(c.n for c in plan.candidates if c.similar)
    assert (plan.n, plan.m) == (4, 3)                       # 12 shards: 4x3 beats 3x4 (deeper), 2x6, 1x12
    assert {"n", "m", "shards", "time_ms", "fits", "similar", "chosen"} == set(plan.table()[0])


def test_compute_plan_is_a_value_not_a_tuple():
    cpu = profile(comp=[0.01 * m for m in range(1, 13)])
    plan, again, other = plan_compute(cpu, 0.12), plan_compute(cpu, 0.12), plan_compute(cpu, 0.2)
    assert plan != (plan.n, plan.m) and (plan.n, plan.m) != plan
    assert plan == again and hash(plan) == hash(again) and len({plan, again, other}) == 2
    assert plan != other
    with pytest.raises(TypeError):
        tuple(plan)


def test_compute_planning_skips_excluded_sizes():
    cpu = profile(comp=[0.01 * m for m in range(1, 13)])
    plan = plan_compute(cpu, 0.12, exclude={(4, 3)})
    assert (plan.n, plan.m) == (3, 4)
    assert [c for c in plan.candidates if (c.n, c.m) == (4, 3)][0].fits


def test_preload_fills_layer_order_and_planner_picks_its_bitwidth():
    prof = profile()
    assert select_preload(prof, 2, 3, 7000, bits=2) == [(0, 0, 2), (0, 1, 2), (0, 2, 2)]
    assert select_preload(prof, 2, 3, 0) == []
    plan = plan_elastic(prof, 0.2, np.ones((6, 12)), 40000)
    assert plan.memory_bytes <= 40000
    assert [o.bits for o in plan.preload_options] == list(BITS)
    assert plan.preload_bits in BITS and plan.preload and {b for _, _, b in plan.preload} == {plan.preload_bits}
    assert plan.io is next(o.io for o in plan.preload_options if o.bits == plan.preload_bits)


def _cold_and_warm(target_s):
    """A plan without a buffer, and the plan whose buffer holds the first plan's layers 0 and 1."""
    prof = profile(io={b: 0.0015 * b for b in BITS})
    imp = np.random.default_rng(1).random((6, 12))
    cold = plan_elastic(prof, target_s, imp, 0)
    cached = [(k, i, int(cold.bits[k, i])) for k in range(2) for i in range(cold.m)]
    return cold, plan_elastic(prof, target_s, imp, 0, cached=cached), cached


def test_cached_shards_free_io_for_upgrades():
    cold, warm, cached = _cold_and_warm(0.3)
    assert (cold.n, cold.m) == (warm.n, warm.m) == (6, 12) and not cold.rejected
    assert warm.preloaded[:2].all() and not warm.preloaded[2:].any() and warm.preload == tuple(cached)
    assert (warm.bits[:2] == cold.bits[:2]).all() and warm.bits.sum() > cold.bits.sum()
    assert warm.preload_bits is None and len(warm.preload_options) == 1


def test_cached_shards_make_a_rejected_submodel_loadable():
    cold, warm, _ = _cold_and_warm(0.15)
    rejected = [(r.n, r.m) for r in cold.rejected]
    assert rejected == [(5, 10), (6, 7), (5, 9), (4, 12), (5, 8), (4, 11)]      # even 2 bits cannot load in time
    assert all("overrun the IO budget" in r.reason for r in cold.rejected)
    assert (cold.first_choice.n, cold.first_choice.m) == (5, 10) and (cold.n, cold.m) == (6, 6)
    assert (warm.n, warm.m) == (6, 7) and [(r.n, r.m) for r in warm.rejected] == [(5, 10)]


@pytest.mark.parametrize("call, error, message", [
    (lambda p: plan_elastic(p, 0, np.ones((6, 12))), PlanningError, "target latency must be positive, got 0"),
    (lambda p: plan_elastic(p, float("nan"), np.ones((6, 12))), PlanningError, "target latency must be positive"),
    (lambda p: plan_elastic(p, 0.1, np.ones((6, 12)), -1), PlanningError,
     "preload buffer size must be >= 0 bytes, got -1"),
    (lambda p: plan_io(p, 0.1, 2, 3, np.ones((1, 3))), PlanningError,
     "importance must be a 2-D array with at least 2 rows and 3 columns, got shape (1, 3)"),
    (lambda p: plan_io(p, 0.1, 2, 3, np.full((2, 3), np.nan)), PlanningError, "importance holds non-finite values"),
    (lambda p: plan_io(p, 0.1, 2, 3, np.ones((2, 3)), [(0, 0, 7)]), PlanningError,
     "at 7 bits, which the cost model lacks"),
    (lambda p: plan_io(p, 0.1, 7, 3, np.ones((7, 3))), PlanningError, "submodel 7 x 3 is outside the 6 x 12 model"),
    (lambda p: plan_stdpl(p.replace_bits((2, 4, 32)), 0.1, 6), WorkbenchError, "has no 6-bit shards; it has 2, 4, 32"),
    (lambda p: plan_method("Magic", p, 0.1, np.ones((6, 12)), 0), UnknownNameError, "unknown method 'Magic'"),
])
def test_bad_input_is_named(call, error, message):
    with pytest.raises(error, match=re.escape(message)) as err:
        call(profile())
    if error is PlanningError:                              # callers may catch the planner's errors as ValueError
        assert isinstance(err.value, ValueError)


def test_target_below_one_layer_gives_an_explained_empty_plan():
    plan = plan_elastic(profile(), 0.005, np.ones((6, 12)))
    assert not plan.found and not plan.valid
    assert plan.reason == "no submodel fits 5.0 ms: one layer of 3 shards alone computes in 16.0 ms"
    assert "no plan" in plan.describe()


def test_baselines_follow_their_models_of_time():
    prof = profile()
    le = plan_load_exec(prof, 0.2)
    assert le.mode == "sequential" and (le.bits == 32).all()
    assert le.predicted_s == pytest.approx(le.n * le.m * prof.t_io(32) + le.n * prof.t_comp(le.m))
    sp = plan_stdpl(prof, 0.2, 6)
    assert (sp.bits == 6).all() and sp.predicted_s <= 0.2 + 1e-12
    pm = plan_preload_model(prof, 0.2, 6)
    assert pm.memory_bytes == 6 * 12 * prof.shard_bytes[6] and pm.preloaded.all()
    assert pm.predicted_s == pytest.approx(pm.n * prof.t_comp(pm.m))
    tiny = plan_load_exec(prof, 0.001)
    assert not tiny.valid and (tiny.n, tiny.m) == (1, 3) and "no submodel fits" in tiny.reason


def test_simulated_timeline_stalls_where_io_is_late():
    prof = figure6_profile()
    tl = simulate(prof, np.array([[2, 2, 2], [4, 4, 4]]), np.zeros((2, 3), bool))
    stalls = tl.of_kind("stall")
    assert [round(s.duration, 6) for s in stalls] == [0.6, 0.2]     # 0.6 s before layer 0; then 1.2 s of IO vs 1 s
    assert tl.end == pytest.approx(0.6 + 1.0 + 0.2 + 1.0)
    io = [(s.layer, s.nbytes) for s in tl.of_kind("io")]
    assert io == [(0, 3 * prof.shard_bytes[2]), (1, 3 * prof.shard_bytes[4])]
    assert [s.layer for s in stalls] == [0, 1]
