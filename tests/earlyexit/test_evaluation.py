"""Paper-scale evaluation (simulated): mixes, the goodput, cost, misprediction and ramp tables."""
from __future__ import annotations

import pytest

from workbench.earlyexit import evaluation as ev
from workbench.earlyexit import pools as pl
from workbench.earlyexit.batchprofile import BatchProfile
from workbench.earlyexit.profiles import LayerProfile, gpu_profiles

approx = pytest.approx
SMALL = pl.EvalSettings(requests=400, min_span_slos=2.0)


def flat_profile() -> LayerProfile:
    """Two layers whatever the batch: layer 0 with its ramp and the embedding 10 ms, layer 1 with its ramp 5 ms."""
    sizes = (1, 2, 4)
    return LayerProfile(sizes, ((8e-3,) * 3, (4e-3,) * 3), ((1e-3,) * 3, (1e-3,) * 3), (1e-3,) * 3, "host", 16, 1,
                        True, "made up")


def test_mixes_and_their_profiles():
    p = ev.parametric_mix(0.8, 12)
    # the paper's Figure 3: about half a DeeBERT batch has left by ramp 6 of 12 at 80:20
    assert p.remaining[5] == approx(0.5) and p.remaining[-1] == 0 and p.remaining[2] > p.remaining[5]
    assert 0.2 < p.remaining[-2] < 0.25                              # the hard fifth runs to the end
    assert ev.parametric_mix(0.2, 12).remaining[5] == approx(0.8 + 0.2 * 0.375)
    six = BatchProfile((0.5, 0.3, 0.3, 0.2, 0.2, 0.0))
    twelve = ev.rescale_profile(six, 12)
    assert twelve.remaining[1] == approx(0.5) and twelve.remaining[3] == approx(0.3) and twelve.remaining[-1] == 0
    assert twelve.remaining[0] == approx(0.75)
    got = ev.mix_profiles(12, {"80:20": six})
    assert got["80:20"][1] == "measured" and got["20:80"][1] == "parametric"
    assert ev.mispredicted(BatchProfile((0.9, 0.5, 0.0)), 0.2).remaining == approx((1.0, 0.6, 0.0))


def test_goodput_table_deploys_e3s_own_plan_where_it_beats_the_model_as_is():
    rows = ev.goodput_table(batches=(1, 4), mixes=("80:20",), clusters=("homogeneous",), scenario=SMALL)
    got = {(r["batch"], r["system"]): r for r in rows}
    assert len(rows) == 6 and all(r["attainment"] >= 0.99 for r in rows)
    gpus = ev.cluster_gpus("homogeneous")
    profiles = gpu_profiles(gpus)
    profile = ev.parametric_mix(0.8, 12)
    plan = ev.e3_plan(4, profile, gpus, profiles, SMALL)
    assert plan and len(plan.splits) > 1 and plan.batch_sizes == [4] * len(plan.splits)
    # where the plan's capacity beats the model as is, E3 serves that plan, and every replica runs batch 4
    assert plan.goodput > plan.baseline.goodput
    assert got[(4, "e3")]["deployment"] == ev.plan_pool(plan).describe()
    assert got[(4, "e3")]["deploys"] == f"its plan, {len(plan.splits)} split(s)"
    assert got[(4, "e3")]["capacity"] > got[(4, "as_is")]["capacity"]
    assert got[(4, "e3")]["e3_over_as_is"] == approx(got[(4, "e3")]["goodput"] / got[(4, "as_is")]["goodput"])
    low, high = got[(4, "e3")]["e3_over_as_is_band"]
    assert low <= got[(4, "e3")]["capacity"] / got[(4, "as_is")]["capacity"] <= high
    assert got[(1, "e3")]["deployment"] == got[(1, "as_is")]["deployment"]   # batch 1: nothing to split for
    for r in rows:     # the simulated goodput is near what the deployment can take, not above it by much
        assert 0.8 * r["capacity"] <= r["goodput"] <= 1.25 * r["capacity"]


def test_a_data_parallel_baseline_leaves_idle_the_gpu_type_that_costs_it_goodput():
    """The mixed cluster at b=8: fifteen K80s, each fed a fifteenth of its pool's share and barely able to run a
    batch within the SLO, drop what waits too long; the baseline that leaves them idle sustains more, and that
    is the one the table compares E3 with (never fewer samples than every GPU gives)."""
    gpus = ev.cluster_gpus("heterogeneous")
    profiles = gpu_profiles(gpus)
    profile = ev.parametric_mix(0.8, 12)
    pools, _ = ev.system_pools("as_is", 8, profile, gpus, profiles, SMALL)
    every = pl.sustained_goodput(pools, profile, profiles, SMALL)
    chosen, best = pl.best_pools(pools, profile, profiles, SMALL)
    assert "k80" in {g for p in pools for g in p.gpus}
    assert best.goodput > 1.2 * every.goodput
    assert {g for p in chosen for g in p.gpus} == {"v100", "p100"}
    assert pl.sustained_goodput(chosen, profile, profiles, SMALL).goodput == approx(best.goodput)


def test_without_exits_e3_shows_no_gain_over_the_model_as_is():
    gpus = ev.cluster_gpus("homogeneous")
    profiles = gpu_profiles(gpus)
    none_leave = BatchProfile((1.0,) * 11 + (0.0,))
    for batch in (1, 4, 16):
        caps = ev.capacities(batch, none_leave, gpus, profiles, SMALL)
        assert caps["e3"] == approx(caps["as_is"])


def test_the_cost_table_buys_the_cheapest_gpus_for_the_target():
    assert ev.cheapest_data_parallel({"a": 100.0, "b": 30.0}, {"a": 3.0, "b": 1.0}, 250.0, 8) == {"a": 2, "b": 2}   # $8, 4 GPUs; 1 + 5 also costs $8 with 6
    assert ev.cheapest_data_parallel({"a": 100.0}, {"a": 3.0}, 250.0, 2) is None
    rows = ev.cost_table(batches=(4,), mixes=("80:20",), clusters=("homogeneous",), scenario=SMALL, target=3000)
    got = {r["system"]: r for r in rows}
    base = min(got["as_is"]["cost_per_s_for_target"], got["stock"]["cost_per_s_for_target"])
    assert got["e3"]["cost_per_s_for_target"] <= base * (1 + 1e-9)           # alpha = 1 over the cheaper baseline
    assert got["e3"]["saving_pct"] == approx(100 * (1 - got["e3"]["cost_per_s_for_target"] / base))
    gpus = {"v100": got["e3"]["gpus_for_target"]}
    plan = ev.e3_plan(4, ev.parametric_mix(0.8, 12), gpus, gpu_profiles(gpus), SMALL, request_rate=3000)
    assert plan and plan.goodput >= 3000                                      # what it bought sustains the target


def test_misprediction_uses_arimas_own_forecasts():
    series = ev.drifting_series(lambda share: ev.parametric_mix(share, 12), 0.8, windows=8, window_size=128)
    assert [w["window"] for w in series] == [2, 3, 4, 5, 6, 7]                # forecast from two windows seen
    assert all(0 < w["error"] < 0.5 for w in series)
    assert any(w["forecast"] != w["measured"] for w in series)
    rows = ev.misprediction_table(batches=(8,), mixes=("50:50",), scenario=SMALL, windows=8, window_size=128)
    assert rows[0]["windows"] == 6 and 0 < rows[0]["arima_mean_abs_error_pct"] < 50
    assert 0 <= rows[0]["loss_mean_pct"] <= rows[0]["loss_worst_pct"]


def test_the_ramp_table_disables_ramps_inside_e3s_splits():
    ramps = ev.ramp_table(batches=(4,), mixes=("80:20",), scenario=SMALL)
    assert ramps and ramps[0]["splits"] > 1
    assert ramps[0]["ramps_disabled"] == len(ramps[0]["disabled"].split())


