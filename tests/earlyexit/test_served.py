"""What a served E3 run takes and gives back, without Ray: the workload's arrivals and checks, the plan's check,
a spec's rebuilt model and the run's per-request summaries."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from workbench.earlyexit.served import ModelSpec, ServedRequest, ServeRun, Workload, check_plan
from workbench.earlyexit.simulator import ArrivalProcess, simulate
from workbench.errors import WorkbenchError
from workbench.timeline import Timeline

N, T = 6, 8


@pytest.fixture(scope="module")
def tokens():
    g = torch.Generator().manual_seed(0)
    return torch.randint(1000, 30522, (N, T), generator=g), torch.ones(N, T, dtype=torch.int64)


def test_arrivals_are_the_simulators(tokens):
    arrivals = ArrivalProcess("bursty", rate=50, count=30)
    work = Workload.from_arrivals(*tokens, arrivals, seed=3)
    sim = simulate([(0, 6)], [1], [4], slo_s=1.0, arrivals=arrivals, service_s=lambda i, b: 0.001, seed=3)
    np.testing.assert_allclose(work.arrival_s, [r.arrival_s for r in sim.requests])
    assert len(work) == 30 and work.length == T and torch.equal(work.ids[N], tokens[0][0])   # rows cycle


@pytest.mark.parametrize("change, words", [
    (lambda w: Workload(w.ids.int(), w.mask, w.arrival_s), "int64"),
    (lambda w: Workload(w.ids, w.mask[:, :3], w.arrival_s), "shaped like ids"),
    (lambda w: Workload(w.ids, w.mask, w.arrival_s[:-1]), f"{N - 1} arrival times for {N} requests"),
    (lambda w: Workload(w.ids, w.mask, np.r_[w.arrival_s[:-1], -1.0]), "finite seconds >= 0"),
    (lambda w: Workload(w.ids, w.mask, np.r_[w.arrival_s[:-1], math.nan]), "finite seconds >= 0"),
])
def test_a_bad_workload_is_named(tokens, change, words):
    work = Workload.from_arrivals(*tokens, np.arange(N) * 0.01)
    work.check(max_positions=T)
    with pytest.raises(WorkbenchError, match=words):
        change(work).check()
    with pytest.raises(WorkbenchError, match=f"{T} tokens long; the model takes at most {T - 1}"):
        work.check(max_positions=T - 1)


def plan(splits, replicas, batch_sizes, **more):
    return SimpleNamespace(splits=splits, replicas=replicas, batch_sizes=batch_sizes, **more)


def test_a_plan_is_read_as_contiguous_splits_with_whole_positive_counts():
    assert check_plan(plan([(0, 2), (2, 6)], [2, 1], [4, 8]), 6) == (((0, 2), (2, 6)), (2, 1), (4, 8))
    for bad, words in [(plan([], [], [], reason="nothing fits"), r"empty \(no splits\).*nothing fits"),
                       (plan([(0, 2), (2, 5)], [1, 1], [4, 4]), "the last split must end at 6"),
                       (plan([(0, 2), (2, 6)], [1, 1], [4, 4], gpu_types=["v100"]), "1 GPU types for 2 splits"),
                       (SimpleNamespace(splits=[(0, 6)], replicas=[1]), r"no \.batch_sizes")]:
        with pytest.raises(WorkbenchError, match=words):
            check_plan(bad, 6)


def test_a_spec_rebuilds_the_same_model_from_its_seed_or_its_weights(tokens):
    seeded = ModelSpec.untrained(num_classes=2, seed=0, threshold=0.69, disabled=[3])
    model = seeded.build()
    again = ModelSpec.of(model).build()
    assert again.disabled == model.disabled == {3}
    a, b = model(*tokens), again(*tokens)
    assert torch.equal(a.logits, b.logits) and a.exit_layers.tolist() == b.exit_layers.tolist()
    with pytest.raises(WorkbenchError, match="needs a seed"):
        ModelSpec(seeded.cfg, 2, 0.69).build()


def test_a_runs_counts_follow_its_requests():
    rows = (ServedRequest(0, 0.0, 2, 0, 1, 0.5, 0.5, True),
            ServedRequest(1, 0.1, 5, 1, 0, 2.1, 2.0, False),
            ServedRequest(2, 0.2, -1, -1, -1, 0.3, math.nan, False, dropped=True, drop_reason="deadline"),
            ServedRequest(3, 0.3, -1, -1, -1, 0.3, math.nan, False, dropped=True, drop_reason="queue full"))
    run = ServeRun(rows, Timeline([]), ({},), ((0, 6),), (1,), (4,), slo_s=1.0, duration_s=2.1, goodput=1 / 2.1,
                   throughput=2 / 2.1, p50_latency_s=1.25, p95_latency_s=1.925)
    assert (run.met, run.late, run.dropped) == (1, 1, 2)
    assert run.served.tolist() == [True, True, False, False]
    assert run.drop_reasons == {"deadline": 1, "queue full": 1}
    assert run.exit_layers.tolist() == [2, 5, -1, -1] and run.labels.tolist() == [1, 0, -1, -1]
