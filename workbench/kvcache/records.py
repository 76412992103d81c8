"""What replaying a trace on the service records: per call, the switch it cost, the chunk map after it,
the LCTRU queue, the evictions with their reasons and the load's predicted and measured timelines.

Plain frozen dataclasses that round-trip through JSON, so a replay made by `workbench prepare` or
`workbench bench llms` is shown by the dashboard and notebooks without running again.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from workbench.timeline import Timeline

CHUNK_STATES = ("32", "16", "8", "4", "2", "swapped", "recomputed", "loaded", "killed")
"""A chunk in the map: in memory at a level (raw 32 or 16, 8, 4, 2 bits), only on disk (swapped), brought back
by this call through recompute or loading, or gone with no file (killed, LMK-style)."""


@dataclass(frozen=True, kw_only=True)
class EvictionEvent:
    call: int                  # index of the call that needed the memory
    context: int               # trace context whose chunk left
    chunk: int
    bits: int
    last_used: int             # the call index of its last use
    bytes: int
    bytes_needed: int
    policy: str                # lctru, lru, density
    action: str                # drop (file written ahead of time), swap_out, kill
    reason: str


@dataclass(frozen=True, kw_only=True)
class CallRecord:
    index: int
    time_s: float              # trace time of the call
    idle_s: float = 0.0        # real seconds the service sat idle before the call (the trace gap, scaled)
    context: int
    switch_s: float            # reclaim + load of the missing chunks + dequantize into the decoder's cache
    io_s: float
    recompute_s: float
    inference_s: float
    queue_wait_s: float
    chunks_missing: int
    chunks_loaded: int
    chunks_recomputed: int
    bytes_read: int
    memory_bytes: int          # KV bytes in memory after the call
    output: str
    evictions: tuple[EvictionEvent, ...] = ()
    chunk_map: tuple[tuple[str, ...], ...] = ()      # after the call: per context, per chunk, a CHUNK_STATES entry
    queue: tuple[tuple[int, int, int], ...] = ()     # eviction order after the call: (context, chunk, bits)
    predicted: Timeline | None = None                # the load as planned
    measured: Timeline | None = None                 # the load as it ran
    missing_bits: tuple[int, ...] = ()               # the level of every chunk the call brought back


@dataclass(frozen=True, kw_only=True)
class ReplayResult:
    method: str                # llms, vllm_sq, vllm_s, swapping, lmk, or an ablation's name
    device: str                # host or an emulated preset
    memory_budget_bytes: int
    contexts: int
    pattern: str
    settings: dict = field(default_factory=dict)     # the service config and trace settings used
    calls: tuple[CallRecord, ...] = ()

    def setting(self, key: str, default=None):
        """A setting this replay recorded: at the top of :attr:`settings`, in its service config or its trace's."""
        for where in (self.settings, self.settings.get("config"), self.settings.get("trace")):
            if isinstance(where, dict) and where.get(key) is not None:
                return where[key]
        return default

    def switch_latencies(self) -> np.ndarray:
        return np.array([c.switch_s for c in self.calls])

    def switches_s(self, skip_first_use: bool = True) -> list[float]:
        """Switching latencies; by default of calls to contexts that already existed (a context's first
        call has nothing to bring back under any method)."""
        seen, values = set(), []
        for c in self.calls:
            if c.context in seen or not skip_first_use:
                values.append(c.switch_s)
            seen.add(c.context)
        return values

    def mean_switch_s(self, skip_first_use: bool = True) -> float:
        """Mean of :meth:`switches_s`; 0 when there is none."""
        values = self.switches_s(skip_first_use)
        return float(np.mean(values)) if values else 0.0

    def to_json(self) -> dict:
        return _encode(self)

    @classmethod
    def from_json(cls, data: dict) -> ReplayResult:
        calls = tuple(_call(c) for c in data["calls"])
        return cls(**{**{k: data[k] for k in ("method", "device", "memory_budget_bytes", "contexts", "pattern")},
                      "settings": data.get("settings", {}), "calls": calls})

    def save(self, path: Path | str) -> Path:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json()))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: Path | str) -> ReplayResult:
        return cls.from_json(json.loads(Path(path).read_text()))


def _encode(value):
    if isinstance(value, Timeline):
        return value.to_dict()
    if hasattr(value, "__dataclass_fields__"):
        return {f.name: _encode(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value


def _timeline(data: dict | None) -> Timeline | None:
    return None if data is None else Timeline.from_dict(data)


def _call(data: dict) -> CallRecord:
    return CallRecord(**{**data, "evictions": tuple(EvictionEvent(**e) for e in data.get("evictions", ())),
                         "chunk_map": tuple(tuple(row) for row in data.get("chunk_map", ())),
                         "queue": tuple(tuple(q) for q in data.get("queue", ())),
                         "missing_bits": tuple(data.get("missing_bits", ())),
                         "predicted": _timeline(data.get("predicted")), "measured": _timeline(data.get("measured"))})
