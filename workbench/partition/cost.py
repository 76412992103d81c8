"""The cost model of partitioned inference: FLOPs, bytes of every collective, seconds on a device profile.

Pure Python (no torch): the dashboards' first figures and the planner read it at once, and the
runtime pads its emulated compute and communication to the seconds it gives.

FLOPs follow the Voltage paper's count Gamma: a product of an (a x b) and a (b x c) matrix costs
a*b*c "floating operations" (multiply-adds). Seconds on a device use 2*Gamma FLOPs, as the
shared :class:`~workbench.devices.DeviceProfile` counts FLOP/s.

Bytes follow what the runtime really sends (:mod:`workbench.partition.runtime` counts the tensors
it hands to each collective):

- All-Gather of parts (Voltage, one per layer): a device sends its own part to each of the K-1
  others and receives every other part. Evenly split, a device sends (K-1)NF/K elements.
- All-Reduce (tensor parallelism, two per layer) as a ring: the tensor is cut into K chunks;
  over K-1 reduce-scatter steps and K-1 all-gather steps a device sends every chunk but two.
  Evenly split, 2(K-1)NF/K elements, so a layer's two cost 4(K-1)NF/K: four times Voltage's.
- Send (the layer pipeline): one device's whole activation to the next.
- Voltage's Algorithm 2 in full: the terminal broadcasts the N x F input to the K-1 others before the first
  layer (it sends (K-1)NF elements), every layer but the last ends in an All-Gather, and the last layer's parts
  go to the terminal only (it receives (N-P_0)F).

Time of a collective on a switch with one full-duplex link per device (the shaped network's
topology): each device's bytes go through its own link, so it takes the steps' latencies plus
the slowest device's bytes over its bandwidth.
"""
from __future__ import annotations

from typing import Literal, Sequence

from workbench.errors import WorkbenchError
from workbench.models.attention import (ORDERS, SCORE_ORDERS, VALUE_ORDERS, Order, attention_flops,  # noqa: F401
                                        attention_order, candidate_gammas, order_threshold, score_gamma,
                                        value_gamma)
from workbench.models.shapes import SHAPES, ModelShape, get_shape  # noqa: F401  (the cost model's names)
from workbench.network import (DTYPE_BYTES, NETWORKS, Traffic, all_gather_traffic, all_reduce_traffic,  # noqa: F401
                               check_network, collective_s, gather_traffic, split_counts)

def layer_orders(shape: ModelShape, N: int, P: int, policy: str = "auto") -> tuple[str, ...]:
    """The order each head of a layer uses for P of N rows: Theorem 2's (``"auto"``), or one forced.

    A rotary model keeps Eq. (3): its keys are rotated by position after x W_K, so x^T cannot be
    multiplied in last (the V side could be, but one order per head keeps the count simple)."""
    if policy not in ("auto", *ORDERS):
        raise WorkbenchError(f"attention order policy must be auto, qk_first or x_first, got {policy!r}")
    if shape.rotary:
        return ("qk_first",) * shape.heads
    order = attention_order(N, P, shape.hidden, shape.head_dim) if policy == "auto" else policy
    return (order,) * shape.heads


def voltage_layer_gamma(shape: ModelShape, N: int, P: int, orders: Sequence[str] | None = None) -> float:
    """Gamma of one layer computing P of N positions (Algorithm 1): attention per head in its order, the
    output projection and the position-wise FFN on P rows. P = N is the whole layer on one device."""
    if P == 0:
        return 0.0
    F, F_H = shape.hidden, shape.head_dim
    orders = layer_orders(shape, N, P) if orders is None else orders
    if shape.num_kv_heads != shape.heads:
        kv = shape.num_kv_heads * F_H
        attention = P * F * F + 2 * N * F * kv + 2 * P * N * F
    else:
        attention = sum(attention_flops(o, N, P, F, F_H) for o in orders)
    return attention + P * F * F + shape.ffn_matrices * P * F * shape.ffn


def tensor_parallel_gammas(shape: ModelShape, N: int, heads: int, ffn: int) -> tuple[float, float]:
    """Gamma of a device's attention part (``heads`` heads and their output-projection rows) and FFN part
    (``ffn`` columns) over all N positions, Megatron-style."""
    F, F_H = shape.hidden, shape.head_dim
    attention = 3 * N * F * heads * F_H + 2 * N * N * heads * F_H + N * heads * F_H * F
    return attention, shape.ffn_matrices * N * F * ffn


# -- bytes

def comm_bytes(scheme: str, N: int, F: int, K: int, dtype_bytes: int = DTYPE_BYTES) -> float:
    """Bytes a device sends per layer, averaged over the K devices of an even split: (K-1)NF/K elements
    for ``"voltage"`` (one All-Gather), 4(K-1)NF/K for ``"tensor_parallel"`` (two ring All-Reduces).
    Per device, :func:`layer_traffic` gives the exact integers the runtime counts."""
    if scheme == "voltage":
        traffic = all_gather_traffic([n * F for n in split_counts(N, K)], dtype_bytes)
    elif scheme == "tensor_parallel":
        traffic = [t + t for t in all_reduce_traffic(N * F, K, dtype_bytes)]
    else:
        raise WorkbenchError(f"comm_bytes knows voltage and tensor_parallel, got {scheme!r}")
    return sum(t.sent for t in traffic) / K


