"""The LLM context service (LLMS, section 3.1): apps bind to it, hold contexts through stubs, and call
the one model on them; the service keeps every context's KV cache in chunks under a memory budget.

A call on a context:

1. waits its turn (a FIFO lock: one model, calls served in arrival order; the wait is recorded);
2. switches to the context: locks it against eviction, evicts other chunks until its missing chunks
   and the call's growth fit the budget, and brings its missing chunks into memory through the
   loader (a pluggable callable; by default the swapping-recompute pipeline, ``loader.PipelineLoader``:
   equation 4 picks which chunks to read and which to recompute, overlapped layer by layer);
3. runs the prompt and the greedy continuation (``engine.run_call``);
4. compresses by tolerance: full chunks get levels from their information density (``assign_levels``),
   a chunk's level only goes down; the open last chunk stays at the base level until it is full;
5. writes every changed chunk to its file and commits the index (ahead-of-time swap-out), and only
   then returns; a service killed at any point restarts with every returned call intact.

Baselines of the paper are configurations of the same service (``ServiceConfig``, ``PRESETS``).
"""
from __future__ import annotations

import hashlib
import secrets
import sqlite3
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from workbench.devices import pad_until
from workbench.errors import UnknownNameError, WorkbenchError
from workbench.kvcache.chunks import CHUNK_SIZE, FLOAT_BITS, LEVELS, ChunkedKV, chunk_nbytes, recompress
from workbench.kvcache.density import assign_levels
from workbench.kvcache.loader import (ChunkSpec, Loader, LoadReport, LoadRequest, PipelineLoader,  # noqa: F401
                                      loader_name)
from workbench.kvcache.lifecycle import (DROP, KILL, SWAP_OUT, EvictionRecord, LCTRUQueue, MemoryBudgetError,
                                         QueueEntry, check_policy)
from workbench.kvcache.metrics import ServiceMetrics
from workbench.kvcache.store import (BOTH, DROPPED, FILE, HAS_FILE, IN_MEMORY, MEMORY, ChunkRow, ContextRow,
                                     SwapStore)

DEFAULT_MEMORY_BUDGET = 512 << 20
DEFAULT_MAX_CONTEXTS_PER_APP = 16
EVICTIONS_KEPT = 1000


class StubError(WorkbenchError):
    """A context stub this app may not use: unknown, deleted, or made by another app."""


class ContextLimitError(WorkbenchError):
    """The app already holds as many contexts as one app may."""


class SwapStoreError(WorkbenchError):
    """The swap store could not be written (a full disk, say); the call or eviction was undone."""


class ServiceClosedError(WorkbenchError):
    """The service was closed."""


def default_swap_dir() -> Path:
    from workbench.cache import cache_dir

    return cache_dir() / "llms" / "swap"


# ----------------------------------------------------------------------------- configuration

COMPRESSIONS = ("tolerance", "static8", "none")
GRANULARITIES = ("chunk", "context")
EVICTIONS = ("swap", "kill")
LOADINGS = ("pipeline", "swap_only")


def _one_of(field_name: str, value, allowed) -> None:
    if value not in allowed:
        raise UnknownNameError(field_name, value, allowed)


@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    """How the service keeps contexts; LLMS by default, the paper's baselines by other values.

    compression: ``tolerance`` (8-bit chunks, full ones lowered to 4/2 bits by density), ``static8``
    (every chunk 8-bit, vLLM-SQ) or ``none`` (raw float32 chunks, vLLM-S).
    granularity: ``chunk`` or ``context`` (whole contexts leave memory together).
    eviction: ``swap`` (to files) or ``kill`` (LMK: KV dropped, recomputed from the tokens; no files).
    policy: ``lctru``, ``lru`` or ``h2o`` (see ``lifecycle``).
    aot_swap_out: write changed chunks as a call returns (off: only at eviction).
    loading: ``pipeline`` or ``swap_only``; handed to the loader, which decides how to honour it.
    """
    compression: str = "tolerance"
    global_ratio: float = 0.5
    levels: tuple[int, ...] = LEVELS
    chunk_size: int = CHUNK_SIZE
    granularity: str = "chunk"
    eviction: str = "swap"
    policy: str = "lctru"
    aot_swap_out: bool = True
    loading: str = "pipeline"
    max_context_tokens: int | None = None

    def __post_init__(self):
        _one_of("compression", self.compression, COMPRESSIONS)
        _one_of("granularity", self.granularity, GRANULARITIES)
        _one_of("eviction", self.eviction, EVICTIONS)
        _one_of("loading", self.loading, LOADINGS)
        check_policy(self.policy)
        if self.chunk_size < 1:
            raise WorkbenchError(f"a chunk holds at least one token, got chunk_size {self.chunk_size}")
        assign_levels([1.0], self.levels, self.global_ratio)            # names a ratio the levels cannot reach

    @property
    def base_bits(self) -> int:
        """Bits of a chunk as a call writes it."""
        return FLOAT_BITS if self.compression == "none" else 8

    @property
    def writes_ahead(self) -> bool:
        return self.eviction == "swap" and self.aot_swap_out

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def preset(cls, name: str) -> ServiceConfig:
        if name not in PRESETS:
            raise UnknownNameError("service preset", name, PRESETS)
        return PRESETS[name]


_BASELINE = dict(policy="lru", aot_swap_out=False, loading="swap_only")
PRESETS: dict[str, ServiceConfig] = {
    "llms": ServiceConfig(),
    "vllm_sq": ServiceConfig(compression="static8", **_BASELINE),
    "vllm_s": ServiceConfig(compression="none", **_BASELINE),
    "swapping": ServiceConfig(compression="none", granularity="context", **_BASELINE),
    "lmk": ServiceConfig(compression="none", granularity="context", eviction="kill", **_BASELINE),
    "llms_without_lifecycle": ServiceConfig(policy="lru", aot_swap_out=False),
    "llms_without_compression": ServiceConfig(compression="static8"),
    "llms_without_pipeline": ServiceConfig(loading="swap_only"),
}
"""The paper's baselines (section 4) and ablations (section 5.3) as service configurations."""


# ----------------------------------------------------------------------------- stubs and stats

@dataclass(frozen=True)
class CtxStub:
    """A handle on one context: an unguessable secret, valid only for the app that made it."""
    token: str

    def __repr__(self) -> str:
        return f"CtxStub({self.token[:4]}...)"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class CallStats:
    """What one call cost. ``switch_s`` (switching latency) = ``reclaim_s`` (evicting others) +
    ``load_s`` (bringing the context's missing chunks into memory), all before inference."""
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

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- fairness

class FairLock:
    """A lock handed out in arrival order (tickets), so no caller is overtaken by a later one."""

    def __init__(self):
        self._cond = threading.Condition()
        self._next = 0
        self._serving = 0

    def acquire(self) -> float:
        """Wait for this caller's turn; returns the seconds waited."""
        t0 = time.perf_counter()
        with self._cond:
            ticket = self._next
            self._next += 1
            while self._serving != ticket:
                self._cond.wait()
        return time.perf_counter() - t0

    def release(self) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()

    @property
    def waiting(self) -> int:
        """Callers waiting for their turn (not counting the one holding the lock)."""
        return max(0, self._next - self._serving - 1)


# ----------------------------------------------------------------------------- the service

@dataclass(eq=False)
class _Context:
    row: ContextRow
    kv: ChunkedKV
    chunks: list[ChunkRow]
    density: np.ndarray = field(default_factory=lambda: np.zeros(0))


class LLMService:
    """The context service on one model. ``LLMService()`` serves the prepared decoder (and its
    tokenizer: ``tokenizer`` must be given with any other model) with a swap directory in the cache;
    contexts found in ``swap_dir`` are served again (nothing in memory yet).

    ``loader`` brings a context's missing chunks into memory; by default the swapping-recompute pipeline
    planned on ``device``'s cost model (``PipelineLoader(device)``: ``"host"``, measured once and cached,
    or an emulated preset such as ``"orin-nx"``, whose loads are padded to its speed).
    A context that cannot fit the budget by itself is refused (``MemoryBudgetError``), never evicted
    while it is served."""

    def __init__(self, model=None, swap_dir: Path | str | None = None,
                 memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
                 max_contexts_per_app: int = DEFAULT_MAX_CONTEXTS_PER_APP, config: ServiceConfig | None = None,
                 *, tokenizer=None, loader: Loader | None = None, device: str = "host"):
        if memory_budget_bytes <= 0:
            raise WorkbenchError(f"the memory budget must be positive, got {memory_budget_bytes} bytes")
        if max_contexts_per_app < 1:
            raise WorkbenchError(f"an app must be allowed at least one context, got {max_contexts_per_app}")
        if model is None:
            from workbench.models.decoder import load_decoder
            model = load_decoder()
        self.model = model
        if tokenizer is None:
            from workbench.models.decoder import decoder_tokenizer
            tokenizer = decoder_tokenizer()
        self.tokenizer = tokenizer
        self.config = config or ServiceConfig()
        self.memory_budget_bytes = int(memory_budget_bytes)
        self.max_contexts_per_app = int(max_contexts_per_app)
        if loader is not None and device != "host":
            raise WorkbenchError("give either a loader or a device for the built-in pipeline loader, not both")
        self.loader: Loader = loader if loader is not None else PipelineLoader(device)
        if loader is None and device != "host":          # a preset also paces eviction writes, before any load
            self.loader.costs_for(model, self.config.chunk_size)
        self.swap_dir = Path(swap_dir) if swap_dir is not None else default_swap_dir()
        cfg = model.cfg
        self.store = SwapStore(self.swap_dir, meta={
            "chunk_size": self.config.chunk_size,
            "model": {"layers": cfg.num_layers, "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
                      "vocab": cfg.vocab_size}})
        self.metrics = ServiceMetrics()
        self.queue = LCTRUQueue(self.config.policy, self.config.granularity)
        self._turn = FairLock()
        self._state = threading.RLock()
        self._contexts: dict[str, _Context] = {}
        self._stubs: dict[str, str] = {}
        self._evictions: deque[EvictionRecord] = deque(maxlen=EVICTIONS_KEPT)
        self._tick = 0
        self._closed = False
        self.last_call: CallStats | None = None
        self._restore()

    # ------------------------------------------------------------------ set-up

    @property
    def _heads_times_layers(self) -> int:
        return self.model.cfg.num_layers * self.model.cfg.num_heads

    def _empty_kv(self) -> ChunkedKV:
        return ChunkedKV.for_decoder(self.model.cfg, self.config.chunk_size)

    def _restore(self) -> None:
        for row, chunks in self.store.load():
            kv = replace(self._empty_kv(), tokens=list(row.tokens), pending=list(row.pending),
                         attn_sum=row.attn_sum, attn_rows=row.attn_rows, chunks=[None] * len(chunks))
            if len(chunks) != -(-len(kv.tokens) // kv.chunk_size):
                raise WorkbenchError(f"the index of {self.swap_dir} lists {len(chunks)} chunks for context {row.id} "
                                     f"of {len(kv.tokens)} tokens; the swap directory is damaged")
            ctx = _Context(row, kv, chunks, kv.chunk_density(self._heads_times_layers))
            self._contexts[row.id] = ctx
            self._stubs[row.stub_sha256] = row.id
            self._tick = max(self._tick, row.last_tick)
        self._update_memory_metrics()

    def bind(self, app: str) -> AppSession:
        """The session of ``app`` (its name identifies it; contexts belong to it)."""
        if not isinstance(app, str) or not app.strip() or len(app) > 200:
            raise WorkbenchError(f"an app is named by a non-empty string of at most 200 characters, got {app!r}")
        if self._closed:
            raise ServiceClosedError("the LLM service was closed")
        self.store.add_app(app)
        return AppSession(self, app)

    @contextmanager
    def _my_turn(self) -> Iterator[float]:
        wait = self._turn.acquire()
        try:
            if self._closed:
                raise ServiceClosedError("the LLM service was closed")
            yield wait
        finally:
            self._turn.release()

    # ------------------------------------------------------------------ contexts

    def _new_ctx(self, app: str, system_prompt: str | None) -> CtxStub:
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise WorkbenchError(f"a system prompt is text, got {type(system_prompt).__name__}")
        with self._my_turn():
            held = sum(1 for c in self._contexts.values() if c.row.app == app)
            if held >= self.max_contexts_per_app:
                raise ContextLimitError(f"app {app!r} holds {held} contexts, the most one app may hold "
                                        f"({self.max_contexts_per_app}); delete one before making another")
            token = secrets.token_urlsafe(32)
            now = time.time()
            row = ContextRow(id=secrets.token_hex(8), app=app, stub_sha256=_digest(token),
                             system_prompt=system_prompt, created=now, last_used=now, last_tick=self._tick)
            self.store.add_context(row)
            with self._state:
                self._contexts[row.id] = _Context(row, self._empty_kv(), [])
                self._stubs[row.stub_sha256] = row.id
            return CtxStub(token)

    def _resolve(self, app: str, stub: CtxStub) -> _Context:
        if not isinstance(stub, CtxStub):
            raise StubError(f"expected a context stub from new_ctx, got {type(stub).__name__}")
        ctx_id = self._stubs.get(_digest(stub.token))
        if ctx_id is None:
            raise StubError("unknown context stub: it was deleted, or this service never made it")
        ctx = self._contexts[ctx_id]
        if ctx.row.app != app:
            raise StubError(f"this context stub belongs to another app; app {app!r} may use only the contexts "
                            f"it made itself")
        return ctx

    def _delete(self, app: str, stub: CtxStub) -> None:
        with self._my_turn():
            ctx = self._resolve(app, stub)
            self.store.delete_context(ctx.row.id)
            with self._state:
                del self._contexts[ctx.row.id]
                del self._stubs[ctx.row.stub_sha256]
                self.queue.remove_context(ctx.row.id)
            self._update_memory_metrics()

    # ------------------------------------------------------------------ a call

    def _prompt_ids(self, ctx: _Context, prompt: str) -> list[int]:
        """SmolLM2's chat format: the first turn with the system prompt; later turns close the last
        answer (``<|im_end|>`` when it was cut short) and open a user and an assistant turn."""
        tok = self.tokenizer
        kv = ctx.kv
        if not kv.tokens and not kv.pending:
            system = ctx.row.system_prompt
            return tok.chat(prompt) if system is None else tok.chat(prompt, system=system)
        close = "\n" if kv.pending == [tok.im_end_id] else "<|im_end|>\n"
        return tok.encode(f"{close}<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")

    def _call(self, app: str, stub: CtxStub, prompt: str, max_new_tokens: int) -> tuple[str, CallStats]:
        if not isinstance(prompt, str) or not prompt.strip():
            raise WorkbenchError("the prompt is empty; send some text")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise WorkbenchError(f"max_new_tokens must be a whole number of at least 1, got {max_new_tokens!r}")
        with self._my_turn() as wait:
            ctx = self._resolve(app, stub)
            kv = ctx.kv
            ids = self._prompt_ids(ctx, prompt)
            t_start = time.perf_counter()
            limit = self.config.max_context_tokens or self.model.cfg.max_positions
            adding = len(kv.pending) + len(ids) + max_new_tokens
            if len(kv.tokens) + adding > limit:
                raise WorkbenchError(f"the context would grow to {len(kv.tokens) + adding} tokens, beyond its "
                                     f"limit of {limit}; start a new context or delete this one")
            self._tick += 1
            with self._state:
                self.queue.lock(ctx.row.id)
            try:
                missing = kv.missing()
                records = self._make_room(ctx, missing, adding)
                t_loaded = time.perf_counter()
                report = self._load(ctx, missing)
                t_infer = time.perf_counter()
                from workbench.kvcache.engine import run_call

                undo = self._undo_for(ctx)
                result = run_call(self.model, kv, ids, max_new_tokens, stop_ids=(self.tokenizer.im_end_id,),
                                  bits=self.config.base_bits, max_context=limit)
                t_compress = time.perf_counter()
                dirty = set(result.changed_chunks) | set(report.recomputed) | self._compress(ctx)
                t_write = time.perf_counter()
                try:
                    written_bytes, written_files = self._finish_call(ctx, dirty)
                except (OSError, sqlite3.Error) as exc:
                    with self._state:
                        undo()
                    raise SwapStoreError(f"could not save context {ctx.row.id} to the swap store in {self.swap_dir} "
                                         f"({exc}); the call was undone and every context is as it was") from exc
                t_end = time.perf_counter()
            finally:
                with self._state:
                    self.queue.unlock(ctx.row.id)
                    self._enqueue(ctx)
            stats = CallStats(
                ctx=ctx.row.id, app=app, tick=self._tick, queue_wait_s=wait, reclaim_s=t_loaded - t_start,
                load_s=t_infer - t_loaded,
                switch_s=t_infer - t_start, io_s=report.io_s, recompute_s=report.recompute_s,
                inference_s=t_compress - t_infer, compress_s=t_write - t_compress, swap_out_s=t_end - t_write,
                total_s=t_end - t_start, chunks_missing=len(missing), chunks_loaded=len(report.loaded),
                chunks_recomputed=len(report.recomputed), bytes_read=report.bytes_read, bytes_written=written_bytes,
                evictions=len(records), evicted_bytes=sum(r.nbytes for r in records), prompt_tokens=len(ids),
                output_tokens=len(result.output_ids), context_tokens=len(kv.tokens),
                loader=loader_name(self.loader))
            self.metrics.record_call(stats)
            self.metrics.record_writes(written_files, written_bytes, "ahead_of_time")
            self._update_memory_metrics()
            self.last_call = stats
            text = self.tokenizer.decode([t for t in result.output_ids if t != self.tokenizer.im_end_id])
            return text, stats

    def _growth_bytes(self, ctx: _Context, adding: int) -> int:
        """Most bytes the call can add: the chunks from the open last one on, at the base level,
        less what the open last one holds now."""
        kv = ctx.kv
        n, cs, end = len(kv.tokens), kv.chunk_size, len(kv.tokens) + adding
        total = sum(chunk_nbytes((kv.layers, 2, kv.kv_heads, min(end, (i + 1) * cs) - i * cs, kv.head_dim),
                                 self.config.base_bits) for i in range(n // cs, -(-end // cs)))
        if n % cs:
            total -= ctx.chunks[-1].nbytes
        return max(0, total)

    def _used_bytes(self) -> int:
        return sum(c.nbytes for ctx in self._contexts.values() for c in ctx.chunks if c.state in IN_MEMORY)

    def _make_room(self, ctx: _Context, missing: list[int], adding: int) -> list[EvictionRecord]:
        growth = self._growth_bytes(ctx, adding)
        whole = sum(c.nbytes for c in ctx.chunks) + growth
        if whole > self.memory_budget_bytes:
            raise MemoryBudgetError(
                f"context {ctx.row.id} needs {whole} bytes in memory for this call ({len(ctx.chunks)} chunks and "
                f"room for {adding} more tokens), more than the whole memory budget of {self.memory_budget_bytes} "
                f"bytes; a served context is never evicted: raise memory_budget_bytes, ask for fewer new tokens "
                f"or start a new context")
        deficit = self._used_bytes() + sum(ctx.chunks[i].nbytes for i in missing) + growth - self.memory_budget_bytes
        return self._evict(deficit, ctx.row.id) if deficit > 0 else []

    def _evict(self, deficit: int, served: str) -> list[EvictionRecord]:
        """Free at least ``deficit`` bytes of other contexts' chunks, as the policy orders them: one
        index transaction for all, writing only chunks without a current file."""
        kill = self.config.eviction == "kill"
        with self._state:
            victims = self.queue.victims(deficit, whole_contexts=kill)
            records, rows, files, undo = [], [], {}, []
            for e in victims:
                ctx = self._contexts[e.ctx]
                row = ctx.chunks[e.chunk]
                undo.append((e, row, row.state, ctx.kv.chunks[e.chunk]))
                if kill:
                    action, row.state = KILL, DROPPED
                elif row.state == BOTH:
                    action, row.state = DROP, FILE
                else:
                    action, row.state = SWAP_OUT, FILE
                    files[row.key] = ctx.kv.chunks[e.chunk]
                ctx.kv.chunks[e.chunk] = None
                rows.append(row)
                records.append(EvictionRecord(policy=self.config.policy, ctx=e.ctx, chunk=e.chunk, bits=e.bits,
                                              last_used=e.last_used, nbytes=e.nbytes, bytes_needed=deficit,
                                              action=action, served_ctx=served))
            t0 = time.perf_counter()
            try:
                written = self.store.commit(chunks=rows, files=files)
            except (OSError, sqlite3.Error) as exc:
                for e, row, state, data in undo:
                    row.state = state
                    self._contexts[e.ctx].kv.chunks[e.chunk] = data
                    self.queue.put(e)
                raise SwapStoreError(f"could not swap chunks out to {self.swap_dir} to make room ({exc}); "
                                     "nothing was evicted and every context is as it was") from exc
            self._evictions.extend(records)
        write_seconds = getattr(self.loader, "write_seconds", None)
        if files and write_seconds is not None:                  # an emulated device's write time
            pad_until(t0 + write_seconds(written, len(files)))
        for r in records:
            self.metrics.record_eviction(r.policy, r.action)
        self.metrics.record_writes(len(files), written, "eviction")
        return records

    def _load(self, ctx: _Context, missing: list[int]) -> LoadReport:
        if not missing:
            return LoadReport()
        specs = {i: ChunkSpec(bits=ctx.chunks[i].bits, shape=tuple(ctx.chunks[i].shape),
                              path=self.store.chunk_path(ctx.row.id, i) if ctx.chunks[i].state in HAS_FILE else None)
                 for i in missing}
        try:
            report = self.loader(LoadRequest(model=self.model, kv=ctx.kv, specs=specs, loading=self.config.loading))
        except BaseException:
            for i in specs:                                  # a half-loaded context stays as the index says
                ctx.kv.chunks[i] = None
            raise
        for i, spec in specs.items():
            got = ctx.kv.chunks[i]
            if got is None or got.bits != spec.bits or tuple(got.shape) != spec.shape:
                raise WorkbenchError(f"the loader left chunk {i} of context {ctx.row.id} "
                                     f"{'missing' if got is None else f'at {got.bits} bits, shape {got.shape}'}; "
                                     f"expected {spec.bits} bits, shape {spec.shape}")
        with self._state:
            for i in report.loaded:
                ctx.chunks[i].state = BOTH
            for i in report.recomputed:
                ctx.chunks[i].state = MEMORY
        return report

    def _compress(self, ctx: _Context) -> set[int]:
        """Tolerance-aware compression of the full chunks; returns the chunks whose level went down."""
        kv = ctx.kv
        ctx.density = kv.chunk_density(self._heads_times_layers)
        if self.config.compression != "tolerance":
            return set()
        full = [i for i in range(kv.num_chunks) if kv.span(i)[1] - kv.span(i)[0] == kv.chunk_size]
        if not full:
            return set()
        lowered = set()
        for i, bits in zip(full, assign_levels(ctx.density[full], self.config.levels, self.config.global_ratio)):
            if int(bits) < kv.chunks[i].bits:
                kv.chunks[i] = recompress(kv.chunks[i], int(bits))
                lowered.add(i)
        return lowered

    @staticmethod
    def _undo_for(ctx: _Context) -> Callable[[], None]:
        """What puts ``ctx`` back as it is now (its tokens, chunks, rows and density), for a call whose
        results cannot be saved."""
        kv = ctx.kv
        saved_kv = (list(kv.tokens), list(kv.pending), kv.attn_sum.copy(), kv.attn_rows.copy(), list(kv.chunks))
        saved_rows, saved_row, saved_density = [replace(r) for r in ctx.chunks], replace(ctx.row), ctx.density

        def undo() -> None:
            kv.tokens, kv.pending, kv.attn_sum, kv.attn_rows, kv.chunks = saved_kv
            ctx.chunks, ctx.row, ctx.density = saved_rows, saved_row, saved_density
        return undo

    def _finish_call(self, ctx: _Context, dirty: set[int]) -> tuple[int, int]:
        """Record the call in one index transaction, writing the changed chunks first when swapping out
        ahead of time; returns (bytes written, files written)."""
        kv = ctx.kv
        rows, files = [], {}
        with self._state:
            for i, data in enumerate(kv.chunks):
                if i == len(ctx.chunks):
                    ctx.chunks.append(ChunkRow(ctx=ctx.row.id, idx=i, bits=data.bits, shape=data.shape,
                                               state=MEMORY, nbytes=data.nbytes))
                row = ctx.chunks[i]
                row.bits, row.shape, row.nbytes, row.last_tick = data.bits, tuple(data.shape), data.nbytes, self._tick
                if i in dirty:
                    row.state = BOTH if self.config.writes_ahead else MEMORY
                    if self.config.writes_ahead:
                        files[row.key] = data
                rows.append(row)
            r = ctx.row
            r.tokens, r.pending, r.attn_sum, r.attn_rows = kv.tokens, kv.pending, kv.attn_sum, kv.attn_rows
            r.last_used, r.last_tick, r.calls = time.time(), self._tick, r.calls + 1
            written = self.store.commit(contexts=[r], chunks=rows, files=files)
        return written, len(files)

    def _enqueue(self, ctx: _Context) -> None:
        for row in ctx.chunks:
            if row.state in IN_MEMORY:
                density = float(ctx.density[row.idx]) if row.idx < len(ctx.density) else 0.0
                self.queue.put(QueueEntry(ctx=row.ctx, chunk=row.idx, bits=row.bits, nbytes=row.nbytes,
                                          last_used=row.last_tick, density=density))

    # ------------------------------------------------------------------ observing

    def memory_by_level(self) -> dict[int, int]:
        out: dict[int, int] = {}
        with self._state:
            for ctx in self._contexts.values():
                for c in ctx.chunks:
                    if c.state in IN_MEMORY:
                        out[c.bits] = out.get(c.bits, 0) + c.nbytes
        return out

    def _update_memory_metrics(self) -> None:
        self.metrics.set_memory(self.memory_by_level(), self.memory_budget_bytes, len(self._contexts))

    @property
    def evictions(self) -> list[EvictionRecord]:
        """The latest evictions (up to 1000), oldest first."""
        with self._state:
            return list(self._evictions)

    def metrics_text(self) -> str:
        return self.metrics.text()

    def start_metrics_server(self, port: int = 0):
        """Serve the Prometheus text on 127.0.0.1:``port``; returns (HTTP server, thread)."""
        return self.metrics.start_server(port)

    def snapshot(self) -> dict:
        """A JSON-ready view for a dashboard: settings, memory per level, every context with its
        chunks' levels and states, the eviction queue in order, recent evictions, counters, the last call."""
        with self._state:
            by_level = self.memory_by_level()
            contexts = [{
                "id": c.row.id, "app": c.row.app, "tokens": len(c.kv.tokens), "calls": c.row.calls,
                "last_used": c.row.last_used, "last_tick": c.row.last_tick, "served": c.row.id in self.queue.locked,
                "bytes_in_memory": sum(r.nbytes for r in c.chunks if r.state in IN_MEMORY),
                "chunks": [{"index": r.idx, "bits": r.bits, "state": r.state, "bytes": r.nbytes,
                            "last_tick": r.last_tick,
                            "density": float(c.density[r.idx]) if r.idx < len(c.density) else None}
                           for r in c.chunks]} for c in self._contexts.values()]
            order = [asdict(e) for e in self.queue.order()]
            subs = {str(bits): [[e.ctx, e.chunk] for e in entries] for bits, entries in self.queue.sub_queues().items()}
            evictions = [r.to_dict() for r in list(self._evictions)[-50:]]
        return {
            "swap_dir": str(self.swap_dir), "config": self.config.to_dict(),
            "memory_budget_bytes": self.memory_budget_bytes, "max_contexts_per_app": self.max_contexts_per_app,
            "memory": {"used_bytes": sum(by_level.values()), "by_level": {str(k): v for k, v in sorted(by_level.items())}},
            "contexts": contexts,
            "queue": {"policy": self.queue.policy, "granularity": self.queue.granularity, "order": order,
                      "sub_queues": subs},
            "evictions": evictions, "waiting_calls": self._turn.waiting,
            "loader": loader_name(self.loader),
            "metrics": self.metrics.values(),
            "last_call": None if self.last_call is None else self.last_call.to_dict(),
        }

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Refuse calls from now on (queued ones too), wait for the call being served, close the index."""
        if self._closed:
            return
        self._closed = True
        self._turn.acquire()
        try:
            self.store.close()
        finally:
            self._turn.release()

    def __enter__(self) -> LLMService:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AppSession:
    """One app's view of the service (``LLMService.bind``): its contexts only."""

    def __init__(self, service: LLMService, app: str):
        self.service = service
        self.app = app

    def new_ctx(self, system_prompt: str | None = None) -> CtxStub:
        """A new, empty context; ``system_prompt`` opens its first turn (SmolLM2's default when None)."""
        return self.service._new_ctx(self.app, system_prompt)

    def call(self, stub: CtxStub, prompt: str, max_new_tokens: int = 16) -> str:
        """Append ``prompt`` as the next user turn and return the model's answer (greedy, up to
        ``max_new_tokens``, stopping at ``<|im_end|>``)."""
        return self.service._call(self.app, stub, prompt, max_new_tokens)[0]

    def call_with_stats(self, stub: CtxStub, prompt: str, max_new_tokens: int = 16) -> tuple[str, CallStats]:
        return self.service._call(self.app, stub, prompt, max_new_tokens)

    def delete(self, stub: CtxStub) -> None:
        self.service._delete(self.app, stub)

    def snapshot(self) -> dict:
        return self.service.snapshot()
