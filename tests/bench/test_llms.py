import math

import pytest

from workbench import bench
from workbench.bench import llms
from workbench.data import heldout_text
from workbench.models.decoder import decoder_tokenizer, load_decoder


@pytest.fixture(scope="module")
def model():
    return load_decoder()


def test_raw_chunks_score_as_the_plain_decoder_and_2_bits_worse_than_8(model):
    ids = decoder_tokenizer().encode(heldout_text(1))
    windows = llms.perplexity_windows(ids, 64, 24, limit=2)
    assert len(windows) == 2 and all(len(w) == 64 + 24 + 1 for w in windows)
    got = llms.kv_perplexity(model, windows, 64, settings=("plain", 32, 8, 2))
    assert got[32][0] == pytest.approx(got["plain"][0], rel=1e-5)
    assert got[32][1] == got["plain"][1] == 4 * 2 * 30 * 3 * 64 * 64         # float32 K and V of 64 tokens
    assert got[2][0] > got[8][0] and got[2][1] < got[8][1]


def test_windows_do_not_overlap_and_stop_at_the_limit():
    windows = llms.perplexity_windows(list(range(100)), 16, 8, limit=3)
    assert windows == [list(range(0, 25)), list(range(25, 50)), list(range(50, 75))]
    assert llms.perplexity_windows(list(range(20)), 16, 8) == []


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


@pytest.mark.slow
def test_quick_bench_makes_every_table():
    tables = bench.run_benchmark("llms", ["--quick"])
    assert set(tables) == set(llms.TABLES)
    assert {r["method"] for r in tables["switching"]} == set(llms.METHODS)
    assert len(tables["switching"]) == len(llms.METHODS) * len(llms.QUICK["contexts"])
    assert [r["method"] for r in tables["ablation"]] == list(llms.ABLATIONS)
    assert len(tables["active_contexts"]) == 3 * len(llms.METHODS)
    assert {r["setting"] for r in tables["perplexity"]} == {str(s) for s in llms.PPL_SETTINGS}
    for row in tables["switching"]:
        assert row["mean_switch_ms"] >= 0 and row["calls"] == llms.QUICK["calls"] * row["contexts"]
    load = tables["load"]
    assert len(load) == 1 and load[0]["problems"] == 0
    assert load[0]["answered"] == llms.QUICK["load_clients"] * llms.QUICK["load_calls"] and load[0]["calls_per_s"] > 0
