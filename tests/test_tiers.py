"""The tiers say what a test starts: a unit test that starts a process or a server fails, naming itself."""
from __future__ import annotations

import multiprocessing
import socket
import subprocess
import sys
import threading

import pytest

from tests.tiers import RunSlot, TierError


def test_a_unit_test_that_starts_a_process_or_a_server_fails_naming_itself(request, monkeypatch):
    monkeypatch.delenv("WORKBENCH_TIER_SCAN", raising=False)
    assert request.node.get_closest_marker("unit") is not None
    name = "test_a_unit_test_that_starts_a_process_or_a_server_fails_naming_itself"
    with pytest.raises(TierError, match=f"{name} is a unit test but starts a subprocess: mark it "
                                        "@pytest.mark.integration"):
        subprocess.run([sys.executable, "-c", "pass"])
    with pytest.raises(TierError, match="starts a multiprocessing process"):
        multiprocessing.get_context("spawn").Process(target=print).start()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        with pytest.raises(TierError, match="listens on a socket"):
            server.listen()


@pytest.mark.integration
def test_an_integration_test_may_start_both(request):
    assert request.node.get_closest_marker("unit") is None
    assert subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout == "42\n"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()


def test_every_collected_test_is_in_exactly_one_tier(request):
    for item in request.session.items:
        tiers = [t for t in ("unit", "integration", "browser", "notebooks") if item.get_closest_marker(t)]
        assert len(tiers) == 1, (item.nodeid, tiers)


@pytest.fixture(scope="module")
def module_server():
    """A server a whole module would share, started for a unit test."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        try:
            server.listen()
        except TierError as refused:
            return refused
    return None


def test_a_unit_tests_module_fixture_is_held_to_the_tier_too(module_server):
    assert isinstance(module_server, TierError)
    assert "test_a_unit_tests_module_fixture_is_held_to_the_tier_too (its fixture module_server) is a unit test " \
           "but listens on a socket" in str(module_server)


def test_a_unit_test_using_a_running_servers_fixture_is_refused(monkeypatch):
    from tests.tiers import refuse_server_fixtures

    monkeypatch.delenv("WORKBENCH_TIER_SCAN", raising=False)
    with pytest.raises(TierError, match="t.py::x is a unit test but uses the running server of fixture ray_cluster"):
        refuse_server_fixtures("t.py::x", ["tmp_path", "ray_cluster"])
    refuse_server_fixtures("t.py::y", ["tmp_path", "prepared"])


def test_a_librarys_hardware_probe_is_let_through(monkeypatch):
    """joblib counts physical cores with ``lscpu`` in whichever test first needs it."""
    import shutil

    monkeypatch.delenv("WORKBENCH_TIER_SCAN", raising=False)
    if shutil.which("lscpu") is None:
        pytest.skip("this host has no lscpu")
    assert subprocess.run(["lscpu", "--parse=core"], capture_output=True).returncode == 0
    with pytest.raises(TierError):
        subprocess.run(["true"])


def _entered(slot, alone: bool) -> tuple[threading.Thread, threading.Event]:
    """``slot.enter(alone)`` on a thread of its own; the event is set once it has entered."""
    done = threading.Event()

    def enter():
        slot.enter(alone)
        done.set()

    thread = threading.Thread(target=enter, daemon=True)
    thread.start()
    return thread, done


def test_an_alone_test_waits_for_the_running_ones_and_holds_back_the_next(tmp_path):
    """Three workers' slots over one directory: tests run beside each other; an ``alone`` test waits until the
    running one leaves, and a test starting after it waits until it has run (no alone test waits for ever
    behind workers that keep starting tests). A slot without the lock, a shared lock for alone tests, or no
    turnstile each lets a test in here too early."""
    first, second, third = (RunSlot(str(tmp_path)) for _ in range(3))
    first.enter(alone=False)
    _, beside = _entered(second, alone=False)
    assert beside.wait(5)
    second.leave()
    _, alone = _entered(second, alone=True)
    assert not alone.wait(0.3)
    _, after = _entered(third, alone=False)
    assert not after.wait(0.3)
    first.leave()
    assert alone.wait(5) and not after.wait(0.3)
    second.leave()
    assert after.wait(5)
    third.leave()
