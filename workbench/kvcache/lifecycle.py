"""Chunk lifecycle (LLMS section 3.4): which in-memory chunks leave when memory is short, and why.

Every chunk in memory has an entry in the eviction queue; the chunks of the context being served
are locked (out of the queue) for the whole call. Policies order the entries:

* ``lctru`` (the paper's LCTRU queue): sub-queues per compression level, heaviest first (raw, then
  8, 4, 2 bits: the least compression-tolerable chunks, which free the most memory per chunk and
  so leave the fewest chunks to bring back), each in recency order, least recently used first;
* ``lru``: recency only;
* ``density``: lowest information density first (the mean attention a chunk's tokens receive; H2O's
  heavy-hitter rule keeps the tokens with the most accumulated attention instead, a sum that favours
  older tokens), recency breaking ties.

Ties fall to the older use, then context id and chunk index, so an order is always the same.
Recency is the service's call clock (one tick per call), not wall time.

Because the service writes every changed chunk to its file when a call returns (ahead-of-time
swap-out), evicting a chunk whose file is current is only dropping it from memory; the records
say which evictions needed a write and which needed none.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from workbench.errors import UnknownNameError, WorkbenchError
from workbench.kvcache.errors import MemoryBudgetError  # noqa: F401

POLICIES = ("lctru", "lru", "density")

DROP = "drop"          # file already written ahead of time: only memory is freed
SWAP_OUT = "swap_out"  # written to its file now, then freed
KILL = "kill"          # the whole context's KV dropped; recomputed from its tokens when called
ACTIONS = {DROP: "dropped from memory, its file was already written ahead of time (no write)",
           SWAP_OUT: "swapped out: written to its file at eviction",
           KILL: "killed: KV dropped without a file, recomputed from the tokens when called"}


@dataclass(frozen=True, kw_only=True)
class QueueEntry:
    """An in-memory chunk as the eviction queue sees it."""
    ctx: str
    chunk: int
    bits: int
    nbytes: int
    last_used: int
    density: float = 0.0

    @property
    def key(self) -> tuple[str, int]:
        return self.ctx, self.chunk


def _tie(e: QueueEntry) -> tuple:
    return e.last_used, e.ctx, e.chunk


SORT_KEYS = {
    "lctru": lambda e: (-e.bits, *_tie(e)),
    "lru": _tie,
    "density": lambda e: (e.density, *_tie(e)),
}


def check_policy(name: str) -> str:
    if name not in SORT_KEYS:
        raise UnknownNameError("eviction policy", name, SORT_KEYS)
    return name


@dataclass(kw_only=True)
class EvictionRecord:
    """One evicted chunk and why: the policy, its level and last use, and the memory the call needed."""
    policy: str
    ctx: str
    chunk: int
    bits: int
    last_used: int
    nbytes: int
    bytes_needed: int
    action: str
    served_ctx: str
    at: float = field(default_factory=time.time)

    @property
    def reason(self) -> str:
        return (f"{self.policy}: chunk {self.chunk} of context {self.ctx} ({self.bits}-bit, last used at "
                f"tick {self.last_used}, {self.nbytes} B) to free {self.bytes_needed} B for context "
                f"{self.served_ctx}; {ACTIONS[self.action]}")

    def to_dict(self) -> dict:
        return {"policy": self.policy, "ctx": self.ctx, "chunk": self.chunk, "bits": self.bits,
                "last_used": self.last_used, "bytes": self.nbytes, "bytes_needed": self.bytes_needed,
                "action": self.action, "served_ctx": self.served_ctx, "at": self.at, "reason": self.reason}


class LCTRUQueue:
    """The eviction queue of in-memory chunks, ordered by ``policy`` (LCTRU unless told otherwise).

    ``granularity="context"`` evicts whole contexts: the context of the first entry in policy order
    leaves with all its chunks (the paper's whole-context swapping and low-memory-killer baselines)."""

    def __init__(self, policy: str = "lctru", granularity: str = "chunk"):
        self.policy = check_policy(policy)
        if granularity not in ("chunk", "context"):
            raise WorkbenchError(f"granularity is 'chunk' or 'context', got {granularity!r}")
        self.granularity = granularity
        self._entries: dict[tuple[str, int], QueueEntry] = {}
        self._locked: set[str] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: tuple[str, int]) -> bool:
        return key in self._entries

    def put(self, entry: QueueEntry) -> None:
        """Add a chunk, or update it after a use or a recompression."""
        self._entries[entry.key] = entry

    def remove(self, key: tuple[str, int]) -> None:
        self._entries.pop(key, None)

    def remove_context(self, ctx: str) -> None:
        for key in [k for k in self._entries if k[0] == ctx]:
            del self._entries[key]

    def lock(self, ctx: str) -> None:
        """Keep ``ctx``'s chunks from eviction (the context being served)."""
        self._locked.add(ctx)

    def unlock(self, ctx: str) -> None:
        self._locked.discard(ctx)

    @property
    def locked(self) -> frozenset[str]:
        return frozenset(self._locked)

    def order(self) -> list[QueueEntry]:
        """Evictable entries, first to leave first."""
        return sorted((e for e in self._entries.values() if e.ctx not in self._locked), key=SORT_KEYS[self.policy])

    def sub_queues(self) -> dict[int, list[QueueEntry]]:
        """Evictable entries per level (bits), heaviest level first, each least recently used first."""
        out: dict[int, list[QueueEntry]] = {}
        for e in sorted((e for e in self._entries.values() if e.ctx not in self._locked), key=SORT_KEYS["lctru"]):
            out.setdefault(e.bits, []).append(e)
        return out

    def victims(self, bytes_needed: int, whole_contexts: bool = False) -> list[QueueEntry]:
        """Take entries off the queue, in order, until they free at least ``bytes_needed`` (all of them
        when the queue cannot). Whole contexts leave together at context granularity or when asked
        (``whole_contexts``, for killing)."""
        taken: list[QueueEntry] = []
        freed = 0
        order = self.order()
        by_context = whole_contexts or self.granularity == "context"
        while freed < bytes_needed and order:
            head = order[0]
            leaving = [e for e in order if e.ctx == head.ctx] if by_context else [head]
            for e in leaving:
                del self._entries[e.key]
                order.remove(e)
                taken.append(e)
                freed += e.nbytes
        return taken
