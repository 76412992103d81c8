"""A client of the LLM service in another process, with the same API as ``AppSession``::

    from workbench.kvcache.client import connect
    with connect("notes") as llm:
        stub = llm.new_ctx("Be brief.")
        print(llm.call(stub, "Name a river in France.", max_new_tokens=8))

Errors the service raises come back as the same classes (``StubError``, ``ContextLimitError``,
``MemoryBudgetError``, ...); a lost connection raises ``ConnectionLostError``.
"""
from __future__ import annotations

import json
import socket
import threading

from workbench.errors import WorkbenchError
from workbench.kvcache.lifecycle import MemoryBudgetError
from workbench.kvcache.server import MAX_LINE, ProtocolError, default_address, parse_address
from workbench.kvcache.service import (CallStats, ContextLimitError, CtxStub, ServiceClosedError, StubError,
                                       SwapStoreError)

_ERRORS = {cls.__name__: cls for cls in (StubError, ContextLimitError, MemoryBudgetError, ServiceClosedError,
                                         SwapStoreError, ProtocolError)}


class RemoteError(WorkbenchError):
    """An error of the service that has no class of its own here."""


class ConnectionLostError(WorkbenchError, ConnectionError):
    """The service closed the connection or could not be reached."""


class RemoteSession:
    """One app's connection to a served LLM service; safe to share between threads (requests take turns)."""

    def __init__(self, app: str, address: str | None = None, timeout: float | None = None):
        self.app = app
        self.address = address or default_address()
        kind, where = parse_address(self.address)
        family = socket.AF_UNIX if kind == "unix" else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(where)
        except OSError as exc:
            self._sock.close()
            raise ConnectionLostError(f"no LLM service answers on {self.address} ({exc.strerror or exc}); "
                                      f"start one with `workbench serve llms`") from exc
        self._file = self._sock.makefile("rwb")
        self._lock = threading.Lock()
        self._request({"op": "bind", "app": app})

    def _request(self, request: dict) -> dict:
        with self._lock:
            try:
                self._file.write(json.dumps(request).encode() + b"\n")
                self._file.flush()
                line = self._file.readline(MAX_LINE + 1)
            except OSError as exc:
                raise ConnectionLostError(f"the connection to the LLM service on {self.address} broke ({exc})") from exc
        if not line:
            raise ConnectionLostError(f"the LLM service on {self.address} closed the connection")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise _ERRORS.get(reply.get("type"), RemoteError)(reply.get("error", "the service refused the request"))
        return reply

    def new_ctx(self, system_prompt: str | None = None) -> CtxStub:
        return CtxStub(self._request({"op": "new_ctx", "system_prompt": system_prompt})["stub"])

    def call(self, stub: CtxStub, prompt: str, max_new_tokens: int = 16) -> str:
        return self.call_with_stats(stub, prompt, max_new_tokens)[0]

    def call_with_stats(self, stub: CtxStub, prompt: str, max_new_tokens: int = 16) -> tuple[str, CallStats]:
        reply = self._request({"op": "call", "stub": stub.token, "prompt": prompt, "max_new_tokens": max_new_tokens})
        return reply["text"], CallStats(**reply["stats"])

    def delete(self, stub: CtxStub) -> None:
        self._request({"op": "delete", "stub": stub.token})

    def snapshot(self) -> dict:
        return self._request({"op": "snapshot"})["snapshot"]

    def close(self) -> None:
        try:
            self._file.close()
        finally:
            self._sock.close()

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect(app: str, address: str | None = None, timeout: float | None = None) -> RemoteSession:
    """Bind ``app`` on the service at ``address`` (default: the Unix socket in the cache)."""
    return RemoteSession(app, address, timeout)
