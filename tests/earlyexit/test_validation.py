"""The simulator against real Ray Serve runs, worked by hand: served runs stood in by plain records, the
simulator on their plan, arrivals and exits; slowdown and serving costs read from a served timeline; a run
predicted out of sample from another run's calibration."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from workbench.earlyexit import validation as va
from tests.earlyexit.test_evaluation import flat_profile

approx = pytest.approx


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

    v = va.validate_simulator("model", plan, "workload", flat_profile(), 1.0, serve=fake_serve, cores=2,
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
    crowded = va.validate_simulator("m", plan, "w", flat_profile(), 1.0, serve=fake_serve, cores=1)
    assert "2 replicas on 1 cores" in crowded.note


def test_validation_reads_the_workloads_arrivals_when_the_run_has_none():
    plan = SimpleNamespace(splits=[(0, 2)], replicas=[1], batch_sizes=[1])
    run = SimpleNamespace(requests=[SimpleNamespace(exit_layer=1)], goodput=1.0, p50_latency_s=0.015,
                          p95_latency_s=0.015, batch_counts=({1: 1},))
    v = va.validate_simulator(None, plan, SimpleNamespace(arrival_s=np.array([0.0])), flat_profile(), 1.0,
                              serve=lambda *a, **k: run)
    assert v.sim.requests[0].latency_s == approx(0.015) and v.p50_error == approx(0.0)


def test_the_real_batch_wait_sets_how_long_the_simulated_batcher_waits():
    """One split, batch 2, 15 ms a batch, a lone request: served after the 50 ms batch wait, done at 65 ms."""
    plan = SimpleNamespace(splits=[(0, 2)], replicas=[1], batch_sizes=[2])
    got = {}

    def fake_serve(model, plan_, workload, *, slo_s, **kwargs):
        got.update(kwargs)
        return SimpleNamespace(requests=[SimpleNamespace(arrival_s=0.0, exit_layer=1)], goodput=1 / 0.065,
                               p50_latency_s=0.065, p95_latency_s=0.065, batch_counts=({1: 1},))

    v = va.validate_simulator(None, plan, None, flat_profile(), 1.0, serve=fake_serve, batch_wait_s=0.05)
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
    over = va.measured_overheads(run)
    assert (over.entry_s, over.hop_s, over.back_s) == approx((0.01, 0.01, 0.01))
    slow = va.measured_slowdown(run, lambda layer, batch, gpu: 0.01)
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
    over = va.measured_overheads(run)
    assert sorted(over.entry_samples) == approx([0.005, 0.01, 0.02]) and over.entry_s == approx(0.01)
    assert sorted(over.back_samples) == approx([0.001, 0.002, 0.003]) and over.back_s == approx(0.002)
    entry, back = over.draw(200, seed=1)
    assert set(np.round(entry, 6)) == {0.005, 0.01, 0.02} and set(np.round(back, 6)) == {0.001, 0.002, 0.003}
    assert np.array_equal(over.draw(5, seed=3)[0], over.draw(5, seed=3)[0])
    flat, _ = va.ServingOverheads(0.004, 0.0, 0.0).draw(3)
    assert list(flat) == [0.004] * 3


def test_a_run_predicted_out_of_sample_by_hand():
    """One split of two layers, one replica, batch 1; the calibration says replicas compute at twice the profile
    and Ray Serve adds 1 ms on entry and 2 ms on the way back. Request 0 (arrives at 0) runs both layers:
    2 x (10 + 5) = 30 ms, answered at 1 + 30 + 2 = 33 ms; request 1 (arrives at 100 ms) leaves at layer 0, whose
    batch then has nobody for layer 1: 2 x 10 = 20 ms, answered at 100 + 1 + 20 + 2 = 123 ms."""
    plan = SimpleNamespace(splits=[(0, 2)], replicas=[1], batch_sizes=[1], gpu_types=["host"])
    cal = va.Calibration(2.0, va.ServingOverheads(0.001, 0.0, 0.002), "a hand-made run")
    got = va.predict_run(plan, [0.0, 0.1], [1, 0], flat_profile(), 1.0, cal)
    assert [r.latency_s for r in got.sim.requests] == approx([0.030, 0.020])
    assert got.p50_s == approx((0.033 + 0.023) / 2) and got.p95_s == approx(0.023 + 0.95 * 0.010)
    assert got.goodput == approx(2 / 0.123) and got.drop_rate == 0.0
    # an SLO of 12 ms: the rest of the plan (15 ms at the profile) cannot return by the deadline: both dropped
    tight = va.predict_run(plan, [0.0, 0.1], [1, 0], flat_profile(), 0.012, cal)
    assert tight.drop_rate == 1.0 and tight.goodput == 0.0
    target = SimpleNamespace(requests=[SimpleNamespace(arrival_s=0.0, exit_layer=1),
                                       SimpleNamespace(arrival_s=0.1, exit_layer=0)],
                             goodput=2 / 0.123, p50_latency_s=0.028, p95_latency_s=0.0325, batch_counts=({1: 2},))
    v = va.validate_out_of_sample(cal, target, plan, flat_profile(), 1.0)
    assert v.goodput_error == approx(0.0) and v.p50_error == approx(0.0) and v.within_target
    assert "calibrated on a hand-made run" in v.note
