import itertools
import json
import math

import numpy as np
import pytest

from workbench.errors import UnknownNameError, WorkbenchError
from workbench.kvcache.costmodel import (
    SWAP_PRESETS, SwapCostModel, device_cost_model, fit_linear, paper_chunk_times, paper_cost_model,
    paper_recompute_line, pipeline_bound)
from workbench.kvcache import planner
from workbench.kvcache.planner import fixed_plan, plan_swap_recompute

CHUNK_BYTES = {32: 4000, 8: 1000, 4: 500, 2: 250}


def costs(a=0.0, b=0.0, c=0.0, bandwidth=1e6, k=0.0, layers=30, **extra) -> SwapCostModel:
    return SwapCostModel(device="host", source="measured", num_layers=layers, chunk_size=16, chunk_bytes=CHUNK_BYTES,
                         recompute_fixed_s=a, recompute_per_chunk_s=b, io_fixed_s=c, read_bytes_per_s=bandwidth,
                         io_per_chunk_s=k, **extra)


def brute_force(model: SwapCostModel, missing) -> float:
    """Equation 4 over every subset of chunks to recompute (not only per-level counts)."""
    best = math.inf
    for r in range(len(missing) + 1):
        for chosen in itertools.combinations(missing, r):
            loaded = sum(m[2] for m in missing) - sum(m[2] for m in chosen)
            best = min(best, max(model.t_re(r), model.t_io(loaded, len(missing) - r)))
    return best


@pytest.mark.parametrize("seed", range(25))
def test_the_plan_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    missing = []
    for i in rng.permutation(12)[:n]:
        bits = int(rng.choice([8, 4, 2]))
        size = CHUNK_BYTES[bits] if rng.random() < 0.8 else CHUNK_BYTES[bits] // 4      # a short tail chunk
        missing.append((int(i), bits, size))
    model = costs(a=float(rng.choice([0, rng.random() * 0.01])), b=float(rng.random() * 0.01),
                  c=float(rng.choice([0, rng.random() * 0.01])), bandwidth=float(rng.uniform(5e4, 1e6)),
                  k=float(rng.choice([0, rng.random() * 0.003])))
    plan = plan_swap_recompute(model, missing)
    best = brute_force(model, missing)
    assert plan.objective_s == pytest.approx(best, rel=1e-6, abs=1e-12)
    assert max(plan.recompute_s, plan.load_s) == pytest.approx(best, rel=1e-6, abs=1e-12)
    assert sorted(plan.recompute + plan.load) == sorted(m[0] for m in missing)
    assert plan.load_bytes == sum(m[2] for m in missing if m[0] in plan.load)
    for bits in {m[1] for m in missing}:              # within a level and size, the earliest chunks are recomputed
        for size in {m[2] for m in missing if m[1] == bits}:
            group = sorted(m[0] for m in missing if m[1:] == (bits, size))
            chosen = [i for i in group if i in plan.recompute]
            assert chosen == group[:len(chosen)]


def test_free_io_recomputes_nothing_and_free_recompute_recomputes_everything():
    missing = [(0, 8, 1000), (3, 4, 500), (5, 2, 250)]
    no_io = plan_swap_recompute(costs(a=0.01, b=0.01, bandwidth=math.inf), missing)
    assert no_io.recompute == () and no_io.load == (0, 3, 5) and no_io.predicted_s == 0.0
    no_compute = plan_swap_recompute(costs(c=0.01, bandwidth=1e3), missing)
    assert no_compute.recompute == (0, 3, 5) and no_compute.load == () and no_compute.load_bytes == 0
    assert no_compute.recompute_counts == {8: 1, 4: 1, 2: 1} == no_compute.missing_counts


def test_a_single_chunk_may_be_recomputed():
    """The paper's bound x_w < count_w, read literally, would forbid this; it is read as <=."""
    plan = plan_swap_recompute(costs(b=0.001, bandwidth=1e3), [(4, 8, 1000)])
    assert plan.recompute == (4,) and plan.objective_s == pytest.approx(0.001)


def test_worked_example():
    """a = 10 ms, b = 45 ms per chunk; c = 2 ms, 100 MB/s. Four 8-bit chunks of 1 MB (0, 2, 4, 6) and four
    4-bit chunks of 0.5 MB (1, 3, 5, 7): 6 MB in all.
    Load all: 2 + 60 = 62 ms. Recompute one 8-bit chunk: max(10 + 45, 2 + 50) = 55 ms. Recompute one
    4-bit chunk: max(55, 2 + 55) = 57 ms. Recompute two: 10 + 90 = 100 ms. Best: chunk 0, 55 ms.
    In a pipeline of 30 layers the fill (the first layer's read, 1.7 ms) keeps it below 62 ms."""
    model = costs(a=0.010, b=0.045, c=0.002, bandwidth=100e6, layers=30)
    missing = [(i, 8 if i % 2 == 0 else 4, 1_000_000 if i % 2 == 0 else 500_000) for i in range(8)]
    plan = plan_swap_recompute(model, missing)
    assert plan.recompute == (0,) and plan.load == (1, 2, 3, 4, 5, 6, 7)
    assert plan.recompute_counts == {8: 1, 4: 0} and plan.missing_counts == {8: 4, 4: 4}
    assert plan.load_bytes == 5_000_000
    assert plan.objective_s == pytest.approx(0.055) and plan.recompute_s == pytest.approx(0.055)
    assert plan.load_s == pytest.approx(0.052) and plan.predicted_s == pytest.approx(0.052 / 30 + 0.055)


def test_with_two_layers_the_fill_makes_reading_everything_the_plan():
    """The same example in a pipeline of two layers: reads of 26 ms each, recompute of 27.5 ms each, the
    first waiting for layer 0's read, so the split ends at 81 ms; equation 4 leaves the fill out and
    still picks chunk 0, but reading everything (62 ms) is faster and is the plan."""
    model = costs(a=0.010, b=0.045, c=0.002, bandwidth=100e6, layers=2)
    missing = [(i, 8 if i % 2 == 0 else 4, 1_000_000 if i % 2 == 0 else 500_000) for i in range(8)]
    assert planner.solve_counts(model, [500_000, 1_000_000], [4, 4]) == ([0, 1], pytest.approx(0.055))
    split = planner.pipeline_timeline(model, 1, 5_000_000, 7)
    got = [(s.lane, s.kind, s.label, round(s.start, 6), round(s.end, 6)) for s in split.spans]
    assert got == [("io", "swap_in", "layer 0", 0.0, 0.026), ("compute", "stall", "wait for layer 0", 0.0, 0.026),
                   ("compute", "recompute", "layer 0", 0.026, 0.0535), ("io", "swap_in", "layer 1", 0.026, 0.052),
                   ("compute", "recompute", "layer 1", 0.0535, 0.081)]
    assert split.source == "predicted" and {s.device for s in split.spans} == {"host"}
    plan = plan_swap_recompute(model, missing)
    assert plan.recompute == () and plan.predicted_s == pytest.approx(0.062) and plan.predicted_s < split.end


def test_edge_cases_are_named_or_empty():
    empty = plan_swap_recompute(costs(a=1, b=1, c=1), [])
    assert empty.recompute == empty.load == () and empty.predicted_s == 0 and empty.timeline.spans == ()
    with pytest.raises(WorkbenchError, match="chunk 2 is listed twice"):
        plan_swap_recompute(costs(), [(2, 8, 1000), (2, 4, 500)])
    with pytest.raises(WorkbenchError, match="read bandwidth > 0"):
        costs(bandwidth=0)


def test_lines_fit_the_points_and_doing_nothing_costs_nothing():
    assert fit_linear([(1, 0.3), (2, 0.5), (4, 0.9)]) == pytest.approx((0.1, 0.2))
    assert fit_linear([(1, 0.05), (2, 0.2), (4, 0.5)])[0] == 0.0        # no negative intercept
    reads = [(n, n * size, 0.002 + 0.0005 * n + n * size / 1e9) for n in (1, 2, 4, 8) for size in (230_400, 92_160)]
    assert fit_linear(reads) == pytest.approx((0.002, 0.0005, 1e-9), rel=1e-6)
    model = costs(a=0.1, b=0.2, c=0.01, bandwidth=1e3, k=0.001)
    assert model.t_re(0) == model.t_io(0, 0) == 0 and model.t_re(3) == pytest.approx(0.7)
    assert model.t_io(500, 2) == pytest.approx(0.512) and model.t_io(500) == pytest.approx(0.511)
    assert SwapCostModel.from_dict(json.loads(json.dumps(model.to_dict()))) == model


HOST = costs(a=0.05, b=0.03, c=0.0005, bandwidth=0.8e9, k=0.0004, recompute_points=((1, 0.08), (8, 0.29)))


B_MI14 = (22.92 - 0.05) / 256
RHO = 0.05 / B_MI14                                                  # the paper's fixed over per-chunk recompute


def test_presets_keep_the_papers_proportions_and_never_run_faster_than_the_host():
    a, b, how = paper_recompute_line("mi14")
    assert (a, b) == (pytest.approx(0.05), pytest.approx(B_MI14)) and "Figure 2" in how
    recompute_s, load_s, how = paper_chunk_times("mi14")
    assert recompute_s == pytest.approx(B_MI14) and load_s == pytest.approx(4_194_304 / 2e9)
    ratios = {}
    for name in SWAP_PRESETS:
        dev = device_cost_model(name, HOST)
        recompute_s, load_s, _ = paper_chunk_times(name)
        ratios[name] = dev.recompute_to_load_ratio(8)
        assert ratios[name] == pytest.approx(recompute_s / load_s)
        assert dev.recompute_fixed_s / dev.recompute_per_chunk_s == pytest.approx(RHO)
        assert dev.source == "emulated" and dev.device == name and dev.title and "proportions" in dev.notes
        for x in range(1, 20):
            assert dev.t_re(x) >= HOST.t_re(x) * (1 - 1e-12)
        for mix in itertools.chain.from_iterable(itertools.combinations_with_replacement((32, 8, 4, 2), n)
                                                 for n in (1, 2, 3, 10)):
            nbytes = sum(CHUNK_BYTES[b] for b in mix)                  # every load of whole chunks
            assert dev.t_io(nbytes, len(mix)) >= HOST.t_io(nbytes, len(mix)) * (1 - 1e-12)
        # bound by bandwidth, as the paper's 4 MB chunks: a 2-bit chunk takes a quarter of an 8-bit one here
        assert dev.t_io(CHUNK_BYTES[2], 1) == pytest.approx(dev.t_io(CHUNK_BYTES[8], 1) / 4)
        # as fast as the host allows: the recompute slope, a line at or above the host's, or R reads
        assert dev.recompute_per_chunk_s == pytest.approx(max(
            HOST.recompute_per_chunk_s, HOST.t_re(1) / (1 + RHO),
            ratios[name] * max(HOST.t_io(n, 1) / n for n in HOST.chunk_bytes.values()) * CHUNK_BYTES[8]))
    assert ratios["mi14"] == pytest.approx(42.6, abs=0.1)
    assert ratios["orin-nx"] == pytest.approx(19.3, abs=0.1)
    assert ratios["jetson-tx2"] == pytest.approx(10.3, abs=0.1)
    assert device_cost_model("host", HOST) is HOST
    with pytest.raises(UnknownNameError, match="unknown swap device preset 'pixel'"):
        device_cost_model("pixel", HOST)


def test_a_host_with_slow_reads_is_emulated_by_slowing_its_recompute():
    slow_disk = costs(a=0.0, b=0.01, c=0.0, bandwidth=1e6)           # 1 ms per 8-bit chunk: ratio 10 < 42.6
    dev = device_cost_model("mi14", slow_disk)
    assert dev.t_io(1000) == pytest.approx(slow_disk.t_io(1000))
    assert dev.recompute_per_chunk_s == pytest.approx(B_MI14 / (4_194_304 / 2e9) * 0.001)
    assert dev.t_re(1) == pytest.approx(dev.recompute_per_chunk_s * (1 + RHO))


def test_emulated_presets_decide_differently_from_the_host():
    """On the host recompute is 1000x dearer than a read, so nothing is recomputed; with the paper's ratio R
    and fixed term rho b, (N - rho R) / (R + 1) of N chunks are (both sides then take as long), fewer where
    the disk is fast relative to compute. On MI14 (R 42.6) that saves 2 % of the load, less than the
    pipeline's fill (a thirtieth of the recompute), so reading everything is the plan there."""
    missing = [(i, 8, 1000) for i in range(200)]
    host = costs(a=0.0, b=0.03, c=0.0, bandwidth=1e3 / 3e-5, layers=30)
    assert plan_swap_recompute(host, missing).recompute == ()
    counts, expected = {}, {}
    for name in SWAP_PRESETS:
        dev = device_cost_model(name, host)
        r = dev.recompute_to_load_ratio(8)
        counts[name] = len(plan_swap_recompute(dev, missing).recompute)
        expected[name] = pytest.approx((200 - RHO * r) / (r + 1), abs=1) if name != "mi14" else 0
    assert counts == expected
    assert counts["jetson-tx2"] > counts["orin-nx"] > counts["mi14"] == 0


def test_at_the_papers_dimensions_the_pipeline_buys_at_most_one_over_r():
    """Llama2-7B's 4 MB chunks priced with the paper's figures: the planner's best load of many chunks is
    reading all of them shortened by about 1 / (R + 1), never more than the bound 1 + 1/R."""
    for name in SWAP_PRESETS:
        paper = paper_cost_model(name)
        assert paper.source == "paper" and paper.num_layers == 32 and paper.chunk_bytes[8] == 4_194_304
        assert paper.chunk_bytes[2] == 1_048_576 and paper.chunk_bytes[16] == 8_388_608
        missing = [(i, 8, paper.chunk_bytes[8]) for i in range(256)]
        plan = plan_swap_recompute(paper, missing)
        read_all = paper.t_io(256 * paper.chunk_bytes[8], 256)
        bound = pipeline_bound(paper)
        assert bound == pytest.approx(1 + 1 / paper_chunk_times(name)[0] * paper_chunk_times(name)[1])
        assert 1.0 <= read_all / plan.predicted_s <= bound + 1e-9       # never slower than reading everything
    assert pipeline_bound(paper_cost_model("mi14")) == pytest.approx(1 + 1 / 42.6, abs=1e-3)


def test_the_solver_is_skipped_only_when_reading_everything_is_optimal(monkeypatch):
    missing = [(i, 8, 1000) for i in range(6)]
    dear = costs(a=1.0, b=0.1, bandwidth=1e5)                 # one recompute (1.1 s) > reading all six (0.06 s)
    cheap = costs(b=0.001, bandwidth=1e4)                      # recomputing some is better
    solved = plan_swap_recompute(cheap, missing)
    assert solved.recompute and solved.objective_s == pytest.approx(brute_force(cheap, missing))

    def no_solver(*args):
        raise AssertionError("the solver ran")

    monkeypatch.setattr(planner, "solve_counts", no_solver)
    plan = plan_swap_recompute(dear, missing)
    assert plan.recompute == () and plan.load == tuple(range(6))
    assert plan.objective_s == pytest.approx(brute_force(dear, missing)) == pytest.approx(dear.t_io(6000, 6))
    with pytest.raises(AssertionError, match="the solver ran"):
        plan_swap_recompute(cheap, missing)


def test_a_fixed_plan_takes_the_chunks_as_given():
    model = costs(a=0.01, b=0.02, c=0.001, bandwidth=1e6)
    plan = fixed_plan(model, [(3, 4, 500)], [(0, 8, 1000), (5, 2, 250)])
    assert (plan.recompute, plan.load, plan.load_bytes) == ((3,), (0, 5), 1250)
    assert plan.recompute_counts == {4: 1} and plan.missing_counts == {4: 1, 8: 1, 2: 1}
    assert plan.objective_s == pytest.approx(max(model.t_re(1), model.t_io(1250, 2)))
    with pytest.raises(WorkbenchError, match="chunk 3 is listed twice"):
        fixed_plan(model, [(3, 4, 500)], [(3, 4, 500)])


def test_the_loader_hands_the_planner_typed_chunks_with_their_bytes_as_stored():
    from workbench.kvcache.loader import ChunkSpec
    from workbench.kvcache.planner import MissingChunk
    from workbench.kvcache.swapfile import file_size

    shape = (30, 2, 3, 16, 64)
    got = ChunkSpec(bits=4, shape=shape, path=None).missing(3)
    assert got == MissingChunk(index=3, bits=4, nbytes=file_size(4, shape)) and got.nbytes > 0
    assert file_size(4, shape) < file_size(8, shape)
