"""The Voltage paper's set-up at this host's scale: devices a fraction of a core each, whose links keep the
paper's ratio of compute to link.

The paper (§VI-A) ran six VMs of one vCPU each, links limited to 500 Mbit/s, and gives no FLOP/s for a vCPU.
What it does give is a measured outcome: Voltage cuts one device's latency on BERT-Large by 27.9 % at six
devices and 500 Mbit/s. :func:`paper_speed_gflops` finds the device speed at which the cost model gives that
(for the ``edge-vm`` preset's 0.5 ms link latency and 0.2 ms per-layer overhead): about 171 GFLOP/s, or
343 FLOP per bit of link. That pins the ratio; no single FLOP/s figure of a 2021 vCPU does.

Six devices at that speed do not fit two cores, so :func:`paper_ratio_device` slows the whole device by one
factor: its speed to ``gflops`` (a sixth of a core here is about 10), and its link bandwidth, link latency and
per-layer overhead by the same factor. Every predicted time is then the paper-speed one times that factor, and
every ratio the paper reports (the reduction against one device, the bandwidth from which a scheme gains) is
unchanged. A paper bandwidth ``b`` Mbit/s stands for ``b / factor`` here.

:func:`fit_half_peak` measures how this host's FLOP/s fall with fewer rows (a device computing N/K of the
positions multiplies thinner matrices; the FLOP/s at P rows are the peak over 1 + h/P): a device emulated as a share of this host's core computes its share
of a layer at that lower rate, and the cost model says so through the profile's ``half_peak_tokens``.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Sequence

from workbench.devices import DeviceProfile, get_profile
from workbench.errors import WorkbenchError

PAPER_REDUCTION = 0.279
"""Voltage's latency reduction against one device, BERT-Large, six devices, 500 Mbit/s (§VI-B)."""
PAPER_MBIT = 500.0
PAPER_K = 6
PAPER_N = 128
"""Positions of the runs here (the paper's 200-word inputs are about 256 tokens; 128 halves every run)."""
BASE = "edge-vm"


def paper_speed_gflops(*, model: str = "bert-large", K: int = PAPER_K, mbit: float = PAPER_MBIT,
                       reduction: float = PAPER_REDUCTION, seq_len: int = PAPER_N, base: str = BASE) -> float:
    """The device speed (GFLOP/s) at which the cost model's Voltage over ``K`` copies of ``base`` at ``mbit``
    cuts one device's latency by ``reduction`` (bisection: the reduction falls as the devices get faster)."""
    from workbench.partition.cost import get_shape
    from workbench.partition.plan import devices_like, plan_partition

    shape = get_shape(model)

    def cut(gflops: float) -> float:
        devices = devices_like(K, dataclasses.replace(get_profile(base), flops_per_s=gflops * 1e9),
                               bandwidth_mbit=mbit)
        return 1 - (plan_partition("voltage", shape, seq_len, devices).predicted_s
                    / plan_partition("single", shape, seq_len, devices).predicted_s)

    low, high = 0.1, 1e5
    if not cut(high) <= reduction <= cut(low):
        raise WorkbenchError(f"no device speed between {low} and {high:g} GFLOP/s gives a {100 * reduction:.1f} % "
                             f"reduction at K={K}, {mbit:g} Mbit/s")
    while high / low > 1.0001:
        mid = (low * high) ** 0.5
        low, high = (mid, high) if cut(mid) > reduction else (low, mid)
    return (low * high) ** 0.5


def paper_ratio_device(gflops: float = 10.0, *, half_peak_tokens: float = 0.0, paper_gflops: float | None = None,
                       base: str = BASE) -> DeviceProfile:
    """``base`` slowed to ``gflops`` in every respect: link bandwidth, link latency and per-layer overhead
    scaled by ``paper_gflops / gflops`` (:func:`paper_speed_gflops` by default), its FLOP/s falling with
    fewer rows by ``half_peak_tokens`` (:func:`fit_half_peak`)."""
    from workbench.distributed import limits

    gflops = limits.speed_gflops.check("device speed", gflops)
    paper = paper_speed_gflops(base=base) if paper_gflops is None else paper_gflops
    factor = paper / gflops
    b = get_profile(base)
    return dataclasses.replace(
        b, name=f"{base}-ratio", title=f"{b.title}, slowed {factor:.1f}x (speed, link, latency, overhead)",
        flops_per_s=gflops * 1e9, net_bytes_per_s=b.net_bytes_per_s / factor, net_latency_s=b.net_latency_s * factor,
        layer_overhead_s=b.layer_overhead_s * factor, half_peak_tokens=half_peak_tokens,
        source=f"the Voltage paper's VM at its ratio of compute to link ({paper:.0f} GFLOP/s to "
               f"{b.net_bytes_per_s * 8 / 1e6:g} Mbit/s, from its 27.9 % on BERT-Large), slowed to {gflops:g} "
               f"GFLOP/s so that this host can emulate six")


def ratio_factor(device: DeviceProfile, base: str = BASE) -> float:
    """How much slower than ``base`` ``device``'s link is: a paper bandwidth ``b`` stands for ``b / factor``."""
    return get_profile(base).net_bytes_per_s / device.net_bytes_per_s


def fit_half_peak(model: str = "bert-large", seq_len: int = PAPER_N, rows: Sequence[int] = (64, 43, 32, 26, 21),
                  repeats: int = 5) -> tuple[float, dict[int, float]]:
    """``half_peak_tokens`` of this host for ``model``'s layer: one thread times the partitioned layer computing
    P of ``seq_len`` rows (the medians of ``repeats``, interleaved), and fits (1 + h/P) / (1 + h/N) to each P's
    FLOP/s against P = N's by least squares. Returns h and each P's measured efficiency."""
    import torch

    from workbench.models.config import EncoderConfig
    from workbench.models.encoder import EncoderLayer
    from workbench.partition.cost import get_shape, voltage_layer_gamma
    from workbench.models.slices import partitioned_layer

    shape = get_shape(model)
    points = sorted({int(p) for p in rows if 0 < int(p) < seq_len})
    if not points:
        raise WorkbenchError(f"fit_half_peak needs rows between 1 and {seq_len - 1}, got {list(rows)}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        layer = EncoderLayer(EncoderConfig(hidden=shape.hidden, num_heads=shape.heads, ffn=shape.ffn)).eval()
        x = torch.randn(1, seq_len, shape.hidden)
        times: dict[int, list[float]] = {p: [] for p in [seq_len, *points]}
        with torch.no_grad():
            partitioned_layer(layer, x, 0, seq_len)
            for _ in range(repeats):
                for p in times:
                    t = time.perf_counter()
                    partitioned_layer(layer, x, 0, p)
                    times[p].append(time.perf_counter() - t)
    finally:
        torch.set_num_threads(threads)
    rate = {p: voltage_layer_gamma(shape, seq_len, p) / statistics.median(ts) for p, ts in times.items()}
    efficiency = {p: rate[p] / rate[seq_len] for p in points}
    return half_peak_from(efficiency, seq_len), efficiency


def half_peak_from(efficiency: dict[int, float], seq_len: int) -> float:
    """The least-squares h of r_P = (1 + h/N) / (1 + h/P) over the measured efficiencies r_P (0 at least)."""
    # r (1 + h/P) = 1 + h/N is linear in h: a h = b with a = r/P - 1/N, b = 1 - r
    a = [r / p - 1 / seq_len for p, r in efficiency.items()]
    b = [1 - r for r in efficiency.values()]
    h = sum(x * y for x, y in zip(a, b)) / sum(x * x for x in a)
    return max(0.0, h)
