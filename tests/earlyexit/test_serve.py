"""E3's served pipeline on Ray Serve: the same exits as the one-process model, batches re-formed after a
split, a measured timeline per replica, and bad input refused before any work."""
from __future__ import annotations

import json
import math
import socket
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from workbench.earlyexit.serve import (REPLICA_CPUS, ModelSpec, ServeRun, Workload, ray_session,
                                       serve_plan)
from workbench.earlyexit.simulator import ArrivalProcess
from workbench.errors import WorkbenchError

pytestmark = pytest.mark.alone         # serves to deadlines on Ray: run with no other test beside it

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


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
def test_three_splits_with_replicas(ray_cluster, spec, workload, reference):
    model = spec.build()        # a model object: its weights travel as a state dict through the object store
    run = serve_plan(model, plan([(0, 1), (1, 3), (3, 6)], [1, 2, 1], [4, 4, 2]), workload, slo_s=5.0,
                     batch_wait_s=0.3)
    assert_same_as_model(run, reference)
    assert len(run.batch_counts) == 3 and max(run.batch_counts[2]) <= 2
    assert sum(s * k for s, k in run.batch_counts[2].items()) == int((reference.exit_layers >= 3).sum())
    assert {s.lane for s in run.timeline.of_kind("compute")} >= {"split 1 · replica 0", "split 1 · replica 1"}


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


# -- E3's serving behaviour: bounded queues, drops under overload, re-plans, stragglers ---------------------

def test_every_queue_is_bounded_and_never_means_unbounded():
    """Backpressure: the ingress and each split take and queue a bounded number of requests; only
    drop="never" (serve everyone) lifts the bounds."""
    from workbench.earlyexit.serve import _Deployer, _read_plan

    spec = ModelSpec.untrained(num_classes=2, seed=0, threshold=THRESHOLD)
    p = _read_plan(plan([(0, 3), (3, 6)], [2, 1], [4, 8]), 6)
    opts = {"service_s": None, "slack": 0.2, "batch_wait_s": None, "drop": "budget", "exclude_after": None,
            "tolerance": 0.2, "slowdown": {}}
    cfg, splits = _Deployer(spec, opts, 1.0).configs(p)
    assert 0 < cfg["max_ongoing"] < 10_000 and 0 < cfg["max_queued"] < 10_000 and cfg["drop"]
    assert [s["max_queued"] for s in splits] == [8 * 4 * 2, 8 * 8 * 1]
    assert [s["batch"] for s in splits] == [4, 8] and [s["replicas"] for s in splits] == [2, 1]
    cfg, splits = _Deployer(spec, dict(opts, drop="never"), 1.0).configs(p)
    assert cfg["max_queued"] == -1 and all(s["max_queued"] == -1 for s in splits) and not cfg["drop"]


@pytest.mark.integration
def test_under_twice_its_capacity_a_run_drops_and_counts_instead_of_letting_latency_grow(ray_cluster, spec, tokens):
    """The served capacity first (a burst, nobody dropped), then about twice that offered: requests that cannot
    make the SLO are dropped and counted, the served ones meet it (or are counted late), and the p95 stays near the
    SLO instead of growing with the backlog."""
    two = plan([(0, 3), (3, 6)], [1, 1], [4, 4])
    burst = Workload.from_arrivals(*tokens, [0.0] * 60)
    measured = serve_plan(spec, two, burst, slo_s=60.0, drop="never", batch_wait_s=0.05)
    assert measured.dropped == 0 and measured.met == 60
    done = np.sort([r.completion_s for r in measured.requests])
    capacity = (done.size - 12) / (done[-1] - done[11])       # steady state: past the first few answers
    slo = 1.0
    offered = Workload.from_arrivals(*tokens, ArrivalProcess("uniform", rate=2 * capacity, duration_s=4.0))
    run = serve_plan(spec, two, offered, slo_s=slo)
    n = len(offered)
    assert run.dropped > 0, "an overloaded run must drop what cannot make its SLO"
    assert run.met + run.late + run.dropped == n and run.drop_rate == pytest.approx(run.dropped / n)
    for r in run.requests:
        if r.dropped:
            assert not r.met_slo and r.exit_layer == -1 and math.isnan(r.latency_s)
            assert r.drop_reason in ("deadline", "queue full")
        else:
            assert r.met_slo == (r.latency_s <= slo)
    # Served without drops, twice the capacity for 4 s would leave the last requests about 2 s behind and the p95
    # near that; with drops it stays near the SLO (1.18 s was seen once on a busy 2-core host, so 1.5 x it)
    assert run.p95_latency_s <= 1.5 * slo, f"p95 {run.p95_latency_s:.2f} s: latency grew past the {slo} s SLO"
    served = run.served
    assert served.sum() > 0
    # what was served is still the model's answer
    ref = spec.build()(offered.ids, offered.mask)
    np.testing.assert_array_equal(run.exit_layers[served], np.asarray(ref.exit_layers)[served])


@pytest.mark.integration
def test_a_batch_leaves_when_full_or_when_its_first_request_runs_out_of_slack(ray_cluster, spec, tokens,
                                                                             reference):
    """Six requests at once, batches of four, two splits, every request past layer 0: at each split the full batch
    leaves at once; the other two wait at split 0 for the slack of the request that opened their batch
    (SLO x (1 - slack) minus the rest of the plan), and at split 1 have none left, so leave at once: all in time.
    Leaving one by one, the second runs after the first on split 1's one replica, past the plan's estimate: the
    slack (1 s) covers that (with 0.4 s, a CI run missed the SLO by 0.21 s)."""
    slo, slack = 4.0, 0.25
    rows = np.flatnonzero(np.asarray(reference.exit_layers) >= 1)[:6]
    ids, mask = tokens
    work = Workload(ids[rows], mask[rows], np.zeros(6))
    run = serve_plan(spec, plan([(0, 1), (1, 6)], [1, 1], [4, 4]), work, slo_s=slo, slack=slack)
    assert run.dropped == 0 and run.met == 6, [(r.drop_reason, r.latency_s) for r in run.requests]
    counts = run.batch_counts
    assert sorted(counts[0].items()) == [(2, 1), (4, 1)] and counts[1].get(4) == 1, counts
    assert sum(b * k for b, k in counts[1].items()) == 6, counts
    waits = [(s.meta["split"], s.meta["batch"], s.end - s.start) for s in run.timeline.of_kind("queue")]
    full = [w for i, b, w in waits if b == 4]
    assert min(w for i, b, w in waits if i == 0 and b == 2) >= 0.5 * slo * (1 - slack) > max(full), waits
    # the two late ones spent their slack at split 0: at split 1 they leave at once (together or one by one)
    assert max(w for i, b, w in waits if i == 1 and b < 4) < 0.25 * slo * (1 - slack), waits
    assert max(r.latency_s for r in run.requests) <= slo


@pytest.fixture(scope="module")
def drifting(tokens, reference):
    """Easy rows (leaving by layer 2) for 3 s, then hard ones (running past layer 3), 10 requests a second."""
    exits = np.asarray(reference.exit_layers)
    easy, hard = np.flatnonzero(exits <= 2), np.flatnonzero(exits >= 4)
    rows = np.concatenate([np.resize(easy, 30), np.resize(hard, 30)])
    ids, mask = tokens
    return Workload(ids[rows], mask[rows], np.arange(rows.size) / 10.0), rows


@pytest.mark.integration
def test_a_drifting_mix_replans_in_place_and_still_answers_as_the_model(ray_cluster, spec, reference, drifting):
    work, rows = drifting
    easy_plan = plan([(0, 3), (3, 6)], [1, 1], [4, 4])
    hard_plan = plan([(0, 6)], [2], [4])
    asked = []

    def replan(profile):
        asked.append(tuple(profile.remaining))
        return easy_plan if profile[2] < 0.5 else hard_plan

    run = serve_plan(spec, easy_plan, work, slo_s=4.0, window_s=1.0, replan=replan)
    assert asked and len(run.windows) == len(asked)
    assert run.replans, f"the mix drifted but nothing was re-planned; forecasts {asked}"
    first = run.replans[0]
    assert first.old["splits"] == [[0, 3], [3, 6]] and first.new["splits"] == [[0, 6]]
    assert first.new["replicas"] == [2] and first.forecast[2] >= 0.5 and first.deploy_s > 0
    assert any(w.observed[2] < 0.5 for w in run.windows) and any(w.observed[2] >= 0.5 for w in run.windows)
    # the new plan really runs: whole-model batches on two replicas after the re-plan, none before it
    whole = [s for s in run.timeline.of_kind("compute") if s.meta["layers"] == [0, 5]]
    assert whole and min(s.start for s in whole) >= first.at_s - first.deploy_s - 1e-3   # not before its deploy
    assert {s.meta["plan"] for s in whole} == {1}
    assert any(r.plan == 1 for r in run.requests if not r.dropped)
    served = run.served
    assert served.sum() >= len(rows) // 2
    np.testing.assert_array_equal(run.exit_layers[served], np.asarray(reference.exit_layers)[rows][served])
    np.testing.assert_array_equal(run.labels[served], np.asarray(reference.labels)[rows][served])
    keep = torch.as_tensor(served)
    torch.testing.assert_close(run.logits[keep], reference.logits[torch.as_tensor(rows)][keep], atol=1e-4, rtol=0)


@pytest.mark.integration
def test_a_straggling_replica_is_excluded_and_its_peers_serve_its_share(ray_cluster, spec, tokens):
    """E3 §3.3 as the simulator's exclude_stragglers_after: replica 0 of the only split runs 5x slower; after
    3 batches it is marked and gets no new work, replica 1 serves the rest."""
    work = Workload.from_arrivals(*tokens, ArrivalProcess("uniform", rate=25, count=100))
    run = serve_plan(spec, plan([(0, 6)], [2], [2]), work, slo_s=10.0, batch_wait_s=0.05,
                     exclude_stragglers_after=3, replica_slowdown={(0, 0): 5.0})
    assert len(run.stragglers) == 1, run.stragglers
    mark = run.stragglers[0]
    assert (mark["split"], mark["replica"]) == (0, 0) and mark["slowdown"] > 1.2 and mark["batches"] >= 3
    spans = run.timeline.of_kind("compute")
    slow_after = [s for s in spans if s.meta["replica"] == 0 and s.start > mark["at_s"]]
    fast_after = [s for s in spans if s.meta["replica"] == 1 and s.start > mark["at_s"]]
    # at most what was already routed to it (its max_ongoing_requests: two batches) runs after the mark
    assert len(slow_after) <= 2 and len(fast_after) >= 5, (len(slow_after), len(fast_after))
    assert run.dropped == 0


@pytest.mark.integration
def test_a_run_that_starts_its_own_ray_leaves_no_raylet_or_controller(tmp_path):
    """serve_plan starting Ray in a fresh process closes the session: no raylet, GCS, worker or Serve
    controller of that session is left once it returns."""
    import subprocess
    import sys

    import psutil

    script = tmp_path / "run.py"
    script.write_text(
        "import json, sys, torch, ray\n"
        "from types import SimpleNamespace\n"
        "from workbench.earlyexit.serve import ModelSpec, Workload, serve_plan\n"
        "seen = []\n"
        "def progress(done, total):\n"
        "    if not seen:\n"
        "        seen.append(ray._private.worker._global_node.get_session_dir_path())\n"
        "ids = torch.randint(1000, 30000, (4, 16))\n"
        "work = Workload(ids, torch.ones_like(ids), [0.0, 0.0, 0.1, 0.1])\n"
        "p = SimpleNamespace(splits=[(0, 6)], replicas=[1], batch_sizes=[2], gpu_types=['host'])\n"
        f"run = serve_plan(ModelSpec.untrained(seed=0, threshold={THRESHOLD}), p, work, slo_s=5.0, "
        "batch_wait_s=0.1, num_cpus=1, progress=progress)\n"
        "print(json.dumps({'session': seen[0], 'up': ray.is_initialized(), 'served': int(run.served.sum())}))\n")
    got = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert out["served"] == 4 and not out["up"]

    def left():
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if out["session"] in " ".join(proc.info["cmdline"] or []):
                    found.append((proc.info["pid"], " ".join(proc.info["cmdline"])[:80]))
            except psutil.Error:
                continue
        return found

    for _ in range(40):          # Ray's processes exit on their own once the driver shut it down
        if not left():
            break
        time.sleep(0.5)
    assert not left()
