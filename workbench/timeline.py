"""One schema for everything that happens over time: IO, compute, communication, stalls.

A planner's prediction and a run's measurement are both a :class:`Timeline` of
:class:`Span` objects (plus optional :class:`Counter` samples such as remaining
IO budget or buffer bytes), so dashboards overlay them directly and
:meth:`Timeline.to_chrome_trace` exports either for Perfetto / chrome://tracing:
one trace process per device, one thread per lane, counters as counter tracks,
and an arrow from each send to its receive.

Several processes each record their own timeline; :meth:`Timeline.merge` puts them on
one clock, with offsets from :func:`barrier_offsets` or :func:`round_trip_offset`.
"""
from __future__ import annotations

import heapq
import json
from collections.abc import Sequence
from dataclasses import KW_ONLY, asdict, dataclass, field, replace
from pathlib import Path

SPAN_KINDS = ("io", "compute", "decompress", "comm", "stall", "recompute", "swap_in", "swap_out", "queue", "idle")
"""What a span is; ``stall``: waiting on another lane or device, ``idle``: taking no part (a dropped device)."""
SPAN_EVENTS = ("decision", "report", "fault")
"""What a span marks beyond its kind, for readers that pick such spans out: ``decision`` a runtime decision
taken in it (Hepti's mode and shares), ``report`` the exchange a decision reads, ``fault`` a device lost (a
zero-length marker). Readers select on this field, never on a span's label, which is for people."""
SOURCES = ("predicted", "measured")


@dataclass(frozen=True)
class Span:
    """Something that occupied ``lane`` from ``start`` to ``end`` seconds after the run began.

    ``device`` is the device profile the process runs or emulates, ``rank`` the process itself (None in a
    single-process run); spans that share a ``flow`` id are one message: the earliest to start is its send,
    the others its receives."""
    lane: str                  # e.g. "io", "compute", "gpu0", "link 0->1"
    kind: str                  # one of SPAN_KINDS
    start: float               # seconds from the run's start
    end: float                 # seconds from the run's start, >= start
    label: str = ""            # e.g. "layer 3", "chunk 12"
    meta: dict = field(default_factory=dict, compare=False)  # free-form details (shard ids ...)
    device: str = "host"
    _: KW_ONLY
    nbytes: int = 0            # bytes moved (read, written, sent or received)
    layer: int | None = None
    rank: int | None = None
    flow: int | str | None = None
    event: str | None = None   # one of SPAN_EVENTS, or None

    def __post_init__(self):
        if self.kind not in SPAN_KINDS:
            raise ValueError(f"span kind {self.kind!r} is not one of {', '.join(SPAN_KINDS)}")
        if self.event is not None and self.event not in SPAN_EVENTS:
            raise ValueError(f"span event {self.event!r} is not one of {', '.join(SPAN_EVENTS)} (or None)")
        if not self.end >= self.start:
            raise ValueError(f"span {self.label or self.kind!r} ends ({self.end}) before it starts ({self.start})")
        if self.nbytes < 0 or self.nbytes != int(self.nbytes):
            raise ValueError(f"span {self.label or self.kind!r} moves {self.nbytes} bytes: not a whole number >= 0")
        object.__setattr__(self, "nbytes", int(self.nbytes))
        for name in ("layer", "rank"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, int(value))

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
    _: KW_ONLY
    rank: int | None = None


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

    def flows(self) -> dict:
        """Each flow id with two or more spans -> its spans, send first (earliest start; ties in span order)."""
        groups: dict = {}
        for s in self.spans:
            if s.flow is not None:
                groups.setdefault(s.flow, []).append(s)
        return {f: sorted(spans, key=lambda s: s.start) for f, spans in groups.items() if len(spans) > 1}

    @classmethod
    def merge(cls, timelines: Sequence[Timeline], offsets_s: Sequence[float] | None = None,
              name: str = "") -> Timeline:
        """One timeline of several processes' timelines: ``offsets_s[i]`` (seconds, default 0) is added to
        every time of ``timelines[i]``, and its spans and counters without a rank get rank ``i``.

        Spans are interleaved by start time, each process's spans staying in the order it recorded them."""
        timelines = list(timelines)
        if not timelines:
            raise ValueError("no timelines to merge")
        offsets = [0.0] * len(timelines) if offsets_s is None else [float(o) for o in offsets_s]
        if len(offsets) != len(timelines):
            raise ValueError(f"{len(offsets)} offsets for {len(timelines)} timelines")
        sources = {tl.source for tl in timelines}
        if len(sources) > 1:
            raise ValueError(f"cannot merge timelines of different sources: {', '.join(sorted(sources))}")

        def own(item, rank):
            return item.rank if item.rank is not None else rank

        shifted = [[replace(s, start=s.start + off, end=s.end + off, rank=own(s, i)) for s in tl.spans]
                   for i, (tl, off) in enumerate(zip(timelines, offsets))]
        counters = sorted((replace(c, time=c.time + off, rank=own(c, i))
                           for i, (tl, off) in enumerate(zip(timelines, offsets)) for c in tl.counters),
                          key=lambda c: c.time)
        return cls(tuple(heapq.merge(*shifted, key=lambda s: s.start)), sources.pop(), tuple(counters),
                   name or " + ".join(tl.name for tl in timelines if tl.name))

    def to_dict(self) -> dict:
        """Plain JSON-able data; :meth:`from_dict` reads it back (and data written before the typed fields)."""
        return {"source": self.source, "name": self.name, "spans": [asdict(s) for s in self.spans],
                "counters": [asdict(c) for c in self.counters]}

    @classmethod
    def from_dict(cls, data: dict) -> Timeline:
        return cls(tuple(Span(**s) for s in data["spans"]), data["source"],
                   tuple(Counter(**c) for c in data.get("counters", ())), data.get("name", ""))

    def to_chrome_trace(self) -> dict:
        """Chrome trace-event JSON (a dict; ``json.dumps`` it) that Perfetto and chrome://tracing open: a
        trace process per device (per device and rank where ranks share a device), a thread per lane, and a
        flow ("s", "t" ..., "f" events bound to the enclosing slices) through the spans of each flow id."""
        names = process_names([*self.spans, *self.counters])
        pid = {p: i + 1 for i, p in enumerate(names)}
        tid: dict[tuple, int] = {}
        events = [{"ph": "M", "name": "process_name", "pid": pid[p], "tid": 0,
                   "args": {"name": f"{names[p]} ({self.source})"}} for p in names]
        for s in self.spans:
            p = (s.device, s.rank)
            key = (*p, s.lane)
            if key not in tid:
                tid[key] = len(tid) + 1
                events.append({"ph": "M", "name": "thread_name", "pid": pid[p], "tid": tid[key],
                               "args": {"name": s.lane}})
            typed = {k: v for k, v in (("layer", s.layer), ("rank", s.rank), ("flow", s.flow), ("event", s.event))
                     if v is not None}
            if s.nbytes:
                typed["nbytes"] = s.nbytes
            events.append({"ph": "X", "name": s.label or s.kind, "cat": s.kind, "pid": pid[p],
                           "tid": tid[key], "ts": _us(s.start), "dur": _us(s.duration),
                           "args": {"kind": s.kind, **typed, **{k: _jsonable(v) for k, v in s.meta.items()}}})
        for flow, spans in self.flows().items():
            for n, s in enumerate(spans):
                ph = "s" if n == 0 else "f" if n == len(spans) - 1 else "t"
                events.append({"ph": ph, "name": f"flow {flow}", "cat": "flow", "id": flow,
                               "pid": pid[(s.device, s.rank)], "tid": tid[(s.device, s.rank, s.lane)],
                               "ts": _us((s.start + s.end) / 2), **({"bp": "e"} if ph != "s" else {})})
        for c in self.counters:
            events.append({"ph": "C", "name": c.name, "pid": pid[(c.device, c.rank)], "tid": 0, "ts": _us(c.time),
                           "args": {"value": c.value}})
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"source": self.source, "name": self.name}}

    def save_chrome_trace(self, path: Path | str) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_chrome_trace()))
        return path


def process_names(items) -> dict[tuple[str, int | None], str]:
    """The name of each (device, rank) of ``items`` (spans or counters), in order of appearance: the
    device, with the rank added where several ranks share that device."""
    keys = list(dict.fromkeys((i.device, i.rank) for i in items))
    shared = {d for d in {d for d, _ in keys} if sum(1 for k in keys if k[0] == d) > 1}
    return {(d, r): f"{d} · rank {r}" if d in shared and r is not None else d for d, r in keys}


def barrier_offsets(release_s: Sequence[float], reference: int = 0) -> list[float]:
    """Clock offsets from a barrier: ``release_s[i]`` is the time process ``i`` read on its own timeline's
    clock (seconds since its run began) the moment the barrier released every process. The result's
    ``[i]`` (``release_s[reference] - release_s[i]``) moves process ``i``'s times onto the reference
    process's clock; pass it as :meth:`Timeline.merge`'s ``offsets_s``. The error is the spread of the
    release over the processes (how late each one woke up)."""
    if not 0 <= reference < len(release_s):
        raise ValueError(f"reference process {reference} is not one of the {len(release_s)} given")
    return [float(release_s[reference]) - float(t) for t in release_s]


def round_trip_offset(samples: Sequence[tuple[float, float, float]]) -> float:
    """Offset of one process's clock to a reference process's, from round trips (Cristian's method): each
    sample is ``(sent_s, reference_s, received_s)``: this process's clock when it asked, the reference's
    clock when it answered, this process's clock when the answer came back. The sample with the shortest
    round trip is used, taking the answer to be read at its midpoint; the error is at most half that
    round trip. Add the result to this process's times (:meth:`Timeline.merge`'s ``offsets_s``)."""
    if not samples:
        raise ValueError("no round trips to estimate a clock offset from")
    sent, ref, received = min(samples, key=lambda s: s[2] - s[0])
    if received < sent:
        raise ValueError(f"a round trip came back ({received}) before it was sent ({sent})")
    return float(ref) - (float(sent) + float(received)) / 2


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
