"""PyTorch's own tensor parallelism over the shipped encoder layer: the baseline a PyTorch user would reach for.

``workbench.partition`` sets position-wise partitioning (Voltage) against Megatron-style tensor parallelism. Before
trusting our own Megatron code, the comparison needs the version anyone would write with stock PyTorch:
``parallelize_module`` with ``ColwiseParallel`` on Q, K, V and FFN1 and ``RowwiseParallel`` on the attention output
and FFN2, over a one-dimensional ``DeviceMesh`` (gloo on CPU). Each rank then runs ``num_heads / K`` heads and
``ffn / K`` FFN neurons, and the two row-wise projections end in an all-reduce each.

:class:`EncoderLayer` runs through the functional ``sharded_layer`` with raw weight tensors, where DTensor's module
hooks would never fire, so :class:`TorchTPLayer` is a separate module that calls its submodules and holds copies of
the layer's weights. :func:`counted_forward` records every collective PyTorch issues in a forward (through
``CommDebugMode``, which counts them, plus the sizes of the tensors they move) and the bytes a rank sends and
receives for each in a ring. This module is not a Megatron implementation of our own and does no backward pass.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils._pytree import tree_leaves

from workbench.errors import WorkbenchError
from workbench.models.encoder import EncoderConfig, EncoderLayer

LINEARS = ("query", "key", "value", "attn_out", "ffn1", "ffn2")


def tp_plan() -> dict:
    """Megatron's split in PyTorch's terms (fresh style objects: ``parallelize_module`` keeps state in them)."""
    return {"query": ColwiseParallel(), "key": ColwiseParallel(), "value": ColwiseParallel(),
            "attn_out": RowwiseParallel(), "ffn1": ColwiseParallel(), "ffn2": RowwiseParallel()}


def check_divisible(cfg: EncoderConfig, world_size: int) -> None:
    """Raise :class:`WorkbenchError` unless every rank gets the same whole number of heads and FFN neurons."""
    if world_size < 1 or cfg.num_heads % world_size or cfg.ffn % world_size:
        raise WorkbenchError(
            f"tensor parallelism over {world_size} ranks needs num_heads and ffn divisible by {world_size}; "
            f"this layer has num_heads={cfg.num_heads}, ffn={cfg.ffn}; pick a world size that divides both")


def _mesh_size(mesh) -> int:
    if mesh.ndim != 1:
        raise WorkbenchError(f"tensor parallelism here runs over a 1-D device mesh, got {mesh.ndim} dimensions "
                             f"{tuple(mesh.shape)}")
    return mesh.size()


class TorchTPLayer(nn.Module):
    """One post-LN encoder layer whose forward calls its own ``nn.Linear`` modules, so that DTensor's hooks run.

    Built by :meth:`from_layer`; ``forward(x, attn_bias)`` takes x replicated on every rank and returns the full
    layer output, a plain tensor equal on every rank. ``last_forward_s`` is the wall time of the latest forward.
    """

    def __init__(self, layer: EncoderLayer, world_size: int):
        super().__init__()
        check_divisible(layer.cfg, world_size)
        self.cfg, self.world_size = layer.cfg, world_size
        self.local_heads = layer.cfg.num_heads // world_size
        for name in (*LINEARS, "ln1", "ln2"):
            setattr(self, name, copy.deepcopy(getattr(layer, name)))
        self.last_forward_s: float | None = None

    @classmethod
    def from_layer(cls, layer: EncoderLayer, mesh) -> "TorchTPLayer":
        """A copy of ``layer`` split over ``mesh`` by :func:`tp_plan`, each rank cutting its shards from its own copy
        (every rank builds the same model from the same seed, as a device loads its slice from disk): nothing
        is sent, which on shaped links would be the whole model scattered from rank 0 before the first run."""
        module = cls(layer, _mesh_size(mesh))
        return parallelize_module(module, mesh, tp_plan(), src_data_rank=None)

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, d), the same on every rank; attn_bias: additive (B, 1, 1, T), causal (B or 1, 1, T, T) or None."""
        start = time.perf_counter()
        B, T, _ = x.shape
        m, dh = self.local_heads, self.cfg.head_dim
        q = self.query(x).view(B, T, m, dh).transpose(1, 2)                 # (B, m, T, dh), this rank's heads
        k = self.key(x).view(B, T, m, dh).transpose(1, 2)
        v = self.value(x).view(B, T, m, dh).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(dh)                      # (B, m, T, T)
        if attn_bias is not None:
            scores = scores + attn_bias
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, m * dh)  # (B, T, d/K)
        h = self.ln1(x + self.attn_out(ctx))                                  # all-reduce -> (B, T, d)
        inner = F.gelu(self.ffn1(h))                                          # (B, T, ffn/K)
        out = self.ln2(h + self.ffn2(inner))                                  # all-reduce -> (B, T, d)
        self.last_forward_s = time.perf_counter() - start
        return out


def tp_stack(layers: Sequence[EncoderLayer], mesh) -> list[TorchTPLayer]:
    """Every layer split over ``mesh``; all shapes are checked before the first collective."""
    world_size = _mesh_size(mesh)
    for layer in layers:
        check_divisible(layer.cfg, world_size)
    return [TorchTPLayer.from_layer(layer, mesh) for layer in layers]


# -- counting

RING_OPS = {
    # functional collective -> (name, which tensor names the op, share of it a rank sends in a ring of K)
    "all_reduce": ("all_reduce", "input", lambda k: 2 * (k - 1)),
    "all_gather_into_tensor": ("all_gather", "output", lambda k: k - 1),
    "reduce_scatter_tensor": ("reduce_scatter", "input", lambda k: k - 1),
    "all_to_all_single": ("all_to_all", "input", lambda k: k - 1),
}
"""Ring traffic per rank, as a multiple of tensor_bytes / K: all-reduce 2(K-1)/K of the tensor, all-gather (K-1)/K of
its output, reduce-scatter (K-1)/K of its input, all-to-all (K-1)/K of its input. Any other collective CommDebugMode
counts is recorded under its own name with its whole input as sent."""


@dataclass(frozen=True)
class CollectiveCount:
    """One collective PyTorch issued during a forward, and what it moves per rank in a ring."""
    op: str                 # all_reduce, all_gather, reduce_scatter, all_to_all; any other under its torch name
    tensor_bytes: int       # all-reduce: its tensor; all-gather: the gathered output; the others: their input
    sent_bytes: int         # bytes one rank sends for it in a ring of K (all of tensor_bytes for an op not in RING_OPS)
    received_bytes: int     # bytes one rank receives (a ring receives what it sends)
    module: str = ""        # the module whose forward issued it, as CommDebugMode names it ("TorchTPLayer.ffn2")


def _nbytes(tree) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))


class _CollectiveRecorder(CommDebugMode):
    """CommDebugMode (which counts collectives per op and per module) that also keeps each one's tensor sizes."""

    def __init__(self, world_size: int):
        super().__init__()
        self.world_size = world_size
        self.collectives: list[CollectiveCount] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = self.get_total_counts()
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.get_total_counts() > before:
            name = func._overloadpacket.__name__
            op, named_by, share = RING_OPS.get(name, (name, "input", lambda k: k))
            size = _nbytes(out) if named_by == "output" else _nbytes((args, kwargs))
            moved = share(self.world_size) * size // self.world_size
            self.collectives.append(CollectiveCount(op, size, moved, moved, self.advanced_module_tracker.name))
        return out


def counted_forward(tp_layer: TorchTPLayer | Sequence[TorchTPLayer], x: torch.Tensor,
                    attn_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, list[CollectiveCount]]:
    """Run one layer (or a stack, in order) and return its output (B, T, d) and every collective, in issue order."""
    layers = [tp_layer] if isinstance(tp_layer, TorchTPLayer) else list(tp_layer)
    with _CollectiveRecorder(layers[0].world_size) as recorder:
        for layer in layers:
            x = layer(x, attn_bias)
    return x, recorder.collectives


def time_forward(layer: nn.Module, x: torch.Tensor, attn_bias: torch.Tensor | None = None, repeats: int = 10,
                 warmup: int = 2) -> list[float]:
    """Wall seconds of ``repeats`` forwards of a plain or a TP layer, after ``warmup`` untimed ones, without
    autograd. Before each TP forward the ranks meet at a barrier, so every rank starts it at the same time; call it
    on every rank for a :class:`TorchTPLayer`."""
    lined_up = isinstance(layer, TorchTPLayer) and dist.is_initialized()
    times = []
    with torch.no_grad():
        for i in range(warmup + repeats):
            if lined_up:
                dist.barrier()
            start = time.perf_counter()
            layer(x, attn_bias)
            if i >= warmup:
                times.append(time.perf_counter() - start)
    return times


class TorchTP:
    """The runtime's ``torch_tp`` scheme on one rank: the model's layers split by PyTorch, built once per model.

    Its collectives are counted as the runtime counts its own (a ring All-Reduce's exact per-rank bytes,
    :func:`workbench.partition.cost.all_reduce_traffic`), so the two tensor-parallel schemes compare byte
    for byte."""

    def __init__(self, model, world_size: int):
        from torch.distributed.device_mesh import init_device_mesh

        self.world_size, self.rank = world_size, dist.get_rank()
        self.mesh = init_device_mesh("cpu", (world_size,))
        self.layers = tp_stack(list(model.layers), self.mesh)

    def forward(self, layer: int, x: torch.Tensor, inputs: dict, comm) -> torch.Tensor:
        from workbench.partition.cost import all_reduce_traffic
        from workbench.partition.execute import Count

        out, collectives = counted_forward(self.layers[layer], x, inputs.get("bias"))
        for c in collectives:
            if c.op == "all_reduce":
                traffic = all_reduce_traffic(c.tensor_bytes // 4, self.world_size)[self.rank]
                comm.counts.append(Count(layer, "all_reduce", traffic.sent, traffic.received))
            else:
                comm.counts.append(Count(layer, c.op, c.sent_bytes, c.received_bytes))
        return out
