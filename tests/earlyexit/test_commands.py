"""`workbench earlyexit accuracy|plan|simulate|serve`: what they print, and bad input refused in one line."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

from workbench.earlyexit.artifacts import load_record
from workbench.earlyexit.scenario import Scenario


def workbench(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "workbench.cli", "earlyexit", *args, "--preset", "quick"],
                          capture_output=True, text=True, timeout=timeout)


def test_accuracy_prints_the_records_table(prepared):
    done = workbench("accuracy", "--task", "bbc", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    rec = load_record("bbc", "quick")
    assert out["stock_accuracy"] == rec.stock_accuracy()
    assert [r["accuracy"] for r in out["thresholds"]] == [r["accuracy"] for r in rec.table()]
    assert out["thresholds"][-1]["threshold"] > 1.609      # ln 5: up to where everyone leaves at once


def test_plan_prints_the_scenarios_plan(prepared):
    done = workbench("plan", "--gpus", "v100=2,k80=3", "--slo-ms", "40", "--mix", "50:50", "--threshold", "0.6",
                     "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)["plan"]
    expected = Scenario(preset="quick", gpus={"v100": 2, "k80": 3}, slo_s=0.04, easy=0.5, threshold=0.6).optimize()
    assert plan["splits"] == [list(s) for s in expected.splits] and plan["replicas"] == expected.replicas
    assert plan["goodput"] == expected.goodput


def test_an_slo_no_plan_meets_prints_why_and_exits_2(prepared):
    done = workbench("plan", "--slo-ms", "0.01")
    assert done.returncode == 2
    assert "\nno plan:" in done.stdout and "raise the SLO" in done.stdout


def test_simulate_writes_a_trace(prepared, tmp_path):
    trace = tmp_path / "sim.json"
    done = workbench("simulate", "--requests", "300", "--pattern", "bursty", "--trace", str(trace), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["simulated"]["goodput"] > 0
    assert json.loads(trace.read_text())["traceEvents"]


def test_bad_input_is_one_line_before_anything_starts():
    for args, message in ((("plan", "--gpus", "v100=0"), "no GPUs"),
                          (("plan", "--gpus", "h100=2"), "unknown GPU type"),
                          (("plan", "--mix", "80:x"), "a mix is EASY:HARD"),
                          (("plan", "--batch-size", "65"), "at most 64"),
                          (("simulate", "--rate", "-5"), "must be more than 0"),
                          (("plan", "--disable", "5"), "cannot be disabled"),
                          (("serve", "--requests", "0"), "at least 1")):
        done = workbench(*args)
        assert done.returncode == 2 or (done.returncode == 1 and message == "cannot be disabled"), done
        assert message in done.stderr, (args, done.stderr)


def test_a_ray_address_that_does_not_answer_is_named_within_seconds(prepared):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]         # closed when the block ends: nothing listens there
    start = time.monotonic()
    done = workbench("serve", "--address", f"127.0.0.1:{port}", timeout=120)
    assert done.returncode != 0
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in done.stderr
    assert "ray start --head" in done.stderr
    assert time.monotonic() - start < 60
