"""The LLM service for other processes: newline-delimited JSON over a Unix socket or loopback TCP.

Protocol: each request and each reply is one JSON object on one line (UTF-8, at most 1 MiB).
A connection binds one app first, then uses it::

    {"op": "bind", "app": "notes"}                         -> {"ok": true}
    {"op": "new_ctx", "system_prompt": null}               -> {"ok": true, "stub": "<secret>"}
    {"op": "call", "stub": "...", "prompt": "...", "max_new_tokens": 16}
                                                           -> {"ok": true, "text": "...", "stats": {...}}
    {"op": "delete", "stub": "..."}                        -> {"ok": true}
    {"op": "snapshot"}                                     -> {"ok": true, "snapshot": {...}}

A failed request answers ``{"ok": false, "error": "<message>", "type": "<error class>"}`` and the
connection stays usable. Each connection has its own thread; calls share the service's FIFO turn.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from workbench.errors import WorkbenchError
from workbench.kvcache.costmodel import host_costs_cached
from workbench.kvcache.service import (DEFAULT_MAX_CONTEXTS_PER_APP, DEFAULT_MEMORY_BUDGET, CtxStub, LLMService,
                                       ServiceConfig)

MAX_LINE = 1 << 20
LOOPBACK = ("127.0.0.1", "localhost")


class ProtocolError(WorkbenchError):
    """A request the protocol does not allow."""


def default_address() -> str:
    """``unix:<cache>/llms/llms.sock``."""
    from workbench.cache import cache_dir

    return f"unix:{cache_dir() / 'llms' / 'llms.sock'}"


def parse_address(address: str) -> tuple[str, object]:
    """``unix:PATH`` (or a path) -> ("unix", path); ``tcp:127.0.0.1:PORT`` (or ``127.0.0.1:PORT``) ->
    ("tcp", (host, port)). TCP is loopback only: the service has no authentication beyond its stubs."""
    text = str(address)
    if text.startswith("unix:"):
        return "unix", text[5:]
    if "/" in text:
        return "unix", text
    host, _, port = text.removeprefix("tcp:").rpartition(":")
    if host not in LOOPBACK or not port.isdigit():
        raise WorkbenchError(f"an address is unix:PATH or tcp:127.0.0.1:PORT (loopback only), got {address!r}")
    return "tcp", ("127.0.0.1", int(port))


def _reply_error(exc: Exception) -> dict:
    return {"ok": False, "error": str(exc), "type": type(exc).__name__}


class _Handler(socketserver.StreamRequestHandler):
    """One connection: bind an app, then answer its requests in order."""

    def handle(self) -> None:
        server: LLMServer = self.server.owner
        session = None
        while True:
            line = self.rfile.readline(MAX_LINE + 1)
            if not line:
                return
            if len(line) > MAX_LINE:
                while line and not line.endswith(b"\n"):         # skip the rest of the oversized line
                    line = self.rfile.readline(MAX_LINE)
                if not self._send(_reply_error(ProtocolError(f"a request is one line of at most {MAX_LINE} bytes"))):
                    return
                continue
            with server.in_flight():
                try:
                    request = json.loads(line)
                    if not isinstance(request, dict):
                        raise ProtocolError("a request is a JSON object")
                    reply, session = self._answer(server.service, session, request)
                except WorkbenchError as exc:
                    reply = _reply_error(exc)
                except (ValueError, TypeError, KeyError) as exc:
                    reply = _reply_error(ProtocolError(f"bad request: {exc}"))
                except Exception as exc:                    # the service failed; the connection stays usable
                    reply = _reply_error(exc)
                if not self._send(reply):
                    return

    def _send(self, reply: dict) -> bool:
        try:
            self.wfile.write(json.dumps(reply).encode() + b"\n")
            self.wfile.flush()
            return True
        except OSError:
            return False

    @staticmethod
    def _answer(service: LLMService, session, request: dict) -> tuple[dict, object]:
        op = request.get("op")
        if op == "bind":
            if session is not None:
                raise ProtocolError(f"this connection is bound to app {session.app!r} already")
            return {"ok": True}, service.bind(request["app"])
        if op == "snapshot":
            return {"ok": True, "snapshot": service.snapshot()}, session
        if session is None:
            raise ProtocolError("bind an app first: {\"op\": \"bind\", \"app\": NAME}")
        if op == "new_ctx":
            return {"ok": True, "stub": session.new_ctx(request.get("system_prompt")).token}, session
        if op == "call":
            text, stats = session.call_with_stats(CtxStub(str(request["stub"])), request["prompt"],
                                                  request.get("max_new_tokens", 16))
            return {"ok": True, "text": text, "stats": stats.to_dict()}, session
        if op == "delete":
            session.delete(CtxStub(str(request["stub"])))
            return {"ok": True}, session
        raise ProtocolError(f"unknown op {op!r}; ops: bind, new_ctx, call, delete, snapshot")


class _UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    block_on_close = False


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


def _claim_socket_path(path: Path) -> None:
    """Remove a socket file left by a dead server; refuse one a live server answers on."""
    if not path.exists() and not path.is_symlink():
        path.parent.mkdir(parents=True, exist_ok=True)
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()
    else:
        raise WorkbenchError(f"an LLM service already listens on unix:{path}; stop it or choose another address")
    finally:
        probe.close()


class LLMServer:
    """``service`` on ``address`` (see ``parse_address``; default ``default_address()``).
    ``serve_forever`` in one thread, ``shutdown`` from another, then ``close``."""

    def __init__(self, service: LLMService, address: str | None = None):
        self.service = service
        self.kind, where = parse_address(address or default_address())
        if self.kind == "unix":
            self.path = Path(where)
            _claim_socket_path(self.path)
            self._server = _UnixServer(str(self.path), _Handler)
            os.chmod(self.path, 0o600)
        else:
            self.path = None
            self._server = _TCPServer(where, _Handler)
        self._server.owner = self
        self._busy = 0
        self._idle = threading.Condition()

    @property
    def address(self) -> str:
        if self.kind == "unix":
            return f"unix:{self.path}"
        host, port = self._server.server_address[:2]
        return f"tcp:{host}:{port}"

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
        self._server.server_close()
        if self.path is not None and self.path.exists():
            self.path.unlink()
        self.service.close()
        with self._idle:
            self._idle.wait_for(lambda: self._busy == 0, timeout=timeout)


def serve(address: str | None = None, *, swap_dir: Path | str | None = None,
          memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET, max_contexts_per_app: int = DEFAULT_MAX_CONTEXTS_PER_APP,
          config: ServiceConfig | None = None, metrics_port: int | None = None, model=None,
          device: str = "host", out: Callable[[str], None] | None = None) -> None:
    """Run an LLM service on ``address`` until SIGTERM or SIGINT (the ``workbench serve llms`` command).

    Prints one line when ready (address, swap directory, contexts restored, metrics URL when
    ``metrics_port`` is given; 0 picks a free port) and one when stopped. Must run in the main thread.
    ``device``: the cost model the swapping-recompute pipeline plans on (``"host"``, measured once and
    cached, or an emulated preset whose loads are padded to its speed); resolved before serving."""
    out = out or (lambda line: print(line, flush=True))
    service = LLMService(model, swap_dir, memory_budget_bytes, max_contexts_per_app, config, device=device)
    try:
        chunk_size = service.config.chunk_size
        if not host_costs_cached(service.model, chunk_size):
            out("llms: measuring this host's swap and recompute costs once (about 10 s; cached after)")
        costs = service.loader.costs_for(service.model, chunk_size)
        server = LLMServer(service, address)
    except BaseException:
        service.close()
        raise

    def stop(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    http = None
    try:
        extra = ""
        if metrics_port is not None:
            http, _ = service.start_metrics_server(metrics_port)
            extra = f", metrics on http://127.0.0.1:{http.server_port}/metrics"
        contexts = len(service.snapshot()["contexts"])
        pipeline = costs.device + (" (emulated)" if costs.source == "emulated" else "")
        out(f"llms: serving on {server.address} (swap dir {service.swap_dir}, {contexts} contexts restored, "
            f"swap-in pipeline planned for {pipeline}{extra})")
        server.serve_forever()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.close()
        if http is not None:
            http.shutdown()
        out("llms: stopped")
