"""How a cluster's devices are linked, and what a collective costs on it: the one network model every
mechanism prices its communication with, so that their predictions on one cluster compare.

A cluster (:class:`workbench.devices.Cluster`) says which model holds: ``switch``, one full-duplex link per
device to a switch (Voltage's shaped network), or ``shared``, one medium every device's received bytes
cross in turn (Hepti's Eq. 6).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from workbench.errors import WorkbenchError

DTYPE_BYTES = 4
"""Activations travel as float32."""


def split_counts(total: int, parts: int) -> list[int]:
    """``total`` items cut into ``parts`` near-equal contiguous pieces, the first ones one longer."""
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


@dataclass(frozen=True)
class Traffic:
    """Bytes one device sends and receives in one collective (or one layer)."""
    sent: int
    received: int

    def __add__(self, other: "Traffic") -> "Traffic":
        return Traffic(self.sent + other.sent, self.received + other.received)


def all_gather_traffic(part_elements: Sequence[int], dtype_bytes: int = DTYPE_BYTES) -> list[Traffic]:
    """Each device sends its part to the K-1 others and receives the rest."""
    K, total = len(part_elements), sum(part_elements)
    return [Traffic((K - 1) * p * dtype_bytes, (total - p) * dtype_bytes) for p in part_elements]


def gather_traffic(part_elements: Sequence[int], dtype_bytes: int = DTYPE_BYTES, root: int = 0) -> list[Traffic]:
    """Every device sends its part to ``root`` only (Algorithm 2's last layer); the root receives the rest."""
    total = sum(part_elements)
    return [Traffic(0, (total - p) * dtype_bytes) if i == root else Traffic(p * dtype_bytes, 0)
            for i, p in enumerate(part_elements)]


def all_reduce_traffic(elements: int, K: int, dtype_bytes: int = DTYPE_BYTES) -> list[Traffic]:
    """A ring All-Reduce of ``elements`` over K devices: chunk i+1 is the one device i never sends in the
    reduce-scatter, chunk i+2 the one it never sends in the all-gather."""
    if K == 1:
        return [Traffic(0, 0)]
    chunks = split_counts(elements, K)
    return [Traffic((2 * elements - chunks[(i + 1) % K] - chunks[(i + 2) % K]) * dtype_bytes,
                    (2 * elements - chunks[i] - chunks[(i + 1) % K]) * dtype_bytes) for i in range(K)]


NETWORKS = ("switch", "shared")
"""How a cluster's devices are linked, which every mechanism's cost model reads from the cluster: ``switch``,
one full-duplex link per device to a switch (a collective takes as long as the busiest link); ``shared``, one
medium every device's received bytes cross in turn (Hepti's Eq. 6: the bytes each device receives over its
bandwidth, summed over the devices)."""


def check_network(network: str) -> str:
    if network not in NETWORKS:
        raise WorkbenchError(f"a network is one of {', '.join(NETWORKS)}, got {network!r}")
    return network


def collective_s(traffic: Sequence[Traffic], bandwidths: Sequence[float], latency_s: float, steps: int = 1,
                 network: str = "switch") -> float:
    """Seconds of one collective, the one network model of every mechanism: ``steps`` latencies plus, on a
    ``switch``, the busiest device's bytes over its link (the larger of what it sends and what it receives;
    links are full duplex), on a ``shared`` medium (Eq. 6) what each device receives over its bandwidth,
    summed. Devices that move nothing take no part."""
    check_network(network)
    if all(t.sent == 0 and t.received == 0 for t in traffic):
        return 0.0
    for b in bandwidths:
        if not b > 0 or not math.isfinite(b):
            raise WorkbenchError(f"a link bandwidth must be a finite number > 0 bytes/s, got {b!r}")
    if network == "shared":
        return steps * latency_s + sum(t.received / b for t, b in zip(traffic, bandwidths))
    return steps * latency_s + max(max(t.sent, t.received) / b for t, b in zip(traffic, bandwidths))
