"""Share vectors and device lists of a split over devices: checked shares, even and speed-proportional
shares, whole numbers in proportion, and devices from a preset or an editable table. Pure Python."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from workbench.devices import DeviceProfile, member
from workbench.distributed import limits
from workbench.errors import WorkbenchError

SHARE_TOLERANCE = 1e-6


def check_shares(shares: Sequence[float], K: int, what: str = "shares") -> tuple[float, ...]:
    """A share vector of K fractions in [0, 1] summing to 1 (to 1e-6), or an error naming what is wrong."""
    shares = tuple(float(s) for s in shares)
    if len(shares) != K:
        raise WorkbenchError(f"{what}: {len(shares)} shares for {K} devices; give one per device")
    bad = [s for s in shares if not (0.0 <= s <= 1.0) or math.isnan(s)]
    if bad:
        raise WorkbenchError(f"{what}: every share must be between 0 and 1, got {bad[0]!r}")
    if abs(sum(shares) - 1.0) > SHARE_TOLERANCE:
        raise WorkbenchError(f"{what} must sum to 1, got {sum(shares):.6g} ({', '.join(f'{s:.4g}' for s in shares)})")
    return shares


def even_shares(K: int) -> tuple[float, ...]:
    return (1.0 / K,) * K


def proportional_shares(devices: Sequence[DeviceProfile]) -> tuple[float, ...]:
    """Shares in proportion to each device's compute speed (FLOP/s)."""
    total = sum(d.flops_per_s for d in devices)
    return tuple(d.flops_per_s / total for d in devices)


def largest_remainder(total: int, weights: Sequence[float]) -> list[int]:
    """Whole numbers in proportion to ``weights`` summing to ``total`` (largest remainder, ties to the first)."""
    s = sum(weights)
    exact = [total * w / s for w in weights]
    counts = [math.floor(e) for e in exact]
    for i in sorted(range(len(exact)), key=lambda i: (counts[i] - exact[i], i))[: total - sum(counts)]:
        counts[i] += 1
    return counts


DEFAULT_DEVICE = "edge-vm"
"""The Voltage paper's device: a 1-vCPU VM on a 500 Mbit/s link."""


def devices_like(count: int, preset: str | DeviceProfile = DEFAULT_DEVICE, *, bandwidth_mbit: float | None = None,
                 latency_ms: float | None = None) -> tuple[DeviceProfile, ...]:
    """``count`` copies of a preset named ``<preset>-<i>``, their links set to ``bandwidth_mbit`` and
    ``latency_ms`` where given (checked: above 0 Mbit/s, 0 ms or more)."""
    limits.devices.check("devices", count)
    changes = {}
    if bandwidth_mbit is not None:
        changes["net_bytes_per_s"] = limits.bandwidth_mbit.check("link bandwidth", bandwidth_mbit) * 1e6 / 8
    if latency_ms is not None:
        changes["net_latency_s"] = limits.latency_ms.check("link latency", latency_ms) / 1e3
    base = preset if isinstance(preset, DeviceProfile) else None
    name = base.name if base is not None else preset
    return tuple(member(base or preset, f"{name}-{i}", **changes) for i in range(count))


@dataclass(frozen=True)
class DeviceRow:
    """One row of an editable device table, in the units people type."""
    speed_gflops: float
    memory_gb: float
    bandwidth_mbit: float
    name: str = ""


def devices_from_table(rows: Sequence[DeviceRow], base: str = DEFAULT_DEVICE,
                       latency_ms: float | None = None) -> tuple[DeviceProfile, ...]:
    """Devices of a table: the ``base`` preset with each row's speed, memory and link, each value checked
    (the message names the row and the allowed range)."""
    limits.devices.check("devices", len(rows))
    out = []
    for i, row in enumerate(rows):
        changes = {"flops_per_s": limits.speed_gflops.check(f"device {i}'s speed", row.speed_gflops) * 1e9,
                   "memory_bytes": limits.memory_gb.check(f"device {i}'s memory", row.memory_gb) * 1e9,
                   "net_bytes_per_s": limits.bandwidth_mbit.check(f"device {i}'s bandwidth", row.bandwidth_mbit) * 1e6 / 8}
        if latency_ms is not None:
            changes["net_latency_s"] = limits.latency_ms.check("link latency", latency_ms) / 1e3
        out.append(member(base, row.name or f"device-{i}", **changes))
    return tuple(out)
