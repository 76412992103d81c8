"""One rank's part of a partitioned run: walk the plan's steps on real weights and real collectives.

Every rank of a ``torch.distributed`` (gloo) group calls :func:`execute` with the same plan. It
computes its part of each step with the layers of :mod:`workbench.models.slices`, exchanges
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

from typing import Callable

import torch

from workbench.distributed.execute import LINKS, MODES, Clock, Comm, Count, RankResult, Walker  # noqa: F401
from workbench.partition.plan import PartitionPlan


def execute(plan: PartitionPlan, rank: int, model, inputs: dict, comm: Comm, *, emulate: bool,
            link: str = "emulated", progress: Callable[[int, str], None] = lambda i, label: None,
            torch_tp=None, limited: bool = False) -> RankResult:
    """Run ``plan`` as rank ``rank`` on ``model`` (see :mod:`workbench.models.split`).

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
                if step.kind == "compute" and step.part == "attention":
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
                if step.part == "attention":
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
    if step.part == "attention":
        return lambda: (x, model.tp_attention(layer, x, heads, inputs))
    columns = slice(ffn_from[rank], ffn_from[rank] + plan.ffn_columns[rank])
    return lambda: (model.tp_ffn(layer, h, columns), h)
