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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from workbench.errors import UnknownNameError

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
    flops_per_s: float               # marginal FLOP/s on transformer layer work
    layer_overhead_s: float          # fixed cost of running one layer, whatever its width
    read_bytes_per_s: float          # storage read bandwidth (cold reads)
    memory_bytes: float              # device memory
    net_bytes_per_s: float = 0.0     # network bandwidth to peers (0: not networked)
    net_latency_s: float = 0.0       # one-way network latency
    source: str = ""                 # where the numbers come from

    def layer_compute_s(self, m: int, shape: LayerShape = DISTILBERT) -> float:
        """Seconds to compute one layer running m shards at ``shape``."""
        if not 0 <= m <= shape.heads:
            raise ValueError(f"a layer has 0..{shape.heads} shards, got m={m}")
        return self.layer_overhead_s + m * shape.shard_flops() / self.flops_per_s if m else 0.0

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


def _fit_cpu(name, title, layer_full_s, layer3_s, layer_load_s, memory, source, shape=DISTILBERT):
    """Fit overhead and FLOP/s so that 12 shards take ``layer_full_s`` and 3 take ``layer3_s``."""
    per_shard = (layer_full_s - layer3_s) / (shape.heads - 3)
    return DeviceProfile(name, title, "cpu", shape.shard_flops() / per_shard, layer_full_s - shape.heads * per_shard,
                         shape.shard_params() * shape.heads * 4 / layer_load_s, memory, source=source)


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
                                 read_bytes_per_s=240 * MB / 3.0, memory_bytes=4 * GB,
                                 source="WRX paper: 12 vs 3 shards +0.7%; Table 6 submodels; 3.0 s IO for 240 MB"),
    "orin-nx": DeviceProfile("orin-nx", "Jetson Orin NX 16GB GPU", "gpu", 4e12, 2.0e-3, 1.5 * GB, 16 * GB,
                             source="estimate, not measured: 4 TFLOP/s usable of the GPU's spec-sheet figure, "
                                    "1.5 GB/s NVMe reads, 2 ms per-layer overhead assumed"),
    "mi14": DeviceProfile("mi14", "Xiaomi 14 (Snapdragon 8 Gen 3) CPU, UFS 4.0", "cpu", 60e9, 0.5e-3, 2.0 * GB,
                          16 * GB, source="estimate, not measured: 60 GFLOP/s on the big CPU cores, 2 GB/s UFS 4.0 "
                                          "reads, 0.5 ms per-layer overhead assumed"),
    "jetson-tx2": DeviceProfile("jetson-tx2", "Jetson TX2 GPU (256-core Pascal), SATA HDD", "gpu", 0.5e12, 3.0e-3,
                                0.1 * GB, 8 * GB,
                                source="estimate, not measured: 0.5 TFLOP/s usable of the GPU's 1.33 TFLOP/s fp16 "
                                       "spec-sheet figure, 100 MB/s SATA HDD reads (the disk of the LLMS paper's "
                                       "Table 2), 3 ms per-layer overhead assumed"),
    "edge-vm": DeviceProfile("edge-vm", "1-vCPU edge VM on a 500 Mbps link (Voltage set-up)", "cpu", 20e9, 0.2e-3,
                             0.5 * GB, 7.6 * GB, net_bytes_per_s=500e6 / 8, net_latency_s=0.5e-3,
                             source="Voltage paper set-up: 1 vCPU, 7.6 GB, 500 Mbps; FLOP/s an estimate"),
    "v100": DeviceProfile("v100", "NVIDIA V100 16GB", "gpu", 14e12, 0.3e-3, 3 * GB, 16 * GB, 10e9 / 8, 50e-6,
                          source="spec sheet (15.7 TFLOP/s fp32); 10 Gbps Ethernet as in E3"),
    "a6000": DeviceProfile("a6000", "NVIDIA RTX A6000 48GB", "gpu", 35e12, 0.3e-3, 3 * GB, 48 * GB, 10e9 / 8, 50e-6,
                           source="spec sheet (38.7 TFLOP/s fp32); 10 Gbps Ethernet as in E3"),
}


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


def measure_host(repeats: int = 5, read_mb: int = 64) -> DeviceProfile:
    """Measure this machine: fit overhead + FLOP/s to real layer times, and time cold reads."""
    shape = DISTILBERT
    times = measure_layer_times(shape, repeats)
    slope, intercept = np.polyfit(np.arange(1, shape.heads + 1), times, 1)
    return DeviceProfile("host", "This machine (measured)", "cpu", shape.shard_flops() / max(slope, 1e-9),
                         max(intercept, 0.0), measure_read_bandwidth(read_mb), _total_memory(),
                         source="measured by workbench (real layers; reads after posix_fadvise DONTNEED)")


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


def host_profile(remeasure: bool = False) -> DeviceProfile:
    """The measured ``host`` profile, cached in the cache directory (about 10 s to measure)."""
    from workbench.cache import write_json

    path = host_profile_path()
    if path.exists() and not remeasure:
        try:
            return DeviceProfile(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            print(f"workbench: {path} is damaged; measuring the host again")
    profile = measure_host()
    write_json(path, profile.to_dict())
    return profile


def profile_names() -> list[str]:
    return ["host", *PRESETS]


def get_profile(name: str) -> DeviceProfile:
    """A preset by name, or the measured ``host``."""
    if name == "host":
        return host_profile()
    if name not in PRESETS:
        raise UnknownNameError("device profile", name, profile_names())
    return PRESETS[name]


def pad_until(deadline_s: float) -> None:
    """Sleep until ``time.perf_counter()`` reaches ``deadline_s``: emulated work that finished early waits here.

    Work already past its deadline (slower here than on the device) returns at once."""
    while True:
        remaining_s = deadline_s - time.perf_counter()
        if remaining_s <= 0:
            return
        time.sleep(remaining_s)
