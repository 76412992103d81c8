"""A client of the LLM service in another process, with the same API as ``AppSession``::

    from workbench.kvcache.client import connect
    with connect("notes") as llm:
        stub = llm.new_ctx("Be brief.")
        print(llm.call(stub, "Name a river in France.", max_new_tokens=8))
        for piece in llm.call_stream(stub, "And in Spain?"):
            print(piece, end="", flush=True)

Light: it imports neither torch nor SciPy (``protocol``, ``errors``). Errors the service raises come back
as the same classes (``StubError``, ``ContextLimitError``, ``MemoryBudgetError``, ``DeadlineError``, ...);
a lost connection raises ``ConnectionLostError`` and a reply later than ``timeout`` ``CallTimeoutError``.
Both carry the call's ``call_id``: calling again with it returns the first call's reply instead of adding
the turn twice. Over TCP the token the service issues at an app's first bind is kept in a 0600 file in
the user's cache (``default_token_file``) and presented at later binds.
"""
from __future__ import annotations

import fcntl
import json
import os
import secrets
import socket
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from workbench.errors import WorkbenchError
from workbench.kvcache.errors import (CallFailedError, ContextLimitError, DeadlineError,  # noqa: F401
                                      IdentityError, MemoryBudgetError, ProtocolError, ServiceClosedError, StubError,
                                      SwapStoreError)
from workbench.kvcache.protocol import (ERRORS, MAX_REQUEST_BYTES, PROTOCOL_VERSION, CallStats, CtxStub, LineReader,
                                        check_version, default_address, encode, parse_address)


class RemoteError(WorkbenchError):
    """An error of the service that has no class of its own here."""


class ConnectionLostError(WorkbenchError, ConnectionError):
    """The service closed the connection or could not be reached."""

    call_id: str | None = None


class CallTimeoutError(WorkbenchError, TimeoutError):
    """No reply within the client's timeout; the request may still be served."""

    call_id: str | None = None


def default_token_file() -> Path:
    from workbench.cache import cache_dir

    return cache_dir() / "llms" / "app-tokens.json"


@contextmanager
def _locked_tokens(path: Path) -> Iterator[dict]:
    """The token file's entries under an exclusive lock; changes are written back (0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        os.fchmod(fd, 0o600)
        text = f.read()
        tokens = json.loads(text) if text.strip() else {}
        before = dict(tokens)
        yield tokens
        if tokens != before:
            f.seek(0)
            f.truncate()
            f.write(json.dumps(tokens))


class CallStream:
    """The pieces of one streamed call's answer as the model generates them; once iterated to the end,
    ``text`` and ``stats`` hold the whole reply (``stats.cut_by_deadline`` says if the deadline ended it)."""

    def __init__(self, messages: Iterator[dict]):
        self._messages = messages
        self.text: str | None = None
        self.stats: CallStats | None = None

    def __iter__(self) -> Iterator[str]:
        sent = ""
        for message in self._messages:
            if "event" in message:
                sent += message["text"]
                yield message["text"]
                continue
            self.text, self.stats = message["text"], CallStats.from_dict(message["stats"])
            if self.text.startswith(sent) and len(self.text) > len(sent):     # a repeated call: no pieces came
                yield self.text[len(sent):]


class RemoteSession:
    """One app's connection to a served LLM service; safe to share between threads (requests take turns).
    ``timeout``: seconds to wait for each reply (or the next streamed piece); it may be changed between calls."""

    def __init__(self, app: str | None, address: str | None = None, timeout: float | None = None, *,
                 token_file: Path | str | None = None):
        self.app = app
        self.address = address or default_address()
        self._timeout = timeout
        kind, where = parse_address(self.address)
        family = socket.AF_UNIX if kind == "unix" else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(where)
        except PermissionError as exc:
            self._sock.close()
            raise ConnectionLostError(
                f"the LLM service on {self.address} refuses this user ({exc.strerror or exc}): its socket admits "
                f"only the user who started it, or, started with `workbench serve llms --group NAME`, that group's "
                f"members too; ask its operator to start it with --group and to add you to the group") from exc
        except OSError as exc:
            self._sock.close()
            raise ConnectionLostError(f"no LLM service answers on {self.address} ({exc.strerror or exc}); "
                                      f"start one with `workbench serve llms`") from exc
        self._reader = LineReader(self._sock)
        self._lock = threading.Lock()
        self._last_id = 0
        try:
            self.identity = None if app is None else self._bind(kind, Path(token_file) if token_file
                                                                else default_token_file())
        except BaseException:
            self._sock.close()
            raise

    @property
    def timeout(self) -> float | None:
        return self._timeout

    @timeout.setter
    def timeout(self, seconds: float | None) -> None:
        self._timeout = seconds
        self._sock.settimeout(seconds)

    def _bind(self, kind: str, token_file: Path) -> str:
        """Bind the app (presenting its TCP token when this user has one); returns the app's identity."""
        key = f"{self.address} {self.app}"
        request = {"op": "bind", "app": self.app, "version": PROTOCOL_VERSION}
        if kind == "tcp":
            with _locked_tokens(token_file) as tokens:
                if key in tokens:
                    request["token"] = tokens[key]
        reply = self._request(request)
        check_version(reply.get("version"), "service")
        if "token" in reply:
            with _locked_tokens(token_file) as tokens:
                tokens[key] = reply["token"]
        return reply["app"]

    def _messages(self, request: dict) -> Iterator[dict]:
        """Send ``request`` and yield what answers it: streamed events, then the reply (raised when it is
        an error). Replies to earlier requests that timed out are skipped by their ``id``."""
        with self._lock:
            self._last_id += 1
            rid = self._last_id
            data = encode(dict(request, id=rid))
            if len(data) > MAX_REQUEST_BYTES:
                raise ProtocolError(f"the request is {len(data)} bytes, more than the {MAX_REQUEST_BYTES} a request "
                                    f"may be; send a shorter prompt")
            while True:
                try:
                    if data:
                        self._sock.sendall(data)
                        data = b""
                    line = self._reader.readline()
                except TimeoutError as exc:
                    raise self._failed(CallTimeoutError, f"no reply from the LLM service on {self.address} within "
                                                         f"{self.timeout} s", request) from exc
                except OSError as exc:
                    raise self._failed(ConnectionLostError, f"the connection to the LLM service on {self.address} "
                                                            f"broke ({exc})", request) from exc
                if not line:
                    raise self._failed(ConnectionLostError, f"the LLM service on {self.address} closed the "
                                                            f"connection", request)
                message = json.loads(line)
                if message.get("id") not in (rid, None):
                    continue
                if "event" not in message:
                    break
                yield message
        if not message.get("ok"):
            raise ERRORS.get(message.get("type"), RemoteError)(message.get("error", "the service refused the request"))
        yield message

    @staticmethod
    def _failed(cls, text: str, request: dict) -> WorkbenchError:
        call_id = request.get("call_id")
        if call_id is not None:
            text += f"; the call may have run: call again with call_id={call_id!r} to get its reply without " \
                    f"adding the turn twice"
        exc = cls(text)
        exc.call_id = call_id
        return exc

    def _request(self, request: dict) -> dict:
        *_, reply = self._messages(request)
        return reply

    def new_ctx(self, system_prompt: str | None = None) -> CtxStub:
        return CtxStub(self._request({"op": "new_ctx", "system_prompt": system_prompt})["stub"])

    def _call_request(self, stub: CtxStub, prompt: str, max_new_tokens: int, call_id: str | None,
                      deadline_s: float | None, stream: bool) -> dict:
        request = {"op": "call", "stub": stub.token, "prompt": prompt, "max_new_tokens": max_new_tokens,
                   "call_id": call_id or secrets.token_hex(16), "stream": stream}
        if deadline_s is not None:
            request["deadline_s"] = deadline_s
        return request

    def call(self, stub: CtxStub, prompt: str, max_new_tokens: int = 16, *, call_id: str | None = None,
             deadline_s: float | None = None) -> str:
        return self.call_with_stats(stub, prompt, max_new_tokens, call_id=call_id, deadline_s=deadline_s)[0]

    def call_with_stats(self, stub: CtxStub, prompt: str, max_new_tokens: int = 16, *, call_id: str | None = None,
                        deadline_s: float | None = None) -> tuple[str, CallStats]:
        """Like ``AppSession.call_with_stats``. ``call_id`` (a new random one by default) makes a repeat of
        this call return its reply instead of running it again. ``deadline_s``: a call whose turn comes
        later is refused (``DeadlineError``), one that reaches it while generating returns what it has."""
        reply = self._request(self._call_request(stub, prompt, max_new_tokens, call_id, deadline_s, False))
        return reply["text"], CallStats.from_dict(reply["stats"])

    def call_stream(self, stub: CtxStub, prompt: str, max_new_tokens: int = 16, *, call_id: str | None = None,
                    deadline_s: float | None = None) -> CallStream:
        """``call`` whose answer arrives in pieces as the model generates it (iterate the result)."""
        return CallStream(self._messages(self._call_request(stub, prompt, max_new_tokens, call_id, deadline_s, True)))

    def contexts(self) -> list[dict]:
        """This app's contexts (id, tokens, bytes, calls, last use; no stubs)."""
        return self._request({"op": "list"})["contexts"]

    def delete(self, stub: CtxStub) -> None:
        self._request({"op": "delete", "stub": stub.token})

    def delete_context(self, ctx_id: str) -> None:
        """Delete one of this app's contexts by its id (from ``contexts()``), for a lost stub."""
        self._request({"op": "delete", "ctx": ctx_id})

    def snapshot(self, operator_token: str | None = None) -> dict:
        """This app's part of the service's snapshot; every app's with the operator's token."""
        if operator_token is None:
            return self._request({"op": "snapshot"})["snapshot"]
        return self._request({"op": "snapshot", "all": True, "operator_token": operator_token})["snapshot"]

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def operator_snapshot(address: str | None, operator_token: str, timeout: float = 10.0) -> dict:
    """Every app's snapshot of the service at ``address`` (its operator's token, from ``operator.token`` in
    its swap directory), over a connection that binds no app: what a monitor polls."""
    with RemoteSession(None, address, timeout) as session:
        return session.snapshot(operator_token)


def connect(app: str, address: str | None = None, timeout: float | None = None, *,
            token_file: Path | str | None = None) -> RemoteSession:
    """Bind ``app`` on the service at ``address`` (default: the Unix socket in the cache)."""
    return RemoteSession(app, address, timeout, token_file=token_file)
