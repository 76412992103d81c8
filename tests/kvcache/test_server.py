import json
import os
import secrets
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

import workbench.kvcache.client as client_module
from workbench.kvcache.client import CallTimeoutError, ConnectionLostError, connect
from workbench.errors import WorkbenchError
from workbench.kvcache.errors import ContextLimitError, DeadlineError, IdentityError, ProtocolError
from workbench.kvcache.protocol import PROTOCOL_VERSION
from workbench.kvcache.server import LLMServer, Peer, ReplyMemory, app_identity, parse_address, peer_credentials
from workbench.kvcache.service import CtxStub, LLMService, ServiceConfig, StubError
from workbench.kvcache.store import FAILPOINT_ENV, SwapStore
from workbench.models.decoder import load_decoder
from tests.kvcache.printing import Printing

NEW = 4
SERVE = ("import sys\nfrom workbench.kvcache.server import serve\nfrom workbench.kvcache.config import ServiceConfig\n"
         "serve(sys.argv[1], swap_dir=sys.argv[2], memory_budget_bytes=int(sys.argv[3]), "
         "config=ServiceConfig(max_context_tokens=256))")
RESERVE = 256 * 2 * 30 * 3 * 64 * 2                 # the working cache of a 256-token call, float16
BUDGET = RESERVE + 1_500_000                        # and a few contexts: calls evict and reload chunks


class Served(Printing):
    """A server in a subprocess; ``lines`` collects what it prints."""

    def __init__(self, address: str, swap_dir, failpoint: str | None = None):
        env = {k: v for k, v in os.environ.items() if k != FAILPOINT_ENV}
        if failpoint:
            env[FAILPOINT_ENV] = failpoint
        super().__init__([sys.executable, "-c", SERVE, address, str(swap_dir), str(BUDGET)], env=env)
        self.wait_for("llms: serving on", 180)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(30) == -signal.SIGKILL


@pytest.fixture(scope="module", autouse=True)
def own_token_file(tmp_path_factory):
    """Clients keep their TCP app tokens in this module's folder (one user), not the user's cache."""
    path = tmp_path_factory.mktemp("client") / "app-tokens.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(client_module, "default_token_file", lambda: path)
        yield path


@pytest.fixture(scope="module")
def model():
    return load_decoder()


def mode(path) -> int:
    return os.stat(path).st_mode & 0o777


def busy(session, swap) -> bool:
    token = (swap / "operator.token").read_text()
    return any(c["served"] for c in session.snapshot(operator_token=token)["contexts"])


@pytest.mark.integration
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
    while not busy(watcher, swap) and time.monotonic() < end:
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
    assert (len(a.snapshot()["contexts"]), len(b.snapshot()["contexts"])) == (2, 1)      # each app sees its own
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
    ref = LLMService(load_decoder(), tmp_path / "ref", BUDGET, config=ServiceConfig(max_context_tokens=256))
    for token, calls in history.items():
        session = ref.bind("a")
        stub = session.new_ctx(systems[token])
        for prompt, seen in calls:
            out = session.call(stub, prompt, NEW)
            assert seen is None or out == seen, (prompt, seen, out)
        assert session.call(stub, "Thanks!", NEW) == final[token]
    ref.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory, model):
    service = LLMService(model, tmp_path_factory.mktemp("swap"))
    server = LLMServer(service, "tcp:127.0.0.1:0")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.close()
    thread.join(10)


@pytest.mark.integration
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


@pytest.mark.integration
def test_the_protocol_names_bad_requests_and_keeps_the_connection(served):
    kind, where = parse_address(served.address)
    assert kind == "tcp" and where[0] == "127.0.0.1"
    with socket.create_connection(where, timeout=30) as sock:
        stream = sock.makefile("rwb")

        def ask(request) -> dict:
            stream.write((request if isinstance(request, bytes) else json.dumps(request).encode()) + b"\n")
            stream.flush()
            return json.loads(stream.readline())

        refused = ask({"op": "new_ctx"})
        assert refused["type"] == "ProtocolError" and refused["error"].startswith("bind an app first")
        assert ask(b"not json")["type"] == "ProtocolError"
        assert ask({"op": "bind", "app": "p", "version": PROTOCOL_VERSION})["app"] == "tcp:p"
        assert "unknown op 'fly'" in ask({"op": "fly"})["error"]
        assert ask({"op": "call", "stub": "guess", "prompt": "hi"})["type"] == "StubError"
        assert "at most 1048576 bytes" in ask(b"x" * (3 << 20))["error"]
        assert ask({"op": "new_ctx"})["ok"]
    with pytest.raises(WorkbenchError, match="loopback only"):
        parse_address("tcp:0.0.0.0:80")


@pytest.mark.integration
def test_a_reply_over_a_mebibyte_is_read_whole_and_the_next_reply_is_its_own(served, monkeypatch):
    big = {"notes": "x" * (3 << 20)}
    monkeypatch.setattr(served.service, "app_snapshot", lambda app: big)
    with connect("big", served.address) as session:
        assert session.snapshot() == big
        assert session.contexts() == []


@pytest.mark.integration
def test_a_call_repeated_after_its_timeout_runs_once_and_later_replies_stay_in_step(served):
    with connect("retry", served.address, timeout=3.0) as session:
        stub = session.new_ctx("Be brief.")
        served.service._turn.acquire()                     # the model is busy: the call waits past the timeout
        try:
            with pytest.raises(CallTimeoutError, match="call again with call_id=") as timed_out:
                session.call(stub, "Name a fruit.", NEW)
        finally:
            served.service._turn.release()
        session.timeout = 60.0                              # the retry is served: a busy host may take seconds
        text = session.call(stub, "Name a fruit.", NEW, call_id=timed_out.value.call_id)
        [ctx] = session.contexts()                          # the late first reply was skipped, not read here
        assert ctx["calls"] == 1
        assert session.call(session.new_ctx("Be brief."), "Name a fruit.", NEW) == text


@pytest.mark.integration
def test_a_repeated_call_id_returns_the_first_reply_without_growing_the_context(served):
    with connect("repeat", served.address) as session, connect("repeat", served.address) as other_connection:
        stub = session.new_ctx()
        first = session.call_with_stats(stub, "Say hi.", NEW, call_id="hello-1")
        [before] = session.contexts()
        assert other_connection.call_with_stats(stub, "Say hi.", NEW, call_id="hello-1") == first
        assert session.contexts() == [before]
        with pytest.raises(ProtocolError, match="was given to another call"):
            session.call(stub, "Say bye.", NEW, call_id="hello-1")
        session.call(stub, "Say hi.", NEW, call_id="hello-2")
        [after] = session.contexts()
        assert (after["calls"], after["tokens"] > before["tokens"]) == (2, True)


@pytest.mark.integration
def test_streamed_pieces_arrive_one_by_one_and_make_the_plain_calls_answer(served):
    with connect("stream", served.address) as session:
        streamed, plain = session.new_ctx("Be brief."), session.new_ctx("Be brief.")
        stream = session.call_stream(streamed, "Name three colours.", 8)
        pieces = list(stream)
        assert len(pieces) > 1
        assert "".join(pieces) == stream.text == session.call(plain, "Name three colours.", 8)
        assert stream.stats.output_tokens == 8 and not stream.stats.cut_by_deadline


@pytest.mark.integration
def test_a_deadline_refuses_a_call_whose_turn_comes_late_and_cuts_one_that_runs_past_it(served):
    with connect("late", served.address) as session:
        stub = session.new_ctx()
        refused = []

        def late_call():
            try:
                session.call(stub, "Hi.", NEW, deadline_s=0.2)
            except DeadlineError as exc:
                refused.append(str(exc))

        served.service._turn.acquire()
        try:
            caller = threading.Thread(target=late_call)
            caller.start()
            time.sleep(0.6)
        finally:
            served.service._turn.release()
        caller.join(60)
        assert refused and "deadline passed" in refused[0] and "\n" not in refused[0]
        [ctx] = session.contexts()
        assert (ctx["calls"], ctx["tokens"]) == (0, 0)
        text, stats = session.call_with_stats(stub, "Count from 1 to 500, separated by commas.", 400, deadline_s=1.0)
        assert stats.cut_by_deadline and 0 < stats.output_tokens < 400 and text
        assert session.contexts()[0]["calls"] == 1


@pytest.mark.integration
def test_a_bind_of_another_major_version_is_refused_naming_both(served):
    with socket.create_connection(parse_address(served.address)[1], timeout=30) as sock:
        stream = sock.makefile("rwb")

        def bind(**fields) -> dict:
            stream.write(json.dumps({"op": "bind", "app": "old", **fields}).encode() + b"\n")
            stream.flush()
            return json.loads(stream.readline())

        refused = bind(version="1.3")
        assert refused["type"] == "ProtocolError"
        assert "protocol 2.0" in refused["error"] and "protocol 1.3" in refused["error"]
        assert "no version" in bind()["error"]
        assert bind(version="2.7")["ok"]


@pytest.mark.integration
def test_over_tcp_an_app_name_belongs_to_the_token_of_its_first_bind(served, tmp_path):
    mine, theirs = tmp_path / "mine.json", tmp_path / "theirs.json"
    with connect("held", served.address, token_file=mine) as session:
        stub = session.new_ctx()
    assert mode(mine) == 0o600
    with pytest.raises(IdentityError, match="has no token for it"):
        connect("held", served.address, token_file=theirs)
    with connect("held", served.address, token_file=mine) as session:       # the same user comes back
        session.delete(stub)
    stored = served.service.swap_dir / "app-tokens.json"
    assert mode(stored) == 0o600 and json.loads(mine.read_text()).popitem()[1] not in stored.read_text()


@pytest.mark.integration
def test_an_app_sees_its_own_snapshot_and_every_apps_needs_the_operators_token(served):
    with connect("x", served.address) as x, connect("y", served.address) as y:
        x.call(x.new_ctx(), "Hi.", NEW)
        y.new_ctx()
        own = y.snapshot()
        assert {c["app"] for c in own["contexts"]} == {"tcp:y"} and "metrics" not in own
        ids = {c["id"] for c in own["contexts"]}
        assert own["last_call"] is None and {e["ctx"] for e in own["queue"]["order"]} <= ids
        with pytest.raises(IdentityError, match="operator's token"):
            y.snapshot(operator_token="guess")
        assert {"tcp:x", "tcp:y"} <= {c["app"] for c in y.snapshot(operator_token=served.operator_token)["contexts"]}
    assert mode(served.operator_token_path) == 0o600
    assert served.operator_token_path.read_text() == served.operator_token


@pytest.mark.integration
def test_an_app_that_lost_its_stubs_lists_and_deletes_its_contexts_by_id(served):
    limit = served.service.max_contexts_per_app
    with connect("forgetful", served.address) as app, connect("neighbour", served.address) as other:
        for _ in range(limit):
            app.new_ctx()
        with pytest.raises(ContextLimitError):
            app.new_ctx()
        listed = app.contexts()
        assert len(listed) == limit
        assert all({"id", "tokens", "bytes", "last_used"} <= set(c) and "stub" not in c for c in listed)
        with pytest.raises(StubError, match="holds no context"):
            other.delete_context(listed[0]["id"])
        app.delete_context(listed[0]["id"])
        assert [c["id"] for c in app.contexts()] == [c["id"] for c in listed[1:]]
        app.new_ctx()
        for c in app.contexts():
            app.delete_context(c["id"])


@pytest.mark.integration
def test_a_stub_never_begins_with_a_dash(served, monkeypatch):
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n=None: "-" + "A" * 42)
    with connect("dash", served.address) as session:
        stub = session.new_ctx()
        assert not stub.token.startswith("-")
        session.delete(stub)


@pytest.mark.integration
def test_the_app_is_a_name_within_the_connecting_uid(tmp_path, model):
    mail = {1001: app_identity("mail", Peer(uid=1001)), 1002: app_identity("mail", Peer(uid=1002))}
    assert len({mail[1001], mail[1002], app_identity("mail", Peer())}) == 3
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert peer_credentials(ours) == Peer(uid=os.getuid(), pid=os.getpid())

    uids = [1001, 1002, 1001]
    address = f"unix:{tmp_path / 'llms.sock'}"
    server = LLMServer(LLMService(model, tmp_path / "swap"), address,
                       peer_credentials=lambda sock: Peer(uid=uids.pop(0), pid=4242))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert (mode(tmp_path / "llms.sock"), mode(tmp_path / "swap")) == (0o600, 0o700)
        with connect("mail", address) as owner, connect("mail", address) as intruder, \
                connect("mail", address) as owner_again:
            assert (owner.identity, intruder.identity, owner_again.identity) == (mail[1001], mail[1002], mail[1001])
            stub = owner.new_ctx()
            with pytest.raises(StubError, match="belongs to another app"):
                intruder.call(stub, "Hi.", NEW)
            with pytest.raises(StubError, match="holds no context"):
                intruder.delete_context(owner.contexts()[0]["id"])
            assert intruder.contexts() == [] and len(owner_again.contexts()) == 1
    finally:
        server.shutdown()
        server.close()
        thread.join(10)


def test_the_reply_memory_waits_for_a_running_first_attempt_and_forgets_a_failed_one():
    memory, started, release, runs = ReplyMemory(kept=2), threading.Event(), threading.Event(), []

    def slow():
        runs.append("slow")
        started.set()
        release.wait(30)
        return {"ok": True, "text": "first"}

    first = threading.Thread(target=memory.run_once, args=(("app", "ctx"), "c1", "p", slow))
    first.start()
    started.wait(30)
    repeat = []
    waiter = threading.Thread(target=lambda: repeat.append(memory.run_once(("app", "ctx"), "c1", "p", slow)))
    waiter.start()
    release.set()
    first.join(30)
    waiter.join(30)
    assert runs == ["slow"] and repeat == [{"ok": True, "text": "first", "repeated": True}]

    def failing():
        runs.append("failing")
        raise WorkbenchError("the disk is full")

    with pytest.raises(WorkbenchError):
        memory.run_once(("app", "other"), "c2", "p", failing)
    assert memory.run_once(("app", "other"), "c2", "p", lambda: {"ok": True}) == {"ok": True}


@pytest.mark.integration
def test_verbose_logs_a_line_per_request_and_quiet_only_the_failed_ones(tmp_path, model):
    service = LLMService(model, tmp_path / "swap")
    logs = {False: [], True: []}
    for verbose in (False, True):
        server = LLMServer(service, "tcp:127.0.0.1:0", log=logs[verbose].append, verbose=verbose)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            with connect(f"log{int(verbose)}", server.address) as session:
                session.call(session.new_ctx(), "Hi.", 2)
                with pytest.raises(StubError):
                    session.call(CtxStub("guess"), "Hi.", 2)
        finally:
            server.shutdown()
            server._server.server_close()
            thread.join(10)
    quiet, verbose = logs[False], logs[True]
    assert len(quiet) == 1 and quiet[0].startswith("llms: tcp:log0 call failed: StubError:"), quiet
    assert [line.split(" ")[2] for line in verbose] == ["bind", "new_ctx", "call", "call"], verbose
    assert " ok in " in verbose[2] and "new tokens" in verbose[2] and "failed: StubError" in verbose[3], verbose
    service.close()


def _as_user(uid: int, gid: int, groups: list[int], work) -> dict:
    """``work()`` in a forked child running as ``uid``, primary group ``gid`` and only ``groups`` besides (root
    drops to them), its result or its error as a dict. Whatever ``work`` needs is imported before the fork: the child may not read it."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                        # the child: never returns into pytest
        out = {}
        try:
            os.close(r)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            out = work()
        except BaseException as exc:
            out = {"error": type(exc).__name__, "message": str(exc)}
        finally:
            os.write(w, json.dumps(out).encode())
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.skipif(os.geteuid() != 0, reason="a second uid needs root to switch to it")
@pytest.mark.integration
def test_a_group_lets_a_second_uid_in_and_keeps_its_apps_apart(model):
    """With ``group`` the socket is the group's (0660) and the swap directory only passable (0710): a member of
    another uid connects as its own app and sees none of the owner's contexts nor the swap files; a user outside
    the group is told the socket refuses it and how to be let in, not that nothing answers."""
    import grp
    import pwd
    import shutil
    import tempfile

    from workbench.kvcache.server import group_id

    nobody = pwd.getpwnam("nobody").pw_uid
    gid = group_id(grp.getgrgid(pwd.getpwnam("nobody").pw_gid).gr_name)
    base = Path(tempfile.mkdtemp(prefix="llms-group-", dir="/tmp"))
    os.chmod(base, 0o711)                               # others may reach the socket inside, not list the folder
    address = f"unix:{base / 'llms.sock'}"
    server = LLMServer(LLMService(model, base / "swap"), address, group=gid)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        for path, want in ((base / "llms.sock", 0o660), (base / "swap", 0o710)):
            assert (mode(path), os.stat(path).st_gid) == (want, gid), path
        with connect("mail", address) as owner:
            owner.new_ctx()
            owner_contexts = owner.contexts()

        def member():
            with connect("mail", address) as session:
                mine = session.new_ctx()
                seen = session.contexts()
                try:
                    os.listdir(base / "swap")
                    listed = "listed"
                except PermissionError:
                    listed = "refused"
                return {"identity": session.identity, "seen": [c["id"] for c in seen], "stub": mine.token,
                        "swap": listed}

        member()                                        # as root first: everything it needs is imported
        alone = 65533                                   # a primary group of no one's: membership is supplementary
        got = _as_user(nobody, alone, [gid], member)
        assert got.get("identity") == f"uid{nobody}:mail", got
        assert len(got["seen"]) == 1 and got["seen"][0] not in {c["id"] for c in owner_contexts}
        assert got["swap"] == "refused"
        outsider = _as_user(nobody, alone, [], member)
        assert outsider["error"] == "ConnectionLostError", outsider
        assert "refuses this user" in outsider["message"] and "--group" in outsider["message"]
        assert "no LLM service answers" not in outsider["message"]
    finally:
        server.shutdown()
        server.close()
        thread.join(10)
        shutil.rmtree(base, ignore_errors=True)
