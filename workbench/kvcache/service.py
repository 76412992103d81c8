"""The LLM context service (LLMS, section 3.1): apps bind to it, hold contexts through stubs, and call
the one model on them; the service keeps every context's KV cache in chunks under a memory budget.

A call on a context:

1. waits its turn (a FIFO lock: one model, calls served in arrival order; the wait is recorded);
2. switches to the context: locks it against eviction, evicts other chunks until its missing chunks
   and the call's growth fit the budget, and brings its missing chunks into memory through the
   loader (a pluggable callable; by default the swapping-recompute pipeline, ``loader.PipelineLoader``:
   equation 4 picks which chunks to read and which to recompute, overlapped layer by layer);
3. runs the prompt and the greedy continuation (``engine.run_call``);
4. compresses by tolerance: every full chunk's level is assigned anew over the whole context from the
   information density (``assign_levels``), up or down, made from the chunk's 8-bit base (kept in a
   base file once the chunk is full); the open last chunk stays at the base level until it is full;
5. writes every changed chunk to its file and commits the index (ahead-of-time swap-out), and only
   then returns; a service killed at any point restarts with every returned call intact.

Baselines of the paper are configurations of the same service (``ServiceConfig``, ``PRESETS``, in the
torch-free ``config``). The budget and its evictions live in ``budget``, the compression after a call in
``compression``, and what the service shows of itself (a typed ``state()``, the JSON snapshot, an app's part
of it) in ``statistics``; this module holds the contexts, the call path and its one commit.
"""
from __future__ import annotations

import hashlib
import json
import logging
import secrets
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence


from workbench.errors import WorkbenchError
from workbench.kvcache import limits
from workbench.kvcache.budget import MemoryBudget
from workbench.kvcache.chunks import ChunkData, ChunkedKV, recompress, working_nbytes
from workbench.kvcache.compression import relevel_context
from workbench.kvcache.config import (DEFAULT_MAX_CONTEXTS_PER_APP, DEFAULT_MEMORY_BUDGET,  # noqa: F401
                                      MAX_CHUNK_SIZE, PRESETS, ServiceConfig, check_whole)
from workbench.kvcache.loader import (ChunkSpec, Loader, LoadReport, LoadRequest, PipelineLoader,  # noqa: F401
                                      loader_name)
from workbench.kvcache.errors import (CallFailedError, ContextLengthError, ContextLimitError, DeadlineError,  # noqa: F401
                                      MemoryBudgetError, ServiceClosedError, StubError, SwapStoreError)
from workbench.kvcache.lifecycle import EvictionRecord, LCTRUQueue, QueueEntry
from workbench.kvcache.metrics import ServiceMetrics
from workbench.kvcache.protocol import GREEDY, CallStats, CtxStub, Sampling
from workbench.kvcache.swapfile import DamagedChunkFileError
from workbench.kvcache.working import WorkingCache
from workbench.kvcache.statistics import ChunkState, ContextState, ServiceState, app_snapshot, queue_dicts
from workbench.kvcache.store import (BASE_BITS, BOTH, DROPPED, HAS_FILE, IN_MEMORY, MEMORY, ChunkRow, ContextRow,
                                     ServedContext, SwapStore)

log = logging.getLogger("workbench.kvcache")

CHAT_ROLES = ("system", "user", "assistant")


def default_swap_dir() -> Path:
    from workbench.cache import cache_dir

    return cache_dir() / "llms" / "swap"


# ----------------------------------------------------------------------------- stubs and stats

def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# ----------------------------------------------------------------------------- fairness

class FairLock:
    """A lock handed out in arrival order (tickets), so no caller is overtaken by a later one.

    A caller whose wait ends in an exception (an interrupt, a timeout of its own) gives its ticket
    back: the lock skips it, so the callers behind it are still served."""

    def __init__(self):
        self._cond = threading.Condition()
        self._next = 0
        self._serving = 0
        self._abandoned: set[int] = set()

    def acquire(self) -> float:
        """Wait for this caller's turn; returns the seconds waited."""
        t0 = time.perf_counter()
        with self._cond:
            ticket = self._next
            self._next += 1
            try:
                while self._serving != ticket:
                    self._cond.wait()
            except BaseException:
                self._give_back(ticket)
                raise
        return time.perf_counter() - t0

    def _give_back(self, ticket: int) -> None:
        if self._serving == ticket:
            self._advance()
        else:
            self._abandoned.add(ticket)

    def _advance(self) -> None:
        self._serving += 1
        while self._serving in self._abandoned:
            self._abandoned.discard(self._serving)
            self._serving += 1
        self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self._advance()

    @property
    def waiting(self) -> int:
        """Callers waiting for their turn (not counting the one holding the lock)."""
        return max(0, self._next - self._serving - 1 - len(self._abandoned))


# ----------------------------------------------------------------------------- the service

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
        limits.budget_bytes.check("memory_budget_bytes", memory_budget_bytes)
        limits.contexts.check("max_contexts_per_app", max_contexts_per_app)
        if model is None:
            from workbench.models.decoder import load_decoder
            model = load_decoder()
        self.model = model
        if tokenizer is None:
            from workbench.models.decoder import decoder_tokenizer
            tokenizer = decoder_tokenizer()
        self.tokenizer = tokenizer
        self.config = config or ServiceConfig()
        context = model.cfg.max_positions
        for name, value in (("chunk_size", self.config.chunk_size),
                            ("max_context_tokens", self.config.max_context_tokens)):
            if value is not None and value > context:
                raise WorkbenchError(f"{name} is at most {context} tokens (the decoder's context), got {value}")
        limit = self.config.max_context_tokens or context
        reserve = working_nbytes(model.cfg, limit, self.config.base_bits)
        if reserve >= memory_budget_bytes:
            raise MemoryBudgetError(
                f"memory_budget_bytes must exceed the working cache of a call at the context limit "
                f"({reserve} bytes for {limit} tokens), got {memory_budget_bytes}; raise the "
                f"budget or lower max_context_tokens")
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
        self._contexts: dict[str, ServedContext] = {}
        self._stubs: dict[str, str] = {}
        self.budget = MemoryBudget(memory_budget_bytes, reserve, config=self.config, queue=self.queue,
                                   store=self.store, metrics=self.metrics, contexts=self._contexts, lock=self._state,
                                   write_seconds=getattr(self.loader, "write_seconds", None))
        self._tick = 0
        self._closed = False
        self.last_call: CallStats | None = None
        self.working = WorkingCache(model.cfg, limit)
        self._restore()

    # ------------------------------------------------------------------ set-up

    @property
    def memory_budget_bytes(self) -> int:
        return self.budget.total_bytes

    @property
    def working_reserve_bytes(self) -> int:
        """The working cache reserved within the budget for a call at the context limit."""
        return self.budget.reserve_bytes

    @property
    def chunk_budget_bytes(self) -> int:
        """What chunks in memory may take: the budget less the working cache reserve."""
        return self.budget.chunk_bytes

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
            ctx = ServedContext(row, kv, chunks, kv.chunk_density(self._heads_times_layers))
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
            token = "s" + secrets.token_urlsafe(32)          # never begins with "-", which a shell reads as an option
            now = time.time()
            row = ContextRow(id=secrets.token_hex(8), app=app, stub_sha256=_digest(token),
                             system_prompt=system_prompt, created=now, last_used=now, last_tick=self._tick)
            self.store.add_context(row)
            with self._state:
                self._contexts[row.id] = ServedContext(row, self._empty_kv(), [])
                self._stubs[row.stub_sha256] = row.id
            return CtxStub(token)

    def _resolve(self, app: str, stub: CtxStub) -> ServedContext:
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
            self._drop(self._resolve(app, stub))

    def _delete_id(self, app: str, ctx_id: str) -> None:
        with self._my_turn():
            ctx = self._contexts.get(ctx_id) if isinstance(ctx_id, str) else None
            if ctx is None or ctx.row.app != app:
                raise StubError(f"app {app!r} holds no context {ctx_id!r}; list its contexts to see their ids")
            self._drop(ctx)

    def _app_contexts(self, app: str) -> list[dict]:
        with self._state:
            return [{"id": c.row.id, "tokens": len(c.kv.tokens), "calls": c.row.calls,
                     "bytes": sum(r.nbytes for r in c.chunks),
                     "bytes_in_memory": sum(r.nbytes for r in c.chunks if r.state in IN_MEMORY),
                     "created": c.row.created, "last_used": c.row.last_used, "system_prompt": c.row.system_prompt}
                    for c in self._contexts.values() if c.row.app == app]

    def _drop(self, ctx: ServedContext) -> None:
        """Delete ``ctx`` (its files, index rows and queue entries); the caller holds the turn."""
        self.store.delete_context(ctx.row.id)
        self.working.forget(ctx.row.id)
        with self._state:
            del self._contexts[ctx.row.id]
            del self._stubs[ctx.row.stub_sha256]
            self.queue.remove_context(ctx.row.id)
        self._update_memory_metrics()

    # ------------------------------------------------------------------ a call

    def _prompt_ids(self, ctx: ServedContext, messages: Sequence[tuple[str, str]]) -> list[int]:
        """SmolLM2's chat format: a new context opens with its system prompt; a later call first closes
        the last answer (``<|im_end|>`` when it was cut short); then each message is a turn of its role and
        an assistant turn is opened for the answer."""
        tok = self.tokenizer
        kv = ctx.kv
        if not kv.tokens and not kv.pending:
            from workbench.models.decoder import DEFAULT_SYSTEM

            system = ctx.row.system_prompt if ctx.row.system_prompt is not None else DEFAULT_SYSTEM
            parts = [f"<|im_start|>system\n{system}<|im_end|>\n"]
        else:
            parts = ["\n" if kv.pending == [tok.im_end_id] else "<|im_end|>\n"]
        parts += [f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages]
        return tok.encode("".join(parts) + "<|im_start|>assistant\n")

    @staticmethod
    def _checked_messages(messages) -> list[tuple[str, str]]:
        if not isinstance(messages, (list, tuple)) or not messages:
            raise WorkbenchError("messages is a non-empty list of (role, text) pairs")
        out = []
        for i, m in enumerate(messages):
            if not (isinstance(m, (list, tuple)) and len(m) == 2 and m[0] in CHAT_ROLES and isinstance(m[1], str)):
                raise WorkbenchError(f"message {i} is not a (role, text) pair with a role of "
                                     f"{', '.join(CHAT_ROLES)}: {m!r}"[:300])
            out.append((m[0], m[1]))
        if out[-1][0] != "user" or not out[-1][1].strip():
            raise WorkbenchError("the last message is the user's, with some text: the answer follows it")
        return out

    def _call(self, app: str, stub: CtxStub, prompt: str, max_new_tokens: int,
              on_token: Callable[[int], bool] | None = None, deadline: float | None = None,
              call_id: str | None = None, *, messages: Sequence[tuple[str, str]] | None = None,
              sampling: Sampling = GREEDY) -> tuple[str, CallStats]:
        if messages is None:
            if not isinstance(prompt, str) or not prompt.strip():
                raise WorkbenchError("the prompt is empty; send some text")
            messages = [("user", prompt)]
        else:
            messages = self._checked_messages(messages)
        if not isinstance(sampling, Sampling):
            raise WorkbenchError(f"sampling is a Sampling, got {type(sampling).__name__}")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise WorkbenchError(f"max_new_tokens must be a whole number of at least 1, got {max_new_tokens!r}")
        with self._my_turn() as wait:
            if deadline is not None and time.monotonic() > deadline:
                raise DeadlineError(f"the call's deadline passed while it waited {wait:.2f} s for its turn; it was "
                                    f"not run and the context is as it was")
            ctx = self._resolve(app, stub)
            request = json.dumps([prompt, max_new_tokens] if len(messages) == 1 and prompt is not None
                                 and sampling == GREEDY else [messages, max_new_tokens, repr(sampling)])
            if call_id is not None and call_id == ctx.row.last_call_id:
                return self._repeated(ctx, call_id, request)
            kv = ctx.kv
            ids = self._prompt_ids(ctx, messages)
            t_start = time.perf_counter()
            limit = self.config.max_context_tokens or self.model.cfg.max_positions
            adding = len(kv.pending) + len(ids) + max_new_tokens
            if len(kv.tokens) + adding > limit:
                exc = ContextLengthError(f"the context would grow to {len(kv.tokens) + adding} tokens, beyond its "
                                         f"limit of {limit}; start a new context or delete this one")
                exc.room = limit - (len(kv.tokens) + adding - max_new_tokens)
                raise exc
            self._tick += 1
            with self._state:
                self.queue.lock(ctx.row.id)
            try:
                missing = kv.missing()
                if missing:                              # a kept buffer is stale once its chunks came back
                    self.working.forget(ctx.row.id)
                records = self.budget.make_room(ctx, missing, adding)
                self.working.trim(self.budget.buffer_room(ctx, missing, adding), keep=(ctx.row.id, ctx.row.last_tick))
                t_loaded = time.perf_counter()
                report = self._load(ctx, missing, self._fill_ahead(kv, missing, adding))
                t_dequantize = time.perf_counter()
                cache, reused = self.working.for_call(kv, ctx.row.id, ctx.row.last_tick, adding,
                                                      self.config.base_bits)
                t_infer = time.perf_counter()
                from workbench.kvcache.engine import run_call

                undo = self._undo_for(ctx)
                try:                                     # nothing of the call stays unless the index commits it
                    result = run_call(self.model, kv, ids, max_new_tokens, stop_ids=(self.tokenizer.im_end_id,),
                                      bits=self.config.base_bits, max_context=limit, on_token=on_token,
                                      cache=cache, sampling=sampling)
                    del cache
                    t_compress = time.perf_counter()
                    releveled, bases = self._compress(ctx)
                    dirty = set(result.changed_chunks) | set(report.recomputed) | releveled
                    self.working.write_back(kv, dirty)
                    t_write = time.perf_counter()
                    text = self.tokenizer.decode([t for t in result.output_ids if t != self.tokenizer.im_end_id])

                    def stats_until(t_end: float, written: int) -> CallStats:
                        return CallStats(
                            ctx=ctx.row.id, app=app, tick=self._tick, queue_wait_s=wait, reclaim_s=t_loaded - t_start,
                            load_s=t_dequantize - t_loaded, dequantize_s=t_infer - t_dequantize,
                            switch_s=t_infer - t_start, io_s=report.io_s, recompute_s=report.recompute_s,
                            inference_s=t_compress - t_infer, compress_s=t_write - t_compress,
                            swap_out_s=t_end - t_write, total_s=t_end - t_start, chunks_missing=len(missing),
                            chunks_loaded=len(report.loaded), chunks_recomputed=len(report.recomputed),
                            bytes_read=report.bytes_read, bytes_written=written, evictions=len(records),
                            evicted_bytes=sum(r.nbytes for r in records), prompt_tokens=len(ids),
                            output_tokens=len(result.output_ids), context_tokens=len(kv.tokens),
                            loader=loader_name(self.loader), chunks_restored=len(report.restored),
                            recovered=report.recovered, cache_reused=reused)

                    reply = None if call_id is None else json.dumps(
                        {"request": request, "text": text, "stats": stats_until(t_write, 0).to_dict()})
                    written_bytes, written_files = self._finish_call(ctx, dirty, bases, call_id, reply)
                    self.working.keep(ctx.row.id, ctx.row.last_tick)
                    self.working.trim(self.budget.buffer_room())
                except BaseException as exc:
                    self.working.forget()
                    with self._state:
                        undo()
                    if isinstance(exc, (OSError, sqlite3.Error)):
                        raise SwapStoreError(f"could not save context {ctx.row.id} to the swap store in "
                                             f"{self.swap_dir} ({exc}); the call was undone and every context is "
                                             f"as it was") from exc
                    if isinstance(exc, Exception) and not isinstance(exc, WorkbenchError):
                        raise CallFailedError(f"the call on context {ctx.row.id} failed ({type(exc).__name__}: "
                                              f"{exc}); it was undone and the context is as it was") from exc
                    raise
                stats = stats_until(time.perf_counter(), written_bytes)
            finally:
                with self._state:
                    self.queue.unlock(ctx.row.id)
                    self._enqueue(ctx)
            self.metrics.record_call(stats)
            self.metrics.record_writes(written_files, written_bytes, "ahead_of_time")
            self._update_memory_metrics()
            self.last_call = stats
            return text, stats

    @staticmethod
    def _repeated(ctx: ServedContext, call_id: str, request: str) -> tuple[str, CallStats]:
        """The committed reply of call ``call_id``, a retry of the context's last call: not run again."""
        saved = json.loads(ctx.row.last_reply)
        if saved["request"] != request:
            raise WorkbenchError(f"call_id {call_id!r} was given to another call on this context (another prompt "
                                 f"or max_new_tokens); a new call needs a new call_id")
        return saved["text"], CallStats.from_dict(saved["stats"])

    def _fill_ahead(self, kv: ChunkedKV, missing: list[int], adding: int) -> Callable[[], None] | None:
        """The pipeline's work beside the reads: the chunks in memory written into the working cache."""
        if self.config.loading != "pipeline" or not missing:
            return None
        gone = set(missing)
        present = [i for i in range(len(kv.chunks)) if i not in gone]
        return lambda: self.working.fill_ahead(kv, adding, self.config.base_bits, present)

    def _load(self, ctx: ServedContext, missing: list[int],
              meanwhile: Callable[[], None] | None = None) -> LoadReport:
        """Bring ``missing`` chunks into memory through the loader. A swap file that fails its size or
        CRC-32 check is logged and counted; its chunk is restored from its intact 8-bit base where it has one
        (exact: the level is made from the base, as compression made it) and its file written again, else
        dropped and recomputed from its tokens (the load is then redone, since recomputed chunks may have
        attended to the damaged one). The report says which chunks came back how."""
        if not missing:
            return LoadReport()
        damaged: dict[int, str] = {}
        restored: dict[int, str] = {}
        while True:
            specs = {i: self._chunk_spec(ctx, i, damaged) for i in missing if i not in restored}
            try:
                report = self.loader(LoadRequest(model=self.model, kv=ctx.kv, specs=specs,
                                                 loading=self.config.loading, meanwhile=meanwhile)) \
                    if specs else LoadReport()
                break
            except DamagedChunkFileError as exc:
                for i in specs:
                    ctx.kv.chunks[i] = None
                fresh = {i: why for i, why in exc.chunks.items() if i not in damaged and i in specs}
                if not fresh:
                    raise
                exact = self._restore_from_base(ctx, fresh)
                restored.update(exact)
                rest = {i: why for i, why in fresh.items() if i not in exact}
                damaged.update(rest)
                if rest:
                    self._drop_damaged(ctx, rest)
            except BaseException:
                for i in specs:                              # a half-loaded context stays as the index says
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
        recovered = [f"chunk {i}: {why}; restored from its intact {BASE_BITS}-bit base (exact)"
                     for i, why in sorted(restored.items())]
        recovered += [f"chunk {i}: {why}; recomputed from its tokens (no intact base)" for i, why in sorted(damaged.items())]
        return replace(report, restored=tuple(sorted(restored)), recovered=tuple(recovered)) if recovered else report

    def _restore_from_base(self, ctx: ServedContext, damaged: Mapping[int, str]) -> dict[int, str]:
        """Chunks of ``damaged`` whose 8-bit base file is intact: each made again at its level from the base
        (bit for bit what compression made) into memory, and its file written again in one index commit.
        Returns those restored, with why their file failed."""
        back: dict[int, ChunkData] = {}
        for i in sorted(damaged):
            row = ctx.chunks[i]
            base = self.store.read_base(row)
            if base is None or tuple(base.shape) != tuple(row.shape):
                continue
            back[i] = recompress(base, row.bits)
        if not back:
            return {}
        with self._state:
            rows = [ctx.chunks[i] for i in back]
            self.store.commit(chunks=rows, files={ctx.chunks[i].key: data for i, data in back.items()})
            for i, data in back.items():
                ctx.kv.chunks[i] = data
                ctx.chunks[i].state = BOTH
                log.warning("llms: %s (chunk %d of context %s); restored from its intact %d-bit base (exact)",
                            damaged[i], i, ctx.row.id, BASE_BITS)
        self.metrics.record_damaged(len(back))
        return {i: damaged[i] for i in back}

    def _chunk_spec(self, ctx: ServedContext, i: int, damaged: Mapping[int, str]) -> ChunkSpec:
        row = ctx.chunks[i]
        has_file = row.state in HAS_FILE and i not in damaged
        return ChunkSpec(bits=row.bits, shape=tuple(row.shape),
                         path=self.store.current_path(ctx.row.id, i) if has_file else None,
                         crc32=row.crc32 if has_file else None)

    def _drop_damaged(self, ctx: ServedContext, damaged: Mapping[int, str]) -> None:
        """Record damaged swap files: their chunks become ``dropped`` (recomputed from their tokens) in
        one index transaction, the files are removed, and each is logged and counted."""
        rows = []
        with self._state:
            for i, why in sorted(damaged.items()):
                row = ctx.chunks[i]
                log.warning("llms: %s (chunk %d of context %s); the chunk is recomputed from its tokens",
                            why, i, ctx.row.id)
                row.state = DROPPED
                rows.append(row)
            self.store.commit(chunks=rows)
            for row in rows:
                self.store.remove_file(row.ctx, row.idx)
        self.metrics.record_damaged(len(rows))

    def _compress(self, ctx: ServedContext) -> tuple[set[int], dict[tuple[str, int], ChunkData]]:
        """Tolerance-aware compression over the whole context (``compression.relevel_context``); raised
        levels keep their old one unless the budget makes room for them. Returns the chunks whose level
        changed and the bases to write, by (context, chunk)."""
        done = relevel_context(ctx.kv, {r.idx: r for r in ctx.chunks}, self.config, self._heads_times_layers,
                               self.store.read_base)
        ctx.density = done.density
        if done.raised and not self.budget.room_for_raised(ctx, done.raised):
            for i, held in done.raised.items():
                ctx.kv.chunks[i] = held
                done.changed.discard(i)
        return done.changed, {(ctx.row.id, i): data for i, data in done.bases.items()}

    @staticmethod
    def _undo_for(ctx: ServedContext) -> Callable[[], None]:
        """What puts ``ctx`` back as it is now (its tokens, chunks, rows and density), for a call whose
        results cannot be saved."""
        kv = ctx.kv
        saved_kv = (list(kv.tokens), list(kv.pending), kv.attn_sum.copy(), kv.attn_rows.copy(), list(kv.chunks))
        saved_rows, saved_row, saved_density = [replace(r) for r in ctx.chunks], replace(ctx.row), ctx.density

        def undo() -> None:
            kv.tokens, kv.pending, kv.attn_sum, kv.attn_rows, kv.chunks = saved_kv
            ctx.chunks, ctx.row, ctx.density = saved_rows, saved_row, saved_density
        return undo

    def _finish_call(self, ctx: ServedContext, dirty: set[int], bases: Mapping[tuple[str, int], ChunkData] | None = None,
                     call_id: str | None = None, reply: str | None = None) -> tuple[int, int]:
        """Record the call in one index transaction, writing the changed chunks first when swapping out
        ahead of time, and the new full chunks' 8-bit bases; returns (bytes written, files written)."""
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
            r.last_call_id, r.last_reply = call_id, reply
            written = self.store.commit(contexts=[r], chunks=rows, files=files, bases=bases)
        return written, len(files)

    def _enqueue(self, ctx: ServedContext) -> None:
        for row in ctx.chunks:
            if row.state in IN_MEMORY:
                density = float(ctx.density[row.idx]) if row.idx < len(ctx.density) else 0.0
                self.queue.put(QueueEntry(ctx=row.ctx, chunk=row.idx, bits=row.bits, nbytes=row.nbytes,
                                          last_used=row.last_tick, density=density))

    # ------------------------------------------------------------------ observing

    def memory_by_level(self) -> dict[int, int]:
        with self._state:
            return self.budget.by_level()

    def _update_memory_metrics(self) -> None:
        self.metrics.set_memory(self.memory_by_level(), self.memory_budget_bytes, len(self._contexts))

    @property
    def evictions(self) -> list[EvictionRecord]:
        """The latest evictions (up to ``budget.EVICTIONS_KEPT``), oldest first."""
        with self._state:
            return list(self.budget.evictions)

    def metrics_text(self) -> str:
        return self.metrics.text()

    def start_metrics_server(self, port: int = 0):
        """Serve the Prometheus text on 127.0.0.1:``port``; returns (HTTP server, thread)."""
        return self.metrics.start_server(port)

    def state(self) -> ServiceState:
        """Every context with its chunks' levels and states, and the eviction queue in order, typed."""
        with self._state:
            contexts = tuple(ContextState(
                id=c.row.id, app=c.row.app, tokens=len(c.kv.tokens), calls=c.row.calls, last_used=c.row.last_used,
                last_tick=c.row.last_tick, served=c.row.id in self.queue.locked,
                chunks=tuple(ChunkState(index=r.idx, bits=r.bits, state=r.state, nbytes=r.nbytes,
                                        last_tick=r.last_tick,
                                        density=float(c.density[r.idx]) if r.idx < len(c.density) else None)
                             for r in c.chunks)) for c in self._contexts.values())
            return ServiceState(contexts=contexts, queue=tuple(self.queue.order()))

    def snapshot(self) -> dict:
        """A JSON-ready view for a dashboard: settings, memory per level, every context with its
        chunks' levels and states, the eviction queue in order, recent evictions, counters, the last call."""
        with self._state:
            state = self.state()
            subs = {str(bits): [[e.ctx, e.chunk] for e in entries] for bits, entries in self.queue.sub_queues().items()}
            evictions = [r.to_dict() for r in list(self.budget.evictions)[-50:]]
        return {
            "swap_dir": str(self.swap_dir), "config": self.config.to_dict(),
            "memory_budget_bytes": self.memory_budget_bytes, "max_contexts_per_app": self.max_contexts_per_app,
            "working_reserve_bytes": self.working_reserve_bytes, "chunk_budget_bytes": self.chunk_budget_bytes,
            "working_bytes": self.working.nbytes(),
            "memory": state.memory_dict(),
            "contexts": [c.to_dict() for c in state.contexts],
            "queue": {"policy": self.queue.policy, "granularity": self.queue.granularity,
                      "order": queue_dicts(state.queue), "sub_queues": subs},
            "evictions": evictions, "waiting_calls": self._turn.waiting,
            "loader": loader_name(self.loader),
            "metrics": self.metrics.values(),
            "last_call": None if self.last_call is None else self.last_call.to_dict(),
        }

    def app_snapshot(self, app: str) -> dict:
        """The snapshot one app may see (``statistics.app_snapshot``)."""
        return app_snapshot(self.snapshot(), app)

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

    def call_with_stats(self, stub: CtxStub, prompt: str, max_new_tokens: int = 16, *,
                        on_token: Callable[[int], bool] | None = None, deadline: float | None = None,
                        call_id: str | None = None) -> tuple[str, CallStats]:
        """``call`` with its costs. ``on_token(id)`` sees each generated token as it comes and stops the
        generation by returning True; a call whose turn comes after ``deadline`` (``time.monotonic()``)
        is refused (``DeadlineError``) and changes nothing. A ``call_id`` equal to the context's last
        committed call's (a retry, after a lost reply or a restart) returns that call's reply without
        running it again; the stats are those recorded when it committed."""
        return self.service._call(self.app, stub, prompt, max_new_tokens, on_token, deadline, call_id)

    def delete(self, stub: CtxStub) -> None:
        self.service._delete(self.app, stub)

    def contexts(self) -> list[dict]:
        """This app's contexts: id, tokens, bytes (all chunks, and those in memory), calls, creation and
        last use, system prompt. Stubs are kept only hashed, so they are not listed."""
        return self.service._app_contexts(self.app)

    def delete_context(self, ctx_id: str) -> None:
        """Delete one of this app's contexts by its id, for a context whose stub was lost."""
        self.service._delete_id(self.app, ctx_id)

    def snapshot(self) -> dict:
        """``LLMService.snapshot`` narrowed to this app (``LLMService.app_snapshot``)."""
        return self.service.app_snapshot(self.app)
