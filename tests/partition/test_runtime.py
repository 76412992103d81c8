"""The runtime on real gloo processes: every scheme equals the model in one process, bytes are counted as the
cost model says, failures are named and leave nothing behind, and the worker runs unchanged under torchrun."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from workbench.errors import WorkbenchError
from workbench.partition.cost import SHAPES
from workbench.models.split import PartitionModel
from workbench.partition.plan import devices_like, plan_partition
from workbench.partition.runtime import PartitionRuntime, RunFailed

pytestmark = pytest.mark.alone         # times work under CPU limits: run with no other test beside it

ENC = SHAPES["encoder"]
N = 48
SCHEMES = ("voltage", "tensor_parallel", "torch_tp", "pipeline", "single")


@pytest.fixture(scope="module")
def reference():
    model = PartitionModel("encoder")
    hidden, logits = model.reference(model.inputs(model.token_ids(N, 0)))
    return hidden.numpy(), logits.numpy()


def assert_equal_outputs(result, reference, atol=2e-4):
    hidden, logits = reference
    np.testing.assert_allclose(result.hidden, hidden, atol=atol, rtol=0)
    np.testing.assert_allclose(result.logits, logits, atol=atol, rtol=0)


@pytest.mark.parametrize("K", [2, 4])
@pytest.mark.integration
def test_every_scheme_equals_the_model_in_one_process_and_counts_the_cost_models_bytes(K, reference):
    devices = devices_like(K)
    results = {}
    with PartitionRuntime(K) as runtime:
        for scheme in SCHEMES:
            plan = plan_partition(scheme, ENC, N, devices)
            result = runtime.run(plan, emulate=False)
            assert_equal_outputs(result, reference)
            assert result.traffic() == plan.traffic(), scheme
            results[scheme] = result
        assert runtime.runs == len(SCHEMES)                    # one group served every run
        for scheme in ("tensor_parallel", "torch_tp"):          # steps are told apart by kind and part, never label
            plan = plan_partition(scheme, ENC, N, devices)
            renamed = replace(plan, steps=tuple(replace(s, label=f"step {i}") for i, s in enumerate(plan.steps)))
            assert_equal_outputs(runtime.run(renamed, emulate=False), reference)
    voltage = results["voltage"].sent_by_kind()
    tp = results["tensor_parallel"].sent_by_kind()
    assert set(voltage) == {"broadcast", "all_gather", "gather"} and set(tp) == {"all_reduce"}
    L = ENC.num_layers                               # All-Gathers in L - 1 layers, two All-Reduces in each of L
    assert [4 * v * L for v in voltage["all_gather"]] == [t * (L - 1) for t in tp["all_reduce"]]   # 1:4, counted
    assert voltage["all_gather"] == [(L - 1) * (K - 1) * N // K * ENC.hidden * 4] * K
    assert voltage["broadcast"] == [(K - 1) * N * ENC.hidden * 4] + [0] * (K - 1)       # the input, from the terminal
    assert voltage["gather"] == [0] + [N // K * ENC.hidden * 4] * (K - 1)            # the last rows, to it
    assert results["voltage"].total_traffic() == plan_partition("voltage", ENC, N, devices).total_traffic()
    assert results["torch_tp"].sent_by_kind() == tp                            # PyTorch's split moves the same


@pytest.mark.integration
def test_uneven_and_per_layer_shares_on_three_processes(reference):
    shares = [[0.5, 0.3, 0.2], [0.2, 0.3, 0.5], [1 / 3] * 3, [0.0, 0.5, 0.5], [0.9, 0.05, 0.05], [0.25, 0.25, 0.5]]
    plan = plan_partition("voltage", ENC, N, devices_like(3), shares=shares)
    with PartitionRuntime(3) as runtime:
        result = runtime.run(plan, emulate=False)
    assert_equal_outputs(result, reference)
    assert result.traffic() == plan.traffic()
    assert result.traffic()[3][0].sent == 0                                    # layer 3: device 0 computes nothing


@pytest.mark.integration
def test_one_process(reference):
    with PartitionRuntime(1) as runtime:
        result = runtime.run(plan_partition("voltage", ENC, N, devices_like(1)), emulate=False)
    assert_equal_outputs(result, reference)
    assert result.sent_by_kind() == {}


@pytest.mark.integration
def test_decoder_prefill_on_three_processes():
    model = PartitionModel("decoder")
    hidden, logits = model.reference(model.inputs(model.token_ids(30, 0)))
    plan = plan_partition("voltage", SHAPES["decoder"], 30, devices_like(3), shares=[0.5, 0.25, 0.25])
    with PartitionRuntime(3) as runtime:
        result = runtime.run(plan, emulate=False)
    np.testing.assert_allclose(result.hidden, hidden.numpy(), atol=1e-3, rtol=1e-4)   # hidden states reach +-300
    np.testing.assert_allclose(result.logits, logits.numpy(), atol=5e-3, rtol=1e-4)
    assert int(np.argmax(result.logits)) == int(logits.argmax())


@pytest.mark.integration
def test_an_emulated_run_follows_its_prediction_and_draws_every_device():
    plan = plan_partition("voltage", ENC, 64, devices_like(2, bandwidth_mbit=200))
    with PartitionRuntime(2) as runtime:
        runtime.run(plan)                                                      # warm up
        result = runtime.run(plan)
    assert result.latency_s >= 0.98 * plan.predicted_s                         # padded to the device, never faster
    assert result.mode == "replay" and result.check().label == "replayed"      # a replay is never called measured
    lanes = {(s.rank, s.kind) for s in result.timeline.spans}
    assert {(0, "compute"), (1, "compute"), (0, "comm"), (1, "comm")} <= lanes
    comm = [s for s in result.timeline.spans if s.kind == "comm" and s.rank == 1]
    steps = [s for s in plan.steps if s.traffic]                               # the broadcast, then each layer's
    assert [s.nbytes for s in comm] == [s.traffic[1].sent + s.traffic[1].received for s in steps]
    assert [s.label for s in comm][0] == "broadcast the input" and comm[-1].label.startswith("gather 5")
    assert result.total_traffic() == plan.total_traffic()
    trace = result.timeline.to_chrome_trace()
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert len(names) == 2                                                     # a process per device in Perfetto


def _pids(runtime):
    return [w.process.pid for w in runtime.group.workers]


def _gone(pids, within_s=10.0):
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    alive += [pid] if f.read().split(") ")[1][0] != "Z" else []
            except FileNotFoundError:
                pass
        if not alive:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.integration
def test_a_rank_killed_mid_run_is_named_and_nothing_is_left():
    plan = plan_partition("voltage", ENC, N, devices_like(3, bandwidth_mbit=1))     # the input 1.2 s, 0.4 s a layer
    runtime = PartitionRuntime(3).start()
    pids = _pids(runtime)
    killer = threading.Timer(2.0, lambda: os.kill(pids[1], signal.SIGKILL))
    killer.start()
    started = time.monotonic()
    with pytest.raises(RunFailed, match=r"rank 1 \(edge-vm-1\) died \(was killed by SIGKILL\) after step"):
        runtime.run(plan)
    assert time.monotonic() - started < 30
    assert runtime.group is None and _gone(pids)


@pytest.mark.integration
def test_a_hung_rank_is_named_when_the_deadline_passes():
    plan = plan_partition("voltage", ENC, N, devices_like(2))
    runtime = PartitionRuntime(2).start()
    pids = _pids(runtime)
    os.kill(pids[1], signal.SIGSTOP)
    try:
        with pytest.raises(RunFailed, match=r"rank 1 \(edge-vm-1\) did not answer within the run's deadline"):
            runtime.run(plan, deadline_s=3.0)
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert _gone(pids)


def test_bad_input_is_refused_before_any_process_starts():
    with pytest.raises(WorkbenchError, match="worker processes: must be at most"):
        PartitionRuntime(10_000)
    runtime = PartitionRuntime(2)
    with pytest.raises(WorkbenchError, match="3 devices but this runtime 2"):
        runtime.run(plan_partition("voltage", ENC, N, devices_like(3)))
    assert runtime.group is None


@pytest.mark.integration
def test_the_worker_runs_unchanged_under_torchrun(tmp_path):
    out = tmp_path / "run.json"
    trace = tmp_path / "trace.json"
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    done = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "workbench.partition.worker",
                           "--scheme", "voltage", "--seq-len", "32", "--out", str(out), "--trace", str(trace)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert summary["ranks"] == 2 and summary["max_abs_diff_hidden"] < 2e-4
    rows = 16 * ENC.hidden * 4                       # half of 32 positions; the input is 32 of them
    # rank 0: the input to rank 1, then its rows in 5 All-Gathers; rank 1: its rows in 5 and to the terminal
    assert summary["sent_bytes_per_rank"] == [2 * rows + (ENC.num_layers - 1) * rows, ENC.num_layers * rows]
    assert {e["pid"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"} and trace.stat().st_size


@pytest.mark.parametrize("env,message", [
    ({}, "no RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment"),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "nowhere.invalid", "MASTER_PORT": "29500"},
     "the rendezvous host 'nowhere.invalid' does not resolve"),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "99999"},
     "MASTER_PORT must be a TCP port, 1 to 65535"),
])
@pytest.mark.integration
def test_a_worker_without_a_usable_rendezvous_says_so_before_waiting(env, message):
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-m", "workbench.partition.worker"], env={**clean, **env},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_a_measured_run_holds_every_rank_in_its_own_cpu_limit(reference):
    """Each rank's process sits in a CPU group of its own, calibrated to its device (a device twice as fast gets
    about twice the share); the run is labelled measured, nothing is padded to the schedule, the outputs are
    the model's; closing removes the groups."""
    from workbench.distributed.cpulimit import limit_problem

    problem = limit_problem()
    if problem:
        pytest.skip(f"CPU limits are not available here: {problem}")
    plan = plan_partition("voltage", ENC, N, devices_like(2))
    with PartitionRuntime(2, cpu=[10e9, 20e9], probe_layer=(384, 12, 1536, N)) as runtime:
        for rank, group in enumerate(runtime.cpu_groups):
            assert runtime.group.workers[rank].process.pid in group.pids()
        shares = [c.share for c in runtime.calibrations]
        assert None not in shares and 1.3 < shares[1] / shares[0] < 3.0
        result = runtime.run(plan, emulate=True)            # limits win: nothing padded, a measurement
        paths = [g.path for g in runtime.cpu_groups]
    assert result.mode == "measured" and result.limited and not result.emulated
    assert result.timeline.name.endswith("measured")
    assert_equal_outputs(result, reference)
    assert not any(p.exists() for p in paths)
    with pytest.raises(WorkbenchError, match="1 CPU limits for 2 worker processes"):
        PartitionRuntime(2, cpu=[10e9])


@pytest.mark.integration
def test_a_run_asked_to_be_measured_without_limits_says_why_and_is_labelled_unlimited(monkeypatch, reference):
    import workbench.partition.runtime as rt

    monkeypatch.setattr(rt, "limits_problem", lambda: "no cgroup here")
    try:
        result = rt.run_partition(plan_partition("voltage", ENC, N, devices_like(2)), mode="measured")
    finally:
        rt.close_shared()
    assert result.mode == "unlimited" and not result.limited and not result.emulated
    assert result.note == "cannot emulate the devices (no cgroup here): ran at this host's full speed"
    assert_equal_outputs(result, reference)
    with pytest.raises(WorkbenchError, match="one of measured, replay, unlimited"):
        rt.run_partition(plan_partition("voltage", ENC, N, devices_like(2)), mode="padded")


def readme_torchrun() -> str:
    """The README's multi-machine command, its continuation lines joined."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = text.index("GLOO_SOCKET_IFNAME=IFACE torchrun")
    end = text.index("```", start)
    return " ".join(line.strip().rstrip("\\").strip() for line in text[start:end].splitlines() if line.strip())


@pytest.mark.slow
@pytest.mark.integration
def test_the_readmes_torchrun_command_runs_across_two_network_namespaces(tmp_path):
    """Two machines as two network namespaces made here (addresses only inside them; gone afterwards), each
    running the README's command as written with its own R, HEAD, THIS and IFACE: both nodes end with 0, node 0
    is the terminal, its outputs equal the one-process model, and the bytes each rank sent are Algorithm 2's."""
    from workbench.distributed.shaping import ShapedNetwork, shaping_problem

    problem = shaping_problem()
    if problem:
        pytest.skip(f"network namespaces are not available here: {problem}")
    command = readme_torchrun()
    assert "--local-addr THIS" in command and "--node-rank R" in command
    bindir = os.path.dirname(sys.executable)
    with ShapedNetwork(2, 1000e6 / 8, name="rd") as net:
        procs = []
        for r in range(2):
            line = (command.replace("IFACE", net.interface).replace("--node-rank R", f"--node-rank {r}")
                    .replace("HEAD", net.master_addr).replace("THIS", net.addresses[r])
                    .replace("run.json", f"run{r}.json").replace("run-trace.json", f"trace{r}.json"))
            procs.append(subprocess.Popen([*net.prefix(r), "bash", "-c", line], cwd=tmp_path, text=True,
                                          env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"},
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        outs = [p.communicate(timeout=300) for p in procs]
        holders = net.holder_pids
    assert [p.returncode for p in procs] == [0, 0], [err[-1500:] for _, err in outs]
    summary = json.loads((tmp_path / "run0.json").read_text())
    assert summary["ranks"] == 2 and summary["max_abs_diff_hidden"] < 2e-4
    assert not (tmp_path / "run1.json").exists()                    # only the terminal reports
    rows = 64 * ENC.hidden * 4                                       # each node's 64 of 128 positions
    assert summary["sent_bytes_per_rank"] == [2 * rows + (ENC.num_layers - 1) * rows, ENC.num_layers * rows]
    assert json.loads((tmp_path / "trace0.json").read_text())["traceEvents"]
    assert not any(os.path.exists(f"/proc/{pid}") for pid in holders)


def test_the_worker_fails_when_its_outputs_differ_from_the_model():
    from workbench.partition.worker import OUTPUT_TOLERANCE, outputs_problem

    assert outputs_problem(2e-6) == "" and outputs_problem(OUTPUT_TOLERANCE) == ""
    said = outputs_problem(0.5)
    assert "differ from the model run in one process by 0.5 (more than 0.001)" in said
