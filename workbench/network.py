"""How a cluster's devices are linked, and what a collective costs on it: the one network model every
mechanism prices its communication with, so that their predictions on one cluster compare.

A cluster (:class:`workbench.devices.Cluster`) says which model holds: ``switch``, one full-duplex link per
device to a switch (Voltage's shaped network), or ``shared``, one medium every device's received bytes
cross in turn (Hepti's Eq. 6).
"""
from __future__ import annotations

import math
from typing import Protocol, Sequence

from workbench.errors import WorkbenchError

class Traffic(Protocol):
    """What a device moves in a collective (``workbench.partition.cost.Traffic`` is one)."""
    sent: int
    received: int


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
