"""This machine measured: real encoder layers timed at every shard count and batch, cold reads timed after
dropping the page cache, fitted to a :class:`~workbench.hardware.DeviceProfile` named ``host`` and cached."""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

from workbench.errors import WorkbenchError
from workbench.hardware import DISTILBERT, DeviceProfile, LayerShape

T = TypeVar("T")


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
