import pytest

from workbench import bench
from workbench.kvcache import bench as llms
from workbench.kvcache import bench_replays as replays
from workbench.kvcache import perplexity as ppl


@pytest.mark.slow
@pytest.mark.integration
def test_quick_bench_makes_every_table():
    tables = bench.run_benchmark("llms", ["--quick"])
    assert set(tables) == set(llms.TABLES)
    assert {r["method"] for r in tables["switching"]} == set(replays.METHODS)
    assert len(tables["switching"]) == len(replays.METHODS) * len(llms.QUICK["contexts"])
    assert [r["method"] for r in tables["ablation"]] == list(replays.ABLATIONS)
    assert len(tables["active_contexts"]) == 3 * len(replays.METHODS)
    assert {r["setting"] for r in tables["perplexity"]} == {str(s) for s in ppl.PPL_SETTINGS}
    paper = tables["paper_scale"]
    assert [r["device"] for r in paper] == list(replays.SWAP_PRESETS)
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
