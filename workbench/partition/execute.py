"""One rank's part of a partitioned run: walk the plan's steps on real weights and real collectives.

Every rank of a ``torch.distributed`` (gloo) group calls :func:`execute` with the same plan. It
computes its part of each step with the layers of :mod:`workbench.partition.layers`, exchanges
activations through :class:`Comm`, which counts the bytes of the tensors it hands to each collective
and times it, and records a measured :class:`~workbench.timeline.Timeline` on its own clock.

Measured runs (``limited=True``): the rank computes under a CPU cgroup quota set to its device's speed, and
only the links' latency is added (and, without shaped links, each collective waits out its own predicted
seconds). Replays (``emulate=True``): each compute step is padded to the device's predicted end and each
collective to its predicted end, on the plan's schedule counted from the run's start: a replay of the
prediction, never called measured. A step that
runs late here (a loopback exchange delayed by the scheduler of a 2-core host) is caught up by the
padding of the next ones, as on the device, where it would not have been late; work that takes
longer here than the device's whole schedule is not hidden: the run ends late and the prediction
check says so.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from workbench.devices import pad_until
from workbench.partition.cost import Traffic, all_gather_traffic, all_reduce_traffic
from workbench.partition.plan import PartitionPlan, Step
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


def execute(plan: PartitionPlan, rank: int, model, inputs: dict, comm: Comm, *, emulate: bool,
            link: str = "emulated", progress: Callable[[int, str], None] = lambda i, label: None,
            torch_tp=None, limited: bool = False) -> RankResult:
    """Run ``plan`` as rank ``rank`` on ``model`` (see :mod:`workbench.partition.models`).

    ``inputs``: ``x`` the embedded input (B, N, F) or (N, F), plus what the model's layers need
    (``attn_bias``, ``positions``). ``progress(i, label)`` is called after step i. ``torch_tp``: the
    rank's PyTorch tensor-parallel layers for the ``torch_tp`` scheme. ``link``: see :data:`LINKS`.
    ``limited``: this rank computes under a CPU limit (:data:`MODES`' measured), so compute is never padded."""
    K, device = plan.K, plan.devices[rank]
    result = RankResult(rank, device.name)
    clock = Clock(emulate, link, limited)
    walker = Walker(rank, device.name, comm, clock, result)
    span, collective = walker.span, walker.collective
    x = inputs["x"]
    if plan.steps and plan.steps[0].kind == "broadcast" and rank != plan.steps[0].src:
        x = torch.full_like(x, float("nan"))    # only the terminal pre-processes; the others wait for its input
    h = None
    heads_from = [sum(plan.heads[:i]) for i in range(K)] if plan.heads else []
    ffn_from = [sum(plan.ffn_columns[:i]) for i in range(K)] if plan.ffn_columns else []

    with torch.no_grad():
        for i, step in enumerate(plan.steps):
            layer = step.layer
            if plan.scheme == "torch_tp":
                if step.label.startswith("attention"):
                    x = _torch_tp_layer(plan, rank, layer, x, inputs, torch_tp, comm, clock, span)
                progress(i, step.label)
                continue
            if step.kind == "compute":
                work = _compute(plan, step, rank, model, x, h, inputs, heads_from, ffn_from, torch_tp, comm)
                x, h = walker.compute(step, work) or (x, h)
            elif step.kind == "broadcast":
                x = collective(step, lambda: comm.broadcast(x, step.src, layer))
            elif step.kind in ("all_gather", "gather"):
                b = plan.bounds[layer]
                rows = [b[j + 1] - b[j] for j in range(K)]
                if step.kind == "gather":
                    x = collective(step, lambda: comm.gather_rows(x, rows, step.dst, layer))
                else:
                    x = collective(step, lambda: comm.all_gather_rows(x, rows, layer))
            elif step.kind == "all_reduce":
                if "attention" in step.label:
                    h = collective(step, lambda: comm.all_reduce(h, layer))
                    h = model.finish_attention(layer, x, h)
                else:
                    x = collective(step, lambda: comm.all_reduce(x, layer))
                    x = model.finish_ffn(layer, h, x)
            elif step.kind == "send":
                if rank == step.src:
                    collective(step, lambda: comm.send(x, step.dst, layer))
                elif rank == step.dst:
                    x = collective(step, lambda: comm.recv(x, step.src, layer))
                else:
                    clock.advance(step.seconds[rank])
            progress(i, step.label)
        if rank == 0:
            start = clock.now()
            result.hidden = x
            result.logits = model.logits(x, inputs)
            span("compute", start, "head", None)
    result.counts = list(comm.counts)
    result.wall_s = clock.now()
    return result


def _torch_tp_layer(plan, rank, layer, x, inputs, torch_tp, comm, clock, span):
    """A whole layer by PyTorch's tensor parallelism: its collectives happen inside the forward, so the
    layer is one span (its bytes counted from the collectives PyTorch issued), padded to the layer's
    predicted seconds."""
    seconds = sum(max(s.seconds) for s in plan.steps if s.layer == layer)
    start, before = clock.now(), len(comm.counts)
    x = torch_tp.forward(layer, x, inputs, comm)
    clock.pad(seconds)
    moved = comm.counts[before:]
    sent, received = sum(c.sent for c in moved), sum(c.received for c in moved)
    span("compute", start, f"layer {layer} (PyTorch TP, {len(moved)} collectives inside)", layer,
         nbytes=sent + received, meta={"sent": sent, "received": received})
    clock.advance(seconds)
    return x


def _compute(plan, step, rank, model, x, h, inputs, heads_from, ffn_from, torch_tp, comm):
    """What this rank computes at a compute step, as a function returning the new (x, h); None if nothing."""
    layer, scheme = step.layer, plan.scheme
    if step.seconds[rank] == 0 and scheme in ("single", "pipeline"):
        return None
    if scheme == "voltage":
        start, end = plan.positions(layer, rank)
        orders = plan.orders[layer][rank]
        return lambda: (model.rows(layer, x, start, end, orders, inputs), h)
    if scheme in ("single", "pipeline"):
        return lambda: (model.rows(layer, x, 0, x.shape[-2], "auto", inputs), h)
    heads = range(heads_from[rank], heads_from[rank] + plan.heads[rank])
    if step.label.startswith("attention"):
        return lambda: (x, model.tp_attention(layer, x, heads, inputs))
    columns = slice(ffn_from[rank], ffn_from[rank] + plan.ffn_columns[rank])
    return lambda: (model.tp_ffn(layer, h, columns), h)
