from workbench.elastic.evaluate import PAPER_NAMES, CellResult, summarize
from workbench.elastic.baselines import METHODS


def cell(method, acc, preload, measured=150.0, device="odroid-n2", target=150.0):
    return CellResult(device=device, target_ms=target, method=method, n=3, m=4, mean_bits=6.0, accuracy=acc,
                      preload_mb=preload, resident_mb=40.0, memory_mb=preload + 40.0, predicted_ms=149.0,
                      measured_ms=measured, measured_max_ms=measured, runs=5, valid=True, plan_ms=1.0)


def test_summary_flags_latency_accuracy_and_memory():
    cells = [cell("Ours", 0.80, 1.0, measured=160.0), cell("StdPL-6", 0.85, 0.0), cell("Load&Exec", 0.70, 0.0),
             cell("PreloadModel-32", 0.90, 40.0), cell("PreloadModel-6", 0.90, 8.0)]
    s = summarize(cells, noise=0.01)
    assert s["latency_over_5pct"] == [("odroid-n2", 150.0, 160.0)]
    assert s["accuracy_shortfalls"] == [("odroid-n2", 150.0, "StdPL-6", 0.85, 0.80)]   # more memory is not a rival
    assert s["memory_ratio"]["PreloadModel-32"]["shard_memory"] == 40.0
    assert s["memory_ratio"]["PreloadModel-6"]["total_memory"] == 48.0 / 41.0


def test_host_latency_is_not_held_to_the_emulation_bound_and_names_map_to_the_paper():
    assert summarize([cell("Ours", 0.8, 1.0, measured=500, device="host")], 0.01)["latency_over_5pct"] == []
    assert set(PAPER_NAMES) == set(METHODS)
