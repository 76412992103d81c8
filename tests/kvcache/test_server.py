import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from workbench.kvcache.client import ConnectionLostError, connect
from workbench.errors import WorkbenchError
from workbench.kvcache.server import LLMServer, parse_address
from workbench.kvcache.service import LLMService, StubError
from workbench.kvcache.store import FAILPOINT_ENV, SwapStore
from workbench.models.decoder import load_decoder

NEW = 4
SERVE = ("import sys\nfrom workbench.kvcache.server import serve\n"
         "serve(sys.argv[1], swap_dir=sys.argv[2], memory_budget_bytes=int(sys.argv[3]))")
BUDGET = 1_500_000                                  # a few contexts: calls evict and reload chunks


class Served:
    """A server in a subprocess; ``lines`` collects what it prints."""

    def __init__(self, address: str, swap_dir, failpoint: str | None = None):
        env = {k: v for k, v in os.environ.items() if k != FAILPOINT_ENV}
        if failpoint:
            env[FAILPOINT_ENV] = failpoint
        self.proc = subprocess.Popen([sys.executable, "-c", SERVE, address, str(swap_dir), str(BUDGET)], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_for("llms: serving on", 180)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def wait_for(self, text: str, timeout: float) -> str:
        seen, end = [], time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                break
            seen.append(line)
            if text in line:
                return line
            if line == "":
                break
        raise AssertionError(f"the server never printed {text!r}; it printed:\n{''.join(seen)}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(30) == -signal.SIGKILL


def busy(session) -> bool:
    return any(c["served"] for c in session.snapshot()["contexts"])


def test_a_killed_server_serves_every_returned_call_with_the_same_continuation(tmp_path):
    address, swap = f"unix:{tmp_path / 'llms.sock'}", tmp_path / "swap"
    history: dict[str, list[tuple[str, str | None]]] = {}        # stub token -> (prompt, output or None: unseen)
    systems = {}

    def called(session, stub, prompt):
        history[stub.token].append((prompt, session.call(stub, prompt, NEW)))

    # run 1: three contexts of two apps; killed between calls
    server = Served(address, swap)
    a, b = connect("a", address), connect("b", address)
    s1, s2, s3 = a.new_ctx("Be brief."), a.new_ctx(), b.new_ctx("Answer in one word.")
    for stub, system in [(s1, "Be brief."), (s2, None), (s3, "Answer in one word.")]:
        history[stub.token], systems[stub.token] = [], system
    called(a, s1, "Name a color.")
    called(a, s2, "Say hi.")
    server.kill()

    # run 2: the stubs and their owners survive; killed right after a call has started
    server = Served(address, swap)
    a, b = connect("a", address), connect("b", address)
    with pytest.raises(StubError, match="belongs to another app"):
        b.call(s1, "Hello?", NEW)
    called(a, s1, "And another?")
    lost = []

    def doomed():
        try:
            a.call(s2, "More?", NEW)
        except ConnectionLostError:
            lost.append(True)

    caller = threading.Thread(target=doomed)
    caller.start()
    watcher, end = connect("watcher", address), time.monotonic() + 60
    while not busy(watcher) and time.monotonic() < end:
        time.sleep(0.01)
    server.kill()
    caller.join(30)
    assert lost, "the call on the killed server should have lost its connection"

    # run 3: killed after the call's index transaction committed, before its files were renamed and it
    # returned: the call never returned, but the restarted service must hold its whole result
    server = Served(address, swap, failpoint="index_committed")
    a = connect("a", address)
    with pytest.raises(ConnectionLostError):
        a.call(s1, "One more.", NEW)
    history[s1.token].append(("One more.", None))
    assert server.proc.wait(30) == -signal.SIGKILL

    # run 4: every context continues; then a clean stop on SIGTERM
    server = Served(address, swap)
    a, b = connect("a", address), connect("b", address)
    assert len(a.snapshot()["contexts"]) == 3
    final = {}
    for session, stub in [(a, s1), (a, s2), (b, s3)]:
        final[stub.token] = session.call(stub, "Thanks!", NEW)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) == 0
    server.wait_for("llms: stopped", 10)
    assert not (tmp_path / "llms.sock").exists()
    with SwapStore(swap) as store:
        assert store.verify() == [] and not store.recovery_notes

    # the reference: the same calls on a service never killed
    ref = LLMService(load_decoder(), tmp_path / "ref", BUDGET)
    for token, calls in history.items():
        session = ref.bind("a")
        stub = session.new_ctx(systems[token])
        for prompt, seen in calls:
            out = session.call(stub, prompt, NEW)
            assert seen is None or out == seen, (prompt, seen, out)
        assert session.call(stub, "Thanks!", NEW) == final[token]
    ref.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    service = LLMService(load_decoder(), tmp_path_factory.mktemp("swap"))
    server = LLMServer(service, "tcp:127.0.0.1:0")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.close()
    thread.join(10)


def test_two_concurrent_clients_get_what_they_would_get_one_after_the_other(served):
    prompts = {"x": ["Name a fruit.", "Another one?"], "y": ["Name a planet.", "Is it big?"]}
    results, start = {}, threading.Barrier(2)

    def client(app):
        with connect(app, served.address) as session:
            stub = session.new_ctx("Be brief.")
            start.wait()
            results[app] = [session.call_with_stats(stub, p, NEW) for p in prompts[app]]

    threads = [threading.Thread(target=client, args=(app,)) for app in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    with connect("sequential", served.address) as session:
        for app, asked in prompts.items():
            stub = session.new_ctx("Be brief.")
            assert [text for text, _ in results[app]] == [session.call(stub, p, NEW) for p in asked]
    stats = [st for app in prompts for _, st in results[app]]
    assert max(st.queue_wait_s for st in stats) > 0.5 * min(st.inference_s for st in stats)   # one waited its turn
    assert served.service.metrics.registry.get_sample_value("llms_queue_wait_seconds_count") == 8


def test_the_protocol_names_bad_requests_and_keeps_the_connection(served):
    kind, where = parse_address(served.address)
    assert kind == "tcp" and where[0] == "127.0.0.1"
    with socket.create_connection(where, timeout=30) as sock:
        stream = sock.makefile("rwb")

        def ask(request) -> dict:
            stream.write((request if isinstance(request, bytes) else json.dumps(request).encode()) + b"\n")
            stream.flush()
            return json.loads(stream.readline())

        assert ask({"op": "new_ctx"}) == {"ok": False, "type": "ProtocolError",
                                          "error": 'bind an app first: {"op": "bind", "app": NAME}'}
        assert ask(b"not json")["type"] == "ProtocolError"
        assert ask({"op": "bind", "app": "p"}) == {"ok": True}
        assert "unknown op 'fly'" in ask({"op": "fly"})["error"]
        assert ask({"op": "call", "stub": "guess", "prompt": "hi"})["type"] == "StubError"
        assert "at most 1048576 bytes" in ask(b"x" * (3 << 20))["error"]
        assert ask({"op": "new_ctx"})["ok"]
    with pytest.raises(WorkbenchError, match="loopback only"):
        parse_address("tcp:0.0.0.0:80")
