"""Hardware profiles for elastic pipelining (WRX section 5.2).

A :class:`CostModel` holds the two functions the planner needs:

- ``t_io(k)``: seconds to read one shard stored at k bits (k = 2..6 and 32);
- ``t_comp(m)``: seconds to compute one layer with m shards at the padded input
  length, including decompressing its m shards (measured with 6-bit shards, as the paper
  prescribes, on one thread as the pipeline decodes them).

:func:`measure_cost_model` measures both on this machine with real reads from the
shard store (the layer file is dropped from the page cache with
``posix_fadvise(DONTNEED)`` before every read, so each read comes from the disk;
on file systems that ignore the hint the figure is a page-cache read and the
profile says so in ``notes``) and real dry runs of one layer. :func:`device_cost_model`
derives the same functions for an emulated device preset from
:mod:`workbench.devices`, using the store's real shard sizes. Profiles are saved as
JSON next to the store they describe.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

from workbench.errors import WorkbenchError

PROFILE_FORMAT = 2
"""Version of the saved JSON; format 1 kept the store version, repeats and title in an ``extra`` dict."""


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """``t_io(bits)`` per shard and ``t_comp(m)`` per layer for one device, model and input length."""
    device: str                                       # "host" or a preset name
    seq_len: int                                      # padded input length the compute times hold for
    num_layers: int                                   # N
    num_shards: int                                   # M
    io_s: dict[int, float]                            # bits -> seconds to read one shard
    comp_s: tuple[float, ...]                         # comp_s[m - 1]: seconds for one layer with m shards
    shard_bytes: dict[int, int]                       # bits -> bytes of one shard on disk
    source: Literal["measured", "emulated"] = "measured"   # real runs here, or a preset's figures
    notes: str = ""                                   # how the figures were obtained (e.g. page cache caveats)
    store_version: str = ""                           # the shard store the sizes and times come from
    repeats: int = 0                                  # measurements per median ("measured" only)
    title: str = ""                                   # the device preset's long name ("emulated" only)

    def __post_init__(self):
        object.__setattr__(self, "io_s", {int(k): float(v) for k, v in self.io_s.items()})
        object.__setattr__(self, "shard_bytes", {int(k): int(v) for k, v in self.shard_bytes.items()})
        object.__setattr__(self, "comp_s", tuple(float(v) for v in self.comp_s))
        if len(self.comp_s) != self.num_shards:
            raise ValueError(f"comp_s needs one time per width 1..{self.num_shards}, got {len(self.comp_s)}")
        bad = {k: v for k, v in self.io_s.items() if not v > 0} | {m + 1: v for m, v in enumerate(self.comp_s)
                                                                     if not v > 0}
        if bad:
            raise ValueError(f"profile times must be positive, got {bad}")

    @property
    def bitwidths(self) -> tuple[int, ...]:
        return tuple(sorted(self.io_s))

    def t_io(self, bits: int) -> float:
        """Seconds to read one shard at ``bits``."""
        try:
            return self.io_s[int(bits)]
        except KeyError:
            raise WorkbenchError(f"profile {self.device!r} has no {bits}-bit shards; it has "
                                 f"{', '.join(map(str, self.bitwidths))}") from None

    def t_comp(self, m: int) -> float:
        """Seconds to decompress and compute one layer with ``m`` shards."""
        if not 1 <= m <= self.num_shards:
            raise ValueError(f"a layer has 1..{self.num_shards} shards, got m={m}")
        return self.comp_s[m - 1]

    def to_dict(self) -> dict:
        return {"format": PROFILE_FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, raw: dict) -> "CostModel":
        """Read :meth:`to_dict`'s output, format 1 (an ``extra`` dict) included."""
        raw = dict(raw)
        version = raw.pop("format", None)
        if version == 1:
            extra = raw.pop("extra", None) or {}
            raw.update(store_version=extra.get("store", ""), repeats=extra.get("repeats", 0),
                       title=extra.get("title", ""))
        elif version != PROFILE_FORMAT:
            raise WorkbenchError("elastic profile has an unknown format; measure it again")
        return cls(**raw)

    def save(self, path: Path | str) -> Path:
        from workbench.cache import write_json

        path = Path(path)
        write_json(path, self.to_dict())
        return path

    @classmethod
    def load(cls, path: Path | str) -> "CostModel":
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise WorkbenchError(f"cannot read elastic profile {path}: {exc}") from exc
        return cls.from_dict(raw)

    def replace_bits(self, keep) -> "CostModel":
        """The same profile restricted to the bitwidths in ``keep`` (for what-if studies and tests)."""
        keep = {int(b) for b in keep}
        return replace(self, io_s={k: v for k, v in self.io_s.items() if k in keep},
                       shard_bytes={k: v for k, v in self.shard_bytes.items() if k in keep})


def _mean_shard_bytes(store) -> dict[int, int]:
    cfg = store.cfg
    return {bits: int(round(np.mean([store.entry(n, i, bits).nbytes for n in range(cfg.num_layers)
                                     for i in range(cfg.num_heads)]))) for bits in store.bitwidths}


def drop_page_cache(path: Path) -> bool:
    """Ask the kernel to drop ``path`` from the page cache; False where that is not supported."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    finally:
        os.close(fd)


def measure_io(store, repeats: int = 5) -> tuple[dict[int, float], bool]:
    """Median seconds to read one shard per bitwidth, each read cold (see module notes)."""
    cfg = store.cfg
    dropped = True
    io = {}
    for bits in store.bitwidths:
        samples = []
        for r in range(repeats):
            n, i = r % cfg.num_layers, (3 * r) % cfg.num_heads
            dropped &= drop_page_cache(store.layer_path(n))
            e = store.entry(n, i, bits)
            t = time.perf_counter()
            with open(store.layer_path(n), "rb", buffering=0) as handle:
                handle.seek(e.offset)
                handle.read(e.nbytes)
            samples.append(time.perf_counter() - t)
        io[bits] = float(np.median(samples))
    return io, dropped


def measure_compute(store, seq_len: int, repeats: int = 5, bits: int = 6) -> list[float]:
    """Median seconds of a dry run of one layer per width m: decompress m ``bits``-bit shards, then compute."""
    import torch

    from workbench.models.encoder import sharded_layer, stack_shards

    cfg = store.cfg
    model = store.model_with_bits(np.full((cfg.num_layers, cfg.num_heads), 32))
    layer = model.layers[0]
    resident = layer.resident()
    biases = [layer.shard_biases(i) for i in range(cfg.num_heads)]
    blobs = [store.read_blob(0, i, bits) for i in range(cfg.num_heads)]
    work = np.empty((cfg.num_heads, store.shard_params), np.float32)         # the working buffer
    x = torch.randn(1, seq_len, cfg.hidden)
    out = []
    with torch.no_grad():
        for m in range(1, cfg.num_heads + 1):
            samples = []
            for _ in range(repeats + 1):
                t = time.perf_counter()
                shards = [store.split(store.decode(blobs[i], bits, out=work[i], num_threads=1)) for i in range(m)]
                parts = stack_shards(shards, biases[:m])
                sharded_layer(x, None, resident, parts, cfg.head_dim, cfg.layer_norm_eps)
                samples.append(time.perf_counter() - t)
            out.append(float(np.median(samples[1:])))
    return out


def measure_cost_model(store, seq_len: int, repeats: int = 5) -> CostModel:
    """Measure ``t_io`` and ``t_comp`` for ``store`` on this machine."""
    io, dropped = measure_io(store, repeats)
    comp = measure_compute(store, seq_len, repeats)
    notes = ("reads after posix_fadvise(DONTNEED) on the layer file" if dropped else
             "page cache could not be dropped: reads may come from memory")
    return CostModel(device="host", seq_len=seq_len, num_layers=store.cfg.num_layers, num_shards=store.cfg.num_heads,
                     io_s=io, comp_s=comp, shard_bytes=_mean_shard_bytes(store), source="measured", notes=notes,
                     store_version=store.version, repeats=repeats)


def device_cost_model(device: str, store, seq_len: int) -> CostModel:
    """An emulated preset's profile for ``store``'s model at ``seq_len`` (``host`` is measured and cached)."""
    from workbench.devices import LayerShape, get_profile

    if device == "host":
        return host_cost_model(store, seq_len)
    dev = get_profile(device)
    cfg = store.cfg
    shape = LayerShape(cfg.hidden, cfg.num_heads, cfg.ffn, seq_len)
    nbytes = _mean_shard_bytes(store)
    io = {bits: dev.read_s(b) for bits, b in nbytes.items()}
    comp = [dev.layer_compute_s(m, shape) for m in range(1, cfg.num_heads + 1)]
    return CostModel(device=device, seq_len=seq_len, num_layers=cfg.num_layers, num_shards=cfg.num_heads, io_s=io,
                     comp_s=comp, shard_bytes=nbytes, source="emulated", notes=dev.source,
                     store_version=store.version, title=dev.title)


def host_cost_model(store, seq_len: int, remeasure: bool = False) -> CostModel:
    """The measured host profile for ``store`` at ``seq_len``, cached beside the store."""
    from workbench.hostprofile import cached_measurement

    return cached_measurement(store.root / f"profile-host-{store.version}-T{seq_len}.json",
                              lambda: measure_cost_model(store, seq_len), CostModel.from_dict, CostModel.to_dict,
                              remeasure)
