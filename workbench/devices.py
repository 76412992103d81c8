"""Device profiles: how fast a device computes a transformer layer and reads its weights.

A :class:`DeviceProfile` predicts the time of one encoder layer that runs m of
its M shards (``layer_compute_s``) and of reading bytes from storage
(``read_s``). Compute follows ``overhead + FLOPs(m) / flops_per_s``: the fixed
per-layer overhead is what makes a GPU nearly flat in m (WRX: 12 shards only 0.7%
slower than 3 on the Jetson Nano) while a CPU grows in proportion.

``host`` is measured on this machine (real layers, real reads after dropping the
page cache for the file). The presets emulate the papers' platforms: where a
paper published figures the parameters are fitted to them (``source`` says
which); the others come from spec sheets and are marked so.

Emulation slows real work on this machine down to a profile: a mechanism times
each read and each piece of compute and pads it with :func:`pad_until` to the
profile's predicted seconds, so a real run here takes as long as on the device.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, fields, replace
from itertools import combinations
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

from workbench.errors import UnknownNameError, WorkbenchError

T = TypeVar("T")

GB = 1e9
MB = 1e6


@dataclass(frozen=True)
class LayerShape:
    """Dimensions that set a layer's cost: hidden d, heads (= shards) M, FFN d_ff, sequence T."""
    hidden: int = 768
    heads: int = 12
    ffn: int = 3072
    seq_len: int = 128

    def shard_flops(self) -> float:
        """FLOPs of one shard at sequence T: its Q/K/V/O projections, attention and FFN slice."""
        d, dh, f, T = self.hidden, self.hidden // self.heads, self.ffn // self.heads, self.seq_len
        return 2 * T * d * dh * 4 + 2 * 2 * T * T * dh + 2 * 2 * T * d * f

    def shard_params(self) -> int:
        return 4 * self.hidden * (self.hidden // self.heads) + 2 * self.hidden * (self.ffn // self.heads)


DISTILBERT = LayerShape(768, 12, 3072, 128)
MINILM = LayerShape(384, 12, 1536, 128)


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    title: str
    kind: str                        # "cpu" or "gpu"
    flops_per_s: float               # marginal FLOP/s on transformer layer work (at large batches)
    layer_overhead_s: float          # fixed cost of running one layer, whatever its width
    read_bytes_per_s: float          # storage read bandwidth (cold reads)
    memory_bytes: float              # device memory
    net_bytes_per_s: float = 0.0     # network bandwidth to peers (0: not networked)
    net_latency_s: float = 0.0       # one-way network latency
    source: str = ""                 # where the numbers come from
    half_peak_tokens: float = 0.0    # rows (batch x sequence) at which FLOP/s reach half of flops_per_s
    price_per_s: float = 0.0         # dollars per second of use (0: not priced)
    clock_hz: float = 0.0            # CPU clock (0: not given)
    paper: str = ""                  # the paper whose set-up the preset emulates ("" for the host)
    preset: str = ""                 # the preset a cluster member copies ("" for a preset itself)

    def __post_init__(self):
        for field in ("flops_per_s", "read_bytes_per_s"):
            if not getattr(self, field) > 0:
                raise WorkbenchError(f"device {self.name!r}: {field} must be > 0, got {getattr(self, field)!r}")
        for field in ("layer_overhead_s", "memory_bytes", "net_bytes_per_s", "net_latency_s", "half_peak_tokens",
                      "price_per_s", "clock_hz"):
            if not getattr(self, field) >= 0:
                raise WorkbenchError(f"device {self.name!r}: {field} must be >= 0, got {getattr(self, field)!r}")

    def layer_compute_s(self, m: int, shape: LayerShape = DISTILBERT, batch: float = 1) -> float:
        """Seconds to compute one layer running m shards at ``shape`` on ``batch`` inputs.

        ``overhead + m FLOPs (batch + half_peak_tokens / T) / flops_per_s``: non-decreasing in the batch,
        and the seconds per input never grow with it."""
        if not 0 <= m <= shape.heads:
            raise ValueError(f"a layer has 0..{shape.heads} shards, got m={m}")
        if not batch >= 0:
            raise ValueError(f"batch must be >= 0, got batch={batch!r}")
        if not m or not batch:
            return 0.0
        rows = batch + self.half_peak_tokens / shape.seq_len
        return self.layer_overhead_s + m * shape.shard_flops() / self.flops_per_s * rows

    def work_s(self, flops: float, rows: float) -> float:
        """Seconds of ``flops`` FLOPs of matrix work over ``rows`` rows (batch x positions), without the
        per-layer overhead: few rows reach less of the peak (``half_peak_tokens``), as in
        :meth:`layer_compute_s`, which equals ``layer_overhead_s + work_s(m * shard_flops, batch * T)``."""
        if not flops:
            return 0.0
        if not rows > 0:
            raise ValueError(f"work over {rows!r} rows: give at least one row")
        return flops / self.flops_per_s * (1 + self.half_peak_tokens / rows)

    def read_s(self, nbytes: float) -> float:
        return nbytes / self.read_bytes_per_s

    def shard_read_s(self, bits: int, shape: LayerShape = DISTILBERT) -> float:
        """Seconds to read one shard stored with ``bits``-bit indexes (fp32 for 32)."""
        return self.read_s(shape.shard_params() * bits / 8)

    def send_s(self, nbytes: float) -> float:
        if self.net_bytes_per_s <= 0:
            raise ValueError(f"profile {self.name!r} has no network")
        return self.net_latency_s + nbytes / self.net_bytes_per_s

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> DeviceProfile:
        """Read :meth:`to_dict`'s output; a profile saved by another version (other fields) is refused."""
        names = {f.name for f in fields(cls)}
        if set(raw) != names:
            raise WorkbenchError(f"device profile fields {sorted(names ^ set(raw))} differ from this version's")
        return cls(**raw)


def member(preset: str | DeviceProfile, name: str, **changes) -> DeviceProfile:
    """A cluster's copy of a preset under its own ``name`` (``changes``: other figures, e.g. memory)."""
    profile = PRESETS[preset] if isinstance(preset, str) else preset
    return replace(profile, name=name, preset=profile.preset or profile.name, **changes)


def _fit_cpu(name, title, layer_full_s, layer3_s, layer_load_s, memory, source, shape=DISTILBERT):
    """Fit overhead and FLOP/s so that 12 shards take ``layer_full_s`` and 3 take ``layer3_s``."""
    per_shard = (layer_full_s - layer3_s) / (shape.heads - 3)
    return DeviceProfile(name, title, "cpu", shape.shard_flops() / per_shard, layer_full_s - shape.heads * per_shard,
                         shape.shard_params() * shape.heads * 4 / layer_load_s, memory, source=source, paper="wrx")


def _arm_cpu(name, title, clock_hz, flops_per_cycle, memory, read_bytes_per_s, net_bytes_per_s, source):
    """A Hepti edge device: its FLOP/s are clock x 4 cores x ``flops_per_cycle`` (an estimate)."""
    return DeviceProfile(name, title, "cpu", clock_hz * 4 * flops_per_cycle, 1e-3, read_bytes_per_s, memory,
                         net_bytes_per_s, 0.2e-3, clock_hz=clock_hz, paper="hepti",
                         source=f"estimate, not measured: {source}; FLOP/s = clock x 4 cores x {flops_per_cycle} "
                                "FLOP/cycle, 1 ms per-layer overhead and 0.2 ms latency assumed (the Hepti text "
                                "gives its model of f_i, s_i and BW_i,i+1 but no device figures)")


E3_PRICE_NOTE = "estimate, not measured"
V100_PRICE_PER_S = 0.013 / 16
K80_PRICE_PER_S = 0.90 / 3600
P100_PRICE_PER_S = (0.013 - 6 * V100_PRICE_PER_S - 15 * K80_PRICE_PER_S) / 8


def _e3_gpu(name, title, flops_per_s, memory, half_peak_tokens, price_per_s, overhead_s, read_bytes_per_s, source):
    return DeviceProfile(name, title, "gpu", flops_per_s, overhead_s, read_bytes_per_s, memory, 10e9 / 8, 50e-6,
                         half_peak_tokens=half_peak_tokens, price_per_s=price_per_s, paper="e3",
                         source=f"{source}; 10 Gbps Ethernet as in E3 (50 us latency assumed); {E3_PRICE_NOTE}: "
                                f"half of peak at {half_peak_tokens:.0f} rows (batch x tokens), "
                                f"{overhead_s * 1e3:.1f} ms per-layer overhead")


PRESETS: dict[str, DeviceProfile] = {
    # WRX: one DistilBERT layer loads in 339 ms and computes in 95 ms on the Odroid's CPU; its
    # Table 6 picks 3x3 at 150 ms and 5x3 at 200 ms with the model in memory, so 3 shards <= 40 ms.
    "odroid-n2": _fit_cpu("odroid-n2", "Odroid-N2+ CPU (4xA73+2xA53, eMMC)", 0.095, 0.040, 0.339, 4 * GB,
                          "WRX paper: 339 ms load / 95 ms compute per DistilBERT layer; Table 6 submodels"),
    # WRX: 12 shards compute only 0.7% slower than 3 on the Jetson GPU; Table 6 (PreloadModel picks
    # 2x12 / 3x12 / 7x12 at 150 / 200 / 400 ms) puts a 12-shard layer in (50, 57] ms; IO 3.0 s for 240 MB.
    "jetson-nano": DeviceProfile("jetson-nano", "Jetson Nano GPU (128 CUDA cores, SD card)", "gpu",
                                 flops_per_s=DISTILBERT.shard_flops() * 9 / (0.055 * 0.007 / 1.007),
                                 layer_overhead_s=0.055 - 12 * 0.055 * 0.007 / 1.007 / 9,
                                 read_bytes_per_s=240 * MB / 3.0, memory_bytes=4 * GB, paper="wrx",
                                 source="WRX paper: 12 vs 3 shards +0.7%; Table 6 submodels; 3.0 s IO for 240 MB"),
    "mi14": DeviceProfile("mi14", "Xiaomi 14 (Snapdragon 8 Gen 3) CPU, UFS 4.0", "cpu", 60e9, 0.5e-3, 2.0 * GB,
                          16 * GB, paper="llms",
                          source="estimate, not measured: 60 GFLOP/s on the big CPU cores, 2 GB/s UFS 4.0 "
                                 "reads, 0.5 ms per-layer overhead assumed"),
    "orin-nx": DeviceProfile("orin-nx", "Jetson Orin NX 16GB GPU", "gpu", 4e12, 2.0e-3, 1.5 * GB, 16 * GB, paper="llms",
                             source="estimate, not measured: 4 TFLOP/s usable of the GPU's spec-sheet figure, "
                                    "1.5 GB/s NVMe reads, 2 ms per-layer overhead assumed"),
    "jetson-tx2": DeviceProfile("jetson-tx2", "Jetson TX2 GPU (256-core Pascal), SATA HDD", "gpu", 0.5e12, 3.0e-3,
                                0.1 * GB, 8 * GB, paper="llms",
                                source="estimate, not measured: 0.5 TFLOP/s usable of the GPU's 1.33 TFLOP/s fp16 "
                                       "spec-sheet figure, 100 MB/s SATA HDD reads (the disk of the LLMS paper's "
                                       "Table 2), 3 ms per-layer overhead assumed"),
    "edge-vm": DeviceProfile("edge-vm", "1-vCPU edge VM on a 500 Mbps link (Voltage set-up)", "cpu", 10e9, 0.2e-3,
                             0.5 * GB, 7.6 * GB, net_bytes_per_s=500e6 / 8, net_latency_s=0.5e-3, paper="voltage",
                             source="Voltage paper §VI-A: 1 vCPU, 7.6 GB, links limited to 500 Mbps; 10 GFLOP/s "
                                    "(chosen so that this 2-core host can emulate six of them at once), 0.2 ms "
                                    "per-layer overhead, 0.5 GB/s reads and 0.5 ms latency are estimates, not "
                                    "measured"),
    "rpi4": _arm_cpu("rpi4", "Raspberry Pi 4B CPU (4x Cortex-A72 @ 1.5 GHz, 4 GB)", 1.5e9, 2, 4 * GB, 45 * MB,
                     1e9 / 8, "spec-sheet clock, memory and Gigabit Ethernet of the Raspberry Pi 4B; 45 MB/s "
                              "microSD reads"),
    "jetson-nano-cpu": _arm_cpu("jetson-nano-cpu", "Jetson Nano CPU (4x Cortex-A57 @ 1.43 GHz, 4 GB)", 1.43e9, 2,
                                4 * GB, 240 * MB / 3.0, 1e9 / 8,
                                "spec-sheet clock, memory and Gigabit Ethernet of the Jetson Nano; reads as the WRX "
                                "paper's 3.0 s for 240 MB"),
    "rpi3": _arm_cpu("rpi3", "Raspberry Pi 3B+ CPU (4x Cortex-A53 @ 1.4 GHz, 1 GB)", 1.4e9, 1, 1 * GB, 25 * MB,
                     300e6 / 8, "spec-sheet clock and memory of the Raspberry Pi 3B+, its Ethernet over USB 2.0 "
                                "at 300 Mbps at most; 25 MB/s microSD reads"),
    "a6000": _e3_gpu("a6000", "NVIDIA RTX A6000 48GB", 35e12, 48 * GB, 1024, 0.80 / 3600, 0.3e-3, 3 * GB,
                     "spec sheet (38.7 TFLOP/s fp32, 48 GB); $0.80 per hour, a public cloud on-demand price "
                     "(Lambda, 2023)"),
    "v100": _e3_gpu("v100", "NVIDIA V100 16GB", 14e12, 16 * GB, 512, V100_PRICE_PER_S, 0.3e-3, 3 * GB,
                    "spec sheet (15.7 TFLOP/s fp32, 16 GB); price from E3 §5.2: 16 V100 cost $0.013 per second "
                    f"(${V100_PRICE_PER_S * 3600:.3f} per hour each; AWS p3.2xlarge lists $3.06)"),
    "p100": _e3_gpu("p100", "NVIDIA P100 16GB (PCIe)", 8.4e12, 16 * GB, 384, P100_PRICE_PER_S, 0.3e-3, 0.5 * GB,
                    "spec sheet (9.3 TFLOP/s fp32, 16 GB), 0.5 GB/s SSD reads; price set so that E3 §5.2's "
                    f"6 V100 + 8 P100 + 15 K80 cost $0.013 per second (${P100_PRICE_PER_S * 3600:.2f} per hour, "
                    "between public cloud list prices of $1.46 and $2.07)"),
    "k80": _e3_gpu("k80", "NVIDIA K80 (one of the board's two GPUs, 12GB)", 3.9e12, 12 * GB, 256, K80_PRICE_PER_S,
                   0.5e-3, 0.5 * GB, "spec sheet (4.37 TFLOP/s fp32 per GPU with boost, 12 GB), 0.5 GB/s SSD "
                                     "reads; $0.90 per hour (AWS p2.xlarge, one K80 GPU)"),
}


def profile_names(paper: str | None = None, host: bool = True) -> list[str]:
    """The device names every list shows: ``host`` (unless ``host=False``) then the presets, or only those
    of one paper's set-up (``"wrx"``, ``"llms"``, ``"voltage"``, ``"hepti"``, ``"e3"``)."""
    papers = {p.paper for p in PRESETS.values()}
    if paper is not None and paper not in papers:
        raise UnknownNameError("paper set-up", paper, papers)
    return ["host"] * host + [n for n, p in PRESETS.items() if paper in (None, p.paper)]


def get_profile(name: str) -> DeviceProfile:
    """A preset by name, or the measured ``host``."""
    if name == "host":
        return host_profile()
    if name not in PRESETS:
        raise UnknownNameError("device profile", name, profile_names())
    return PRESETS[name]


def emulated_name(device: str) -> str:
    """How a timeline names a preset emulated here: ``"<device> emulated on this host"``."""
    return f"{device} emulated on this host"


@dataclass(frozen=True)
class Link:
    """A link between two devices: a transfer of n bytes takes ``latency_s + n / bandwidth_bytes_per_s``."""
    bandwidth_bytes_per_s: float
    latency_s: float
    source: str = ""

    def __post_init__(self):
        if not self.bandwidth_bytes_per_s > 0:
            raise WorkbenchError(f"link bandwidth must be > 0 bytes/s, got {self.bandwidth_bytes_per_s!r}")
        if not self.latency_s >= 0:
            raise WorkbenchError(f"link latency must be >= 0 s, got {self.latency_s!r}")

    def transfer_s(self, nbytes: float) -> float:
        if not nbytes >= 0:
            raise WorkbenchError(f"bytes to transfer must be >= 0, got {nbytes!r}")
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s


class Cluster:
    """Devices and a :class:`Link` per linked pair; ``links`` maps (name, name), in either order, to a link."""

    def __init__(self, devices, links, *, name: str = "", title: str = "", source: str = "", network: str = "switch"):
        from workbench.network import check_network

        self.devices: tuple[DeviceProfile, ...] = tuple(devices)
        self.name, self.title, self.source = name, title, source
        self.network = check_network(network)
        """How collectives cross the links (:data:`workbench.network.NETWORKS`): every mechanism's cost
        model on this cluster reads it, so their predictions compare."""
        if not self.devices:
            raise WorkbenchError(f"cluster {name!r} has no devices; give at least one")
        self._by_name: dict[str, DeviceProfile] = {}
        for device in self.devices:
            if device.name in self._by_name:
                raise WorkbenchError(f"device {device.name!r} appears twice in cluster {name!r}; names must differ")
            self._by_name[device.name] = device
        self.links: dict[tuple[str, str], Link] = {}
        self._links: dict[frozenset, Link] = {}
        for (a, b), link in dict(links).items():
            self.device(a), self.device(b)
            if a == b:
                raise WorkbenchError(f"a link joins two devices, got {a!r} at both ends")
            if not isinstance(link, Link):
                raise WorkbenchError(f"link {a!r}-{b!r} must be a Link, got {type(link).__name__}")
            key = frozenset((a, b))
            if self._links.get(key, link) != link:
                raise WorkbenchError(f"link {a!r}-{b!r} is given twice with different figures")
            self._links[key] = self.links[(a, b)] = link

    def __repr__(self) -> str:
        return f"Cluster({self.name or 'unnamed'}: {len(self.devices)} devices, {len(self._links)} links)"

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def device(self, name: str) -> DeviceProfile:
        if name not in self._by_name:
            raise UnknownNameError(f"device of cluster {self.name or 'unnamed'}", name, self._by_name)
        return self._by_name[name]

    def link(self, a: str, b: str) -> Link:
        """The link between ``a`` and ``b`` (either order); a pair with none is an error naming both."""
        self.device(a), self.device(b)
        if frozenset((a, b)) not in self._links:
            raise WorkbenchError(f"no link between {a!r} and {b!r} in cluster {self.name or 'unnamed'}; "
                                 f"{a!r} is linked to {', '.join(map(repr, self.neighbours(a))) or 'nothing'}")
        return self._links[frozenset((a, b))]

    def neighbours(self, name: str) -> list[str]:
        self.device(name)
        return [other for other in self._by_name if frozenset((name, other)) in self._links]

    def transfer_s(self, src: str, dst: str, nbytes: float) -> float:
        """Seconds to send ``nbytes`` from ``src`` to ``dst`` over their link (0 from a device to itself)."""
        if src == dst:
            self.device(src)
            return 0.0
        return self.link(src, dst).transfer_s(nbytes)

    @property
    def price_per_s(self) -> float:
        return sum(d.price_per_s for d in self.devices)

    def counts(self) -> dict[str, int]:
        """How many devices of each preset the cluster holds."""
        counts: dict[str, int] = {}
        for d in self.devices:
            counts[d.preset or d.name] = counts.get(d.preset or d.name, 0) + 1
        return counts


def _voltage_cluster() -> Cluster:
    vms = [member("edge-vm", f"vm{i}") for i in range(6)]
    link = Link(500e6 / 8, 0.5e-3, source="Voltage paper §VI-A: bandwidth limited to 500 Mbps; 0.5 ms latency "
                                           "an estimate, not measured")
    return Cluster(vms, {(a.name, b.name): link for a, b in combinations(vms, 2)}, name="voltage", network="switch",
                   title="Voltage: six 1-vCPU VMs, 7.6 GB each, 500 Mbps between every pair",
                   source="Voltage paper §VI-A (six Compute Canada VMs, 1 vCPU and 7.6 GB each, 500 Mbps)")


def _hepti_cluster() -> Cluster:
    devices = [member("rpi4", "rpi4-a"), member("jetson-nano-cpu", "jetson-nano-cpu"),
               member("rpi4", "rpi4-b", memory_bytes=2 * GB, title="Raspberry Pi 4B CPU (4x Cortex-A72 @ 1.5 GHz, 2 GB)"),
               member("rpi3", "rpi3")]
    gbe = Link(1e9 / 8, 0.2e-3, source="estimate, not measured: Gigabit Ethernet of both boards, 0.2 ms latency")
    usb = Link(300e6 / 8, 0.2e-3, source="estimate, not measured: the Raspberry Pi 3B+'s Ethernet over USB 2.0 "
                                         "(300 Mbps at most), 0.2 ms latency")
    links = {("rpi4-a", "jetson-nano-cpu"): gbe, ("jetson-nano-cpu", "rpi4-b"): gbe, ("rpi4-b", "rpi3"): usb}
    return Cluster(devices, links, name="hepti", network="shared",
                   title="Hepti: four CPU boards of unequal clock and memory, linked to their neighbours",
                   source="Hepti §4.3's inputs (CPU frequency f_i, memory s_i, bandwidth BW_i,i+1 between "
                          "neighbours; the first device the primary); the devices and figures are estimates, "
                          "not measured")


PCIE = Link(12e9, 10e-6, source="estimate, not measured: a shared PCIe 3.0 x16 (15.75 GB/s, the Xeon E5-2690 v4's "
                                "generation in E3 §5), 12 GB/s usable and 10 us latency assumed")
ETHERNET_10G = Link(10e9 / 8, 50e-6, source="E3 §5: servers interconnected via 10 Gbps Ethernet; 50 us latency "
                                            "an estimate, not measured")


def e3_cluster(name: str, gpus: dict[str, int], per_server: int = 2, title: str = "", source: str = "") -> Cluster:
    """GPUs of E3's presets filled into servers of ``per_server`` each, one type a server: PCIe within a
    server, 10 Gbps Ethernet between servers."""
    devices, servers, server = [], [], 0
    for gpu, count in gpus.items():
        for i in range(count):
            server += bool(i) and i % per_server == 0
            devices.append(member(gpu, f"{gpu}-s{server}g{i % per_server}"))
            servers.append(server)
        server += 1
    links = {(a.name, b.name): PCIE if sa == sb else ETHERNET_10G
             for (a, sa), (b, sb) in combinations(zip(devices, servers), 2)}
    return Cluster(devices, links, name=name, title=title, source=source)


def _e3_clusters() -> dict[str, Cluster]:
    layout = "2 GPUs per server assumed (the paper's 46 GPUs spread over 26 servers)"
    return {
        "e3-v100": e3_cluster("e3-v100", {"v100": 16}, title="E3: 16 V100 GPUs ($0.013 per second)",
                              source=f"E3 §5.2: a homogeneous cluster of 16 V100, $0.013 per second; {layout}"),
        "e3-mixed": e3_cluster("e3-mixed", {"v100": 6, "p100": 8, "k80": 15},
                               title="E3: 6 V100 + 8 P100 + 15 K80 GPUs ($0.013 per second)",
                               source=f"E3 §5.2: a heterogeneous cluster of 6 V100, 8 P100 and 15 K80, "
                                      f"$0.013 per second; {layout}"),
        "e3-a6000": e3_cluster("e3-a6000", {"a6000": 4}, per_server=4, title="E3: 4 A6000 GPUs (the T5/CALM runs)",
                               source="E3 §5.1.3: 4 NVIDIA A6000 GPUs; one server assumed"),
    }


CLUSTERS: dict[str, Cluster] = {"voltage": _voltage_cluster(), "hepti": _hepti_cluster(), **_e3_clusters()}


def get_cluster(name: str) -> Cluster:
    """A cluster preset by name."""
    if name not in CLUSTERS:
        raise UnknownNameError("cluster", name, CLUSTERS)
    return CLUSTERS[name]


def measure_layer_times(shape: LayerShape = DISTILBERT, repeats: int = 5) -> list[float]:
    """Median seconds of one real encoder layer running m = 1..M shards at ``shape`` (batch 1)."""
    import torch

    from workbench.models.encoder import EncoderConfig, EncoderLayer

    torch.manual_seed(0)
    layer = EncoderLayer(EncoderConfig(hidden=shape.hidden, num_heads=shape.heads, ffn=shape.ffn)).eval()
    x = torch.randn(1, shape.seq_len, shape.hidden)
    times = []
    with torch.no_grad():
        layer(x)
        for m in range(1, shape.heads + 1):
            samples = []
            for _ in range(repeats):
                t = time.perf_counter()
                layer(x, None, range(m))
                samples.append(time.perf_counter() - t)
            times.append(float(np.median(samples)))
    return times


def measure_batch_times(shape: LayerShape = DISTILBERT, batches=(1, 2, 4, 8), repeats: int = 3) -> dict[int, float]:
    """Median seconds of one real encoder layer (all shards) on ``b`` inputs, for each b in ``batches``."""
    import torch

    from workbench.models.encoder import EncoderConfig, EncoderLayer

    torch.manual_seed(0)
    layer = EncoderLayer(EncoderConfig(hidden=shape.hidden, num_heads=shape.heads, ffn=shape.ffn)).eval()
    times = {}
    with torch.no_grad():
        for b in batches:
            x = torch.randn(b, shape.seq_len, shape.hidden)
            layer(x)
            samples = []
            for _ in range(repeats):
                t = time.perf_counter()
                layer(x)
                samples.append(time.perf_counter() - t)
            times[b] = float(np.median(samples))
    return times


def fit_compute(shard_s, batch_s: dict[int, float], shape: LayerShape = DISTILBERT) -> tuple[float, float, float]:
    """``(layer_overhead_s, flops_per_s, half_peak_tokens)`` fitted to a layer's seconds at m = 1..M shards
    (batch 1) and to the whole layer's seconds at several batch sizes.

    The shard line gives the overhead and the batch-1 compute; the batch line's slope, the seconds each
    further input adds, gives the FLOP/s at large batches. A slope at or above the batch-1 compute (no
    gain from batching) or below zero (noise) fits compute in proportion to the batch."""
    slope, intercept = np.polyfit(np.arange(1, shape.heads + 1), shard_s, 1)
    per_shard = max(float(slope), 1e-9)
    batch1 = shape.heads * per_shard
    sizes = sorted(batch_s)
    per_input = float(np.polyfit(sizes, [batch_s[b] for b in sizes], 1)[0]) if len(sizes) > 1 else batch1
    if not 0 < per_input < batch1:
        return max(float(intercept), 0.0), shape.shard_flops() / per_shard, 0.0
    return (max(float(intercept), 0.0), shape.heads * shape.shard_flops() / per_input,
            (batch1 / per_input - 1) * shape.seq_len)


def measure_host(repeats: int = 5, read_mb: int = 64) -> DeviceProfile:
    """Measure this machine: fit overhead, FLOP/s and batch saturation to real layer times, and time cold reads."""
    shape = DISTILBERT
    batch_s = measure_batch_times(shape, repeats=max(1, repeats - 2))
    overhead, flops, half_peak = fit_compute(measure_layer_times(shape, repeats), batch_s, shape)
    points = ", ".join(f"{b}: {t * 1e3:.1f} ms" for b, t in batch_s.items())
    return DeviceProfile("host", "This machine (measured)", "cpu", flops, overhead, measure_read_bandwidth(read_mb),
                         _total_memory(), half_peak_tokens=half_peak,
                         source=f"measured by workbench (real layers at batch 1 to 8 [{points}]; reads after "
                                "posix_fadvise DONTNEED)")


def _total_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return 0.0


def measure_read_bandwidth(megabytes: int = 64, directory: Path | None = None) -> float:
    """Bytes/s reading a fresh file after ``posix_fadvise(DONTNEED)`` dropped it from the page cache."""
    from workbench.cache import cache_dir

    directory = directory or cache_dir()
    payload = os.urandom(1 << 20)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".readprobe-") as handle:
        for _ in range(megabytes):
            handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
        samples = []
        for _ in range(3):
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            t = time.perf_counter()
            with open(handle.name, "rb", buffering=0) as reader:
                while reader.read(4 << 20):
                    pass
            samples.append(time.perf_counter() - t)
    return megabytes * (1 << 20) / float(np.median(samples))


def host_profile_path() -> Path:
    """Where the measured host profile is cached (present or not)."""
    from workbench.cache import cache_dir

    return cache_dir() / "profiles" / "host.json"


def cached_measurement(path: Path, measure: Callable[[], T], load: Callable[[dict], T], dump: Callable[[T], dict],
                       remeasure: bool = False) -> T:
    """What ``measure()`` returns, measured once and cached as JSON at ``path`` (``dump`` writes it, ``load``
    reads it); measured again when asked, or when the file is damaged or from another version."""
    from workbench.cache import write_json

    if path.exists() and not remeasure:
        try:
            return load(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, WorkbenchError):
            print(f"workbench: {path} is damaged; measuring the host again")
    value = measure()
    write_json(path, dump(value))
    return value


def host_profile(remeasure: bool = False) -> DeviceProfile:
    """The measured ``host`` profile, cached in the cache directory (about 15 s to measure)."""
    return cached_measurement(host_profile_path(), measure_host, DeviceProfile.from_dict, DeviceProfile.to_dict,
                              remeasure)


def pad_until(deadline_s: float) -> None:
    """Sleep until ``time.perf_counter()`` reaches ``deadline_s``: emulated work that finished early waits here.

    Work already past its deadline (slower here than on the device) returns at once."""
    while True:
        remaining_s = deadline_s - time.perf_counter()
        if remaining_s <= 0:
            return
        time.sleep(remaining_s)
