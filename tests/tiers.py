"""The test tiers' rule, enforced: a ``unit`` test runs in one process and starts no server."""
from __future__ import annotations

import os


class TierError(AssertionError):
    """A test marked ``unit`` started a process or a server."""


PROBES = ("lscpu",)
"""Commands a library runs once per process to read the hardware (joblib's core count): not what a test
starts, and run by whichever test first needs them, so they are let through."""


def _probe(command) -> bool:
    first = command if isinstance(command, (str, bytes, os.PathLike)) else next(iter(command), "")
    return os.path.basename(os.fsdecode(first).split()[0] if first else "") in PROBES


SERVER_FIXTURES = ("ray_cluster",)
"""Session fixtures that hold a running server (started before any test's guard): a test using one is an
integration test."""


def refuse_server_fixtures(nodeid: str, fixturenames) -> None:
    """Fail a unit test that uses one of :data:`SERVER_FIXTURES` (recorded instead under a scan)."""
    used = [name for name in SERVER_FIXTURES if name in fixturenames]
    if not used:
        return
    what = f"uses the running server of fixture {used[0]}"
    scan = os.environ.get("WORKBENCH_TIER_SCAN")
    if scan:
        with open(scan, "a") as handle:
            handle.write(f"{nodeid}\t{what}\n")
        return
    raise TierError(f"{nodeid} is a unit test but {what}: mark it @pytest.mark.integration "
                    "(unit tests run in one process and start no server)")


def refuse_processes(monkeypatch, nodeid: str) -> None:
    """Make starting a process (subprocess, multiprocessing, fork) or listening on a socket fail in this test,
    naming the test and what it tried. With ``WORKBENCH_TIER_SCAN=FILE`` set, the attempt is appended to FILE
    and allowed instead: a whole run then lists the tests that belong in the integration tier."""
    import multiprocessing.process
    import socket
    import subprocess

    def refusing(what, original):
        def guard(*args, **kwargs):
            if what == "starts a subprocess" and _probe(args[1]):
                return original(*args, **kwargs)
            scan = os.environ.get("WORKBENCH_TIER_SCAN")
            if scan:
                with open(scan, "a") as handle:
                    handle.write(f"{nodeid}\t{what}\n")
                return original(*args, **kwargs)
            raise TierError(f"{nodeid} is a unit test but {what}: mark it @pytest.mark.integration "
                            "(unit tests run in one process and start no server)")
        return guard

    monkeypatch.setattr(subprocess.Popen, "_execute_child",
                        refusing("starts a subprocess", subprocess.Popen._execute_child))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start",
                        refusing("starts a multiprocessing process", multiprocessing.process.BaseProcess.start))
    monkeypatch.setattr(os, "fork", refusing("forks", os.fork))
    monkeypatch.setattr(socket.socket, "listen", refusing("listens on a socket", socket.socket.listen))


class RunSlot:
    """Who may run beside whom when pytest-xdist runs tests on several workers: a test marked ``alone`` (it
    times work under CPU limits, shaped links or deadlines, which another worker's load would bend) runs with
    no other test running; any other test runs beside any other. A readers-writer lock over two files in a
    directory every worker of the run shares; the turnstile makes an ``alone`` test wait only for the tests
    already running, not for every test the other workers start meanwhile."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self._turnstile = os.open(os.path.join(directory, "turnstile"), os.O_RDWR | os.O_CREAT, 0o600)
        self._room = os.open(os.path.join(directory, "room"), os.O_RDWR | os.O_CREAT, 0o600)

    def enter(self, alone: bool) -> None:
        import fcntl

        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)

    def leave(self) -> None:
        import fcntl

        fcntl.flock(self._room, fcntl.LOCK_UN)
