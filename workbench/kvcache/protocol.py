"""The LLM service's wire protocol, shared by server and client and importable without torch or SciPy.

Every message is one JSON object on one line (UTF-8, ended by ``\\n``; JSON escapes newlines inside
strings, so a line is always a whole message). Requests are at most ``MAX_REQUEST_BYTES``; replies
have no limit and are read to their newline. A request carries an ``id`` the reply repeats, so a
reply that arrives after its request timed out is recognised and skipped. See ``server`` for the ops.
"""
from __future__ import annotations

import json
import socket
from dataclasses import asdict, dataclass, fields

from workbench.errors import WorkbenchError
from workbench.kvcache.errors import (CallFailedError, ContextLengthError, ContextLimitError, DeadlineError, IdentityError,
                                      MemoryBudgetError, ProtocolError, ServiceClosedError, StubError, SwapStoreError)

PROTOCOL_VERSION = "2.0"
"""major.minor: peers of different majors refuse each other at bind; a minor adds optional fields only."""
MAX_REQUEST_BYTES = 1 << 20
LOOPBACK = ("127.0.0.1", "localhost")

ERRORS = {cls.__name__: cls for cls in (StubError, ContextLimitError, MemoryBudgetError, SwapStoreError,
                                        CallFailedError, ServiceClosedError, DeadlineError, ProtocolError,
                                        IdentityError, ContextLengthError)}
"""The error classes a client raises again from a reply's ``type``."""


def major(version) -> int | None:
    """The major number of ``"2.0"``; None for anything that is not a version."""
    head = str(version).split(".")[0] if isinstance(version, (str, int)) else ""
    return int(head) if head.isdigit() else None


def check_version(theirs, who: str) -> None:
    """Refuse a peer (``who``: "client" or "service") whose major version differs from ours."""
    if major(theirs) != major(PROTOCOL_VERSION):
        said = "no version (protocol 1)" if theirs is None else f"protocol {theirs}"
        mine = "service" if who == "client" else "client"
        raise ProtocolError(f"this LLM {mine} speaks protocol {PROTOCOL_VERSION} and the {who} speaks {said}; "
                            f"use a {who} of the same major version")


def default_address() -> str:
    """``unix:<cache>/llms/llms.sock``."""
    from workbench.cache import cache_dir

    return f"unix:{cache_dir() / 'llms' / 'llms.sock'}"


def parse_address(address: str) -> tuple[str, object]:
    """``unix:PATH`` (or a path) -> ("unix", path); ``tcp:127.0.0.1:PORT`` (or ``127.0.0.1:PORT``) ->
    ("tcp", (host, port)). TCP is loopback only."""
    text = str(address)
    if text.startswith("unix:"):
        return "unix", text[5:]
    if "/" in text:
        return "unix", text
    host, _, port = text.removeprefix("tcp:").rpartition(":")
    if host not in LOOPBACK or not port.isdigit():
        raise WorkbenchError(f"an address is unix:PATH or tcp:127.0.0.1:PORT (loopback only), got {address!r}")
    return "tcp", ("127.0.0.1", int(port))


def encode(message: dict) -> bytes:
    return json.dumps(message).encode() + b"\n"


class LineReader:
    """Whole lines from a socket, however long; a timeout leaves what was read so far for the next read."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._buffer = bytearray()
        self._skipping = False

    def readline(self, limit: int | None = None) -> bytes:
        """The next line with its newline, or ``b""`` when the peer closed the connection. A line longer
        than ``limit`` bytes is read to its end and refused (``ProtocolError``); the next one reads as usual."""
        start = 0
        while True:
            end = self._buffer.find(b"\n", start)
            if end >= 0:
                line = bytes(self._buffer[:end + 1])
                del self._buffer[:end + 1]
                if self._skipping or (limit is not None and len(line) > limit):
                    self._skipping = False
                    raise ProtocolError(f"a request is one line of at most {limit} bytes")
                return line
            if limit is not None and len(self._buffer) > limit:
                self._buffer.clear()
                self._skipping = True
            start = len(self._buffer)
            data = self._sock.recv(1 << 16)
            if not data:
                return b""
            self._buffer += data


# ----------------------------------------------------------------------------- stubs and stats

@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How the next token is chosen: ``temperature`` 0 is greedy (argmax); above 0 the logits are divided
    by it and a token is drawn, from the smallest set of tokens whose probability reaches ``top_p``,
    with a generator seeded by ``seed`` (a fresh random seed when None)."""
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and 0 <= self.temperature <= 2):
            raise WorkbenchError(f"temperature is 0 to 2, got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise WorkbenchError(f"top_p is above 0 and at most 1, got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self):
        """The torch generator of one call's draws (None when greedy)."""
        if self.greedy:
            return None
        import torch

        g = torch.Generator()
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(int(self.seed))
        return g

    def pick(self, logits, generator) -> int:
        """The next token from one row of logits."""
        if self.greedy:
            return int(logits.argmax())
        import torch

        probs = torch.softmax(logits.double() / self.temperature, dim=-1)
        if self.top_p < 1:
            ordered, order = probs.sort(descending=True)
            keep = int((ordered.cumsum(0) < self.top_p).sum()) + 1
            probs = torch.zeros_like(probs).scatter_(0, order[:keep], ordered[:keep])
        return int(torch.multinomial(probs, 1, generator=generator))


GREEDY = Sampling()


@dataclass(frozen=True)
class CtxStub:
    """A handle on one context: an unguessable secret, valid only for the app that made it."""
    token: str

    def __repr__(self) -> str:
        return f"CtxStub({self.token[:4]}...)"


@dataclass(frozen=True, kw_only=True)
class CallStats:
    """What one call cost. ``switch_s`` (switching latency, as the paper measures it) = ``reclaim_s``
    (evicting others) + ``load_s`` (bringing the context's missing chunks into memory) + ``dequantize_s``
    (turning every chunk into the decoder's float cache), all before inference. LLMS's pipeline writes the
    chunks already in memory into that cache during ``load_s``; ``dequantize_s`` is then what is left."""
    ctx: str
    app: str
    tick: int                 # the service's call counter: calls are served in this order
    queue_wait_s: float
    reclaim_s: float
    load_s: float
    switch_s: float
    io_s: float
    recompute_s: float
    inference_s: float
    compress_s: float
    swap_out_s: float
    total_s: float
    chunks_missing: int
    chunks_loaded: int
    chunks_recomputed: int
    bytes_read: int
    bytes_written: int
    evictions: int
    evicted_bytes: int
    prompt_tokens: int
    output_tokens: int
    context_tokens: int
    loader: str
    dequantize_s: float = 0.0      # part of switch_s: the chunks dequantized into the decoder's cache
    cut_by_deadline: bool = False   # set by the server: the call's deadline ended its generation
    chunks_restored: int = 0        # damaged chunk files restored exactly from their intact 8-bit base
    recovered: tuple[str, ...] = () # each damaged chunk file of the call, and how its chunk came back
    cache_reused: bool = False      # the working cache still held this context from its last call: no rebuild

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> CallStats:
        """From a reply; fields a newer service added are left out."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})
