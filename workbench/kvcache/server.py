"""The LLM service for other processes: newline-delimited JSON over a Unix socket or loopback TCP.

Each request and reply is one JSON object on one line (``protocol``); a request's ``id`` comes back in
its reply. A connection binds one app first, then uses it::

    {"op": "bind", "app": "notes", "version": "2.0"}       -> {"ok": true, "app": "uid1000:notes", "version": "2.0"}
    {"op": "new_ctx", "system_prompt": null}               -> {"ok": true, "stub": "<secret>"}
    {"op": "call", "stub": "...", "prompt": "...", "max_new_tokens": 16, "call_id": "...",
     "deadline_s": 30, "stream": true}                     -> {"event": "text", "text": "..."} lines while it
                                                              generates (stream only), then
                                                              {"ok": true, "text": "...", "stats": {...}}
    {"op": "list"}                                         -> {"ok": true, "contexts": [{"id": ..., ...}]}
    {"op": "delete", "stub": "..."} or {"op": "delete", "ctx": "<id>"}   -> {"ok": true}
    {"op": "snapshot"}                                     -> {"ok": true, "snapshot": {the app's own}}
    {"op": "snapshot", "all": true, "operator_token": "..."}   -> every app's (no bind needed)

Identity: on a Unix socket the app is a label within the connecting process's uid (``SO_PEERCRED``):
``uid1000:notes``. On TCP the first bind of a name issues a token (``"token"`` in the reply, stored hashed
in the swap directory, 0600) and later binds of that name must present it (``"token"`` in the bind).
The all-app snapshot needs the operator's token, written 0600 to ``operator.token`` in the swap
directory at each start. The socket file is 0600 and the swap directory 0700; started with ``group`` (``workbench
serve llms --group NAME``) the socket is 0660 and the swap directory 0710, both that group's, so its members
can connect (each still its own uid's apps) and pass through the swap directory, never list or read it.

A call with a ``call_id`` is run once: a repeat of the same id on the same context (after a timeout,
from any connection of the app) gets the first reply (with ``"repeated": true``) without running the
model again; replies are kept in this process's memory only, so a restart forgets them.
``deadline_s`` counts from the request's arrival: a call whose turn comes later is refused
(``DeadlineError``) and changes nothing; one that reaches it while generating stops there and returns
what it generated, with ``stats.cut_by_deadline`` true (the context keeps that shortened answer).

A failed request answers ``{"ok": false, "error": "<message>", "type": "<error class>"}`` and the
connection stays usable. Each connection has its own thread; calls share the service's FIFO turn.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import queue
import secrets
import signal
import socket
import socketserver
import struct
import tempfile
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

from workbench.errors import WorkbenchError
from workbench.listen import AddressError, bind_tcp, check_tcp_port, make_folder, remove_made  # noqa: F401
from workbench.kvcache.costmodel import host_costs_cached
from workbench.kvcache.errors import IdentityError, ProtocolError
from workbench.kvcache.protocol import (MAX_REQUEST_BYTES, PROTOCOL_VERSION, LineReader, check_version,  # noqa: F401
                                        default_address, encode, parse_address)
from workbench.kvcache.service import (DEFAULT_MAX_CONTEXTS_PER_APP, DEFAULT_MEMORY_BUDGET, CtxStub, LLMService,
                                       ServiceConfig, default_swap_dir)

MAX_APP_NAME = 100
REPLIES_KEPT = 4096
OPS = "bind, new_ctx, call, list, delete, snapshot"


# ----------------------------------------------------------------------------- identity

@dataclass(frozen=True)
class Peer:
    """The other end of a connection: a local process (uid and pid from the kernel) or a TCP client (neither)."""
    uid: int | None = None
    pid: int | None = None


def peer_credentials(sock: socket.socket) -> Peer:
    """The uid and pid of the process connected on a Unix socket (``SO_PEERCRED``)."""
    size = struct.calcsize("3i")
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, size))
    return Peer(uid=uid, pid=pid)


def app_identity(name, peer: Peer) -> str:
    """The app a bind of ``name`` stands for: a label within the peer's uid, or within TCP's token holders."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_APP_NAME:
        raise WorkbenchError(f"an app is named by a non-empty string of at most {MAX_APP_NAME} characters, "
                             f"got {name!r}")
    return f"tcp:{name}" if peer.uid is None else f"uid{peer.uid}:{name}"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600), replacing it whole."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")          # mkstemp makes it 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class AppTokens:
    """The TCP apps' tokens, hashed in a 0600 JSON file: the first bind of a name holds it from then on."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        try:
            self._hashes: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
        except ValueError as exc:
            raise WorkbenchError(f"the app tokens in {path} are damaged ({exc}); remove the file and apps bound "
                                 f"over TCP get new tokens at their next bind") from exc

    def admit(self, name: str, token) -> str | None:
        """Check ``token`` for ``name``; a name not seen before takes the token given, or a new one, which
        is returned (None when the client's own token was accepted)."""
        if token is not None and not isinstance(token, str):
            raise ProtocolError(f"an app token is a string, got {type(token).__name__}")
        with self._lock:
            known = self._hashes.get(name)
            if known is None:
                issued = None if token else secrets.token_urlsafe(32)
                self._hashes[name] = _sha256(token or issued)
                _write_private(self.path, json.dumps(self._hashes))
                return issued
        if token is None or not hmac.compare_digest(_sha256(token), known):
            raise IdentityError(f"app {name!r} is held by the client that first bound it over TCP; this client "
                                f"{'presented a wrong token' if token else 'has no token for it'}; choose "
                                f"another app name")
        return None


class ReplyMemory:
    """The last reply per app and context with its ``call_id``, so a repeated call is answered, not run."""

    @dataclass(eq=False)
    class _Entry:
        call_id: str
        request: str
        done: threading.Event
        reply: dict | None = None

    def __init__(self, kept: int = REPLIES_KEPT):
        self.kept = kept
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], ReplyMemory._Entry] = OrderedDict()

    def run_once(self, key: tuple[str, str], call_id: str | None, request: str, run: Callable[[], dict]) -> dict:
        """``run()``'s reply, or the reply an earlier request of the same ``call_id`` got (waiting for it
        while it runs); ``request`` (the prompt and settings) must be the same. A failed run is forgotten,
        so its repeat runs again."""
        if call_id is None:
            return run()
        with self._lock:
            entry = self._entries.get(key)
            first = entry is None or entry.call_id != call_id
            if not first and entry.request != request:
                raise ProtocolError(f"call_id {call_id!r} was given to another call on this context (another prompt "
                                    f"or max_new_tokens); a new call needs a new call_id")
            if first:
                entry = self._entries[key] = self._Entry(call_id, request, threading.Event())
            self._entries.move_to_end(key)
            while len(self._entries) > self.kept:
                self._entries.popitem(last=False)
        if not first:
            entry.done.wait()
            if entry.reply is not None:
                return dict(entry.reply, repeated=True)
            return self.run_once(key, call_id, request, run)
        try:
            entry.reply = run()
        except BaseException:
            with self._lock:
                if self._entries.get(key) is entry:
                    del self._entries[key]
            raise
        finally:
            entry.done.set()
        return entry.reply


# ----------------------------------------------------------------------------- connections

class _Pieces:
    """Generated token ids -> the new text each adds (held back while a character is incomplete)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def add(self, token: int) -> str:
        if token == self.tokenizer.im_end_id:
            return ""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd") or not text.startswith(self.text):
            return ""
        piece, self.text = text[len(self.text):], text
        return piece


def _reply_error(exc: Exception) -> dict:
    return {"ok": False, "error": str(exc), "type": type(exc).__name__}


def _deadline(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ProtocolError(f"deadline_s is a positive number of seconds, got {value!r}")
    return time.monotonic() + value


class _Handler(socketserver.BaseRequestHandler):
    """One connection: bind an app, then answer its requests in order. Replies and streamed pieces go
    out through a writer thread, so a client that reads slowly never holds up the model."""

    def setup(self) -> None:
        self.owner: LLMServer = self.server.owner
        self.reader = LineReader(self.request)
        self.outbox: queue.Queue[dict | None] = queue.Queue()
        self.broken = False
        self.session = None
        self.peer = self.owner.peer_of(self.request)
        threading.Thread(target=self._write, daemon=True).start()

    def finish(self) -> None:
        self.outbox.put(None)

    def _write(self) -> None:
        while True:
            message = self.outbox.get()
            try:
                if message is None:
                    return
                if not self.broken:
                    self.request.sendall(encode(message))
            except OSError:
                self.broken = True
            finally:
                self.outbox.task_done()

    def _send(self, reply: dict) -> bool:
        """Queue ``reply`` and wait until it (and every piece before it) is written."""
        self.outbox.put(reply)
        self.outbox.join()
        return not self.broken

    def handle(self) -> None:
        while True:
            try:
                line = self.reader.readline(MAX_REQUEST_BYTES)
            except ProtocolError as exc:
                if not self._send(_reply_error(exc)):
                    return
                continue
            except OSError:
                return
            if not line:
                return
            with self.owner.in_flight():
                rid, op, started = None, None, time.monotonic()
                try:
                    request = json.loads(line)
                    if not isinstance(request, dict):
                        raise ProtocolError("a request is a JSON object")
                    rid, op = request.get("id"), request.get("op")
                    reply = self._answer(request)
                except WorkbenchError as exc:
                    reply = _reply_error(exc)
                except (ValueError, TypeError, KeyError) as exc:
                    reply = _reply_error(ProtocolError(f"bad request: {exc}"))
                except Exception as exc:                    # the service failed; the connection stays usable
                    reply = _reply_error(exc)
                self.owner.log_request(self.session.app if self.session else None, op, reply,
                                       time.monotonic() - started)
                if not self._send(dict(reply, id=rid)):
                    return

    def _answer(self, request: dict) -> dict:
        op = request.get("op")
        service, session = self.owner.service, self.session
        if op == "bind":
            return self._bind(request)
        if op == "snapshot" and request.get("all"):
            self.owner.check_operator(request.get("operator_token"))
            return {"ok": True, "snapshot": service.snapshot()}
        if session is None:
            raise ProtocolError(f"bind an app first: {{\"op\": \"bind\", \"app\": NAME, \"version\": "
                                f"\"{PROTOCOL_VERSION}\"}}")
        if op == "new_ctx":
            return {"ok": True, "stub": session.new_ctx(request.get("system_prompt")).token}
        if op == "call":
            return self._call(request)
        if op == "list":
            return {"ok": True, "contexts": session.contexts()}
        if op == "delete":
            if "ctx" in request:
                session.delete_context(request["ctx"])
            else:
                session.delete(CtxStub(str(request["stub"])))
            return {"ok": True}
        if op == "snapshot":
            return {"ok": True, "snapshot": session.snapshot()}
        raise ProtocolError(f"unknown op {op!r}; ops: {OPS}")

    def _bind(self, request: dict) -> dict:
        if self.session is not None:
            raise ProtocolError(f"this connection is bound to app {self.session.app!r} already")
        check_version(request.get("version"), "client")
        name = request["app"]
        identity = app_identity(name, self.peer)
        issued = self.owner.tokens.admit(name, request.get("token")) if self.peer.uid is None else None
        self.session = self.owner.service.bind(identity)
        reply = {"ok": True, "app": identity, "version": PROTOCOL_VERSION}
        if issued is not None:
            reply["token"] = issued
        return reply

    def _call(self, request: dict) -> dict:
        session, rid = self.session, request.get("id")
        stub = CtxStub(str(request["stub"]))
        prompt, max_new_tokens = request["prompt"], request.get("max_new_tokens", 16)
        call_id, deadline = request.get("call_id"), _deadline(request.get("deadline_s"))
        if call_id is not None and (not isinstance(call_id, str) or not 0 < len(call_id) <= 200):
            raise ProtocolError(f"a call_id is a string of 1 to 200 characters, got {call_id!r}")
        tokenizer = self.owner.service.tokenizer
        pieces = _Pieces(tokenizer) if request.get("stream") is True else None

        def run() -> dict:
            generated: list[int] = []
            stopped = []

            def on_token(token: int) -> bool:
                generated.append(token)
                if pieces is not None:
                    piece = pieces.add(token)
                    if piece:
                        self.outbox.put({"id": rid, "event": "text", "text": piece})
                if deadline is not None and time.monotonic() >= deadline:
                    stopped.append(True)
                return bool(stopped)

            text, stats = session.call_with_stats(stub, prompt, max_new_tokens, on_token=on_token, deadline=deadline,
                                                  call_id=call_id)
            cut = bool(stopped) and len(generated) < max_new_tokens and generated[-1] != tokenizer.im_end_id
            return {"ok": True, "text": text, "stats": replace(stats, cut_by_deadline=cut).to_dict()}

        fingerprint = json.dumps([prompt, max_new_tokens])
        return self.owner.replies.run_once((session.app, _sha256(stub.token)), call_id, fingerprint, run)


class _UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    block_on_close = False


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


def _claim_socket_path(path: Path, made: list[Path] | None = None) -> None:
    """Remove a socket file left by a dead server; refuse one a live server answers on."""
    if not path.exists() and not path.is_symlink():
        make_folder(path.parent, what=f"the folder of the socket unix:{path} (--address)", made=made)
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()
    else:
        raise AddressError(f"an LLM service already listens on unix:{path}; stop it or pass another --address")
    finally:
        probe.close()


def group_id(name: str) -> int:
    """The gid of group ``name``, one this user may give files to; else an error naming the problem."""
    import grp

    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        raise WorkbenchError(f"--group: no group {name!r} on this machine (`getent group` lists them)") from None
    if os.geteuid() != 0 and gid not in os.getgroups() and gid != os.getegid():
        raise WorkbenchError(f"--group {name}: this user is not one of its members, so it cannot give the socket "
                             f"to it (`usermod -aG {name} USER`, then log in again)")
    return gid


def _bind_unix(path: Path, group: int | None = None) -> _UnixServer:
    """A server on ``path`` that no other user could reach at any moment: bound in a private (0700)
    folder, made 0600 (or 0660 and given to ``group``), then moved into place."""
    try:
        private = Path(tempfile.mkdtemp(prefix=".llms-", dir=path.parent))
    except OSError as exc:
        raise AddressError(f"cannot make the socket unix:{path} (--address): {exc.strerror or exc}; give a path in "
                           f"a writable folder") from None
    try:
        server = _UnixServer(str(private / "s"), _Handler)
        if group is not None:
            os.chown(private / "s", -1, group)
        os.chmod(private / "s", 0o600 if group is None else 0o660)
        os.replace(private / "s", path)
    except OSError as exc:
        raise AddressError(f"cannot listen on unix:{path} (--address): {exc.strerror or exc}; give a shorter path "
                           f"in a writable folder") from None
    finally:
        for leftover in private.iterdir():
            leftover.unlink()
        private.rmdir()
    return server


def listen(address: str | None = None, made: list[Path] | None = None,
           group: int | None = None) -> tuple[str, Path | None, object]:
    """Bind ``address`` now, before a model loads: (kind, socket path or None, the socketserver).
    An address that cannot be used raises an ``AddressError`` naming it and what to do; folders made
    for a socket are appended to ``made``. ``group``: a Unix socket that group's members may connect to."""
    kind, where = parse_address(address or default_address())
    if kind == "unix":
        path = Path(where)
        _claim_socket_path(path, made)
        return kind, path, _bind_unix(path, group)
    host, port = where
    sock = bind_tcp(port, host, option=f"--address tcp:{host}:{port}", free=f"tcp:{host}:0")
    server = _TCPServer(sock.getsockname(), _Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.server_address = sock.getsockname()
    return kind, None, server


def private_dir(path: Path | str, made: list[Path] | None = None, group: int | None = None) -> Path:
    """``path`` as a folder only its owner may enter (0700), made if missing; with ``group``, one that group's
    members may pass through but not list (0710)."""
    folder = make_folder(path, what="the swap directory (--swap-dir)", mode=0o700 if group is None else 0o710,
                         made=made)
    if group is not None:
        os.chown(folder, -1, group)
    return folder


class LLMServer:
    """``service`` on ``address`` (see ``parse_address``; default ``default_address()``).
    ``serve_forever`` in one thread, ``shutdown`` from another, then ``close``.

    ``operator_token`` (also in ``operator_token_path``, 0600) opens the all-app snapshot.
    ``peer_credentials(sock)`` reads who connected on a Unix socket (the kernel's answer by default)."""

    def __init__(self, service: LLMService, address: str | None = None, *,
                 peer_credentials: Callable[[socket.socket], Peer] = peer_credentials,
                 bound: tuple | None = None, log: Callable[[str], None] | None = None, verbose: bool = False,
                 group: int | None = None):
        self.service = service
        self.kind, self.path, self._server = bound or listen(address, group=group)
        self._peer_credentials = peer_credentials
        self._log, self.verbose, self._log_lock = log, verbose, threading.Lock()
        try:
            swap = private_dir(service.swap_dir, group=group)
            self.tokens = AppTokens(swap / "app-tokens.json")
            self.replies = ReplyMemory()
            self.operator_token = secrets.token_urlsafe(32)
            self.operator_token_path = swap / "operator.token"
            _write_private(self.operator_token_path, self.operator_token)
        except BaseException:
            self._close_socket()
            raise
        self._server.owner = self
        self._busy = 0
        self._idle = threading.Condition()

    def log(self, line: str) -> None:
        """One line to the server's log (``log`` given at start), whole even when threads write at once."""
        if self._log is not None:
            with self._log_lock:
                self._log(line)

    def log_request(self, app: str | None, op, reply: dict, seconds: float) -> None:
        """A failed request's line always; an answered one's with ``verbose``."""
        if reply.get("ok", True) and not self.verbose:
            return
        what = f"llms: {app or 'unbound'} {op if isinstance(op, str) else '?'}"
        if reply.get("ok", True):
            stats = reply.get("stats") or {}
            extra = (f", {stats['prompt_tokens']} prompt and {stats['output_tokens']} new tokens, switch "
                     f"{1e3 * stats['switch_s']:.0f} ms" if "output_tokens" in stats else "")
            self.log(f"{what} ok in {1e3 * seconds:.0f} ms{extra}")
        else:
            self.log(f"{what} failed: {reply.get('type')}: {reply.get('error')}")

    def _close_socket(self) -> None:
        self._server.server_close()
        if self.path is not None and self.path.exists():
            self.path.unlink()

    @property
    def address(self) -> str:
        if self.kind == "unix":
            return f"unix:{self.path}"
        host, port = self._server.server_address[:2]
        return f"tcp:{host}:{port}"

    def peer_of(self, sock: socket.socket) -> Peer:
        return self._peer_credentials(sock) if self.kind == "unix" else Peer()

    def check_operator(self, token) -> None:
        if not isinstance(token, str) or not hmac.compare_digest(token, self.operator_token):
            raise IdentityError(f"every app's snapshot needs the operator's token (in {self.operator_token_path}); "
                                f"without it, ask for this app's own snapshot")

    @contextmanager
    def in_flight(self) -> Iterator[None]:
        """Counts a request from its arrival until its reply is written (``close`` waits for them)."""
        with self._idle:
            self._busy += 1
        try:
            yield
        finally:
            with self._idle:
                self._busy -= 1
                self._idle.notify_all()

    def serve_forever(self) -> None:
        self._server.serve_forever(poll_interval=0.2)

    def shutdown(self) -> None:
        """Stop accepting (call from another thread than ``serve_forever``'s)."""
        self._server.shutdown()

    def close(self, timeout: float = 60.0) -> None:
        """Close the listening socket, let the call being served finish (queued ones are refused),
        wait for their replies, close the service."""
        self._close_socket()
        self.operator_token_path.unlink(missing_ok=True)
        self.service.close()
        with self._idle:
            self._idle.wait_for(lambda: self._busy == 0, timeout=timeout)


def serve(address: str | None = None, *, swap_dir: Path | str | None = None,
          memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET, max_contexts_per_app: int = DEFAULT_MAX_CONTEXTS_PER_APP,
          config: ServiceConfig | None = None, metrics_port: int | None = None, model=None,
          device: str = "host", out: Callable[[str], None] | None = None, verbose: bool = False,
          group: str | None = None, http: str | None = None) -> None:
    """Run an LLM service on ``address`` until SIGTERM or SIGINT (the ``workbench serve llms`` command).

    The address, swap directory and metrics port are checked (the address bound) before the model
    loads: one that cannot be used raises an ``AddressError`` and leaves no socket or folder made.
    Logs one line when ready (address, swap directory, contexts restored, metrics URL when
    ``metrics_port`` is given; 0 picks a free port), one per failed request, one when stopped;
    ``verbose`` adds one per request. Must run in the main thread.
    ``device``: the cost model the swapping-recompute pipeline plans on (``"host"``, measured once and
    cached, or an emulated preset whose loads are padded to its speed); resolved before serving. ``group``: a
    group whose members may connect too (a Unix socket only; each is still its own uid's apps). ``http``:
    also serve the OpenAI-compatible endpoint (``endpoint``) on ``127.0.0.1:PORT``."""
    out = out or (lambda line: print(line, flush=True))
    gid = group_id(group) if group is not None else None
    if gid is not None and parse_address(address or default_address())[0] != "unix":
        raise WorkbenchError("--group lets a group in through a Unix socket's permissions; a TCP address has "
                             "none (its apps bind with tokens): drop --group or serve on unix:PATH")
    made: list[Path] = []
    http_sock = None
    if http is not None:
        from workbench.kvcache.endpoint import parse_http_address

        http_sock = bind_tcp(parse_http_address(http)[1], option="--http", free="--http 127.0.0.1:0")
    try:
        bound = listen(address, made, group=gid)
    except BaseException:
        if http_sock is not None:
            http_sock.close()
        raise
    service = None
    try:
        swap_dir = private_dir(swap_dir if swap_dir is not None else default_swap_dir(), made, group=gid)
        if metrics_port:
            check_tcp_port(metrics_port, option="--metrics-port", free="--metrics-port 0")
        service = LLMService(model, swap_dir, memory_budget_bytes, max_contexts_per_app, config, device=device)
        chunk_size = service.config.chunk_size
        if not host_costs_cached(service.model, chunk_size):
            out("llms: measuring this host's swap and recompute costs once (about 10 s; cached after)")
        costs = service.loader.costs_for(service.model, chunk_size)
        server = LLMServer(service, bound=bound, log=out, verbose=verbose, group=gid)
    except BaseException:
        if http_sock is not None:
            http_sock.close()
        bound[2].server_close()
        if bound[1] is not None:
            bound[1].unlink(missing_ok=True)
        if service is not None:
            service.close()
        remove_made(made)
        raise

    def stop(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    metrics = api = None
    try:
        extra = ""
        if metrics_port is not None:
            metrics, _ = service.start_metrics_server(metrics_port)
            extra = f", metrics on http://127.0.0.1:{metrics.server_port}/metrics"
        if http_sock is not None:
            from workbench.kvcache.endpoint import ChatEndpoint, HTTPServer

            api = HTTPServer(ChatEndpoint(service), http_sock, log=out if verbose else None).start()
            keys = len(api.endpoint.keys.names())
            extra += (f", OpenAI-compatible endpoint on {api.url} ({keys} API key{'' if keys == 1 else 's'}; add "
                      f"one with `workbench serve llms keys add NAME`)")
        contexts = len(service.snapshot()["contexts"])
        pipeline = costs.device + (" (emulated)" if costs.source == "emulated" else "")
        out(f"llms: serving on {server.address} (swap dir {service.swap_dir}, {contexts} contexts restored, "
            f"swap-in pipeline planned for {pipeline}{extra})")
        server.serve_forever()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if api is not None:
            api.stop()
        server.close()
        if metrics is not None:
            metrics.shutdown()
        out("llms: stopped")
