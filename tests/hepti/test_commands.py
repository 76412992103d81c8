"""`workbench hepti plan|run` (and the alias `workbench partition hepti`): what they print, and bad input refused
in one line before anything starts."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workbench.models.shapes import SHAPES


def workbench(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.integration
def test_plan_prints_the_partitioners_decision_and_the_alias_the_same():
    from workbench.devices import get_cluster
    from workbench.hepti import hepti_partition
    from workbench.hepti.run import shape_of

    done = workbench("hepti", "plan", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    expected = hepti_partition(get_cluster("hepti").devices, shape_of(SHAPES["encoder"], 128), num_layers=6)
    assert out["mode"] == expected.mode and out["sizes"] == list(expected.sizes)
    assert abs(out["predicted_ms"] - 1e3 * expected.predicted_latency_s) < 1e-9
    assert "measured_ms" not in out
    assert json.loads(workbench("partition", "hepti", "--json").stdout) == out
    even = json.loads(workbench("hepti", "plan", "--shares", "even", "--json").stdout)
    assert even["shares"] == [0.25] * 4 and even["predicted_ms"] > out["predicted_ms"]


def test_run_runs_plan_does_not_and_the_alias_asks_for_run():
    from workbench.cli import build_parser

    parse = build_parser().parse_args
    assert parse(["hepti", "run"]).run is True
    assert parse(["hepti", "plan"]).run is False
    assert parse(["partition", "hepti"]).run is False and parse(["partition", "hepti", "--run"]).run is True
    run = parse(["hepti", "run", "--kill", "rpi4-b:2", "--memory-falls", "rpi4-a:1:10", "--measured"])
    assert run.kill == ("rpi4-b", 2) and run.memory_falls == [("rpi4-a", (1, 10e6))] and run.measured


def _dropped_by_the_default_plan() -> list[str]:
    from workbench.devices import get_cluster
    from workbench.hepti import hepti_partition
    from workbench.hepti.run import shape_of

    devices = get_cluster("hepti").devices
    part = hepti_partition(devices, shape_of(SHAPES["encoder"], 128), num_layers=6)
    dropped = [d.name for d, n in zip(devices, part.sizes) if not n]
    assert dropped, "the hepti cluster's default plan leaves its slowest device out (rpi3); pick a case that drops one"
    return dropped


def one_line(done, message, args=()):
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, \
        (args, done.stderr)


@pytest.mark.integration
def test_bad_input_is_refused_in_one_line():
    for args, message in ((("run", "--memory-falls", "rpi3:x:5"), "expected DEVICE:LAYER:MB"),
                          (("run", "--kill", "rpi3"), "expected DEVICE:LAYER"),
                          (("plan", "--deadline-ms", "0"), "must be more than 0 ms"),
                          (("plan", "--kill", "rpi4-b:2"), "unrecognized arguments: --kill"),
                          (("run", "--kill", "laptop:2"), "no device 'laptop' in cluster hepti"),
                          (("run", "--kill", "rpi4-b:99"), "the layer must be 0 to 5 (encoder has 6 layers)"),
                          (("run", "--memory-falls", "rpi4-b:6:10"), "the layer must be 0 to 5"),
                          (("plan", "--seq-len", "8192"), "sequence length must be 1 to 512 positions for encoder"),
                          *[(("run", "--kill", f"{name}:2"), f"{name} takes no part in the plan")
                            for name in _dropped_by_the_default_plan()]):
        one_line(workbench("hepti", *args), message, args)
    done = workbench("hepti", "plan", "--deadline-ms", "1")
    assert done.returncode != 0 and "best reachable is" in done.stderr


@pytest.mark.integration
def test_the_alias_refuses_run_options_without_run():
    for args, message in ((("--kill", "rpi4-b:2"), "--kill acts on a run: add --run"),
                          (("--memory-falls", "rpi4-b:2:10"), "--memory-falls acts on a run: add --run"),
                          (("--measured",), "--measured acts on a run: add --run"),
                          (("--run", "--kill", "rpi4-b:99"), "the layer must be 0 to 5")):
        one_line(workbench("partition", "hepti", *args), message, args)
