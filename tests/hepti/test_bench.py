"""`workbench bench hepti`: the quick benchmark's tables on disk, and what they must say whatever the host's
speed: every real run equals the model in one process, counts the bytes its schedule says, the predictions
are the engine's own, the memory fall switches the mode and the fault names the killed device."""
import csv
import json

import pytest

from workbench import bench
from workbench.hepti import bench as bh
from workbench.hepti import bench_runs as br
from workbench.hepti.plan import hepti_partition
from workbench.distributed.shares import proportional_shares

COLUMNS = {
    "lp": ["K", "case", "mode", "grid", "participants", "dropped", "repeats", "median_ms", "p95_ms", "min_ms", "max_ms",
           "bare_lp_ms", "over_bare_lp", "within_target", "heuristic_ms", "predicted_ms", "heuristic_predicted_ms",
           "heuristic_participants", "relaxation_predicted_ms", "primary_share"],
    "modes": ["mode", "run", "K", "T", "grid", "shares", "repeats", "predicted_ms", "schedule_ms", "measured_ms", "min_ms",
              "max_ms", "error_pct", "schedule_error_pct", "reports_ms", "decide_ms", "error_without_runtime_pct",
              "sent_B", "collective_sent_B", "scheduled_sent_B", "counted_equal_schedule", "decisions", "faults",
              "max_abs_diff"],
    "shares": ["scenario", "mode", "shares_kind", "shares", "repeats", "predicted_ms", "schedule_ms", "measured_ms",
               "error_pct", "sent_B", "scheduled_sent_B", "counted_equal_schedule", "faults", "max_abs_diff", "note"],
    "switch": ["device", "fall_layer", "free_MB", "ws_needs_MB", "switched", "switch_layer", "from_mode", "to_mode",
               "why", "repeats", "baseline_ms", "switched_ms", "cost_ms", "schedule_baseline_ms", "schedule_switched_ms",
               "schedule_cost_ms", "runtime_cost_ms", "unexplained_ms", "decide_ms", "max_abs_diff"],
    "fault": ["device", "kill_layer", "mode", "faults", "fault", "named_device", "resumed_layer", "devices_after",
              "redecision", "repeats", "baseline_ms", "fault_latency_ms", "time_lost_ms", "inference_before_kill_ms",
              "detection_ms", "restart_ms", "resumed_run_ms", "charged_to_cut_run_ms", "max_abs_diff"],
}


def test_quick_replaces_the_sizes_and_bad_combinations_stop_before_any_work(capsys):
    opts = bh.options(["--quick"])
    assert opts.repeats == 1 and opts.scenarios == ["unequal"] and opts.seq_len == bh.QUICK["seq_len"]
    for bad in (["--bandwidths-mbit", "1000"], ["--kill-device", "4"], ["--speeds-gflops", "3"],
                ["--fall-layer", "0"], ["--seq-len", "3"]):
        with pytest.raises(SystemExit) as stop:
            bh.options(bad)
        assert stop.value.code == 2
    assert "--bandwidths-mbit" in capsys.readouterr().err


def test_the_lp_devices_differ_and_the_short_case_solves_the_tiled_modes():
    """Short of memory, the tiled modes; from 16 devices the rule would say 2D-tiled, but the mixed-integer
    optimum over those links takes fewer than 16 part, so 1D-tiled (2D over all 64 predicts 30x slower)."""
    opts = bh.options([])
    shape, L = br._shape(opts)
    for K, tiled in ((4, "1d"), (16, "1d"), (64, "1d")):
        ample, short = bh.lp_devices(K, "ample", 0, shape, L), bh.lp_devices(K, "short", 0, shape, L)
        assert len({d.flops_per_s for d in ample}) == len({d.net_bytes_per_s for d in ample}) == K
        assert hepti_partition(ample, shape, num_layers=L).mode == "ws"
        assert hepti_partition(short, shape, num_layers=L).mode == tiled
    devices = br.run_devices(opts, "memory-short")
    assert hepti_partition(devices, shape, num_layers=L).mode == "1d"


@pytest.mark.slow
@pytest.mark.integration
def test_quick_bench_writes_every_table_and_its_runs_equal_the_model(tmp_cache):
    from workbench.bench.results import results_root

    tables = bench.run_benchmark("hepti", ["--quick"])
    assert set(tables) == set(bh.TABLES)
    for name, columns in COLUMNS.items():                       # on disk, labelled a quick run
        path = results_root() / "quick" / f"hepti-{name}.csv"
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert list(rows[0]) == columns and len(rows) == len(tables[name]), name
        label = json.loads(path.with_suffix(".json").read_text())
        assert label["run"] == "quick" and label["command"] == "workbench bench hepti --quick"

    opts = bh.options(["--quick"])
    shape, L = br._shape(opts)
    lp = tables["lp"]
    assert [(r["K"], r["case"]) for r in lp] == [(K, c) for K in (4, 16) for c in bh.LP_CASES]
    for r in lp:
        assert 0 < r["min_ms"] <= r["median_ms"] <= r["p95_ms"] <= r["max_ms"] and r["repeats"] == bh.QUICK["lp_repeats"]
        part = hepti_partition(bh.lp_devices(r["K"], r["case"], 0, shape, L), shape, num_layers=L)
        assert r["mode"] == part.mode and r["predicted_ms"] == pytest.approx(1e3 * part.predicted_latency_s)
        old = hepti_partition(bh.lp_devices(r["K"], r["case"], 0, shape, L), shape, num_layers=L, solver="lp")
        assert r["heuristic_predicted_ms"] == pytest.approx(1e3 * old.predicted_latency_s)
        assert r["predicted_ms"] <= r["heuristic_predicted_ms"] * (1 + 1e-9) or r["mode"] == "2d"
        assert r["over_bare_lp"] == pytest.approx(r["median_ms"] / r["bare_lp_ms"])
    assert {(r["K"], r["mode"]) for r in lp if r["case"] == "short"} == {(4, "1d"), (16, "1d")}

    devices = br.run_devices(opts)
    modes = {r["mode"]: r for r in tables["modes"]}
    assert set(modes) == set(br.RUN_MODES)
    for mode, r in modes.items():
        part = hepti_partition(devices, shape, num_layers=L, mode=mode)
        assert r["predicted_ms"] == pytest.approx(1e3 * part.predicted_latency_s)
        assert r["error_pct"] == pytest.approx(100 * (r["measured_ms"] / r["predicted_ms"] - 1))
        assert r["counted_equal_schedule"] and r["decisions"] == 1 and r["faults"] == 0
        assert r["max_abs_diff"] < 1e-3 and r["measured_ms"] > 0 and r["run"] == "replayed"
    assert modes["2d"]["grid"] == "2x2"

    shares = {r["shares_kind"]: r for r in tables["shares"]}
    assert set(shares) == set(br.SHARES) and {r["scenario"] for r in tables["shares"]} == {"unequal"}
    fixed = {"hepti": None, "even": [0.25] * 4, "proportional": list(proportional_shares(devices))}
    for kind, r in shares.items():
        part = hepti_partition(devices, shape, num_layers=L, mode=r["mode"], fixed_shares=fixed[kind])
        assert r["predicted_ms"] == pytest.approx(1e3 * part.predicted_latency_s)
        assert r["max_abs_diff"] < 1e-3 and r["counted_equal_schedule"] and r["sent_B"] > 0 and r["faults"] == 0
    assert shares["hepti"]["predicted_ms"] <= min(shares["even"]["predicted_ms"], shares["proportional"]["predicted_ms"])

    (switch,) = tables["switch"]
    assert switch["switched"] and switch["switch_layer"] == opts.fall_layer
    assert (switch["from_mode"], switch["to_mode"]) == ("ws", "1d") and "free memory fell" in switch["why"]
    assert switch["max_abs_diff"] < 1e-3 and switch["decide_ms"] > 0
    assert switch["schedule_switched_ms"] > switch["schedule_baseline_ms"]      # 1d after the switch: slower here
    assert switch["cost_ms"] == pytest.approx(switch["switched_ms"] - switch["baseline_ms"])

    (fault,) = tables["fault"]
    killed = devices[opts.kill_device].name
    assert fault["device"] == killed and fault["named_device"] and f"({killed})" in fault["fault"]
    assert fault["faults"] == 1 and fault["resumed_layer"] == opts.kill_layer and fault["devices_after"] == 3
    assert fault["max_abs_diff"] < 1e-3 and fault["restart_ms"] > 0 and fault["detection_ms"] > 0
