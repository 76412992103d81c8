"""An OpenAI-compatible chat endpoint over the context service (``workbench serve llms --http HOST:PORT``).

Clients written against OpenAI's chat completions API (its ``openai`` package, curl, the many apps
that also talk to llama.cpp's server, vLLM or Ollama) reach LLMS contexts unchanged:

* ``POST /v1/chat/completions``: ``messages``, ``max_tokens`` (or ``max_completion_tokens``),
  ``temperature``, ``top_p``, ``seed``, ``stop``, ``stream`` (server-sent events, ``data: [DONE]`` last)
  and ``stream_options.include_usage``, with OpenAI's request and response shapes;
* ``GET /v1/models``: the one model served.

**Context reuse.** The API is stateless: a client sends the whole conversation every turn. The
endpoint keeps, per app, the conversations its contexts hold (SHA-256 digests of each message's role
and text, in order). A request whose messages begin with a context's conversation continues that
context: only the new messages are processed, the way llama.cpp's prompt cache and vLLM's prefix
caching reuse a prompt's prefix, except that here the prefix is an LLMS context (compressed, swapped,
evicted by tolerance like any other). Matching is by whole messages, not tokens, because an answer's
text does not always tokenize back to the tokens generated. The longest match wins; a request nothing
matches gets a new context. An app holding its most contexts first gives up its least recently used
conversation. ``usage.prompt_tokens_details.cached_tokens`` says how many prompt tokens were reused;
the reply's ``llms`` field has the call's costs (switch, tokens, context id).

**Identity.** Every request carries ``Authorization: Bearer KEY``. Keys are made by
``workbench serve llms keys add NAME`` (printed once, kept only as SHA-256 digests in the swap
directory, 0600) and each names one app (``key:NAME``); a conversation is only ever continued by the
app that made it. A missing or wrong key is a 401 in OpenAI's error shape.

**Bad input** gets OpenAI's error shape (``{"error": {"message", "type", "param", "code"}}``) and
status before any work: malformed JSON 400, an unknown model 404, a body over ``MAX_BODY_BYTES`` 413,
``max_tokens`` beyond what the context can still hold 400 (``context_length_exceeded``); the service
keeps serving.

A stop sequence ends the answer where it begins; the answer returned (and kept as the conversation's
message) is cut there, while the context keeps the tokens generated up to it.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from workbench.errors import WorkbenchError
from workbench.kvcache.errors import (ContextLengthError, ContextLimitError, MemoryBudgetError, ServiceClosedError,
                                      StubError)
from workbench.kvcache.protocol import CtxStub, Sampling

MODEL_ID = "smollm2-135m-instruct"
"""The name ``/v1/models`` gives the decoder the service runs (SmolLM2-135M-Instruct)."""
MAX_BODY_BYTES = 1 << 20
DRAIN_BYTES = 64 << 20
DEFAULT_MAX_TOKENS = 128
MAX_STOP = 4
MAX_KEY_NAME = 64
KEYS_FILE = "http-keys.json"
CONVERSATIONS_FILE = "http-conversations.json"
KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _write_private(path: Path, data) -> None:
    """``data`` as JSON in ``path``, replaced whole (a temporary file renamed), 0600."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ----------------------------------------------------------------------------- keys

class APIKeys:
    """The bearer keys of ``swap_dir`` (``http-keys.json``: name -> SHA-256 of its key), read again
    whenever the file changes, so keys added while the service runs work at once."""

    def __init__(self, swap_dir: Path | str):
        self.path = Path(swap_dir) / KEYS_FILE
        self._seen: tuple | None = None
        self._digests: dict[str, str] = {}
        self._lock = threading.Lock()

    def _read(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise WorkbenchError(f"cannot read the API keys in {self.path} ({exc}); remove it and add the keys "
                                 f"again") from None
        if not isinstance(data, dict):
            raise WorkbenchError(f"{self.path} is not a key file; remove it and add the keys again")
        return data

    def names(self) -> list[str]:
        return sorted(self._read())

    @staticmethod
    def check_name(name) -> str:
        if not isinstance(name, str) or not KEY_NAME.fullmatch(name) or len(name) > MAX_KEY_NAME:
            raise WorkbenchError(f"a key's name is 1 to {MAX_KEY_NAME} letters, digits, '.', '_' and '-', "
                                 f"beginning with a letter or digit; got {name!r}")
        return name

    def add(self, name: str) -> str:
        """A new key for app ``name`` (refused when the name has one: remove it first); returns the key,
        which is stored only as its digest."""
        self.check_name(name)
        with self._lock:
            data = self._read()
            if name in data:
                raise WorkbenchError(f"app {name!r} already has a key; remove it first "
                                     f"(workbench serve llms keys remove {name}) to issue another")
            key = "sk-llms-" + secrets.token_urlsafe(32)
            data[name] = {"sha256": _sha256(key), "created": time.time()}
            _write_private(self.path, data)
        return key

    def remove(self, name: str) -> None:
        with self._lock:
            data = self._read()
            if name not in data:
                raise WorkbenchError(f"no key is named {name!r}; the keys are: {', '.join(sorted(data)) or 'none'}")
            del data[name]
            _write_private(self.path, data)

    def app_for(self, key: str | None) -> str | None:
        """The app ``key`` names (``key:NAME``), or None for a missing or unknown key."""
        if not key:
            return None
        try:
            st = self.path.stat()
            seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            seen = None
        with self._lock:
            if seen != self._seen:
                self._digests = {name: row.get("sha256", "") for name, row in self._read().items()}
                self._seen = seen
            digest = _sha256(key)
            for name, stored in self._digests.items():
                if hmac.compare_digest(digest, stored):
                    return f"key:{name}"
        return None


# ----------------------------------------------------------------------------- conversations

@dataclass
class Conversation:
    """A context and the messages it holds (digests, in order)."""
    ctx: str
    stub: str
    messages: list[str]
    last_used: float = field(default_factory=time.time)


def message_digests(messages: list[tuple[str, str]]) -> list[str]:
    return [_sha256(json.dumps([role, text])) for role, text in messages]


class Conversations:
    """Per app, the conversations its contexts hold; kept in ``swap_dir`` (0600, it holds context stubs)
    so a restarted service continues them. A conversation being continued is taken out until its call
    ends, so two requests never continue one context at once."""

    def __init__(self, swap_dir: Path | str, live: Callable[[], set[str]] | None = None):
        self.path = Path(swap_dir) / CONVERSATIONS_FILE
        self._lock = threading.Lock()
        self._apps: dict[str, list[Conversation]] = {}
        try:
            data = json.loads(self.path.read_text())
            self._apps = {app: [Conversation(**c) for c in rows] for app, rows in data.items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError):
            self._apps = {}                                # a damaged map only costs reuse: start afresh
        if live is not None:
            alive = live()
            self._apps = {app: [c for c in rows if c.ctx in alive] for app, rows in self._apps.items()}

    def _save(self) -> None:
        _write_private(self.path, {app: [c.__dict__ for c in rows] for app, rows in self._apps.items() if rows})

    def take(self, app: str, digests: list[str]) -> Conversation | None:
        """The app's conversation whose messages are the longest proper prefix of ``digests``, taken out."""
        with self._lock:
            rows = self._apps.get(app, [])
            best = None
            for c in rows:
                n = len(c.messages)
                if n < len(digests) and digests[:n] == c.messages and (best is None or n > len(best.messages)):
                    best = c
            if best is not None:
                rows.remove(best)
            return best

    def put(self, app: str, conversation: Conversation) -> None:
        with self._lock:
            self._apps.setdefault(app, []).append(conversation)
            self._save()

    def forget(self, app: str, ctx: str) -> None:
        with self._lock:
            self._apps[app] = [c for c in self._apps.get(app, []) if c.ctx != ctx]
            self._save()

    def oldest(self, app: str) -> Conversation | None:
        with self._lock:
            rows = self._apps.get(app, [])
            return min(rows, key=lambda c: c.last_used) if rows else None

    def count(self, app: str) -> int:
        with self._lock:
            return len(self._apps.get(app, []))


# ----------------------------------------------------------------------------- requests

class APIError(Exception):
    """An error answered in OpenAI's shape with ``status``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ChatRequest:
    """A chat completion request, checked."""
    model: str
    messages: list[tuple[str, str]]
    max_tokens: int | None
    sampling: Sampling
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


def _text_of(content, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise APIError(400, f"messages[{i}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                                    f"are served by this model", param=f"messages[{i}].content")
            parts.append(part["text"])
        return "".join(parts)
    raise APIError(400, f"messages[{i}].content must be a string or a list of text parts",
                   param=f"messages[{i}].content")


def _number(body: dict, name: str, low: float, high: float, default, *, whole: bool = False):
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, int) if whole else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not low <= value <= high:
        kind = "an integer" if whole else "a number"
        raise APIError(400, f"{name} must be {kind} from {low} to {high}, got {value!r}"[:300], param=name)
    return value


def parse_chat_request(body, model_id: str) -> ChatRequest:
    """Check a chat completion body the way OpenAI's API does (status 400 naming the field, 404 for a
    model not served)."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError(400, "you must provide a model parameter", param="model")
    if model != model_id:
        raise APIError(404, f"the model {model!r} does not exist; this service serves {model_id!r} "
                            f"(GET /v1/models)", param="model", code="model_not_found")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise APIError(400, "messages must be a non-empty array of {role, content} objects", param="messages")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise APIError(400, f"messages[{i}] must be an object with role and content", param=f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise APIError(400, f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}"[:300],
                           param=f"messages[{i}].role")
        messages.append((ROLES[role], _text_of(m.get("content"), i)))
    if messages[-1][0] != "user" or not messages[-1][1].strip():
        raise APIError(400, "the last message must be the user's, with some text: the answer follows it",
                       param="messages")
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise APIError(400, "give max_tokens or max_completion_tokens, not both", param="max_tokens")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, name, 1, 1 << 20, None, whole=True)
    n = _number(body, "n", 1, 1, 1, whole=True)
    del n
    temperature = _number(body, "temperature", 0, 2, 1.0)
    top_p = _number(body, "top_p", 0, 1, 1.0)
    if top_p == 0:
        raise APIError(400, "top_p must be above 0 and at most 1, got 0", param="top_p")
    seed = _number(body, "seed", -(1 << 63), (1 << 63) - 1, None, whole=True)
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= MAX_STOP:
        stops = tuple(stop)
    else:
        raise APIError(400, f"stop must be a string or an array of at most {MAX_STOP} strings", param="stop")
    if any(not s for s in stops):
        raise APIError(400, "a stop sequence must not be empty", param="stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError(400, f"stream must be true or false, got {stream!r}"[:200], param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise APIError(400, "stream_options must be an object", param="stream_options")
    if body.get("tools") or body.get("functions"):
        raise APIError(400, "this model does not call tools; send messages only", param="tools")
    return ChatRequest(model=model, messages=messages, max_tokens=max_tokens,
                       sampling=Sampling(temperature=float(temperature), top_p=float(top_p),
                                         seed=None if seed is None else seed % (1 << 63)),
                       stop=stops, stream=stream, include_usage=bool(options.get("include_usage")))


# ----------------------------------------------------------------------------- answers

class StopScanner:
    """Generated tokens -> the answer's text, cut at the first stop sequence; ``on_text`` gets each new
    piece once nothing after it can still turn out to begin a stop sequence."""

    def __init__(self, tokenizer, stops: tuple[str, ...], on_text: Callable[[str], None] | None = None):
        self.tokenizer, self.stops, self.on_text = tokenizer, stops, on_text
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0
        self.stopped = False
        self.ended = False
        self.hold = max((len(s) for s in stops), default=1) - 1

    def add(self, token: int) -> bool:
        if token == self.tokenizer.im_end_id:
            self.ended = True
            return True
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return False
        self.text = text
        cut = min((i for i in (text.find(s, max(0, self.sent - len(s))) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped = text[:cut], True
            self._send(len(self.text))
            return True
        self._send(len(text) - self.hold)
        return False

    def _send(self, upto: int) -> None:
        if upto > self.sent and self.on_text is not None:
            self.on_text(self.text[self.sent:upto])
        self.sent = max(self.sent, upto)

    def finish(self) -> str:
        self._send(len(self.text))
        return self.text


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stats: dict


class ChatEndpoint:
    """The engine behind the HTTP routes: keys, conversations and calls on ``service`` (no HTTP here).
    ``reuse`` False makes every request a new context, deleted after its answer: a server without
    context reuse, for comparison."""

    def __init__(self, service, model_id: str = MODEL_ID, *, reuse: bool = True):
        self.service, self.model_id, self.reuse = service, model_id, reuse
        self.keys = APIKeys(service.swap_dir)
        self.conversations = Conversations(service.swap_dir, live=lambda: {c["id"] for c in
                                                                           service.snapshot()["contexts"]})

    @property
    def context_limit(self) -> int:
        return self.service.config.max_context_tokens or self.service.model.cfg.max_positions

    def _make_room(self, session) -> None:
        """Delete the app's least recently used conversations while it holds its most contexts."""
        while len(session.contexts()) >= self.service.max_contexts_per_app:
            old = self.conversations.oldest(session.app)
            if old is None:
                return                                   # its contexts are not ours: the service's error says so
            self.conversations.forget(session.app, old.ctx)
            try:
                session.delete_context(old.ctx)
            except StubError:
                pass

    def complete(self, app: str, request: ChatRequest, on_text: Callable[[str], None] | None = None,
                 cancelled: Callable[[], bool] | None = None) -> Completion:
        """Answer ``request`` for ``app``, continuing the context that holds its conversation if any."""
        session = self.service.bind(app)
        digests = message_digests(request.messages)
        found = self.conversations.take(app, digests) if self.reuse else None
        made = False
        if found is None:
            self._make_room(session)
            system = request.messages[0][1] if request.messages[0][0] == "system" else None
            stub = session.new_ctx(system)
            new = request.messages[1:] if system is not None else request.messages
            made = True
        else:
            stub = CtxStub(found.stub)
            new = request.messages[len(found.messages):]
        scanner = StopScanner(self.service.tokenizer, request.stop, on_text)

        def on_token(token: int) -> bool:
            return scanner.add(token) or (cancelled is not None and cancelled())

        try:
            before = self._tokens(session, found.ctx) if found is not None else 0
            room = self.context_limit - before
            max_tokens = request.max_tokens
            if max_tokens is None:
                max_tokens = max(1, min(DEFAULT_MAX_TOKENS, room - self._estimate(new, found is None)))
            _, stats = self.service._call(app, stub, None, max_tokens, on_token, messages=new,
                                          sampling=request.sampling)
        except BaseException:
            if made:
                self._delete(session, stub)
            elif found is not None:
                self.conversations.put(app, found)
            raise
        text = scanner.finish()
        if self.reuse:
            kept = (found.messages if found is not None else []) + digests[len(found.messages) if found else 0:]
            self.conversations.put(app, Conversation(ctx=stats.ctx, stub=stub.token,
                                                     messages=kept + message_digests([("assistant", text)])))
        else:
            self._delete(session, stub)
        finish = "stop" if scanner.ended or scanner.stopped else "length"
        prompt = stats.context_tokens + 1 - stats.output_tokens  # the last generated token is not in the context yet
        return Completion(text=text, finish_reason=finish, prompt_tokens=prompt, completion_tokens=stats.output_tokens,
                          cached_tokens=before, stats=stats.to_dict())

    def _tokens(self, session, ctx: str) -> int:
        return next((c["tokens"] for c in session.contexts() if c["id"] == ctx), 0)

    def _estimate(self, messages, first: bool) -> int:
        text = "".join(f"<|im_start|>{r}\n{t}<|im_end|>\n" for r, t in messages)
        return len(self.service.tokenizer.encode(text)) + (64 if first else 8)

    def _delete(self, session, stub: CtxStub) -> None:
        try:
            session.delete(stub)
        except (StubError, ServiceClosedError):
            pass


def api_error_for(exc: BaseException) -> APIError:
    """The HTTP status and OpenAI error shape of a service error."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ContextLengthError):
        room = exc.room
        how = (f"max_tokens may be at most {room} here" if room is not None and room >= 1
               else "the conversation alone is too long")
        return APIError(400, f"{str(exc).split(';')[0]}: {how}; lower max_tokens or start a new conversation",
                        param="max_tokens", code="context_length_exceeded")
    if isinstance(exc, MemoryBudgetError):
        return APIError(400, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, ContextLimitError):
        return APIError(429, str(exc), type="rate_limit_error", code="too_many_contexts")
    if isinstance(exc, ServiceClosedError):
        return APIError(503, "the LLM service is stopping; try again when it is back", type="server_error")
    if isinstance(exc, WorkbenchError):
        return APIError(400, str(exc))
    return APIError(500, f"the service failed on this request ({type(exc).__name__}); it keeps serving",
                    type="server_error")


# ----------------------------------------------------------------------------- HTTP

def _completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


def _usage(done: Completion) -> dict:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens}}


def make_app(endpoint: ChatEndpoint, *, max_body_bytes: int = MAX_BODY_BYTES, log: Callable[[str], None] | None = None):
    """The Starlette application of ``endpoint``."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def error(exc: APIError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    def authorize(request: Request) -> str:
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        app = endpoint.keys.app_for(key.strip()) if scheme.lower() == "bearer" else None
        if app is None:
            said = "no API key was given" if not header else "the API key given is not one of this service's"
            raise APIError(401, f"{said}; send Authorization: Bearer KEY with a key from "
                                f"`workbench serve llms keys add NAME`", code="invalid_api_key")
        return app

    async def read_json(request: Request):
        """The JSON body; one over the limit is read and dropped (up to ``DRAIN_BYTES``, so the client sees
        the 413 rather than a broken pipe), never kept."""
        declared = request.headers.get("content-length")
        size = int(declared) if declared is not None and declared.isdigit() else None
        body, seen = bytearray(), 0
        try:
            async for piece in request.stream():
                seen += len(piece)
                if seen <= max_body_bytes:
                    body += piece
                elif seen > DRAIN_BYTES:
                    break
        except ClientDisconnect:
            raise APIError(400, "the client went away before the body was read") from None
        if seen > max_body_bytes:
            said = f"{size} bytes" if size is not None else f"over {max_body_bytes} bytes"
            raise APIError(413, f"the request body is {said}, over this service's limit of {max_body_bytes} bytes",
                           code="request_too_large")
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the body is not valid JSON ({exc}); send a JSON object") from None

    async def models(request: Request):
        try:
            authorize(request)
        except APIError as exc:
            return error(exc)
        return JSONResponse({"object": "list", "data": [
            {"id": endpoint.model_id, "object": "model", "created": 0, "owned_by": "workbench"}]})

    async def chat(request: Request):
        started = time.perf_counter()
        try:
            app = authorize(request)
            chat_request = parse_chat_request(await read_json(request), endpoint.model_id)
        except APIError as exc:
            return error(exc)
        ident, created = _completion_id(), int(time.time())
        if not chat_request.stream:
            try:
                done = await run_in_threadpool(endpoint.complete, app, chat_request)
            except Exception as exc:
                failure = api_error_for(exc)
                if log is not None:
                    log(f"llms http: {app} failed: {failure.status} {failure.message}")
                return error(failure)
            if log is not None:
                log(f"llms http: {app} answered {done.completion_tokens} tokens in "
                    f"{1e3 * (time.perf_counter() - started):.0f} ms")
            return JSONResponse({
                "id": ident, "object": "chat.completion", "created": created, "model": endpoint.model_id,
                "system_fingerprint": None,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": done.text, "refusal": None},
                             "logprobs": None, "finish_reason": done.finish_reason}],
                "usage": _usage(done), "llms": done.stats})

        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        gone = threading.Event()

        def on_text(piece: str) -> None:
            loop.call_soon_threadsafe(events.put_nowait, ("text", piece))

        def work() -> None:
            try:
                done = endpoint.complete(app, chat_request, on_text, cancelled=gone.is_set)
                loop.call_soon_threadsafe(events.put_nowait, ("done", done))
            except BaseException as exc:               # noqa: BLE001 - sent to the stream as an error
                loop.call_soon_threadsafe(events.put_nowait, ("error", exc))

        threading.Thread(target=work, daemon=True, name="llms-http-call").start()
        first = await events.get()
        if first[0] == "error":                          # refused before any token: a plain error reply
            return error(api_error_for(first[1]))

        def chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> str:
            body = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": endpoint.model_id,
                    "system_fingerprint": None,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            if chat_request.include_usage:
                body["usage"] = usage
            return f"data: {json.dumps(body)}\n\n"

        async def stream():
            event = first
            try:
                yield chunk({"role": "assistant", "content": ""})
                while True:
                    kind, value = event
                    if kind == "text":
                        yield chunk({"content": value})
                    elif kind == "done":
                        if log is not None:
                            log(f"llms http: {app} streamed {value.completion_tokens} tokens in "
                                f"{1e3 * (time.perf_counter() - started):.0f} ms")
                        yield chunk({}, value.finish_reason)
                        if chat_request.include_usage:
                            tail = {"id": ident, "object": "chat.completion.chunk", "created": created,
                                    "model": endpoint.model_id, "choices": [], "usage": _usage(value),
                                    "llms": value.stats}
                            yield f"data: {json.dumps(tail)}\n\n"
                        break
                    else:
                        yield f"data: {json.dumps(api_error_for(value).body())}\n\n"
                        break
                    event = await events.get()
                yield "data: [DONE]\n\n"
            finally:
                gone.set()

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def not_found(request: Request, exc):
        return error(APIError(404, f"no route {request.method} {request.url.path}; this service answers POST "
                                   f"/v1/chat/completions and GET /v1/models", code="unknown_url"))

    async def wrong_method(request: Request, exc):
        return error(APIError(405, f"{request.url.path} does not take {request.method}", code="method_not_allowed"))

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/models", models, methods=["GET"])],
                     exception_handlers={404: not_found, 405: wrong_method})


def parse_http_address(text: str) -> tuple[str, int]:
    """``127.0.0.1:PORT`` (loopback only; 0 picks a free port) -> (host, port)."""
    host, sep, port = str(text).rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise WorkbenchError(f"--http is HOST:PORT with a port 0 to 65535 (0 picks a free one), got {text!r}")
    if host not in ("127.0.0.1", "localhost"):
        raise WorkbenchError(f"--http binds to loopback only (127.0.0.1:PORT), got host {host!r}; put a reverse "
                             f"proxy with TLS in front of it to reach it from elsewhere")
    return "127.0.0.1", int(port)


class HTTPServer:
    """``make_app(endpoint)`` served by uvicorn on a listening socket, in a thread of its own."""

    def __init__(self, endpoint: ChatEndpoint, sock, *, log: Callable[[str], None] | None = None):
        import uvicorn

        self.endpoint, self.sock = endpoint, sock
        config = uvicorn.Config(make_app(endpoint, log=log), log_level="warning", lifespan="off",
                                access_log=False, timeout_graceful_shutdown=30)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True,
                                       name="llms-http")

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> HTTPServer:
        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()
