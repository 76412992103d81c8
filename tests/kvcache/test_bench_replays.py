"""The replayed tables of `workbench bench llms`, on stand-in replays: what each table computes from them, the
order the switching table runs them in, and the line that states the device."""
import math

import pytest

from workbench.kvcache import bench_replays as replays


def test_the_paper_scale_table_prices_each_load_of_a_replay_at_llama2_dimensions():
    """A replay whose one later call brought back 256 chunks at 8 bits and one with 40 at mixed levels:
    on the TX2 (R 10.3) the pipeline recomputes some and beats reading everything, within 1 + 1/R."""
    from types import SimpleNamespace

    from workbench.kvcache.records import CallRecord, ReplayResult

    def call(i, context, bits):
        return CallRecord(index=i, time_s=i, context=context, switch_s=0.0, io_s=0.0, recompute_s=0.0,
                          inference_s=0.0, queue_wait_s=0.0, chunks_missing=len(bits), chunks_loaded=0,
                          chunks_recomputed=0, bytes_read=0, memory_bytes=0, output="", missing_bits=bits)

    result = ReplayResult(method="llms", device="orin-nx", memory_budget_bytes=1, contexts=2, pattern="markov",
                          calls=(call(0, 0, ()), call(1, 1, ()), call(2, 0, (8,) * 256),
                                 call(3, 1, (8, 4, 2, 2) * 10)))
    fake = SimpleNamespace(opts=SimpleNamespace(patterns=["markov"], reference_contexts=2, budget=0.5),
                           budget=lambda fraction: 1, run=lambda *args: result)
    rows = {r["device"]: r for r in replays.paper_scale_table(fake)}
    assert set(rows) == set(replays.SWAP_PRESETS)
    tx2 = rows["jetson-tx2"]
    assert tx2["loads"] == 2 and tx2["chunks_per_load"] == 148 and tx2["chunks_recomputed"] > 0
    assert 1.0 < tx2["without_over_with"] <= tx2["bound"] == pytest.approx(1 + 1 / 10.29, abs=2e-3)
    assert tx2["mean_switch_read_all_ms"] == pytest.approx(1e3 * (256 * 4_194_304 + 10 * 4_194_304 * 2) / 0.1e9 / 2)
    assert rows["mi14"]["without_over_with"] >= 1.0 and tx2["paper_ratio"] == pytest.approx(6.0)


def test_the_search_doubles_then_bisects_for_the_last_count_under_the_threshold():
    asked = []

    def latency(n):
        asked.append(n)
        return float(n)                                                        # ms, growing with the count

    assert replays.most_contexts(latency, 10.0, cap=32) == 9
    assert asked[:4] == [2, 4, 8, 16] and set(asked[4:]) <= set(range(9, 16)) and len(asked) <= 8
    assert replays.most_contexts(latency, 100.0, cap=24) == 24                   # never past the cap
    assert replays.most_contexts(lambda n: math.inf, 10.0, cap=8) == 0


def test_switching_ratios_average_each_method_over_every_cell():
    rows = [{"method": m, "mean_switch_ms": v} for m, v in
            (("llms", 1.0), ("vllm_sq", 4.0), ("vllm_s", 6.0), ("swapping", 8.0), ("lmk", 30.0),
             ("llms", 3.0), ("vllm_sq", 16.0), ("vllm_s", 6.0), ("swapping", 8.0), ("lmk", 50.0))]
    assert replays.switching_ratios(rows) == {"llms": 1.0, "vllm_sq": 5.0, "vllm_s": 3.0, "swapping": 4.0, "lmk": 20.0}


def _fake_replay(method, contexts, switches_ms, missing=0):
    """A replay whose calls alternate over ``contexts`` contexts: first uses, then later calls switching in
    ``switches_ms`` (the first later call bringing ``missing`` chunks back)."""
    from workbench.kvcache.records import CallRecord, ReplayResult

    def call(i, context, switch_ms, missing):
        return CallRecord(index=i, time_s=i, context=context, switch_s=switch_ms / 1e3, io_s=0.0, recompute_s=0.0,
                          inference_s=0.0, queue_wait_s=0.0, chunks_missing=missing, chunks_loaded=missing,
                          chunks_recomputed=0, bytes_read=0, memory_bytes=0, output="")

    calls = [call(i, i, 0.0, 0) for i in range(contexts)]
    calls += [call(contexts + i, i % contexts, v, missing if i == 0 else 0) for i, v in enumerate(switches_ms)]
    return ReplayResult(method=method, device="orin-nx", memory_budget_bytes=1000, contexts=contexts,
                        pattern="markov", settings={"budget_raised": False}, calls=tuple(calls))


def test_each_switching_cell_starts_with_the_next_method_and_a_cell_that_fits_is_replayed_in_interleaved_rounds(
        monkeypatch):
    """The first replay after a new trace runs cold; rotating the order spreads that over the methods. A
    cell where nothing is brought back is replayed --fit-rounds times, each round every method once, starting
    with the next; its rows pool every round. Catches a table that always runs LLMS first, rows that follow the
    run order, rounds run one method after another, rounds for a cell that reads, or a mean of one round."""
    from types import SimpleNamespace

    import numpy as np

    from workbench.kvcache import replay
    from workbench.kvcache.replays import METHODS

    order = []

    def switches(method, n, rnd):                       # ms: LLMS 0.30 + round; vllm_sq a hair faster; lmk far
        base = {"llms": 0.30, "vllm_sq": 0.297, "lmk": 0.05}.get(method, 0.5 + METHODS.index(method))
        return [base + 0.01 * rnd + 0.002 * j for j in range(4)]

    class Replays:
        opts = SimpleNamespace(patterns=["markov", "random"], contexts=[2, 4, 8], device="orin-nx", max_new_tokens=4,
                               budget=0.375, fit_rounds=3)
        model = None

        def trace(self, n, pattern):
            return (n, pattern)

        def budget(self, fraction):
            return 1000

        def run(self, method, n, pattern, budget, round=0):
            order.append((method, n, pattern, round))
            return _fake_replay(method, n, switches(method, n, round), missing=1 if n == 8 else 0)

    monkeypatch.setattr(replay, "working_set_bytes", lambda *a, **k: 1e6)
    rows = replays.switching_table(Replays())
    cells = [(n, p) for p in ("markov", "random") for n in (2, 4, 8)]
    runs = [[(m, r) for m, n, p, r in order if (n, p) == cell] for cell in cells]
    m = len(METHODS)
    for k, (cell, ran) in enumerate(zip(cells, runs)):
        rounds = 1 if cell[0] == 8 else 3
        assert len(ran) == rounds * m
        for r in range(rounds):                          # round by round, every method once, the next one first
            assert [x[1] for x in ran[r * m:(r + 1) * m]] == [r] * m
            assert ran[r * m][0] == METHODS[(k + r) % m]
            assert sorted(x[0] for x in ran[r * m:(r + 1) * m]) == sorted(METHODS)
    assert [r["method"] for r in rows] == list(METHODS) * 6
    assert [(r["pattern"], r["contexts"]) for r in rows[::m]] == [(p, n) for n, p in cells]
    llms_row, sq_row = rows[0], rows[1]
    pooled = [v for rnd in range(3) for v in switches("llms", 2, rnd)]
    assert llms_row["rounds"] == 3 and llms_row["mean_switch_ms"] == pytest.approx(np.mean(pooled))
    assert llms_row["switch_sem_ms"] == pytest.approx(np.std(pooled, ddof=1) / np.sqrt(len(pooled)))
    assert sq_row["ratio_to_llms"] == pytest.approx(np.mean([v - 0.003 for v in pooled]) / np.mean(pooled))
    assert rows[2 * m]["rounds"] == 1 and rows[2 * m]["contexts"] == 8
    ahead = {(r["pattern"], r["contexts"], r["method"]): beyond for r, beyond in replays.baselines_ahead(rows)}
    assert set(ahead) == {(p, n, b) for n, p in cells for b in ("vllm_sq", "lmk")}
    assert ahead[("markov", 2, "lmk")] and not ahead[("markov", 2, "vllm_sq")]


def test_the_bench_states_the_speeds_its_device_replays_at():
    """An emulated preset follows the host's cached profile, so a run prints what its device read and
    recomputed at, and says how to measure the host again (a host run has nothing to add)."""
    from dataclasses import replace

    from workbench.kvcache.costmodel import SwapCostModel

    costs = SwapCostModel(device="orin-nx", source="emulated", num_layers=30, chunk_size=16,
                          chunk_bytes={8: 2_000_000, 4: 1_000_000}, recompute_fixed_s=0.005,
                          recompute_per_chunk_s=0.010, io_fixed_s=0.0, read_bytes_per_s=100e6)
    line = replays.device_line(costs, model=None)
    assert line.startswith("device orin-nx (emulated): an 8-bit chunk read in 20.00 ms (100.0 MB/s), "
                           "recomputed in 5 ms + 10 ms per chunk; derived from this host's cached swap profile")
    assert "workbench kvcache costs --remeasure" in line
    host = replays.device_line(replace(costs, device="host", source="measured", io_fixed_s=0.02), model=None)
    assert host == "device host (measured): an 8-bit chunk read in 40.00 ms (50.0 MB/s), recomputed in 5 ms + 10 ms per chunk"
