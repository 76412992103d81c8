"""What a rank of any split run walks with: collectives that count and time their bytes (:class:`Comm`), its
clock and what it pads to (:class:`Clock`), a walker over a schedule's steps (:class:`Walker`) and the
:class:`RankResult` it reports. Knows no mechanism: Voltage's and Hepti's ranks both walk with these."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from workbench.devices import pad_until
from workbench.distributed.steps import Step
from workbench.network import all_gather_traffic, all_reduce_traffic
from workbench.timeline import Span, Timeline


@dataclass
class Count:
    """Bytes one rank moved in one collective."""
    layer: int | None
    kind: str                  # "all_gather", "all_reduce", "send", "recv", "broadcast", "gather"
    sent: int
    received: int


class Comm:
    """Collectives over the default process group, counted (bytes of the tensors handed over) and timed."""

    def __init__(self, rank: int, world: int, groups: dict | None = None):
        self.rank, self.world = rank, world
        self.counts: list[Count] = []
        self._groups: dict = {} if groups is None else groups     # kept by the worker between runs

    def all_gather_rows(self, part: torch.Tensor, rows: list[int], layer: int | None) -> torch.Tensor:
        """Concatenate every rank's rows along dim -2; parts may differ in length."""
        return self.all_gather(part, rows, list(range(self.world)), -2, layer)

    def all_gather(self, part: torch.Tensor, sizes: list[int], members: list[int], dim: int,
                   layer: int | None) -> torch.Tensor:
        """Concatenate the parts of ``members`` (this rank among them) along ``dim``, ``sizes[k]`` long for
        member k: each sends its part to every other member and receives theirs, point to point (on loopback
        here this took a third of gloo's ring ``all_gather`` for four ranks, and it sends exactly what is
        counted)."""
        dim = dim % part.dim()
        part = part.contiguous()
        per_unit = part.numel() // part.shape[dim] if part.shape[dim] else \
            int(torch.tensor([n for i, n in enumerate(part.shape) if i != dim] or [1]).prod())
        pieces, requests = [], []
        for r, n in zip(members, sizes):
            if r == self.rank:
                pieces.append(part)
                continue
            shape = list(part.shape)
            shape[dim] = n
            pieces.append(torch.empty(shape, dtype=part.dtype))
            if n:
                requests.append(dist.irecv(pieces[-1], src=r))
            if part.numel():
                requests.append(dist.isend(part, dst=r))
        for request in requests:
            request.wait()
        traffic = all_gather_traffic([n * per_unit for n in sizes], part.element_size())[members.index(self.rank)]
        self.counts.append(Count(layer, "all_gather", traffic.sent, traffic.received))
        return torch.cat(pieces, dim=dim)

    def all_reduce(self, tensor: torch.Tensor, layer: int | None, members: list[int] | None = None) -> torch.Tensor:
        """Sum ``tensor`` over ``members`` (default: every rank) in place, counted as a ring moves it."""
        members = list(range(self.world)) if members is None else members
        tensor = tensor.contiguous()
        if len(members) > 1:
            dist.all_reduce(tensor, group=self.group(members))
        traffic = all_reduce_traffic(tensor.numel(), len(members), tensor.element_size())[members.index(self.rank)]
        self.counts.append(Count(layer, "all_reduce", traffic.sent, traffic.received))
        return tensor

    def group(self, members: list[int]):
        """The process group of ``members`` (the default group for every rank), made once by its members."""
        if len(members) == self.world:
            return None
        key = tuple(members)
        if key not in self._groups:
            self._groups[key] = dist.new_group(list(members), use_local_synchronization=True)
        return self._groups[key]

    def broadcast(self, tensor: torch.Tensor, root: int, layer: int | None = None) -> torch.Tensor:
        """``root``'s tensor on every rank: it sends it to each other rank, point to point (counted)."""
        tensor = tensor.contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if self.rank == root:
            for request in [dist.isend(tensor, dst=r) for r in range(self.world) if r != root]:
                request.wait()
            self.counts.append(Count(layer, "broadcast", (self.world - 1) * nbytes, 0))
            return tensor
        out = torch.empty_like(tensor)
        dist.recv(out, src=root)
        self.counts.append(Count(layer, "broadcast", 0, nbytes))
        return out

    def gather_rows(self, part: torch.Tensor, rows: list[int], root: int, layer: int | None) -> torch.Tensor:
        """Every rank's rows (dim -2) to ``root`` only, which returns them joined; the others return their part."""
        part = part.contiguous()
        per_row = part.numel() // part.shape[-2] if part.shape[-2] else 0
        size = part.element_size()
        if self.rank != root:
            if part.numel():
                dist.send(part, dst=root)
            self.counts.append(Count(layer, "gather", part.numel() * size, 0))
            return part
        pieces, requests = [], []
        for r, n in enumerate(rows):
            if r == root:
                pieces.append(part)
                continue
            shape = list(part.shape)
            shape[-2] = n
            pieces.append(torch.empty(shape, dtype=part.dtype))
            if n:
                requests.append(dist.irecv(pieces[-1], src=r))
        for request in requests:
            request.wait()
        self.counts.append(Count(layer, "gather", 0, (sum(rows) - rows[root]) * per_row * size))
        return torch.cat(pieces, dim=-2)

    def send(self, tensor: torch.Tensor, dst: int, layer: int | None) -> None:
        dist.send(tensor.contiguous(), dst=dst)
        self.counts.append(Count(layer, "send", tensor.numel() * tensor.element_size(), 0))

    def recv(self, like: torch.Tensor, src: int, layer: int | None) -> torch.Tensor:
        out = torch.empty_like(like)
        dist.recv(out, src=src)
        self.counts.append(Count(layer, "recv", 0, out.numel() * out.element_size()))
        return out


@dataclass
class RankResult:
    rank: int
    device: str
    spans: list[Span] = field(default_factory=list)
    counts: list[Count] = field(default_factory=list)
    hidden: torch.Tensor | None = None          # final hidden states (the terminal, rank 0)
    logits: torch.Tensor | None = None
    wall_s: float = 0.0                         # from the start to the logits on this rank
    memory: list = field(default_factory=list)  # Hepti: per decision, the weights' held and resident bytes
    t0: float | None = None                     # perf_counter at the rank's clock's 0, when not the job's start

    def timeline(self) -> Timeline:
        return Timeline(tuple(self.spans), "measured", name=f"rank {self.rank}")


LINKS = ("emulated", "shaped")
"""How links behave: emulated in the application (a collective lasts at least the cost model's seconds), or real
traffic over links shaped by ``tc`` (:mod:`workbench.distributed.shaping`) plus the latency, which ``tbf`` cannot
add."""

MODES = ("measured", "replay", "unlimited")
"""How a run relates to its devices: ``measured``, each rank in a CPU cgroup whose quota makes it compute at its
device's speed (:mod:`workbench.distributed.cpulimit`) and nothing padded but the links' latency (and, on
emulated links, a collective's bandwidth time); ``replay``, compute and collectives padded to the cost model's
schedule, a replay of the prediction; ``unlimited``, this host's full speed, nothing padded."""


class Clock:
    """The run's clock on this rank, and what it pads to: the cost model's schedule (a replay), or per step the
    links' time when the ranks' compute is limited for real."""

    def __init__(self, emulate: bool, link: str = "emulated", limited: bool = False):
        self.t0 = time.perf_counter()
        self.schedule = self.t0
        self.emulate, self.link, self.limited = emulate, link, limited

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def pad(self, seconds_after_schedule: float) -> None:
        if self.emulate and not self.limited:
            pad_until(self.schedule + seconds_after_schedule)

    def pad_collective(self, step: Step, rank: int, started: float | None = None) -> None:
        """A replay on emulated links: until the step's end on the schedule. A shaped link: its latency after
        the real transfer (the schedule restarts there). A limited run on emulated links: the step's own
        seconds from when this rank ``started`` it (perf_counter)."""
        if self.limited:
            if self.link == "shaped":
                pad_until(time.perf_counter() + step.latency_s)
            elif started is not None:
                pad_until(started + step.seconds[rank])
            return
        if not self.emulate:
            return
        if self.link == "shaped":
            pad_until(time.perf_counter() + step.latency_s)
            self.schedule = time.perf_counter() - step.seconds[rank]
        else:
            self.pad(step.seconds[rank])

    def advance(self, seconds: float) -> None:
        self.schedule += seconds


class Walker:
    """Walks steps on one rank: runs each, pads it when emulating, and records its span and bytes."""

    def __init__(self, rank: int, device: str, comm: Comm, clock: Clock, result: RankResult):
        self.rank, self.device, self.comm, self.clock, self.result = rank, device, comm, clock, result
        self.lane = f"device {rank}"

    def span(self, kind: str, start: float, label: str, layer: int | None, **extra) -> None:
        self.result.spans.append(Span(self.lane, kind, start, self.clock.now(), label, device=self.device,
                                      layer=layer, rank=self.rank, **extra))

    def compute(self, step: Step, work: Callable[[], object] | None):
        """This rank's part of a compute step (None: it has none), padded to its seconds."""
        out = None
        if work is not None:
            start = self.clock.now()
            out = work()
            real = self.clock.now() - start
            self.clock.pad(step.seconds[self.rank])
            self.span("compute", start, step.label, step.layer,
                      meta={"real_s": real, "predicted_s": step.seconds[self.rank]})
        self.clock.advance(max(step.seconds))
        return out

    def collective(self, step: Step, run: Callable[[], object]):
        """A collective this rank takes part in, padded to the link, with the bytes it counted."""
        start, before = self.clock.now(), len(self.comm.counts)
        out = run()
        self.clock.pad_collective(step, self.rank, self.clock.t0 + start)
        moved = self.comm.counts[before:]
        sent, received = sum(c.sent for c in moved), sum(c.received for c in moved)
        self.span("comm", start, step.label, step.layer, nbytes=sent + received,
                  meta={"sent": sent, "received": received}, flow=step.label if step.kind == "send" else None)
        self.clock.advance(step.seconds[self.rank])
        return out

    def skip(self, step: Step) -> None:
        self.clock.advance(max(step.seconds))
