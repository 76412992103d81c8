"""`workbench earlyexit accuracy|plan|simulate|serve`: what they print, and bad input refused in one line."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from workbench.cli import main
from workbench.earlyexit.artifacts import load_record
from workbench.earlyexit.scenario import Scenario
from workbench.prepare import preset_notice

NOTICE = preset_notice("quick")


def workbench(*args, timeout=300, preset=("--preset", "quick"), env=None):
    return subprocess.run([sys.executable, "-m", "workbench.cli", "earlyexit", *args, *preset],
                          capture_output=True, text=True, timeout=timeout, env=env)


def said_once(stderr: str) -> bool:
    """The quick-preset line is on stderr, once."""
    return stderr.splitlines().count(NOTICE) == 1


@pytest.mark.integration
def test_accuracy_prints_the_records_table(prepared):
    done = workbench("accuracy", "--task", "bbc", "--json")
    assert done.returncode == 0, done.stderr
    assert said_once(done.stderr), done.stderr
    out = json.loads(done.stdout)
    rec = load_record("bbc", "quick")
    assert out["stock_accuracy"] == rec.stock_accuracy()
    assert [r["accuracy"] for r in out["thresholds"]] == [r["accuracy"] for r in rec.table()]
    assert out["thresholds"][-1]["threshold"] > 1.609      # ln 5: up to where everyone leaves at once


@pytest.mark.integration
def test_plan_prints_the_scenarios_plan(prepared):
    done = workbench("plan", "--gpus", "v100=2,k80=3", "--slo-ms", "40", "--mix", "50:50", "--threshold", "0.6",
                     "--json")
    assert done.returncode == 0, done.stderr
    assert said_once(done.stderr), done.stderr
    plan = json.loads(done.stdout)["plan"]
    expected = Scenario(preset="quick", gpus={"v100": 2, "k80": 3}, slo_s=0.04, easy=0.5, threshold=0.6).optimize()
    assert plan["splits"] == [list(s) for s in expected.splits] and plan["replicas"] == expected.replicas
    assert plan["goodput"] == expected.goodput


@pytest.mark.integration
def test_an_slo_no_plan_meets_prints_why_and_exits_2(prepared):
    done = workbench("plan", "--slo-ms", "0.01")
    assert done.returncode == 2
    assert "\nno plan:" in done.stdout and "raise the SLO" in done.stdout
    assert said_once(done.stderr), done.stderr       # the plan was made from quick artifacts all the same


@pytest.mark.integration
def test_simulate_writes_a_trace(prepared, tmp_path):
    trace = tmp_path / "sim.json"
    done = workbench("simulate", "--requests", "300", "--pattern", "bursty", "--trace", str(trace), "--json")
    assert done.returncode == 0, done.stderr
    assert said_once(done.stderr), done.stderr
    assert json.loads(done.stdout)["simulated"]["goodput"] > 0
    assert json.loads(trace.read_text())["traceEvents"]


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
def test_the_quick_preset_from_the_environment_is_said_too(prepared):
    done = workbench("plan", "--json", preset=(), env={**os.environ, "WORKBENCH_PRESET": "quick"})
    assert done.returncode == 0, done.stderr
    assert said_once(done.stderr), done.stderr
    json.loads(done.stdout)                           # stdout stays JSON: the line goes to stderr


@pytest.mark.parametrize("preset, said", [("quick", True), ("full", False)])
def test_serve_says_the_quick_preset_after_its_run(preset, said, monkeypatch, capsys):
    from workbench.earlyexit import realrun

    asked = {}

    def fake_run(**kwargs):                          # the run itself is test_realrun's; here only what is printed
        asked.update(kwargs)
        return SimpleNamespace(plan=SimpleNamespace(explain=lambda: "a plan"), lines=lambda: ["served"], equal=True)

    monkeypatch.setattr(realrun, "real_run", fake_run)
    assert main(["earlyexit", "serve", "--preset", preset]) == 0
    out, err = capsys.readouterr()
    assert asked["preset"] == preset and out == "a plan\nserved\n"
    assert err.splitlines() == ([NOTICE] if said else [])


# ---------------------------------------------------------------- bad input: one line, exit 2, nothing heavy

CHILD = textwrap.dedent("""
    import contextlib, io, json, sys
    from workbench.cli import main

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(sys.argv[1:])
    except SystemExit as stop:
        code = stop.code
    # what is loaded at the moment the input was refused: the command ends there
    heavy = sorted(m for m in ("torch", "ray", "transformers") if m in sys.modules)
    print(json.dumps({"code": code, "err": err.getvalue(), "heavy": heavy}))
""")


def refused(*argv) -> dict:
    """``workbench earlyexit *argv`` in a fresh interpreter: its exit code, stderr and which heavy modules it
    had imported when it stopped."""
    done = subprocess.run([sys.executable, "-c", CHILD, "earlyexit", *argv], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def usage(command: str, option: str, message: str) -> str:
    return (f"workbench earlyexit {command}: error: argument {option}: {message} "
            f"(see `workbench earlyexit {command} --help`)")


GPUS_EXAMPLE = "(e.g. v100=6,p100=8)"
MIX_FORM = ("a mix is EASY:HARD, two percentages of 0 or more that sum to 100 (e.g. 80:20), or the easy share in "
            "0..1 (e.g. 0.8)")
ADDRESS_FORM = "a Ray address is HOST:PORT with a port in 1..65535 (e.g. 127.0.0.1:6379), ray://HOST:PORT or auto"

BAD_INPUT = [
    (("plan", "--gpus", "v100=6,v100=2"), usage(
        "plan", "--gpus", f"GPU type v100 is given twice (v100=6 and v100=2): give each type once, TYPE=COUNT "
                          f"{GPUS_EXAMPLE}")),
    (("simulate", "--gpus", "h100=2"), usage(
        "simulate", "--gpus", f"unknown GPU type 'h100': GPUs are TYPE=COUNT with TYPE one of a6000, v100, p100, "
                              f"k80, host {GPUS_EXAMPLE}")),
    (("plan", "--gpus", "v100=0,k80=0"), usage(
        "plan", "--gpus", f"no GPUs: give a count above 0 for at least one type {GPUS_EXAMPLE}; a plan needs "
                          f"somewhere to run")),
    (("plan", "--mix", "80:30"), usage("plan", "--mix", f"{MIX_FORM}; got '80:30', which sums to 110")),
    (("simulate", "--mix=-20:120"), usage("simulate", "--mix", f"{MIX_FORM}; got '-20:120', a negative part")),
    (("serve", "--mix", "1.5"), usage("serve", "--mix", f"{MIX_FORM}; got '1.5', an easy share outside 0..1")),
    (("serve", "--address", "nowhere"), usage("serve", "--address", f"{ADDRESS_FORM}; got 'nowhere'")),
    (("serve", "--address", "127.0.0.1:0"), usage("serve", "--address", f"{ADDRESS_FORM}; got '127.0.0.1:0'")),
    (("serve", "--address", "head:65536"), usage("serve", "--address", f"{ADDRESS_FORM}; got 'head:65536'")),
    (("serve", "--address", "http://head:6379"),
     usage("serve", "--address", f"{ADDRESS_FORM}; got 'http://head:6379'")),
]


@pytest.mark.parametrize("argv, line", BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
@pytest.mark.integration
def test_bad_input_is_one_usage_line_before_ray_or_torch_load(argv, line):
    got = refused(*argv)
    assert got["code"] == 2 and got["err"].strip() == line, got
    assert got["heavy"] == [], f"refused only after importing {got['heavy']}"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]                      # closed when the block ends: nothing listens there


@pytest.mark.parametrize("scheme, flag", [("", "--port"), ("ray://", "--ray-client-server-port")])
@pytest.mark.integration
def test_an_address_where_nothing_answers_is_one_usage_line_before_ray_or_torch_load(scheme, flag):
    port = _closed_port()
    address = f"{scheme}127.0.0.1:{port}"
    got = refused("serve", "--address", address)
    assert got["code"] == 2 and got["err"].strip() == usage(
        "serve", "--address", f"no Ray cluster answers at {address} (Connection refused); start one on that "
                              f"machine with `ray start --head {flag}={port}`, or leave out --address to start a "
                              f"local one"), got
    assert got["heavy"] == [], f"refused only after importing {got['heavy']}"


@pytest.mark.integration
def test_good_forms_pass_the_parse():
    from workbench.earlyexit.commands import _mix, ray_address_problem
    from workbench.earlyexit.scenario import parse_gpus

    assert _mix("80:20") == 0.8 and _mix("0.8") == 0.8 and _mix("100:0") == 1.0
    assert _mix("33.3:66.7") == pytest.approx(0.333)
    assert parse_gpus("v100=6, p100=8,k80=0") == {"v100": 6, "p100": 8, "k80": 0}
    assert ray_address_problem("auto") is None
    with socket.socket() as server:                     # something that answers
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert ray_address_problem(f"127.0.0.1:{port}") is None
        assert ray_address_problem(f"ray://localhost:{port}") is None
