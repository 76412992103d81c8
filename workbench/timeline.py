"""One schema for everything that happens over time: IO, compute, communication, stalls.

A planner's prediction and a run's measurement are both a :class:`Timeline` of
:class:`Span` objects (plus optional :class:`Counter` samples such as remaining
IO budget or buffer bytes), so dashboards overlay them directly and
:meth:`Timeline.to_chrome_trace` exports either for Perfetto / chrome://tracing:
one trace process per device, one thread per lane, counters as counter tracks.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SPAN_KINDS = ("io", "compute", "decompress", "comm", "stall", "recompute", "swap_in", "swap_out", "queue")
SOURCES = ("predicted", "measured")


@dataclass(frozen=True)
class Span:
    """Something that occupied ``lane`` from ``start`` to ``end`` seconds after the run began."""
    lane: str                  # e.g. "io", "compute", "gpu0", "link 0->1"
    kind: str                  # one of SPAN_KINDS
    start: float               # seconds from the run's start
    end: float                 # seconds from the run's start, >= start
    label: str = ""            # e.g. "layer 3", "chunk 12"
    meta: dict = field(default_factory=dict, compare=False)  # free-form details (bytes, shard ids ...)
    device: str = "host"       # which device's process the lane belongs to

    def __post_init__(self):
        if self.kind not in SPAN_KINDS:
            raise ValueError(f"span kind {self.kind!r} is not one of {', '.join(SPAN_KINDS)}")
        if not self.end >= self.start:
            raise ValueError(f"span {self.label or self.kind!r} ends ({self.end}) before it starts ({self.start})")

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Counter:
    """A sampled value over time, e.g. an accumulated IO budget or buffer occupancy."""
    name: str                  # e.g. "AIB layer 2 (ms)", "preload buffer (bytes)"
    time: float                # seconds from the run's start
    value: float
    device: str = "host"


@dataclass(frozen=True)
class Timeline:
    spans: tuple[Span, ...]
    source: str = "predicted"  # "predicted" or "measured"
    counters: tuple[Counter, ...] = ()
    name: str = ""

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"timeline source {self.source!r} is not one of {', '.join(SOURCES)}")
        object.__setattr__(self, "spans", tuple(self.spans))
        object.__setattr__(self, "counters", tuple(self.counters))

    @property
    def end(self) -> float:
        return max((s.end for s in self.spans), default=0.0)

    @property
    def lanes(self) -> list[str]:
        return list(dict.fromkeys(s.lane for s in self.spans))

    def of_kind(self, kind: str) -> list[Span]:
        return [s for s in self.spans if s.kind == kind]

    def busy(self, kind: str) -> float:
        """Total seconds spent in spans of ``kind``."""
        return sum(s.duration for s in self.of_kind(kind))

    def to_chrome_trace(self) -> dict:
        """Chrome trace-event JSON (a dict; ``json.dumps`` it) that Perfetto and chrome://tracing open."""
        devices = list(dict.fromkeys([s.device for s in self.spans] + [c.device for c in self.counters]))
        pid = {d: i + 1 for i, d in enumerate(devices)}
        tid: dict[tuple[str, str], int] = {}
        events = []
        for d in devices:
            events.append({"ph": "M", "name": "process_name", "pid": pid[d], "tid": 0,
                           "args": {"name": f"{d} ({self.source})"}})
        for s in self.spans:
            key = (s.device, s.lane)
            if key not in tid:
                tid[key] = len(tid) + 1
                events.append({"ph": "M", "name": "thread_name", "pid": pid[s.device], "tid": tid[key],
                               "args": {"name": s.lane}})
            events.append({"ph": "X", "name": s.label or s.kind, "cat": s.kind, "pid": pid[s.device],
                           "tid": tid[key], "ts": _us(s.start), "dur": _us(s.duration),
                           "args": {"kind": s.kind, **{k: _jsonable(v) for k, v in s.meta.items()}}})
        for c in self.counters:
            events.append({"ph": "C", "name": c.name, "pid": pid[c.device], "tid": 0, "ts": _us(c.time),
                           "args": {"value": c.value}})
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"source": self.source, "name": self.name}}

    def save_chrome_trace(self, path: Path | str) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_chrome_trace()))
        return path


def _us(seconds: float) -> float:
    """Trace timestamps are microseconds; keep nanosecond resolution and drop float noise."""
    return round(seconds * 1e6, 3)


def _jsonable(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)
