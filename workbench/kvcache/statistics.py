"""What the LLM context service shows of itself: a typed view of its contexts, chunks and eviction queue
(:class:`ServiceState`, for code such as the replays), the JSON snapshot a dashboard reads, and the part of
it one app may see."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from workbench.kvcache.lifecycle import QueueEntry
from workbench.kvcache.store import IN_MEMORY


@dataclass(frozen=True)
class ChunkState:
    index: int
    bits: int
    state: str                      # store.MEMORY, FILE, BOTH or DROPPED
    nbytes: int
    last_tick: int                  # the service's call counter when the chunk was last used
    density: float | None           # equation 1; None before the chunk's first call ends

    @property
    def in_memory(self) -> bool:
        return self.state in IN_MEMORY

    def to_dict(self) -> dict:
        return {"index": self.index, "bits": self.bits, "state": self.state, "bytes": self.nbytes,
                "last_tick": self.last_tick, "density": self.density}


@dataclass(frozen=True)
class ContextState:
    id: str
    app: str
    tokens: int
    calls: int
    last_used: float                # wall-clock seconds
    last_tick: int
    served: bool                    # a call is being served on it now
    chunks: tuple[ChunkState, ...]

    @property
    def bytes_in_memory(self) -> int:
        return sum(c.nbytes for c in self.chunks if c.in_memory)

    def to_dict(self) -> dict:
        return {"id": self.id, "app": self.app, "tokens": self.tokens, "calls": self.calls,
                "last_used": self.last_used, "last_tick": self.last_tick, "served": self.served,
                "bytes_in_memory": self.bytes_in_memory, "chunks": [c.to_dict() for c in self.chunks]}


@dataclass(frozen=True)
class ServiceState:
    """The service's contexts and its eviction queue (first victim first), at one moment."""
    contexts: tuple[ContextState, ...]
    queue: tuple[QueueEntry, ...]

    def by_level(self) -> dict[int, int]:
        """Bytes of chunks in memory per level."""
        out: dict[int, int] = {}
        for ctx in self.contexts:
            for c in ctx.chunks:
                if c.in_memory:
                    out[c.bits] = out.get(c.bits, 0) + c.nbytes
        return dict(sorted(out.items()))

    @property
    def used_bytes(self) -> int:
        return sum(self.by_level().values())

    def context(self, ctx_id: str) -> ContextState:
        return next(c for c in self.contexts if c.id == ctx_id)

    def memory_dict(self) -> dict:
        return {"used_bytes": self.used_bytes, "by_level": {str(k): v for k, v in self.by_level().items()}}


def app_snapshot(snapshot: dict, app: str) -> dict:
    """The part of a service's JSON ``snapshot`` that ``app`` may see: the settings, and of the contexts,
    memory, queue, evictions and last call only its own; service-wide counters are left out."""
    snap = dict(snapshot)
    snap["contexts"] = [c for c in snapshot["contexts"] if c["app"] == app]
    mine = {c["id"] for c in snap["contexts"]}
    by_level: dict[str, int] = {}
    for c in snap["contexts"]:
        for r in c["chunks"]:
            if r["state"] in IN_MEMORY:
                by_level[str(r["bits"])] = by_level.get(str(r["bits"]), 0) + r["bytes"]
    snap["memory"] = {"used_bytes": sum(by_level.values()), "by_level": dict(sorted(by_level.items()))}
    queue = dict(snapshot["queue"])
    queue["order"] = [e for e in queue["order"] if e["ctx"] in mine]
    queue["sub_queues"] = {bits: [e for e in entries if e[0] in mine] for bits, entries in queue["sub_queues"].items()}
    snap["queue"] = queue
    snap["evictions"] = [r if r["served_ctx"] in mine else
                         dict(r, served_ctx=None, reason=r["reason"].replace(f"context {r['served_ctx']}",
                                                                             "another app's context"))
                         for r in snapshot["evictions"] if r["ctx"] in mine]
    if snap["last_call"] is not None and snap["last_call"]["app"] != app:
        snap["last_call"] = None
    snap.pop("metrics", None)
    return snap


def queue_dicts(queue: tuple[QueueEntry, ...]) -> list[dict]:
    return [asdict(e) for e in queue]
