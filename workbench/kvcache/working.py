"""The working cache a call runs in, kept from call to call (the budget's reserve, made one buffer).

The memory budget reserves room for one call's float cache beside the chunks (``budget.MemoryBudget``).
The service holds that cache as one buffer: allocated when a call first needs more slots than it has
(grown in steps of :data:`GROWTH` tokens, never past the context limit, never shrunk), and written in
place by every switch, so a switch allocates nothing. Slots past the context are not cleared: the
decoder reads only the slots a call has filled.

After a call, the chunks it changed (the re-encoded tail, its new chunks, chunks compression moved to
another level) are written back from their stored form, so the buffer holds bit for bit what
rebuilding it from the chunks would. A next call on the same context, with nothing served in between,
then has nothing to rebuild: its switch is the eviction check alone. Every method's service does this
(it is the runtime's, not a policy), so no method gains from it over another.

A switch that reads chunks can write the chunks already in memory into the buffer while the reads are in
flight (:meth:`WorkingCache.fill_ahead`, which the pipeline loader runs on its calling thread while its IO
thread reads); :meth:`~WorkingCache.for_call` then writes only what the load brought or changed. That
overlap is part of LLMS's pipeline (``loading="pipeline"``); the baselines read, then rebuild.
"""
from __future__ import annotations

GROWTH = 256
"""Tokens the buffer grows by at least, so a conversation growing call by call does not reallocate each call."""


class WorkingCache:
    """The service's working cache (module docstring) for a decoder of ``cfg`` and contexts of at most
    ``limit`` tokens. ``allocations`` counts the buffers made (a test reads it)."""

    def __init__(self, cfg, limit: int):
        self.cfg, self.limit = cfg, int(limit)
        self.cache = None
        self.allocations = 0
        self._holds: tuple[str, int] | None = None
        self._ahead: dict[int, object] = {}              # chunk -> the ChunkData fill_ahead wrote for it

    def holds(self, ctx_id: str, tick: int) -> bool:
        """Whether the buffer mirrors context ``ctx_id`` as its call ``tick`` left it."""
        return self.cache is not None and self._holds == (ctx_id, tick)

    def for_call(self, kv, ctx_id: str, tick: int, extra: int, new_bits: int):
        """The cache for a call on ``kv`` (context ``ctx_id``, last called at ``tick``) adding up to ``extra``
        tokens: the buffer as it is when it mirrors that context, else the context written into it. Returns
        (cache, reused). Until :meth:`keep` the buffer mirrors nothing (the call changes it)."""
        dtype = kv.working_dtype(new_bits)
        reused = (self.holds(ctx_id, tick) and self.cache.length == len(kv.tokens)
                  and self.cache.capacity >= len(kv.tokens) + extra and self.cache.k.dtype == dtype
                  and not kv.missing())
        self._holds = None
        ahead, self._ahead = self._ahead, {}
        if reused:
            return self.cache, True
        if self.cache is None or self.cache.capacity < len(kv.tokens) + extra or self.cache.k.dtype != dtype:
            ahead = {}
        self._fit(len(kv.tokens) + extra, dtype)
        return kv.to_cache(self.cfg, extra, new_bits, into=self.cache, written=ahead), False

    def fill_ahead(self, kv, extra: int, new_bits: int, indices) -> None:
        """Write chunks ``indices`` of ``kv`` (in memory) into the buffer for a call adding up to ``extra``
        tokens, before the rest of the context is loaded; the next :meth:`for_call` skips each of them that
        still holds the chunk written here. The buffer mirrors no context from here on."""
        self._holds = None
        self._fit(len(kv.tokens) + extra, kv.working_dtype(new_bits))
        indices = list(indices)
        kv.write_chunks(self.cache, indices)
        self._ahead = {i: kv.chunks[i] for i in indices}

    def _fit(self, tokens: int, dtype) -> None:
        import torch

        from workbench.models.decoder import KVCache

        if self.cache is not None and self.cache.capacity >= tokens and self.cache.k.dtype == dtype:
            return
        self.cache = None                                  # the old buffer goes before the new one is made
        capacity = min(self.limit, max(tokens, -(-tokens // GROWTH) * GROWTH))
        shape = (self.cfg.num_layers, self.cfg.num_kv_heads, capacity, self.cfg.head_dim)
        self.cache = KVCache(torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype),
                             torch.zeros(capacity, dtype=torch.long))
        self.allocations += 1

    def write_back(self, kv, changed) -> None:
        """Write the chunks ``changed`` by a call back into the buffer from their stored form."""
        kv.write_chunks(self.cache, sorted(changed))

    def keep(self, ctx_id: str, tick: int) -> None:
        """The call at ``tick`` on ``ctx_id`` is committed and its changes written back: the buffer mirrors it."""
        self._holds = (ctx_id, tick)

    def forget(self) -> None:
        self._holds = None
        self._ahead = {}
