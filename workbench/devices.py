"""The papers' device and cluster presets, the measured ``host``, and emulation.

The presets emulate the papers' platforms (:mod:`workbench.hardware` says what a profile
is): where a paper published figures the parameters are fitted to them (``source`` says
which); the others come from spec sheets and are marked so. ``host`` is measured on this
machine (:mod:`workbench.hostprofile`: real layers, real reads after dropping the page
cache for the file).

Emulation slows real work on this machine down to a profile: a mechanism times
each read and each piece of compute and pads it with :func:`pad_until` to the
profile's predicted seconds, so a real run here takes as long as on the device.
"""
from __future__ import annotations

import time
from dataclasses import replace
from itertools import combinations

from workbench.errors import UnknownNameError
from workbench.hardware import DISTILBERT, GB, MB, MINILM, Cluster, DeviceProfile, LayerShape, Link
from workbench.hostprofile import host_profile

__all__ = ["DISTILBERT", "GB", "MB", "MINILM", "Cluster", "DeviceProfile", "LayerShape", "Link", "PRESETS",
           "CLUSTERS", "member", "profile_names", "get_profile", "emulated_name", "e3_cluster", "get_cluster",
           "pad_until"]


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


def pad_until(deadline_s: float) -> None:
    """Sleep until ``time.perf_counter()`` reaches ``deadline_s``: emulated work that finished early waits here.

    Work already past its deadline (slower here than on the device) returns at once."""
    while True:
        remaining_s = deadline_s - time.perf_counter()
        if remaining_s <= 0:
            return
        time.sleep(remaining_s)
