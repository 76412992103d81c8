"""Start-up failures of every server the workbench starts: one line, before any work, nothing left behind."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.listen import AddressError, bind_tcp, check_tcp_port, make_folder, remove_made

CLI = [sys.executable, "-m", "workbench.cli"]


@pytest.fixture
def taken():
    """A port something listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def in_group(pgid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            found.append(int(stat.parent.name))
    return found


def refused(args: list[str], cache: Path) -> str:
    """Run ``workbench ARGS``; it must exit 2 within a minute with one line on stderr, no traceback, and
    leave no process of its group behind. Returns that line."""
    proc = subprocess.Popen(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "WORKBENCH_CACHE": str(cache)})
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert proc.returncode == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert in_group(proc.pid) == []
    return err.strip()


@pytest.mark.integration
def test_serve_llms_on_a_taken_port_names_it_and_how_to_get_a_free_one(tmp_path, taken):
    line = refused(["serve", "llms", "--address", f"tcp:127.0.0.1:{taken}", "--swap-dir", str(tmp_path / "swap")],
                   tmp_path / "cache")
    assert f"127.0.0.1:{taken}" in line and "in use" in line and "tcp:127.0.0.1:0" in line, line
    assert not (tmp_path / "swap").exists()


@pytest.mark.integration
def test_serve_llms_refuses_a_socket_in_a_folder_it_cannot_make(tmp_path):
    line = refused(["serve", "llms", "--address", "unix:/proc/nope/s", "--swap-dir", str(tmp_path / "swap")],
                   tmp_path / "cache")
    assert "unix:/proc/nope/s" in line and "writable folder" in line, line
    assert not (tmp_path / "swap").exists()


@pytest.mark.integration
def test_serve_llms_refuses_a_swap_dir_it_cannot_make_and_removes_the_socket_it_bound(tmp_path):
    sock = tmp_path / "new" / "deeper" / "s"
    line = refused(["serve", "llms", "--address", f"unix:{sock}", "--swap-dir", "/proc/nope"], tmp_path / "cache")
    assert "/proc/nope" in line and "--swap-dir" in line and "writable folder" in line, line
    assert not (tmp_path / "new").exists()


@pytest.mark.integration
def test_serve_llms_refuses_a_taken_metrics_port_before_the_model_loads(tmp_path, taken):
    line = refused(["serve", "llms", "--address", f"unix:{tmp_path / 's'}", "--swap-dir", str(tmp_path / "swap"),
                    "--metrics-port", str(taken)], tmp_path / "cache")
    assert f"127.0.0.1:{taken}" in line and "--metrics-port 0" in line, line
    assert not (tmp_path / "swap").exists() and not (tmp_path / "s").exists()


@pytest.mark.parametrize("command", ["dashboards", "lab"])
@pytest.mark.integration
def test_the_gallery_and_the_lab_on_a_taken_port_say_so_and_start_nothing(tmp_path, taken, command):
    line = refused([command, "--port", str(taken)], tmp_path / "cache")
    assert f"127.0.0.1:{taken}" in line and "--port 0" in line, line
    assert not (tmp_path / "cache" / "prepare-job").exists()


@pytest.mark.integration
def test_the_shared_binding_names_the_address_and_cleans_up_what_it_made(tmp_path, taken):
    with pytest.raises(AddressError, match=f"127.0.0.1:{taken}.*in use"):
        bind_tcp(taken, option="--address", free="tcp:127.0.0.1:0")
    with pytest.raises(AddressError, match="0 to 65535, got 99999"):
        bind_tcp(99999)
    assert check_tcp_port(0) > 0
    made: list[Path] = []
    assert make_folder(tmp_path / "a" / "b", what="a test folder", made=made).is_dir()
    assert made == [tmp_path / "a"]
    remove_made(made)
    assert not (tmp_path / "a").exists()
    with pytest.raises(AddressError, match="cannot use /proc/nope as a test folder"):
        make_folder("/proc/nope", what="a test folder")
