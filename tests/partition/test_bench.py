"""`workbench bench partition`: the quick benchmark's tables on disk, and what they must say whatever the host's
speed: Voltage's bytes a quarter of tensor parallelism's on even splits, counted equal to the cost model, the
attention table's orders Theorem 2's, every prediction the engine's own."""
import csv
import json
import math

import pytest

from workbench import bench
from workbench.partition import bench as pb
from workbench.partition.cost import SHAPES, attention_flops, attention_order
from workbench.partition.plan import devices_like, plan_partition
from workbench.partition.ratio import paper_ratio_device, paper_speed_gflops

COLUMNS = {
    "bytes": ["model", "N", "K", "device", "even_split", "voltage_sent_B", "voltage_received_B", "tp_sent_B",
              "tp_received_B", "torch_tp_sent_B", "tp_over_voltage", "model_voltage_sent_B", "model_tp_sent_B",
              "voltage_input_sent_B", "voltage_last_layer_sent_B", "counted_equal_model", "same_every_layer"],
    "attention": ["H", "F_H", "N", "K", "P", "order", "full_ms", "ours_ms", "naive_ms", "speedup_ours",
                  "speedup_naive", "naive_over_ours", "model_speedup_ours", "model_naive_over_ours", "layer_ms",
                  "partitioned_layer_ms", "repeats"],
    "latency": ["model", "mode", "links", "K", "bandwidth_mbit", "link_mbit", "device", "device_gflops",
                "half_peak_tokens", "scheme", "repeats", "latency_ms", "min_ms", "max_ms",
                "predicted_ms", "error_pct", "counted_bytes_equal_model", "sent_kB_per_device_layer",
                "wire_over_counted"],
    "cost_model": ["model", "K", "bandwidth_mbit", "scheme", "predicted_ms", "compute_ms", "comm_ms",
                   "sent_kB_per_device_layer", "reduction_vs_single_pct"],
}


def test_p_is_n_over_k_rounded_half_up():
    assert [pb.rows_of(100, k) for k in range(1, 9)] == [100, 50, 33, 25, 20, 17, 14, 13]
    assert pb.rows_of(300, 8) == 38 and pb.rows_of(5, 8) == 1


def test_quick_replaces_the_sizes_and_bad_combinations_stop_before_any_work(capsys):
    opts = pb.options(["--quick"])
    assert opts.ks == pb.QUICK["ks"] and opts.bandwidth_k == 4 and opts.paper_ks == [] and opts.measured_bandwidths == []
    assert pb.options(["--bandwidths", "300"]).measured_bandwidths == [300.0]
    for bad in (["--bytes-ks", "1"], ["--seq-len", "3", "--ks", "4"]):
        with pytest.raises(SystemExit) as stop:
            pb.options(bad)
        assert stop.value.code == 2
    assert "--bytes-ks" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.integration
def test_quick_bench_writes_every_table_and_counts_the_papers_bytes(tmp_cache):
    from workbench.bench.results import results_root

    tables = bench.run_benchmark("partition", ["--quick"])
    assert set(tables) == set(pb.TABLES)
    for name, columns in COLUMNS.items():                       # on disk, labelled a quick run
        path = results_root() / "quick" / f"partition-{name}.csv"
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert list(rows[0]) == columns and len(rows) == len(tables[name]), name
        label = json.loads(path.with_suffix(".json").read_text())
        assert label["run"] == "quick" and label["command"] == "workbench bench partition --quick"

    N, F = 128, SHAPES["encoder"].hidden
    counted = tables["bytes"]
    assert sorted({(r["K"], r["device"]) for r in counted}) == [(K, d) for K in pb.QUICK["bytes_ks"] for d in range(K)]
    for r in counted:
        assert r["even_split"] and r["counted_equal_model"] and r["same_every_layer"]
        per_device = (r["K"] - 1) * (N // r["K"]) * F * 4             # (K-1)NF/K float32 elements
        assert r["voltage_sent_B"] == r["voltage_received_B"] == r["model_voltage_sent_B"] == per_device
        assert r["tp_sent_B"] == r["tp_received_B"] == r["model_tp_sent_B"] == 4 * per_device
        assert r["tp_over_voltage"] == 4 and r["torch_tp_sent_B"] == r["tp_sent_B"]
        terminal = r["device"] == 0                                 # Algorithm 2: the input out, the last rows in
        assert r["voltage_input_sent_B"] == ((r["K"] - 1) * N * F * 4 if terminal else 0)
        assert r["voltage_last_layer_sent_B"] == (0 if terminal else N // r["K"] * F * 4)

    latency = tables["latency"]
    emulated = {(r["K"], r["bandwidth_mbit"], r["scheme"]): r for r in latency if r["mode"] == "replay"}
    expected = {(K, 500.0, s) for K in pb.QUICK["ks"] for s in pb.SCHEMES}
    expected |= {(pb.QUICK["bandwidth_k"], b, s) for b in pb.QUICK["bandwidths"] for s in pb.SCHEMES}
    assert set(emulated) == expected                       # 12 heads and 1536 columns divide by 2 and 4
    from workbench.partition.runtime import limits_problem

    shaped = [r for r in latency if r["mode"] == "measured"]
    assert all(r["links"] == "shaped" for r in shaped) and all(r["links"] == "emulated" for r in emulated.values())
    assert {(r["K"], r["scheme"]) for r in shaped} == ({(2, s) for s in pb.SCHEMES} if limits_problem() is None
                                                       else set())
    paper = paper_speed_gflops()
    for r in latency:
        if r["mode"] == "measured":      # at the paper's ratio: the named bandwidth is the paper's, slowed for the run
            device = paper_ratio_device(r["device_gflops"], half_peak_tokens=r["half_peak_tokens"], paper_gflops=paper)
            assert r["device"] == "edge-vm-ratio" and r["device_gflops"] == 10 and r["half_peak_tokens"] >= 0
            assert r["link_mbit"] == pytest.approx(r["bandwidth_mbit"] * 10 / paper)
        else:
            device = "edge-vm"
            assert r["link_mbit"] == r["bandwidth_mbit"] and r["device"] == device
        plan = plan_partition(r["scheme"], SHAPES[r["model"]], N,
                              devices_like(r["K"], device, bandwidth_mbit=r["link_mbit"]))
        assert r["predicted_ms"] == pytest.approx(1e3 * plan.predicted_s)
        assert r["counted_bytes_equal_model"] and r["repeats"] == pb.QUICK["repeats"]
        if r["mode"] == "measured" and r["sent_kB_per_device_layer"] > 0:
            # off the veths: the counted bytes, 4.6 % of TCP/IP framing (1514 bytes on the wire per 1448), up to
            # 2.3 % of acknowledgements for as much received (66 bytes per two segments, on slow links where none
            # are coalesced: 1.069 at 29 Mbit/s), and a few kB of gloo's own messages per run (its barrier and
            # handshakes), which weigh most where a rank sends least
            least = min(t.sent for t in plan.total_traffic() if t.sent)
            assert 1.0 <= r["wire_over_counted"] <= 1.075 + 16384 / least, (r, least)
        else:
            assert math.isnan(r["wire_over_counted"])
        assert 0 < r["min_ms"] <= r["latency_ms"] <= r["max_ms"]
        assert r["error_pct"] == pytest.approx(100 * (r["latency_ms"] / r["predicted_ms"] - 1))
    assert all(emulated[(K, 500.0, "single")]["sent_kB_per_device_layer"] == 0 for K in pb.QUICK["ks"])
    for scheme in ("voltage", "tensor_parallel"):     # the input and the last rows are in Voltage's total
        plan = plan_partition(scheme, SHAPES["encoder"], N, devices_like(4))
        assert emulated[(4, 500.0, scheme)]["sent_kB_per_device_layer"] == \
            pytest.approx(sum(t.sent for t in plan.total_traffic()) / 4 / 6 / 1e3)

    attention = tables["attention"]
    assert len(attention) == len(pb.ATTENTION_LAYERS) * len(pb.QUICK["attention_ns"]) * 8
    for r in attention:
        assert r["H"] * r["F_H"] == 1024 and r["P"] == pb.rows_of(r["N"], r["K"])
        assert r["order"] == attention_order(r["N"], r["P"], 1024, r["F_H"])           # Theorem 2's
        ours = attention_flops(r["order"], r["N"], r["P"], 1024, r["F_H"])
        assert r["model_naive_over_ours"] == pytest.approx(attention_flops("qk_first", r["N"], r["P"], 1024, r["F_H"]) / ours)
        assert r["model_speedup_ours"] == pytest.approx(attention_flops("qk_first", r["N"], r["N"], 1024, r["F_H"]) / ours)
        assert r["naive_over_ours"] == pytest.approx(r["naive_ms"] / r["ours_ms"]) and min(r["full_ms"], r["ours_ms"]) > 0
        # which order is faster is this host's timing, printed by the benchmark, not asserted here (two timings a
        # few % apart swap under load); that each order runs exactly the products Gamma counts is
        # tests/partition/test_layers.py's
        assert r["layer_ms"] > 0 and r["partitioned_layer_ms"] > 0
    assert {r["order"] for r in attention if r["K"] == 1} == {"qk_first"}
    assert {r["order"] for r in attention if r["F_H"] == 256 and r["K"] > 1} == {"x_first"}

    model = tables["cost_model"]
    assert {r["model"] for r in model} == {"encoder", "bert-large", "gpt2"}
    assert not [r for r in model if r["scheme"] == "torch_tp" and r["K"] == 5]            # 5 divides neither
    for r in model:
        if r["scheme"] == "single" or r["K"] == 1:
            assert r["reduction_vs_single_pct"] == 0 and r["comm_ms"] == 0
    six = {r["scheme"]: r for r in model if r["model"] == "bert-large" and r["K"] == 6 and r["bandwidth_mbit"] == 500}
    single = plan_partition("single", SHAPES["bert-large"], N, devices_like(6)).predicted_s
    voltage = plan_partition("voltage", SHAPES["bert-large"], N, devices_like(6)).predicted_s
    assert six["voltage"]["reduction_vs_single_pct"] == pytest.approx(100 * (1 - voltage / single))
    assert not math.isnan(six["tensor_parallel"]["sent_kB_per_device_layer"])
