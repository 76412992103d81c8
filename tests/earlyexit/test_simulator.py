"""The SimPy serving simulator: a case worked out by hand, re-formed batches, drops, determinism, bad input."""
from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.earlyexit.batchprofile import BatchProfile
from workbench.earlyexit.simulator import ArrivalProcess, simulate, simulate_plan
from workbench.errors import WorkbenchError
from workbench.timeline import Timeline

approx = pytest.approx


def fixed(seconds):
    return lambda split, batch: seconds


def test_one_split_by_hand():
    """1 split, 1 replica, batch size 2, 10 ms per batch, SLO 100 ms with 20% slack.

    A replica may wait for a full batch until the oldest request's arrival + 80 ms - 10 ms (its service),
    i.e. 70 ms after it arrived.
    - r0 @ 0 waits; r1 @ 4 ms fills the batch: served 4..14 ms -> latencies 14 and 10 ms.
    - r2 @ 6 ms queues behind it; at 14 ms it is alone and may wait until 6 + 70 = 76 ms; nothing comes,
      so it is served alone 76..86 ms -> 80 ms.
    - r3 @ 100 ms likewise waits until 170 ms, served 170..180 ms -> 80 ms.
    All four meet the SLO; the run ends at 180 ms: goodput 4 / 0.18 s. Median of (10, 14, 80, 80) = 47 ms;
    p95 interpolates between the 3rd and 4th (both 80 ms)."""
    res = simulate([(0, 6)], [1], [2], slo_s=0.1, slack=0.2, service_s=fixed(0.010),
                   arrivals=[0.0, 0.004, 0.006, 0.100])
    assert [r.completion_s for r in res.requests] == approx([0.014, 0.014, 0.086, 0.180])
    assert [r.latency_s for r in res.requests] == approx([0.014, 0.010, 0.080, 0.080])
    assert all(r.met_slo and not r.dropped and not r.straggler for r in res.requests)
    assert [r.exit_layer for r in res.requests] == [5] * 4  # no exits given: everyone runs all 6 layers
    busy = res.replica(0, 0).busy
    assert [(p.start_s, p.end_s, p.batch_size) for p in busy] == [
        approx((0.004, 0.014, 2)), approx((0.076, 0.086, 1)), approx((0.170, 0.180, 1))]
    assert res.splits[0].batch_counts == {1: 2, 2: 1}
    queue = res.splits[0].queue
    assert [t for t, _ in queue] == approx([0.0, 0.004, 0.006, 0.076, 0.100, 0.170])
    assert [n for _, n in queue] == [1, 0, 1, 0, 1, 0]
    assert res.duration_s == approx(0.180)
    assert res.goodput == approx(4 / 0.180)
    assert res.throughput == approx(4 / 0.180)
    assert res.p50_latency_s == approx(0.047)
    assert res.p95_latency_s == approx(0.080)
    assert res.drop_rate == 0 and res.straggler_rate == 0


def test_drops_and_stragglers_by_hand():
    """Batch size 1, 10 ms per batch, SLO 15 ms. r0 @ 0 is served 0..10 ms. At 10 ms r1 (@ 1 ms, deadline
    16 ms) and r2 (@ 2 ms, deadline 17 ms) could at best return at 20 ms: both are dropped. Without drops
    they are served late (19 and 28 ms) and marked stragglers."""
    kwargs = dict(slo_s=0.015, slack=0.0, service_s=fixed(0.010), arrivals=[0.0, 0.001, 0.002])
    res = simulate([(0, 2)], [1], [1], **kwargs)
    assert [r.dropped for r in res.requests] == [False, True, True]
    assert [r.dropped_at_s for r in res.requests[1:]] == approx([0.010, 0.010])
    assert res.requests[0].latency_s == approx(0.010) and res.requests[1].latency_s is None
    assert res.drop_rate == approx(2 / 3)
    assert res.goodput == approx(1 / 0.010)  # the last event is the drop at 10 ms
    assert res.splits[0].queue[-1] == approx((0.010, 0))

    kept = simulate([(0, 2)], [1], [1], drop="never", **kwargs)
    assert [r.latency_s for r in kept.requests] == approx([0.010, 0.019, 0.028])
    assert [r.straggler for r in kept.requests] == [False, True, True]
    assert [r.met_slo for r in kept.requests] == [True, False, False]
    assert kept.straggler_rate == approx(2 / 3) and kept.goodput == approx(1 / 0.030)


def test_worst_case_drop_rule_counts_the_rest_of_the_model():
    """Two splits of 10 ms each at batch 1, SLO 15 ms: nobody can run both in time, but a sample may exit
    in the first split. "hopeless" serves it (it returns at 10 ms); "worst_case" drops it on arrival."""
    kwargs = dict(slo_s=0.015, slack=0.0, service_s=fixed(0.010), arrivals=[0.0], exits=[0])
    assert simulate([(0, 1), (1, 2)], [1, 1], [1, 1], **kwargs).requests[0].met_slo
    assert simulate([(0, 1), (1, 2)], [1, 1], [1, 1], drop="worst_case", **kwargs).requests[0].dropped


def test_two_splits_reform_batches_from_survivors():
    """Half of each batch exits in split 0 (exit layer 1); split 1 merges two upstream batches' survivors
    into one full batch: 10 batches of 4 in split 0 become 5 batches of 4 (not 10 of 2) in split 1."""
    exits = [1, 3] * 20
    res = simulate([(0, 2), (2, 4)], [2, 1], [4, 4], slo_s=0.2, service_s=lambda i, b: 0.005 if i == 0 else 0.006,
                   arrivals=ArrivalProcess("uniform", rate=400, count=40), exits=exits, transfer_s=0.001)
    assert res.splits[0].batch_counts == {4: 10}
    assert res.splits[1].batch_counts == {4: 5}
    assert sum(p.batch_size for p in res.splits[0].transfers) == 20  # survivors sent across
    assert all(p.duration_s == approx(0.001) for p in res.splits[0].transfers)
    early, late = res.requests[0], res.requests[1]
    assert (early.exit_split, late.exit_split) == (0, 1)
    # r0 and r1 arrive at 0 and 2.5 ms; their batch fills at 7.5 ms and runs until 12.5 ms: r0 exits then.
    assert early.completion_s == approx(0.0125)
    # r1 survives, reaches split 1 at 13.5 ms and waits for the next batch's survivors (22.5 + 1 ms).
    assert late.completion_s == approx(0.0235 + 0.006)
    assert all(r.met_slo for r in res.requests)
    # both replicas of split 0 share its queue: batches alternate between them
    assert [len(res.replica(0, r).busy) for r in (0, 1)] == [5, 5]


def test_exits_inside_a_split_return_at_their_layer_with_per_layer_times():
    """Per-layer times: 1 ms per layer per sample. A batch of 2 on a 3-layer split where one sample exits
    at layer 0: layer 0 runs 2 samples (2 ms), layers 1-2 one sample (1 ms each). The early sample returns
    at 2 ms, the other at 4 ms, and the replica is busy 4 ms, not 6."""
    res = simulate([(0, 3)], [1], [2], slo_s=1.0, layer_s=lambda i, k, b: 0.001 * b, arrivals=[0.0, 0.0],
                   exits=[0, 2])
    assert [r.completion_s for r in res.requests] == approx([0.002, 0.004])
    assert res.replica(0, 0).busy[0].duration_s == approx(0.004)


def test_unpipelined_replicas_wait_for_their_send():
    kwargs = dict(slo_s=1.0, service_s=fixed(0.010), arrivals=[0.0, 0.0], exits=[1, 1], transfer_s=0.005)
    piped = simulate([(0, 1), (1, 2)], [1, 1], [1, 1], **kwargs)
    blocking = simulate([(0, 1), (1, 2)], [1, 1], [1, 1], pipelined=False, **kwargs)
    # second sample starts split 0 at 10 ms pipelined, at 15 ms when the replica must finish sending first
    assert piped.replica(0, 0).busy[1].start_s == approx(0.010)
    assert blocking.replica(0, 0).busy[1].start_s == approx(0.015)


def test_a_slow_replica_is_marked_a_straggler():
    res = simulate([(0, 1)], [2], [1], slo_s=1.0, service_s=fixed(0.010), arrivals=[0.0, 0.0, 0.05, 0.05],
                   replica_slowdown={(0, 1): 1.5})
    assert [r.straggler for r in res.replicas] == [False, True]
    assert res.replica(0, 1).busy[0].duration_s == approx(0.015)


def test_a_seed_determines_the_run():
    def run(seed, pattern="poisson"):
        return simulate([(0, 4), (4, 8)], [2, 1], [8, 8], slo_s=0.1, service_s=lambda i, b: 0.002 + 0.0004 * b,
                        arrivals=ArrivalProcess(pattern, rate=800, duration_s=1.0),
                        exits=BatchProfile((0.8, 0.6, 0.5, 0.5, 0.4, 0.3, 0.2, 0.0)), transfer_s=0.001, seed=seed)

    a, b = run(7), run(7)
    assert a == b and a.timeline == b.timeline
    c = run(8)
    assert [r.arrival_s for r in c.requests] != [r.arrival_s for r in a.requests]
    bursty = run(7, "bursty")
    assert bursty == run(7, "bursty") and len(bursty.requests) > 0


def test_arrival_patterns_have_the_asked_mean_rate():
    for pattern in ("uniform", "poisson", "bursty"):
        t = ArrivalProcess(pattern, rate=500, duration_s=40.0, burst_s=0.2).times(seed=1)
        assert np.all(np.diff(t) >= 0) and t.min() >= 0 and t.max() < 40.0
        assert len(t) / 40.0 == approx(500, rel=0.1), pattern
    uniform = ArrivalProcess("uniform", rate=4, count=3).times()
    assert list(uniform) == [0.0, 0.25, 0.5]
    # bursty: gaps vary far more than Poisson's (coefficient of variation 1)
    gaps = np.diff(ArrivalProcess("bursty", rate=500, duration_s=40.0, burst_s=0.2).times(seed=1))
    assert gaps.std() / gaps.mean() > 1.5


def test_results_as_a_timeline():
    res = simulate([(0, 2), (2, 4)], [1, 1], [2, 2], slo_s=0.2, service_s=fixed(0.010),
                   arrivals=[0.0, 0.001, 0.002, 0.003], exits=[3, 3, 3, 3], transfer_s=0.002, devices=["v100", "k80"])
    tl = res.timeline
    assert isinstance(tl, Timeline) and tl.source == "predicted"
    compute = tl.of_kind("compute")
    assert len(compute) == sum(len(r.busy) for r in res.replicas) == 4
    assert {s.device for s in compute} == {"v100", "k80"}
    assert tl.busy("compute") == approx(sum(r.busy_s for r in res.replicas))
    queue = tl.of_kind("queue")
    assert queue and all(s.meta["length"] > 0 for s in queue)
    assert len(tl.of_kind("comm")) == 2
    assert "traceEvents" in tl.to_chrome_trace()


class _Plan:
    """A stand-in for the optimizer's SplitPlan (only the attributes simulate_plan reads)."""
    splits = [(0, 2), (2, 4)]
    replicas = [2, 1]
    gpu_types = ["v100", "k80"]
    batch_sizes = [4, 4]
    goodput = 0.0


def test_simulate_plan_reads_a_split_plan():
    seen = []

    def layer_latency(layer, batch, gpu_type):
        seen.append(gpu_type)
        return (0.001 if gpu_type == "v100" else 0.002) * batch

    res = simulate_plan(_Plan(), layer_latency=layer_latency, slo_s=0.5, arrivals=[0.0] * 4, exits=[1, 1, 3, 3])
    assert res.splits[0].batch_counts == {4: 1} and res.splits[1].batch_counts == {2: 1}
    assert set(seen) == {"v100", "k80"} and {r.device for r in res.replicas} == {"v100", "k80"}
    # split 0: 2 layers x 4 ms; split 1: 2 layers x 2 samples x 2 ms; both r2, r3 waited for the SLO timeout
    assert res.requests[0].completion_s == approx(0.008)
    # r2, r3 wait in split 1 until 0.4 s (80% of the SLO) - 16 ms (split 1 at batch 4), then run 2 x 4 ms
    assert res.requests[2].completion_s == approx(0.384 + 0.008)
    with pytest.raises(WorkbenchError, match="no .splits"):
        simulate_plan(object(), service_s=fixed(0.01), slo_s=1.0, arrivals=[0.0])


@pytest.mark.parametrize("make, match", [
    (lambda: ArrivalProcess("poisson", rate=-5, count=10), r"arrival rate -5 must be .* > 0"),
    (lambda: ArrivalProcess("zipf", rate=5, count=10), "not one of uniform, poisson, bursty"),
    (lambda: ArrivalProcess("poisson", rate=5), "exactly one of duration_s"),
    (lambda: simulate([(0, 2)], [0], [1], slo_s=0.1, service_s=fixed(0.01), arrivals=[0.0]),
     "split 0 has replicas 0: every split needs a whole number >= 1"),
    (lambda: simulate([(0, 2)], [1], [0], slo_s=0.1, service_s=fixed(0.01), arrivals=[0.0]),
     "split 0 has batch size 0"),
    (lambda: simulate([(0, 2), (3, 4)], [1, 1], [1, 1], slo_s=0.1, service_s=fixed(0.01), arrivals=[0.0]),
     "split 1 starts at layer 3, expected 2"),
    (lambda: simulate([(0, 2)], [1, 1], [1], slo_s=0.1, service_s=fixed(0.01), arrivals=[0.0]),
     "2 replicas for 1 splits"),
    (lambda: simulate([(0, 2)], [1], [1], slo_s=0, service_s=fixed(0.01), arrivals=[0.0]), "slo_s 0 must be > 0"),
    (lambda: simulate([(0, 2)], [1], [1], slo_s=0.1, service_s=fixed(-1), arrivals=[0.0]),
     r"service_s\(0, 1\) returned -1.0"),
    (lambda: simulate([(0, 2)], [1], [1], slo_s=0.1, arrivals=[0.0]), "exactly one of service_s"),
    (lambda: simulate([(0, 2)], [1], [1], slo_s=0.1, service_s=fixed(0.01), arrivals=[0.0], exits=[2]),
     r"exit layers are whole layer numbers in 0..1"),
    (lambda: simulate([(0, 2)], [1], [1], slo_s=0.1, service_s=fixed(0.01), arrivals=[0.0, 1.0], exits=[1]),
     "1 exit layers for 2 requests"),
    (lambda: simulate([(0, 2)], [1], [1], slo_s=0.1, service_s=fixed(0.01), arrivals=[-1.0]), "seconds >= 0"),
    (lambda: simulate([(0, 1), (1, 2)], [1, 1], [1, 1], slo_s=0.1, service_s=fixed(0.01), arrivals=[0.0],
                      transfer_s=[0.1, 0.1]), "2 transfer times for 1 split boundaries"),
    (lambda: simulate([(0, 2)], [1], [1], slo_s=0.1, service_s=fixed(0.01), arrivals=[0.0], drop="maybe"),
     "drop rule 'maybe'"),
])
def test_bad_input_is_refused_clearly(make, match):
    with pytest.raises(WorkbenchError, match=match):
        make()


def test_no_requests_is_an_empty_run():
    res = simulate([(0, 2)], [1], [1], slo_s=0.1, service_s=fixed(0.01), arrivals=[])
    assert res.requests == () and res.goodput == 0 and math.isnan(res.p50_latency_s)


def test_a_batch_wait_dispatches_a_partial_batch_when_its_oldest_sample_has_waited_that_long():
    """One split, batch 4, 10 ms per batch, 50 ms wait: three requests at 0, 0.01 and 0.02 s leave together at
    0.05 + 0.01 s; a fourth at 0.1 s waits alone until 0.15 s; SLO 1 s, so E3's rule would wait far longer."""
    from workbench.earlyexit.simulator import simulate

    res = simulate([(0, 2)], [1], [4], slo_s=1.0, arrivals=[0.0, 0.01, 0.02, 0.1], service_s=lambda i, b: 0.01,
                   batch_wait_s=0.05, drop="never")
    assert [r.completion_s for r in res.requests] == pytest.approx([0.06, 0.06, 0.06, 0.16])
    assert dict(res.splits[0].batch_counts) == {3: 1, 1: 1}
    slow = simulate([(0, 2)], [1], [4], slo_s=1.0, arrivals=[0.0, 0.01, 0.02, 0.1], service_s=lambda i, b: 0.01,
                    drop="never")
    assert dict(slow.splits[0].batch_counts) == {4: 1}


def test_a_batch_wait_longer_than_the_slo_is_refused():
    from workbench.earlyexit.simulator import simulate

    with pytest.raises(WorkbenchError, match="batch_wait_s"):
        simulate([(0, 2)], [1], [4], slo_s=0.1, arrivals=[0.0], service_s=lambda i, b: 0.01, batch_wait_s=0.5)


@pytest.mark.parametrize("kwargs, message", [
    ({"count": 10**13}, r"0..1,000,000"), ({"count": float("inf")}, r"0..1,000,000"),
    ({"rate": 1e9, "duration_s": 1e6}, "at most 1,000,000"), ({"count": 2.5}, "whole number")])
def test_huge_arrival_counts_are_refused_before_any_work(kwargs, message):
    kwargs.setdefault("rate", 10.0)
    with pytest.raises(WorkbenchError, match=message):
        ArrivalProcess("poisson", **kwargs)


def test_exits_can_answer_when_the_batch_leaves_the_split():
    """One split of layers 0-1, 10 ms a layer per batch; a sample leaving at layer 0 answers at 10 ms, or at
    15 ms (layer 1 then runs for the one sample left, 5 ms) when exits answer at the split's end."""
    def layer_s(i, k, b):
        return 0.005 * b

    args = dict(slo_s=1.0, arrivals=[0.0, 0.0], layer_s=layer_s, exits=[0, 1], drop="never")
    early = simulate([(0, 2)], [1], [2], **args)
    late = simulate([(0, 2)], [1], [2], exit_at_split_end=True, **args)
    assert [r.completion_s for r in early.requests] == approx([0.010, 0.015])
    assert [r.completion_s for r in late.requests] == approx([0.015, 0.015])


def test_under_overload_the_budget_rule_keeps_serving_what_can_still_make_it():
    """Two splits of 10 ms per batch of 4, SLO 100 ms, offered 5x their capacity of 400/s: FIFO with the
    hopeless rule serves samples about to expire, which then miss downstream; the budget rule drops those
    that have spent their slack and keeps most of the capacity."""
    arrivals = ArrivalProcess("poisson", rate=2000, count=4000)
    args = dict(slo_s=0.1, arrivals=arrivals, service_s=lambda i, b: 0.01, exits=[1] * 4000)
    hopeless = simulate([(0, 1), (1, 2)], [1, 1], [4, 4], drop="hopeless", **args)
    budget = simulate([(0, 1), (1, 2)], [1, 1], [4, 4], drop="budget", **args)
    assert budget.goodput > 300 and budget.goodput > 1.5 * hopeless.goodput
    assert budget.straggler_rate == 0


def test_a_straggling_replica_is_excluded_after_its_first_batches_and_the_others_take_its_share():
    """One split, two replicas, 10 ms a batch of 1; replica 1 runs 4x slower. Excluded after 2 batches, it
    serves exactly 2 and the fast replica serves the rest; the last replica of a split is never excluded."""
    args = dict(slo_s=1.0, arrivals=ArrivalProcess("uniform", rate=60, count=300), service_s=lambda i, b: 0.01,
                replica_slowdown={(0, 1): 4.0}, drop="never")
    marked = simulate([(0, 2)], [2], [1], **args)
    excluded = simulate([(0, 2)], [2], [1], exclude_stragglers_after=2, **args)
    slow = [r for r in excluded.replicas if r.replica == 1][0]
    assert len(slow.busy) == 2 and slow.straggler and slow.excluded_s == approx(slow.busy[-1].end_s)
    assert [r.excluded_s for r in marked.replicas] == [None, None]
    assert excluded.p95_latency_s < marked.p95_latency_s
    alone = simulate([(0, 2)], [1], [1], slo_s=1.0, arrivals=[0.0, 0.1, 0.2, 0.3], service_s=lambda i, b: 0.01,
                     replica_slowdown={(0, 0): 4.0}, exclude_stragglers_after=1)
    assert alone.replicas[0].excluded_s is None and len(alone.replicas[0].busy) == 4


def test_exclusion_needs_a_whole_number_of_batches():
    with pytest.raises(WorkbenchError, match="number of batches >= 1"):
        simulate([(0, 2)], [1], [1], slo_s=1.0, arrivals=[0.0], service_s=lambda i, b: 0.01,
                 exclude_stragglers_after=0)


def test_a_queue_per_replica_as_ray_serve_routes():
    """``queues="replica"``: each request goes to the shorter queue of two replicas drawn at random, and each
    replica batches its own queue. With one replica per split nothing changes; with two, each replica's batch
    fills at half the rate, so requests wait longer for a full batch than from one shared queue."""
    kwargs = dict(slo_s=1.0, arrivals=ArrivalProcess("uniform", rate=100, count=200), service_s=lambda i, b: 0.004,
                  slack=0.2, seed=3)
    one_split = simulate([(0, 2)], [1], [4], queues="split", **kwargs)
    one_replica = simulate([(0, 2)], [1], [4], queues="replica", **kwargs)
    assert [r.completion_s for r in one_split.requests] == [r.completion_s for r in one_replica.requests]
    shared = simulate([(0, 2)], [2], [4], queues="split", **kwargs)
    own = simulate([(0, 2)], [2], [4], queues="replica", **kwargs)
    assert own.p50_latency_s > 1.5 * shared.p50_latency_s
    assert all(r.latency_s is not None for r in own.requests)
    assert sum(s.batch_counts.get(4, 0) for s in own.splits) >= 40
    with pytest.raises(WorkbenchError, match="queues is 'split' or 'replica'"):
        simulate([(0, 2)], [1], [4], queues="node", **kwargs)
