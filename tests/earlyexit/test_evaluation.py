"""Paper-scale evaluation (simulated) and the simulator-vs-real validation path, with a case worked by hand."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from workbench.earlyexit import evaluation as ev
from workbench.earlyexit.batchprofile import BatchProfile
from workbench.earlyexit.profiles import LayerProfile, gpu_profiles

approx = pytest.approx
SMALL = ev.EvalSettings(requests=400, min_span_slos=2.0)


def flat_profile() -> LayerProfile:
    """Two layers whatever the batch: layer 0 with its ramp and the embedding 10 ms, layer 1 with its ramp 5 ms."""
    sizes = (1, 2, 4)
    return LayerProfile(sizes, ((8e-3,) * 3, (4e-3,) * 3), ((1e-3,) * 3, (1e-3,) * 3), (1e-3,) * 3, "host", 16, 1,
                        True, "made up")


def test_validation_runs_the_simulator_on_the_real_runs_arrivals_and_exits_by_hand():
    """Splits (0,1) and (1,2), one replica each, batch 2; 10 ms and 5 ms a batch; SLO 1 s; a replica waits at
    most 50 ms for a full batch (as the real replicas do). Arrivals 0, 10, 20, 30 ms (uniform); the real run says
    r0 left at layer 0, the others ran both layers.
    - split 0: r0 waits; r1 fills the batch at 10 ms: served 10..20 ms, r0 leaves at 20 ms, r1 goes on.
    - split 1: r1 waits alone (it may, until 20 + 50 ms).
    - split 0: r2 (20 ms) waits; r3 fills the batch at 30 ms: served 30..40 ms; both go on.
    - split 1: at 40 ms [r1, r2] is full: served 40..45 ms. r3 waits alone until 40 + 50 = 90 ms, served
      90..95 ms.
    Latencies 20, 35, 25, 65 ms; all meet the SLO; the run ends at 95 ms."""
    plan = SimpleNamespace(splits=[(0, 1), (1, 2)], replicas=[1, 1], batch_sizes=[2, 2], gpu_types=["host"] * 2)
    arrivals = [0.0, 0.01, 0.02, 0.03]
    calls = []

    def fake_serve(model, plan_, workload, *, slo_s, **kwargs):
        calls.append((model, plan_, workload, slo_s, kwargs))
        requests = [SimpleNamespace(arrival_s=t, exit_layer=e) for t, e in zip(arrivals, [0, 1, 1, 1])]
        return SimpleNamespace(requests=requests, goodput=5.0, p50_latency_s=0.020, p95_latency_s=0.75,
                               batch_counts=({2: 2}, {2: 1, 1: 1}))

    v = ev.validate_simulator("model", plan, "workload", flat_profile(), 1.0, serve=fake_serve, cores=2,
                              timeout_s=30.0, batch_wait_s=0.05)
    assert calls == [("model", plan, "workload", 1.0, {"timeout_s": 30.0, "batch_wait_s": 0.05})]
    assert [r.completion_s for r in v.sim.requests] == approx([0.020, 0.045, 0.045, 0.095])
    assert [r.latency_s for r in v.sim.requests] == approx([0.020, 0.035, 0.025, 0.065])
    assert v.sim_goodput == approx(4 / 0.095)
    assert v.sim_p50_s == approx(0.030)
    assert v.sim_p95_s == approx(0.035 + 0.85 * (0.065 - 0.035))
    assert v.goodput_error == approx((4 / 0.095 - 5.0) / 5.0)
    assert v.p50_error == approx(0.5) and v.p95_error == approx((v.sim_p95_s - 0.75) / 0.75)
    assert v.sim_batch_counts == (((2, 2),), ((1, 1), (2, 1)))
    assert v.real_batch_counts == (((2, 2),), ((1, 1), (2, 1)))
    assert not v.within_target                   # the p50 is 50% off
    assert v.note == "" and v.row()["requests"] == 4
    crowded = ev.validate_simulator("m", plan, "w", flat_profile(), 1.0, serve=fake_serve, cores=1)
    assert "2 replicas on 1 cores" in crowded.note


def test_validation_reads_the_workloads_arrivals_when_the_run_has_none():
    plan = SimpleNamespace(splits=[(0, 2)], replicas=[1], batch_sizes=[1])
    run = SimpleNamespace(requests=[SimpleNamespace(exit_layer=1)], goodput=1.0, p50_latency_s=0.015,
                          p95_latency_s=0.015, batch_counts=({1: 1},))
    v = ev.validate_simulator(None, plan, SimpleNamespace(arrival_s=np.array([0.0])), flat_profile(), 1.0,
                              serve=lambda *a, **k: run)
    assert v.sim.requests[0].latency_s == approx(0.015) and v.p50_error == approx(0.0)


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


def test_pools_capacity_exits_and_disabled_ramps():
    layer_s = lambda k, b, g: 1e-3 * b + 1e-3                      # noqa: E731
    pool = ev.Pool(((0, 2),), (3,), (4,), ("x",), ramps=False)
    profile = BatchProfile((0.5, 0.0))
    assert ev.pool_capacity(pool, profile, layer_s) == approx(3 * 4 / (2 * 5e-3))   # nobody leaves: full batches
    assert list(pool.exit_layers(np.array([0, 1]))) == [1, 1]
    # with exits, half the batch runs layer 1: the expected time over Binomial(4, 1/2) survivors
    shrinking = ev.Pool(((0, 2),), (1,), (4,), ("x",))
    expected = 5e-3 + sum(math.comb(4, n) / 16 * (1e-3 * n + 1e-3) for n in range(1, 5))
    assert ev.pool_capacity(shrinking, profile, layer_s) == approx(4 / expected)
    split = ev.Pool(((0, 2), (2, 4)), (1, 1), (2, 2), ("x", "x"), ramps=frozenset({0, 1}))
    assert list(split.exit_layers(np.arange(4))) == [0, 1, 3, 3]      # ramp 2 off: its samples leave at 3


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
    every = ev.sustained_goodput(pools, profile, profiles, SMALL)
    chosen, best = ev.best_pools(pools, profile, profiles, SMALL)
    assert "k80" in {g for p in pools for g in p.gpus}
    assert best.goodput > 1.2 * every.goodput
    assert {g for p in chosen for g in p.gpus} == {"v100", "p100"}
    assert ev.sustained_goodput(chosen, profile, profiles, SMALL).goodput == approx(best.goodput)


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


def test_the_real_batch_wait_sets_how_long_the_simulated_batcher_waits():
    """One split, batch 2, 15 ms a batch, a lone request: served after the 50 ms batch wait, done at 65 ms."""
    plan = SimpleNamespace(splits=[(0, 2)], replicas=[1], batch_sizes=[2])
    got = {}

    def fake_serve(model, plan_, workload, *, slo_s, **kwargs):
        got.update(kwargs)
        return SimpleNamespace(requests=[SimpleNamespace(arrival_s=0.0, exit_layer=1)], goodput=1 / 0.065,
                               p50_latency_s=0.065, p95_latency_s=0.065, batch_counts=({1: 1},))

    v = ev.validate_simulator(None, plan, None, flat_profile(), 1.0, serve=fake_serve, batch_wait_s=0.05)
    assert got == {"batch_wait_s": 0.05}
    assert v.sim.requests[0].completion_s == approx(0.065) and v.within_target


def test_slowdown_and_serving_costs_are_read_from_a_served_runs_timeline():
    """Split 0 (layers 0-1) then split 1 (layer 2). Request 7 arrives at 0.0, waits in split 0's queue from
    0.01, is computed 0.05-0.09 (2 rows at layer 0, 1 at layer 1), enters split 1's queue at 0.10, is computed
    0.11-0.12 and answers at 0.13: entry 10 ms, hop 10 ms, back 10 ms. A flat profile of 10 ms per layer and
    batch predicts 20 ms for split 0's batch (measured 40: slowdown 2) and 10 ms for split 1's (measured 10)."""
    from workbench.timeline import Span, Timeline

    def span(kind, split, start, end, layers, rows):
        return Span(f"split {split} · replica 0", kind, start, end, "",
                    {"split": split, "replica": 0, "layers": layers, "rows": rows, "requests": [7]})

    timeline = Timeline((span("queue", 0, 0.01, 0.05, [0, 1], [2, 1]), span("compute", 0, 0.05, 0.09, [0, 1], [2, 1]),
                         span("queue", 1, 0.10, 0.11, [2, 2], [1]), span("compute", 1, 0.11, 0.12, [2, 2], [1])),
                        "measured")
    run = SimpleNamespace(timeline=timeline, requests=[SimpleNamespace(id=7, arrival_s=0.0, exited_s=0.12,
                                                                       completion_s=0.13)])
    over = ev.measured_overheads(run)
    assert (over.entry_s, over.hop_s, over.back_s) == approx((0.01, 0.01, 0.01))
    slow = ev.measured_slowdown(run, lambda layer, batch, gpu: 0.01)
    assert slow == approx({(0, 0): 2.0, (1, 0): 1.0})


def test_each_request_is_timed_from_its_own_arrival_at_the_replica_not_its_batchs():
    """One batch of three requests that arrived at 0, 0.1 and 0.2 s and reached the replica 5, 10 and 20 ms
    later; the batch's queue span starts with the first (0.005). Entry costs are 5, 10 and 20 ms (median 10),
    not 5, 0 and 0 as reading the batch's start would give; a prediction draws each request's from them."""
    from workbench.timeline import Span, Timeline

    meta = {"split": 0, "replica": 0, "layers": [0, 0], "rows": [3], "requests": [0, 1, 2],
            "entered": [0.005, 0.11, 0.22]}
    timeline = Timeline((Span("split 0 · replica 0 queue", "queue", 0.005, 0.3, "", meta),
                         Span("split 0 · replica 0", "compute", 0.3, 0.4, "", meta)), "measured")
    run = SimpleNamespace(timeline=timeline, requests=[
        SimpleNamespace(id=i, arrival_s=0.1 * i, exited_s=0.4, completion_s=0.4 + 0.001 * (i + 1)) for i in range(3)])
    over = ev.measured_overheads(run)
    assert sorted(over.entry_samples) == approx([0.005, 0.01, 0.02]) and over.entry_s == approx(0.01)
    assert sorted(over.back_samples) == approx([0.001, 0.002, 0.003]) and over.back_s == approx(0.002)
    entry, back = over.draw(200, seed=1)
    assert set(np.round(entry, 6)) == {0.005, 0.01, 0.02} and set(np.round(back, 6)) == {0.001, 0.002, 0.003}
    assert np.array_equal(over.draw(5, seed=3)[0], over.draw(5, seed=3)[0])
    flat, _ = ev.ServingOverheads(0.004, 0.0, 0.0).draw(3)
    assert list(flat) == [0.004] * 3


def test_a_run_predicted_out_of_sample_by_hand():
    """One split of two layers, one replica, batch 1; the calibration says replicas compute at twice the profile
    and Ray Serve adds 1 ms on entry and 2 ms on the way back. Request 0 (arrives at 0) runs both layers:
    2 x (10 + 5) = 30 ms, answered at 1 + 30 + 2 = 33 ms; request 1 (arrives at 100 ms) leaves at layer 0, whose
    batch then has nobody for layer 1: 2 x 10 = 20 ms, answered at 100 + 1 + 20 + 2 = 123 ms."""
    plan = SimpleNamespace(splits=[(0, 2)], replicas=[1], batch_sizes=[1], gpu_types=["host"])
    cal = ev.Calibration(2.0, ev.ServingOverheads(0.001, 0.0, 0.002), "a hand-made run")
    got = ev.predict_run(plan, [0.0, 0.1], [1, 0], flat_profile(), 1.0, cal)
    assert [r.latency_s for r in got.sim.requests] == approx([0.030, 0.020])
    assert got.p50_s == approx((0.033 + 0.023) / 2) and got.p95_s == approx(0.023 + 0.95 * 0.010)
    assert got.goodput == approx(2 / 0.123) and got.drop_rate == 0.0
    # an SLO of 12 ms: the rest of the plan (15 ms at the profile) cannot return by the deadline: both dropped
    tight = ev.predict_run(plan, [0.0, 0.1], [1, 0], flat_profile(), 0.012, cal)
    assert tight.drop_rate == 1.0 and tight.goodput == 0.0
    target = SimpleNamespace(requests=[SimpleNamespace(arrival_s=0.0, exit_layer=1),
                                       SimpleNamespace(arrival_s=0.1, exit_layer=0)],
                             goodput=2 / 0.123, p50_latency_s=0.028, p95_latency_s=0.0325, batch_counts=({1: 2},))
    v = ev.validate_out_of_sample(cal, target, plan, flat_profile(), 1.0)
    assert v.goodput_error == approx(0.0) and v.p50_error == approx(0.0) and v.within_target
    assert "calibrated on a hand-made run" in v.note
