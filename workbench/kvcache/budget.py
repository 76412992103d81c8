"""The LLM context service's memory budget and the evictions that keep it (LLMS 3.4).

The budget holds two things: the working cache of the call being served (the decoder's K/V of the
whole context in float16), reserved for the longest context the service allows, and the chunks in
memory, which get what that reserve leaves. A call first makes room for its context's missing chunks
and its growth by evicting other contexts' chunks in the order of the LCTRU queue (or the configured
policy); a context that cannot fit by itself is refused, since a served context is never evicted.
The reserve and whatever the chunks leave also hold the working caches kept from earlier calls
(``working.WorkingCache``); they give way to chunks, never the other way round (:meth:`MemoryBudget.buffer_room`).
"""
from __future__ import annotations

import sqlite3
import threading
import time
from collections import deque
from typing import Callable, Mapping, Sequence

from workbench.kvcache.chunks import ChunkData, chunk_nbytes
from workbench.kvcache.config import ServiceConfig
from workbench.kvcache.errors import MemoryBudgetError, SwapStoreError
from workbench.kvcache.lifecycle import DROP, KILL, SWAP_OUT, EvictionRecord, LCTRUQueue
from workbench.kvcache.metrics import ServiceMetrics
from workbench.kvcache.store import BOTH, DROPPED, FILE, IN_MEMORY, ServedContext, SwapStore

EVICTIONS_KEPT = 1000
"""Evictions remembered for the snapshot and the replays (oldest forgotten first)."""


class MemoryBudget:
    """``total_bytes`` of memory for one service: ``reserve_bytes`` (less than the total; the service checks
    it when made) for the working cache of the call served, the rest for chunks. Evicts from ``contexts`` (the service's, by id) through ``queue`` and ``store``;
    the caller's ``lock`` guards the contexts and the queue. ``write_seconds(bytes, files)`` pads eviction
    writes to an emulated device's speed (None: writes take what they take)."""

    def __init__(self, total_bytes: int, reserve_bytes: int, *, config: ServiceConfig, queue: LCTRUQueue,
                 store: SwapStore, metrics: ServiceMetrics, contexts: Mapping[str, ServedContext],
                 lock: threading.RLock, write_seconds: Callable[[int, int], float] | None = None):
        self.total_bytes = int(total_bytes)
        self.reserve_bytes = int(reserve_bytes)
        self.config, self.queue, self.store, self.metrics = config, queue, store, metrics
        self.contexts, self.lock, self.write_seconds = contexts, lock, write_seconds
        self.evictions: deque[EvictionRecord] = deque(maxlen=EVICTIONS_KEPT)

    @property
    def chunk_bytes(self) -> int:
        """What chunks in memory may take: the budget less the working cache reserved for the call served."""
        return self.total_bytes - self.reserve_bytes

    def used_bytes(self) -> int:
        return sum(c.nbytes for ctx in self.contexts.values() for c in ctx.chunks if c.state in IN_MEMORY)

    def by_level(self) -> dict[int, int]:
        """Bytes of chunks in memory per level."""
        out: dict[int, int] = {}
        for ctx in self.contexts.values():
            for c in ctx.chunks:
                if c.state in IN_MEMORY:
                    out[c.bits] = out.get(c.bits, 0) + c.nbytes
        return out

    def growth_bytes(self, ctx: ServedContext, adding: int) -> int:
        """Most bytes a call adding ``adding`` tokens can add: the chunks from the open last one on, at the
        base level, less what the open last one holds now."""
        kv = ctx.kv
        n, cs, end = len(kv.tokens), kv.chunk_size, len(kv.tokens) + adding
        total = sum(chunk_nbytes((kv.layers, 2, kv.kv_heads, min(end, (i + 1) * cs) - i * cs, kv.head_dim),
                                 self.config.base_bits) for i in range(n // cs, -(-end // cs)))
        if n % cs:
            total -= ctx.chunks[-1].nbytes
        return max(0, total)

    def make_room(self, ctx: ServedContext, missing: list[int], adding: int) -> list[EvictionRecord]:
        """Evict what the served context's ``missing`` chunks and a growth of ``adding`` tokens need, or refuse
        a context that cannot fit by itself (``MemoryBudgetError``, nothing evicted)."""
        growth = self.growth_bytes(ctx, adding)
        whole = sum(c.nbytes for c in ctx.chunks) + growth
        if whole > self.chunk_bytes:
            raise MemoryBudgetError(
                f"context {ctx.row.id} needs {whole} bytes in memory for this call ({len(ctx.chunks)} chunks and "
                f"room for {adding} more tokens), more than the {self.chunk_bytes} bytes the memory budget "
                f"of {self.total_bytes} leaves beside the call's working cache ({self.reserve_bytes} "
                f"bytes); a served context is never evicted: raise memory_budget_bytes, lower max_context_tokens, "
                f"ask for fewer new tokens or start a new context")
        deficit = self.used_bytes() + sum(ctx.chunks[i].nbytes for i in missing) + growth - self.chunk_bytes
        return self.evict(deficit, ctx.row.id) if deficit > 0 else []

    def buffer_room(self, ctx: ServedContext | None = None, missing: Sequence[int] = (), adding: int = 0) -> int:
        """Bytes the working caches may take (``working.WorkingCache.room``): the budget less the chunks in
        memory and, for a call on ``ctx``, its ``missing`` chunks and a growth of ``adding`` tokens. At least
        the reserve once :meth:`make_room` has made room for that call."""
        needed = 0 if ctx is None else sum(ctx.chunks[i].nbytes for i in missing) + self.growth_bytes(ctx, adding)
        return self.total_bytes - self.used_bytes() - needed

    def room_for_raised(self, ctx: ServedContext, raised: Mapping[int, ChunkData]) -> bool:
        """Whether the served context, with ``raised`` chunks at their new (higher) level, fits the budget,
        evicting other contexts' chunks for it when they hold enough."""
        with self.lock:
            others = sum(c.nbytes for other in self.contexts.values() if other is not ctx
                         for c in other.chunks if c.state in IN_MEMORY)
            deficit = others + ctx.kv.nbytes() - self.chunk_bytes
            if deficit <= 0:
                return True
            if sum(e.nbytes for e in self.queue.order()) < deficit:
                return False
        self.evict(deficit, ctx.row.id)
        return True

    def evict(self, deficit: int, served: str) -> list[EvictionRecord]:
        """Free at least ``deficit`` bytes of other contexts' chunks, as the policy orders them: one index
        transaction for all, writing only chunks without a current file. A failed write evicts nothing.
        Evictions that write nothing (drops of chunks whose file is current, kills) commit without waiting
        for the disk: recovery after a crash moves such rows the same way."""
        kill = self.config.eviction == "kill"
        with self.lock:
            victims = self.queue.victims(deficit, whole_contexts=kill)
            records, rows, files, undo = [], [], {}, []
            for e in victims:
                ctx = self.contexts[e.ctx]
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
                written = self.store.commit(chunks=rows, files=files, durable=bool(files))
            except (OSError, sqlite3.Error) as exc:
                for e, row, state, data in undo:
                    row.state = state
                    self.contexts[e.ctx].kv.chunks[e.chunk] = data
                    self.queue.put(e)
                raise SwapStoreError(f"could not swap chunks out to {self.store.root} to make room ({exc}); "
                                     "nothing was evicted and every context is as it was") from exc
            self.evictions.extend(records)
        if files and self.write_seconds is not None:                 # an emulated device's write time
            from workbench.devices import pad_until

            pad_until(t0 + self.write_seconds(written, len(files)))
        for r in records:
            self.metrics.record_eviction(r.policy, r.action)
        self.metrics.record_writes(len(files), written, "eviction")
        return records
