"""`workbench partition plan|run` from the command line: what they print, and bad input refused in one line."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workbench.partition.cost import SHAPES
from workbench.partition.plan import devices_like, plan_partition


def workbench(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.integration
def test_plan_prints_every_scheme_as_the_cost_model_predicts():
    done = workbench("partition", "plan", "--devices", "6", "--seq-len", "120", "--bandwidth-mbit", "200", "--json")
    assert done.returncode == 0, done.stderr
    plans = {p["scheme"]: p for p in json.loads(done.stdout)["plans"]}
    assert set(plans) == {"voltage", "tensor_parallel", "torch_tp", "pipeline", "single"}
    expected = plan_partition("voltage", SHAPES["encoder"], 120, devices_like(6, bandwidth_mbit=200)).predicted_s
    assert abs(plans["voltage"]["predicted_ms"] - 1e3 * expected) < 1e-6
    assert plans["tensor_parallel"]["sent_bytes_per_layer"][0] == 4 * plans["voltage"]["sent_bytes_per_layer"][0]


@pytest.mark.integration
def test_run_on_real_processes_matches_the_model_and_the_cost_models_bytes(tmp_path):
    trace = tmp_path / "trace.json"
    done = workbench("partition", "run", "--devices", "2", "--seq-len", "32", "--repeats", "1", "--mode", "unlimited",
                     "--trace", str(trace), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)                     # only JSON on stdout; progress on stderr
    assert summary["max_abs_diff_hidden"] < 2e-4
    assert summary["counted_sent_bytes_layer0"] == summary["predicted_sent_bytes_layer0"] == [16 * 384 * 4] * 2
    assert json.loads(trace.read_text())["traceEvents"]


@pytest.mark.integration
def test_bad_input_is_one_line_before_anything_starts():
    for args, message in ((("--devices", "0"), "must be at least 1 devices"),
                          (("--bandwidth-mbit", "0"), "must be more than 0 Mbit/s"),
                          (("--seq-len", "100000000"), "must be at most 8192 positions"),
                          (("--latency-ms", "nan"), "expected a finite number")):
        done = workbench("partition", "plan", *args)
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = workbench("partition", "run", "--devices", "100000")
    assert done.returncode == 2 and "worker processes" in done.stderr
    done = workbench("partition", "plan", "--devices", "5", "--seq-len", "3")
    assert done.returncode != 0 and "shorter than the 5 devices" in done.stderr
