"""E3's served pipeline on Ray Serve: the same exits as the one-process model, batches re-formed after a
split, a measured timeline per replica, and bad input refused before any work."""
from __future__ import annotations

import math
import socket
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from workbench.earlyexit.serve import (REPLICA_CPUS, ModelSpec, ServeRun, Workload, ray_session,
                                       serve_plan)
from workbench.earlyexit.simulator import ArrivalProcess, simulate
from workbench.errors import WorkbenchError

THRESHOLD = 0.6905   # untrained ramps sit near ln 2: rows of this workload leave at layers 1 to 5
N, T = 24, 32


@pytest.fixture(scope="module")
def spec():
    return ModelSpec.untrained(num_classes=2, seed=0, threshold=THRESHOLD)


@pytest.fixture(scope="module")
def tokens():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, T + 1, (N,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    ids = torch.randint(1000, 30522, (N, T), generator=g) * mask
    return ids, mask


@pytest.fixture(scope="module")
def reference(spec, tokens):
    out = spec.build()(*tokens)
    assert len(set(out.exit_layers.tolist())) >= 3, "the workload should leave at several layers"
    return out


@pytest.fixture(scope="module")
def workload(tokens):
    return Workload.from_arrivals(*tokens, ArrivalProcess("uniform", rate=100, count=N))


def plan(splits, replicas, batch_sizes):
    return SimpleNamespace(splits=splits, replicas=replicas, batch_sizes=batch_sizes)


PROGRESS: list[tuple[int, int]] = []


@pytest.fixture(scope="module")
def two_split(ray_cluster, spec, workload) -> ServeRun:
    return serve_plan(spec, plan([(0, 3), (3, 6)], [2, 1], [4, 4]), workload, slo_s=5.0, batch_wait_s=1.0,
                      progress=lambda done, total: PROGRESS.append((done, total)))


def assert_same_as_model(run: ServeRun, reference):
    np.testing.assert_array_equal(run.exit_layers, reference.exit_layers)
    np.testing.assert_array_equal(run.labels, reference.labels)
    torch.testing.assert_close(run.logits, reference.logits, atol=1e-4, rtol=0)


def test_two_splits_serve_the_model_exits(two_split, reference):
    assert_same_as_model(two_split, reference)
    assert {r.exit_split for r in two_split.requests} == {0, 1}
    for r in two_split.requests:
        assert r.latency_s == pytest.approx(r.completion_s - r.arrival_s)
        assert r.met_slo == (r.latency_s <= 5.0) and not r.dropped
        assert r.sent_s >= r.arrival_s - 1e-3 and r.exited_s <= r.completion_s + 1e-3
    assert two_split.duration_s == pytest.approx(max(r.completion_s for r in two_split.requests))
    assert two_split.goodput == pytest.approx(two_split.met / two_split.duration_s)
    assert 0 < two_split.p50_latency_s <= two_split.p95_latency_s and two_split.drop_rate == 0
    assert PROGRESS[-1] == (N, N) and len(PROGRESS) == N


def test_survivors_are_reformed_into_full_batches(two_split, reference):
    counts = two_split.batch_counts
    survivors = int((reference.exit_layers >= 3).sum())
    assert sum(counts[0].values()) >= N // 4 and sum(size * k for size, k in counts[0].items()) == N
    assert sum(size * k for size, k in counts[1].items()) == survivors
    assert max(counts[0]) <= 4 and max(counts[1]) <= 4
    # which first-split batch each request rode in, then the second split's full batches
    first = {}
    for s in two_split.timeline.of_kind("compute"):
        if s.meta["split"] == 0:
            first.update({j: (s.meta["replica"], s.meta["index"]) for j in s.meta["requests"]})
    full = [s for s in two_split.timeline.of_kind("compute") if s.meta["split"] == 1 and s.meta["batch"] == 4]
    assert full and counts[1][4] == len(full)
    assert any(len({first[j] for j in s.meta["requests"]}) >= 2 for s in full), \
        "a full second-split batch should gather the survivors of several first-split batches"


def test_timeline_has_a_lane_per_replica(two_split):
    tl = two_split.timeline
    assert tl.source == "measured"
    lanes = {s.lane for s in tl.of_kind("compute")}
    assert lanes == {"split 0 · replica 0", "split 0 · replica 1", "split 1 · replica 0"}
    for lane in lanes:
        spans = sorted((s for s in tl.spans if s.lane == lane), key=lambda s: s.start)
        assert all(a.end <= b.start + 1e-6 for a, b in zip(spans, spans[1:])), "one batch at a time per replica"
        waits = {(s.meta["index"]): s for s in tl.of_kind("queue") if s.lane == lane + " queue"}
        for s in spans:
            assert s.meta["batch"] == len(s.meta["requests"]) and s.label.startswith("layers ")
            assert waits[s.meta["index"]].end == pytest.approx(s.start)
    assert 0 <= min(s.start for s in tl.spans) and tl.end <= two_split.duration_s + 1e-3


def test_three_splits_with_replicas(ray_cluster, spec, workload, reference):
    model = spec.build()        # a model object: its weights travel as a state dict through the object store
    run = serve_plan(model, plan([(0, 1), (1, 3), (3, 6)], [1, 2, 1], [4, 4, 2]), workload, slo_s=5.0,
                     batch_wait_s=0.3)
    assert_same_as_model(run, reference)
    assert len(run.batch_counts) == 3 and max(run.batch_counts[2]) <= 2
    assert sum(s * k for s, k in run.batch_counts[2].items()) == int((reference.exit_layers >= 3).sum())
    assert {s.lane for s in run.timeline.of_kind("compute")} >= {"split 1 · replica 0", "split 1 · replica 1"}


def test_arrivals_are_the_simulators(tokens):
    arrivals = ArrivalProcess("bursty", rate=50, count=30)
    work = Workload.from_arrivals(*tokens, arrivals, seed=3)
    sim = simulate([(0, 6)], [1], [4], slo_s=1.0, arrivals=arrivals, service_s=lambda i, b: 0.001, seed=3)
    np.testing.assert_allclose(work.arrival_s, [r.arrival_s for r in sim.requests])
    assert len(work) == 30 and torch.equal(work.ids[N], tokens[0][0])   # rows cycle


@pytest.mark.parametrize("bad, words", [
    (plan([], [], []), "empty"),
    (plan([(0, 3), (3, 6)], [1, 0], [4, 4]), "replicas"),
    (plan([(0, 3), (3, 6)], [1, 1], [4, 0]), "batch size"),
    (plan([(0, 2), (3, 6)], [1, 1], [4, 4]), "contiguous"),
    (plan([(0, 3), (3, 5)], [1, 1], [4, 4]), "6 layers"),
    (plan([(0, 6)], [int(2 / REPLICA_CPUS) + 1], [4]), "CPUs"),
])
def test_bad_plans_are_refused_before_any_work(spec, workload, bad, words):
    with pytest.raises(WorkbenchError, match=words):
        serve_plan(spec, bad, workload, slo_s=1.0, num_cpus=2)


@pytest.mark.parametrize("slo", [-1.0, math.nan, 0.0, math.inf])
def test_bad_slo_is_refused(spec, workload, slo):
    with pytest.raises(WorkbenchError, match="slo_s"):
        serve_plan(spec, plan([(0, 6)], [1], [4]), workload, slo_s=slo)


def test_an_address_that_does_not_answer_fails_fast():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]          # nothing listens there once closed
    began = time.perf_counter()
    with pytest.raises(WorkbenchError, match=rf"127\.0\.0\.1:{port}.*ray start --head"):
        ray_session(address=f"127.0.0.1:{port}")
    assert time.perf_counter() - began < 5


def test_ray_is_started_from_a_thread_that_lives_as_long_as_the_process(monkeypatch):
    """Ray's head processes die with the thread that forked them: a page's background run must not be it."""
    import threading

    from workbench.earlyexit import raycluster

    seen = []
    monkeypatch.setattr(raycluster, "start_local_here", lambda *a: seen.append(threading.current_thread().name))
    worker = threading.Thread(target=raycluster.start_local, args=(2,), name="background-run")
    worker.start()
    worker.join()
    raycluster.start_local(2)
    assert seen[0].startswith("workbench-ray") and seen[1] == threading.main_thread().name
