import math

import pytest

from workbench import bench
from workbench.kvcache import bench as llms
from workbench.kvcache import perplexity as ppl


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
    rows = {r["device"]: r for r in llms.paper_scale_table(fake)}
    assert set(rows) == set(llms.SWAP_PRESETS)
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

    assert llms.most_contexts(latency, 10.0, cap=32) == 9
    assert asked[:4] == [2, 4, 8, 16] and set(asked[4:]) <= set(range(9, 16)) and len(asked) <= 8
    assert llms.most_contexts(latency, 100.0, cap=24) == 24                   # never past the cap
    assert llms.most_contexts(lambda n: math.inf, 10.0, cap=8) == 0


def test_switching_ratios_average_each_method_over_every_cell():
    rows = [{"method": m, "mean_switch_ms": v} for m, v in
            (("llms", 1.0), ("vllm_sq", 4.0), ("vllm_s", 6.0), ("swapping", 8.0), ("lmk", 30.0),
             ("llms", 3.0), ("vllm_sq", 16.0), ("vllm_s", 6.0), ("swapping", 8.0), ("lmk", 50.0))]
    assert llms.switching_ratios(rows) == {"llms": 1.0, "vllm_sq": 5.0, "vllm_s": 3.0, "swapping": 4.0, "lmk": 20.0}


def test_each_switching_cell_starts_with_the_next_method_and_rows_keep_the_methods_order(monkeypatch):
    """The first replay after a new trace runs cold; rotating the order spreads that over the methods
    (catches a table that always runs LLMS first, or rows that follow the run order)."""
    from types import SimpleNamespace

    from workbench.kvcache import replay
    from workbench.kvcache.replays import METHODS

    order = []

    class Replays:
        opts = SimpleNamespace(patterns=["markov", "random"], contexts=[2, 4, 8], device="orin-nx", max_new_tokens=4,
                               budget=0.375)
        model = None

        def trace(self, n, pattern):
            return (n, pattern)

        def budget(self, fraction):
            return 1000

        def run(self, method, n, pattern, budget):
            order.append(method)
            return SimpleNamespace(mean_switch_s=lambda: 1.0 + METHODS.index(method))

    monkeypatch.setattr(replay, "working_set_bytes", lambda *a, **k: 1e6)
    monkeypatch.setattr(llms, "_summary_of", lambda result: {"mean_switch_ms": 1e3 * result.mean_switch_s()})
    rows = llms.switching_table(Replays())
    firsts = order[::len(METHODS)]
    assert firsts == [METHODS[k % len(METHODS)] for k in range(6)]
    assert all(sorted(order[i:i + len(METHODS)]) == sorted(METHODS) for i in range(0, len(order), len(METHODS)))
    assert [r["method"] for r in rows] == list(METHODS) * 6
    assert [(r["pattern"], r["contexts"]) for r in rows[::len(METHODS)]] == [(p, n) for p in ("markov", "random")
                                                                             for n in (2, 4, 8)]
    assert [r["ratio_to_llms"] for r in rows[:len(METHODS)]] == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_the_bench_states_the_speeds_its_device_replays_at():
    """An emulated preset follows the host's cached profile, so a run prints what its device read and
    recomputed at, and says how to measure the host again (a host run has nothing to add)."""
    from dataclasses import replace

    from workbench.kvcache.costmodel import SwapCostModel

    costs = SwapCostModel(device="orin-nx", source="emulated", num_layers=30, chunk_size=16,
                          chunk_bytes={8: 2_000_000, 4: 1_000_000}, recompute_fixed_s=0.005,
                          recompute_per_chunk_s=0.010, io_fixed_s=0.0, read_bytes_per_s=100e6)
    line = llms.device_line(costs, model=None)
    assert line.startswith("device orin-nx (emulated): an 8-bit chunk read in 20.00 ms (100.0 MB/s), "
                           "recomputed in 5 ms + 10 ms per chunk; derived from this host's cached swap profile")
    assert "workbench kvcache costs --remeasure" in line
    host = llms.device_line(replace(costs, device="host", source="measured", io_fixed_s=0.02), model=None)
    assert host == "device host (measured): an 8-bit chunk read in 40.00 ms (50.0 MB/s), recomputed in 5 ms + 10 ms per chunk"


@pytest.mark.slow
@pytest.mark.integration
def test_quick_bench_makes_every_table():
    tables = bench.run_benchmark("llms", ["--quick"])
    assert set(tables) == set(llms.TABLES)
    assert {r["method"] for r in tables["switching"]} == set(llms.METHODS)
    assert len(tables["switching"]) == len(llms.METHODS) * len(llms.QUICK["contexts"])
    assert [r["method"] for r in tables["ablation"]] == list(llms.ABLATIONS)
    assert len(tables["active_contexts"]) == 3 * len(llms.METHODS)
    assert {r["setting"] for r in tables["perplexity"]} == {str(s) for s in ppl.PPL_SETTINGS}
    paper = tables["paper_scale"]
    assert [r["device"] for r in paper] == list(llms.SWAP_PRESETS)
    for row in paper:                      # priced by a cost model: never slower with the pipeline, never past 1 + 1/R
        assert 1.0 <= row["without_over_with"] <= row["bound"] + 1e-9
        assert "not measured" in row["source"]
    for row in tables["switching"]:
        assert row["mean_switch_ms"] >= 0 and row["calls"] == llms.QUICK["calls"] * row["contexts"]
    http = {(r["scenario"], r["server"]): r for r in tables["http"]}
    assert set(http) == {(s, v) for s in ("conversation", "interleaved") for v in ("llms", "reprocess")}
    for scenario in ("conversation", "interleaved"):
        reuse, whole = http[(scenario, "llms")], http[(scenario, "reprocess")]
        assert whole["processed_tokens"] == whole["prompt_tokens"]           # nothing reused without context reuse
        assert reuse["processed_tokens"] < reuse["prompt_tokens"]            # later turns continue their context
        assert reuse["turns"] == whole["turns"]
        assert reuse["ttft_mean_ms"] > 0 and whole["ttft_mean_ms"] > 0
    assert http[("interleaved", "llms")]["conversations"] == llms.QUICK["http_conversations"]
    load = tables["load"]
    assert len(load) == 1 and load[0]["problems"] == 0
    assert load[0]["answered"] == llms.QUICK["load_clients"] * llms.QUICK["load_calls"] and load[0]["calls_per_s"] > 0
