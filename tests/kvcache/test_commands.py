"""`workbench serve llms` and `workbench kvcache call` as a user runs them: two processes on loopback."""
import os
import signal
import subprocess
import sys

import pytest

from workbench.serving import free_port

CLI = [sys.executable, "-m", "workbench.cli"]


@pytest.mark.integration
def test_serve_call_continue_and_stop(tmp_path):
    port = free_port()
    address = f"tcp:127.0.0.1:{port}"
    env = {**os.environ, "WORKBENCH_PRESET": "quick"}
    server = subprocess.Popen(CLI + ["serve", "llms", "--address", address, "--swap-dir", str(tmp_path / "swap"),
                                     "--memory-mb", "64", "--max-context-tokens", "512", "--device", "orin-nx"],
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env)
    try:
        ready = server.stdout.readline()
        if ready.startswith("llms: measuring this host's swap and recompute costs"):       # a cold cache
            ready = server.stdout.readline()
        assert ready.startswith(f"llms: serving on {address} ("), ready
        assert "swap-in pipeline planned for orin-nx (emulated)" in ready, ready
        first = subprocess.run(CLI + ["kvcache", "call", "Name a colour.", "--address", address, "--app", "paint",
                                      "--max-new-tokens", "3"], capture_output=True, text=True, env=env, timeout=300)
        assert first.returncode == 0, first.stderr
        stub = first.stdout.strip().splitlines()[-1].split("--context=")[1].rstrip(")")
        again = subprocess.run(CLI + ["kvcache", "call", "Another one.", "--address", address, "--app", "paint",
                                      f"--context={stub}", "--max-new-tokens", "3"], capture_output=True, text=True,
                               env=env, timeout=300)
        assert again.returncode == 0 and "--context" not in again.stdout, again.stderr
        thief = subprocess.run(CLI + ["kvcache", "call", "Mine now.", "--address", address, "--app", "other",
                                      "--context", stub], capture_output=True, text=True, env=env, timeout=300)
        assert thief.returncode == 2 and "belongs to another app" in thief.stderr
        assert len(thief.stderr.strip().splitlines()) == 1
    finally:
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=60)
    assert server.returncode == 0
    failed, stopped = out.splitlines()                    # one line per failed request, none per answered one
    assert failed.startswith("llms: tcp:other call failed: StubError:") and "belongs to another app" in failed, out
    assert stopped == "llms: stopped"


@pytest.mark.integration
def test_group_is_refused_in_one_line_when_unknown_or_on_tcp(tmp_path):
    """--group names a group this machine has and acts on a Unix socket's permissions: an unknown group, or a
    TCP address (no permissions; its apps bind with tokens), is refused before anything starts."""
    import grp

    for args, message in ((["--group", "no-such-group-here"], "no group 'no-such-group-here' on this machine"),
                          (["--group", grp.getgrgid(os.getegid()).gr_name, "--address", "tcp:127.0.0.1:0",
                            "--swap-dir", str(tmp_path / "swap")], "a TCP address has none")):
        done = subprocess.run(CLI + ["serve", "llms", *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "swap").exists()
