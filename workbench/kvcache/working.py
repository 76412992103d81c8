"""The working caches calls run in, kept from call to call (the budget's reserve, and the room chunks leave).

The memory budget reserves room for one call's float cache beside the chunks (``budget.MemoryBudget``).
The service holds that cache as a buffer: allocated when a call first needs more slots than a buffer has
(grown in steps of :data:`GROWTH` tokens, never past the context limit), and written in place by every
switch. Slots past the context are not cleared: the decoder reads only the slots a call has filled.

After a call, the chunks it changed (the re-encoded tail, its new chunks, chunks compression moved to
another level) are written back from their stored form, so the buffer holds bit for bit what rebuilding
it from the chunks would. The buffer then *mirrors* the context at that call.

Memory the chunks leave unused is not wasted: the service keeps the buffers of the contexts it served
last, each still mirroring its context, in the budget's reserve and whatever room the chunks in memory
leave (:attr:`WorkingCache.room`, set by the service before and after each call with :meth:`trim`). A
call on a context whose buffer is kept, with nothing of it changed since (the service forgets the buffer
of a context whose chunks left memory), runs on that buffer: its switch rebuilds nothing. Buffers give way first: the budget
never evicts a chunk to keep a buffer, and when chunks need the room the least recently used buffers go.
A method whose chunks are smaller (LLMS's compression) thus leaves room for more decompressed contexts.
Every method's service does this (it is the runtime's, not a policy).

A switch that reads chunks can write the chunks already in memory into a buffer while the reads are in
flight (:meth:`WorkingCache.fill_ahead`, which the pipeline loader runs on its calling thread while its IO
thread reads); :meth:`~WorkingCache.for_call` then writes only what the load brought or changed. That
overlap is part of LLMS's pipeline (``loading="pipeline"``); the baselines read, then rebuild.
"""
from __future__ import annotations

from dataclasses import dataclass

GROWTH = 256
"""Tokens a buffer grows by at least, so a conversation growing call by call does not reallocate each call."""


@dataclass(eq=False)
class Buffer:
    """One float cache and what it mirrors: (context, call tick), or None while a call changes it."""
    cache: object
    mirrors: tuple[str, int] | None = None

    @property
    def nbytes(self) -> int:
        return self.cache.k.nbytes + self.cache.v.nbytes


class WorkingCache:
    """The service's working caches (module docstring) for a decoder of ``cfg`` and contexts of at most
    ``limit`` tokens. :attr:`room`: the bytes all buffers may take (None: one buffer only).
    ``allocations`` counts the buffers made (a test reads it)."""

    def __init__(self, cfg, limit: int):
        self.cfg, self.limit = cfg, int(limit)
        self.buffers: list[Buffer] = []                  # least recently used first; the last is in use
        self.room: int | None = None
        self.allocations = 0
        self._ahead: dict[int, object] = {}              # chunk -> the ChunkData fill_ahead wrote for it

    @property
    def cache(self):
        """The buffer in use (the last call's, or the one a call is being served in)."""
        return self.buffers[-1].cache if self.buffers else None

    def nbytes(self) -> int:
        """Bytes of every buffer held."""
        return sum(b.nbytes for b in self.buffers)

    def holds(self, ctx_id: str, tick: int) -> bool:
        """Whether a buffer mirrors context ``ctx_id`` as its call ``tick`` left it."""
        return any(b.mirrors == (ctx_id, tick) for b in self.buffers)

    def trim(self, room: int, keep: tuple[str, int] | None = None) -> None:
        """Let the buffers take at most ``room`` bytes from now on, letting the least recently used go
        (the one in use, or the one mirroring ``keep``, last of all)."""
        self.room = int(room)
        spare = [b for b in self.buffers[:-1] if keep is None or b.mirrors != keep]
        while spare and self.nbytes() > self.room:
            self.buffers.remove(spare.pop(0))

    def for_call(self, kv, ctx_id: str, tick: int, extra: int, new_bits: int):
        """The cache for a call on ``kv`` (context ``ctx_id``, last called at ``tick``) adding up to ``extra``
        tokens: a kept buffer as it is when it mirrors that context, else the context written into one.
        Returns (cache, reused). Until :meth:`keep` the buffer mirrors nothing (the call changes it)."""
        need, dtype = len(kv.tokens) + extra, kv.working_dtype(new_bits)
        ahead, self._ahead = self._ahead, {}
        if self.holds(ctx_id, tick):
            hit = next(b for b in self.buffers if b.mirrors == (ctx_id, tick))
            if hit.cache.length == len(kv.tokens) and hit.cache.capacity >= need and hit.cache.k.dtype == dtype:
                self._use(hit)
                return hit.cache, True
        if not (ahead and self._fits(self.buffers[-1], need, dtype)):
            ahead = {}
            self._use(self._target(need, dtype))
        return kv.to_cache(self.cfg, extra, new_bits, into=self.cache, written=ahead), False

    def fill_ahead(self, kv, extra: int, new_bits: int, indices) -> None:
        """Write chunks ``indices`` of ``kv`` (in memory) into a buffer for a call adding up to ``extra``
        tokens, before the rest of the context is loaded; the next :meth:`for_call` skips each of them that
        still holds the chunk written here."""
        self._use(self._target(len(kv.tokens) + extra, kv.working_dtype(new_bits)))
        indices = list(indices)
        kv.write_chunks(self.cache, indices)
        self._ahead = {i: kv.chunks[i] for i in indices}

    @staticmethod
    def _fits(buffer: Buffer, tokens: int, dtype) -> bool:
        return buffer.cache.capacity >= tokens and buffer.cache.k.dtype == dtype

    def _use(self, buffer: Buffer) -> None:
        """Make ``buffer`` the one in use; it mirrors nothing until :meth:`keep`."""
        self.buffers.remove(buffer)
        self.buffers.append(buffer)
        buffer.mirrors = None

    def _target(self, tokens: int, dtype) -> Buffer:
        """A buffer to write a context of ``tokens`` slots into: a free one that fits, else a new one where
        the room allows it beside the others, else the least recently used that fits, else a new one for
        which the least recently used go."""
        fitting = [b for b in self.buffers if self._fits(b, tokens, dtype)]
        free = [b for b in fitting if b.mirrors is None]
        if free:
            return free[0]
        if self.room is None:
            if fitting:
                return fitting[0]
            self.buffers.clear()                           # the old buffer goes before the new one is made
            return self._new(tokens, dtype)
        capacity = self._capacity(tokens)
        size = self._nbytes(capacity, dtype)
        if self.nbytes() + size <= self.room:
            return self._new(tokens, dtype)
        if fitting:
            return fitting[0]
        while self.buffers and self.nbytes() + size > self.room:
            self.buffers.pop(0)
        return self._new(tokens, dtype)

    def _capacity(self, tokens: int) -> int:
        return min(self.limit, max(tokens, -(-tokens // GROWTH) * GROWTH))

    def _nbytes(self, capacity: int, dtype) -> int:
        import torch

        from workbench.kvcache.chunks import FLOAT_BITS, HALF_BITS, working_nbytes

        return working_nbytes(self.cfg, capacity, FLOAT_BITS if dtype == torch.float32 else HALF_BITS)

    def _new(self, tokens: int, dtype) -> Buffer:
        import torch

        from workbench.models.decoder import KVCache

        capacity = self._capacity(tokens)
        shape = (self.cfg.num_layers, self.cfg.num_kv_heads, capacity, self.cfg.head_dim)
        buffer = Buffer(KVCache(torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype),
                                torch.zeros(capacity, dtype=torch.long)))
        self.buffers.append(buffer)
        self.allocations += 1
        return buffer

    def write_back(self, kv, changed) -> None:
        """Write the chunks ``changed`` by a call back into the buffer in use from their stored form."""
        kv.write_chunks(self.cache, sorted(changed))

    def keep(self, ctx_id: str, tick: int) -> None:
        """The call at ``tick`` on ``ctx_id`` is committed and its changes written back: the buffer in use
        mirrors it (and no other buffer mirrors that context any more)."""
        for b in self.buffers:
            if b.mirrors is not None and b.mirrors[0] == ctx_id:
                b.mirrors = None
        self.buffers[-1].mirrors = (ctx_id, tick)

    def forget(self, ctx_id: str | None = None) -> None:
        """No buffer mirrors ``ctx_id`` (every context when None) any more; ``None`` also lets every buffer but
        the one in use go."""
        self._ahead = {}
        if ctx_id is None:
            del self.buffers[:-1]
        for b in self.buffers:
            if ctx_id is None or (b.mirrors is not None and b.mirrors[0] == ctx_id):
                b.mirrors = None
