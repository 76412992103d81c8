"""Layer profiles: seconds per encoder layer, per exit ramp and for the embedding, against the batch size.

E3's optimizer and simulator need ``layer_latency(layer, batch, gpu_type)``; a :class:`LayerProfile` is that
function for one device, tabulated at a few batch sizes (1, 2, 4, ..., 64 by default) and interpolated linearly
between them. Two kinds:

- **Measured on this host** (:func:`host_layer_profile`): the shipped encoder (all-MiniLM-L6-v2, 6 layers,
  hidden 384) and one exit ramp per layer, timed with ``torch.set_num_threads(1)``, the single thread each
  Ray Serve replica of :mod:`workbench.earlyexit.serve` gets. Every figure is the median of repeats after a
  warm-up pass, the parts timed interleaved so that a slow moment of the machine spreads over all of them.
  What one thread limits: the profile is *per core*. Replicas placed on different cores do not slow each other
  only while no more of them run at once than the machine has cores (two on this 2-core host); beyond that
  they share cores and a real run is slower than the profile says. It also leaves out what several threads of
  one replica would gain. Cached in the workbench cache under a key of host, torch version, sequence length,
  batch sizes and model shape; ``remeasure=True`` measures again.
- **Published for E3's GPUs** (:func:`gpu_profile`): the V100, P100, K80 and A6000 read off published BERT-base
  batch curves (:mod:`workbench.earlyexit.gpu_curves`; the P100, K80 and A6000 curves derived from measured
  ones), another model shape at its work-equivalent batch. Not measured here: ``measured`` is False and
  ``source`` names the curve.

A ramp costs its own time (pooling, pooler, classifier, entropy and the exit test). On a GPU that is mostly
kernel launches and the host reading the exit decision back, modelled as :data:`RAMP_OVERHEAD_SHARE` of a
layer's batch-1 time; measured here it is whatever the ramp takes. Because the
ramp is its own entry, a caller can leave it out where a ramp is disabled (:meth:`LayerProfile.latency`'s
``ramp``), and a stock model without exits pays only the last one, its classifier.
"""
from __future__ import annotations

import math
import platform
import statistics
import time
from dataclasses import asdict, dataclass, fields
from numbers import Integral
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from workbench.errors import WorkbenchError

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
"""The batch sizes a profile is measured at; between them it is interpolated linearly."""
MAX_BATCH = 64
GPU_BATCH_SIZES = tuple(range(1, 65)) + (128, 256, 512, 1024)
"""A GPU profile's batch sizes: every batch a replica may run (1..64), then larger ones for studies."""
MAX_GPU_BATCH = 1024
DEFAULT_SEQ_LEN = 64
"""The sentiment task's max_length: the sequence length of a profile when none is given."""
RAMP_OVERHEAD_SHARE = 0.25
"""A GPU ramp's cost as a share of a layer's batch-1 time (assumed, not measured: a ramp is a few small kernels
and one read of the exit decision back to the host, a quarter of a layer's launches)."""
EMBED_OVERHEAD_SHARE = 0.5
"""The GPU embedding's cost as a share of a layer's batch-1 time (assumed, not measured)."""
NUM_CLASSES = 2

_VERSION = 1

BERT_SHAPES = {"bert-base": ((768, 12, 3072, 128), 12), "bert-large": ((1024, 16, 4096, 128), 24)}
"""(hidden, heads, FFN, tokens) and layers of the BERT shapes the paper evaluates."""


@dataclass(frozen=True)
class LayerProfile:
    """Seconds per part of an early-exit encoder at each of ``batch_sizes`` on one device.

    ``layer_s[k][j]``: encoder layer k on ``batch_sizes[j]`` samples; ``ramp_s[k][j]``: the exit ramp after
    layer k (the last one is the model's classifier); ``embed_s[j]``: the embedding. ``measured`` tells a
    measurement on this host (medians) from an estimate; ``source`` says how the figures came about."""
    batch_sizes: tuple[int, ...]
    layer_s: tuple[tuple[float, ...], ...]
    ramp_s: tuple[tuple[float, ...], ...]
    embed_s: tuple[float, ...]
    device: str
    seq_len: int
    threads: int
    measured: bool
    source: str
    hidden: int = 384

    def __post_init__(self):
        sizes = tuple(int(b) for b in self.batch_sizes)
        if not sizes or sizes[0] < 1 or any(b <= a for a, b in zip(sizes, sizes[1:])):
            raise WorkbenchError(f"a layer profile's batch sizes must be increasing whole numbers >= 1, got {sizes}")
        object.__setattr__(self, "batch_sizes", sizes)
        for name in ("layer_s", "ramp_s"):
            rows = tuple(tuple(float(v) for v in row) for row in getattr(self, name))
            object.__setattr__(self, name, rows)
        object.__setattr__(self, "embed_s", tuple(float(v) for v in self.embed_s))
        if not self.layer_s or len(self.ramp_s) != len(self.layer_s):
            raise WorkbenchError(f"a layer profile needs one row of ramp times per layer: {len(self.layer_s)} "
                                 f"layers, {len(self.ramp_s)} ramps")
        for row in (*self.layer_s, *self.ramp_s, self.embed_s):
            if len(row) != len(sizes):
                raise WorkbenchError(f"every row of a layer profile has one time per batch size ({len(sizes)}), "
                                     f"got {len(row)}")
            if not all(math.isfinite(v) and v >= 0 for v in row):
                raise WorkbenchError(f"layer profile times are seconds >= 0, got {row}")

    @property
    def num_layers(self) -> int:
        return len(self.layer_s)

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    def _batch(self, batch) -> int:
        low, high = self.batch_sizes[0], self.batch_sizes[-1]
        if isinstance(batch, bool) or not isinstance(batch, Integral) or not low <= int(batch) <= high:
            raise WorkbenchError(f"batch size {batch!r} is outside this layer profile's range: whole numbers "
                                 f"{low}..{high} (the batch sizes {'measured' if self.measured else 'tabulated'} "
                                 f"on {self.device}); give a batch in {low}..{high}")
        return int(batch)

    def _interpolate(self, row: Sequence[float], batch) -> float:
        return float(np.interp(self._batch(batch), self.batch_sizes, row))

    def _layer(self, layer) -> int:
        if isinstance(layer, bool) or not isinstance(layer, Integral) or not 0 <= int(layer) < self.num_layers:
            raise WorkbenchError(f"layer {layer!r} is not one of the profile's layers 0..{self.num_layers - 1}")
        return int(layer)

    def layer_time(self, layer: int, batch: int) -> float:
        """Seconds of encoder layer ``layer`` alone (no ramp) on ``batch`` samples."""
        return self._interpolate(self.layer_s[self._layer(layer)], batch)

    def ramp_time(self, layer: int, batch: int) -> float:
        """Seconds of the exit ramp after ``layer`` on ``batch`` samples."""
        return self._interpolate(self.ramp_s[self._layer(layer)], batch)

    def embed_time(self, batch: int) -> float:
        return self._interpolate(self.embed_s, batch)

    def latency(self, layer: int, batch: int, gpu_type: str | None = None, *, ramp: bool = True,
                embed: bool = True) -> float:
        """Seconds of ``layer`` on ``batch`` samples as the optimizer's ``layer_latency`` asks for it: the
        layer, its ramp (unless ``ramp=False``: a disabled ramp, or a model without exits; the last layer's
        classifier runs either way) and, for layer 0, the embedding (unless ``embed=False``). ``gpu_type`` is
        accepted for the optimizer's signature and not read: a profile is one device's (see
        :func:`latency_by_type` for several). Exact at the tabulated batch sizes, linear between them."""
        k = self._layer(layer)
        seconds = self.layer_time(k, batch)
        if ramp or k == self.num_layers - 1:
            seconds += self.ramp_time(k, batch)
        if embed and k == 0:
            seconds += self.embed_time(batch)
        return seconds

    __call__ = latency

    def adapter(self, *, ramps: bool | Iterable[int] = True, embed: bool = True) -> Callable[[int, int, str], float]:
        """``layer_latency(layer, batch, gpu_type)`` with every ramp (``ramps=True``), none but the classifier
        (``False``), or only those at the layers given."""
        enabled = None if isinstance(ramps, bool) else frozenset(int(k) for k in ramps)

        def layer_latency(layer: int, batch: int, gpu_type: str | None = None) -> float:
            on = ramps if enabled is None else layer in enabled
            return self.latency(layer, batch, gpu_type, ramp=on, embed=embed)

        return layer_latency

    def batch_seconds(self, batch: int, *, ramps: bool = True) -> float:
        """Seconds of the whole model on ``batch`` samples that all run to the end."""
        return sum(self.latency(k, batch, ramp=ramps) for k in range(self.num_layers))

    def to_dict(self) -> dict:
        return {"version": _VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, raw: dict) -> LayerProfile:
        """Read :meth:`to_dict`'s output; one saved by another version (or other fields) is refused."""
        names = {f.name for f in fields(cls)}
        if raw.get("version") != _VERSION or set(raw) - {"version"} != names:
            raise WorkbenchError(f"a layer profile saved by another version ({raw.get('version')!r}, this is "
                                 f"{_VERSION}); measure it again")
        return cls(**{k: v for k, v in raw.items() if k in names})

    def rows(self) -> list[dict]:
        """One row per batch size: milliseconds of the embedding, each layer and each ramp."""
        out = []
        for j, b in enumerate(self.batch_sizes):
            row = {"device": self.device, "batch": b, "seq_len": self.seq_len, "measured": self.measured,
                   "embed_ms": 1e3 * self.embed_s[j]}
            row.update({f"layer{k}_ms": 1e3 * r[j] for k, r in enumerate(self.layer_s)})
            row.update({f"ramp{k}_ms": 1e3 * r[j] for k, r in enumerate(self.ramp_s)})
            out.append(row)
        return out


def latency_by_type(profiles: Mapping[str, LayerProfile], *, ramps: bool | Iterable[int] = True,
                    embed: bool = True) -> Callable[[int, int, str], float]:
    """One ``layer_latency(layer, batch, gpu_type)`` over several devices' profiles, keyed by GPU type."""
    adapters = {name: p.adapter(ramps=ramps, embed=embed) for name, p in profiles.items()}

    def layer_latency(layer: int, batch: int, gpu_type: str) -> float:
        if gpu_type not in adapters:
            raise WorkbenchError(f"no layer profile for GPU type {gpu_type!r}; profiles: {', '.join(adapters)}")
        return adapters[gpu_type](layer, batch, gpu_type)

    return layer_latency


def _check_sizes(batch_sizes: Sequence[int], limit: int = MAX_BATCH) -> tuple[int, ...]:
    sizes = tuple(batch_sizes)
    bad = [b for b in sizes if isinstance(b, bool) or not isinstance(b, Integral) or not 1 <= b <= limit]
    if not sizes or bad:
        raise WorkbenchError(f"profile batch sizes are whole numbers 1..{limit}, got {list(sizes)}")
    return tuple(sorted(set(int(b) for b in sizes)))


# ------------------------------------------------------------------------------------------ measured here

def _host_key(seq_len: int, sizes: tuple[int, ...], repeats: int, cfg) -> dict:
    import torch

    return {"host": platform.node(), "machine": platform.machine(), "torch": torch.__version__, "seq_len": seq_len,
            "batch_sizes": list(sizes), "threads": 1, "hidden": cfg.hidden, "layers": cfg.num_layers,
            "ffn": cfg.ffn, "repeats": repeats}


def measure_layer_profile(seq_len: int = DEFAULT_SEQ_LEN, batch_sizes: Sequence[int] = BATCH_SIZES,
                          repeats: int = 5, *, num_classes: int = NUM_CLASSES, encoder=None) -> LayerProfile:
    """Time the shipped encoder's embedding, layers and one exit ramp per layer on this host, one thread.

    For each batch size: one untimed pass, then ``repeats`` passes in which every part is timed in model
    order; each figure is the median of its part's repeats. The inputs are random token ids with a full
    mask (every position real, the cost the task's longest inputs pay)."""
    import torch

    from workbench.earlyexit.model import ExitRamp
    from workbench.models.encoder import Encoder, load_pretrained_encoder

    sizes = _check_sizes(batch_sizes)
    if isinstance(seq_len, bool) or not isinstance(seq_len, Integral) or not 1 <= seq_len <= 512:
        raise WorkbenchError(f"seq_len must be a whole number of tokens 1..512, got {seq_len!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, Integral) or repeats < 1:
        raise WorkbenchError(f"repeats must be a whole number >= 1, got {repeats!r}")
    encoder = encoder if encoder is not None else load_pretrained_encoder(0)
    cfg = encoder.cfg
    torch.manual_seed(0)
    ramps = [ExitRamp(cfg.hidden, num_classes).eval() for _ in range(cfg.num_layers)]
    encoder.eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    L = cfg.num_layers
    embed, layers, ramp_t = [], [[] for _ in range(L)], [[] for _ in range(L)]
    try:
        with torch.no_grad():
            for b in sizes:
                gen = torch.Generator().manual_seed(b)
                ids = torch.randint(1000, cfg.vocab_size, (b, seq_len), generator=gen)
                mask = torch.ones(b, seq_len, dtype=torch.long)
                bias = Encoder.attn_bias(mask)
                samples = {"embed": [], **{("layer", k): [] for k in range(L)}, **{("ramp", k): [] for k in range(L)}}
                for rep in range(repeats + 1):                       # pass 0 warms up
                    t = time.perf_counter()
                    x = encoder.embed(ids)
                    now = time.perf_counter()
                    parts = [("embed", now - t)]
                    for k in range(L):
                        t = time.perf_counter()
                        x = encoder.layers[k](x, bias)
                        now = time.perf_counter()
                        parts.append((("layer", k), now - t))
                        t = now
                        ramps[k](x, mask)
                        parts.append((("ramp", k), time.perf_counter() - t))
                    if rep:
                        for key, s in parts:
                            samples[key].append(s)
                embed.append(statistics.median(samples["embed"]))
                for k in range(L):
                    layers[k].append(statistics.median(samples[("layer", k)]))
                    ramp_t[k].append(statistics.median(samples[("ramp", k)]))
    finally:
        torch.set_num_threads(threads)
    source = (f"measured on {platform.node()} ({platform.machine()}, torch {torch.__version__}), one thread: the "
              f"shipped encoder's layers and untrained exit ramps at sequence length {seq_len}, full masks, median "
              f"of {repeats} repeats after a warm-up pass at each batch size")
    return LayerProfile(sizes, tuple(map(tuple, layers)), tuple(map(tuple, ramp_t)), tuple(embed), "host",
                        seq_len, 1, True, source, hidden=cfg.hidden)


def layer_profile_path(seq_len: int = DEFAULT_SEQ_LEN, batch_sizes: Sequence[int] = BATCH_SIZES,
                       repeats: int = 5) -> Path:
    """Where :func:`host_layer_profile` caches its measurement for these settings (present or not)."""
    from workbench.cache import cache_dir, fingerprint
    from workbench.models.config import EncoderConfig

    key = _host_key(int(seq_len), _check_sizes(batch_sizes), int(repeats), EncoderConfig())
    return cache_dir() / "profiles" / f"earlyexit-layers-{fingerprint(key)}.json"


def host_layer_profile(seq_len: int | None = None, batch_sizes: Sequence[int] = BATCH_SIZES, repeats: int = 5, *,
                       task: str = "sentiment", remeasure: bool = False) -> LayerProfile:
    """:func:`measure_layer_profile` at ``seq_len`` (default: ``task``'s max_length), measured once and cached
    under a key of host, torch version, sequence length, batch sizes and repeats; ``remeasure=True`` measures
    again (as does a damaged or outdated file)."""
    from workbench.hostprofile import cached_measurement

    if seq_len is None:
        from workbench.data import task_spec

        seq_len = task_spec(task).max_length
    path = layer_profile_path(seq_len, batch_sizes, repeats)
    return cached_measurement(path, lambda: measure_layer_profile(seq_len, batch_sizes, repeats),
                              LayerProfile.from_dict, LayerProfile.to_dict, remeasure)


# ------------------------------------------------------------------------------------------ E3's GPUs

def model_shape(name: str | tuple) -> tuple:
    """``(LayerShape, num_layers)`` of ``"encoder"`` (the shipped MiniLM at the sentiment task's 64 tokens),
    ``"bert-base"`` or ``"bert-large"`` (128 tokens, as :func:`bert_problem`), or such a tuple itself."""
    from workbench.devices import LayerShape
    from workbench.models.config import EncoderConfig

    if isinstance(name, tuple) and len(name) == 2 and isinstance(name[0], LayerShape):
        return name
    if name == "encoder":
        cfg = EncoderConfig()
        return LayerShape(cfg.hidden, cfg.num_heads, cfg.ffn, DEFAULT_SEQ_LEN), cfg.num_layers
    if name in BERT_SHAPES:
        dims, layers = BERT_SHAPES[name]
        return LayerShape(*dims), layers
    raise WorkbenchError(f"unknown model shape {name!r}; known: encoder, {', '.join(BERT_SHAPES)}, or a "
                         "(LayerShape, num_layers) tuple")


SATURATIONS = ("published", "flatter", "steeper")
"""How a GPU profile reads its published curve: as printed, or with the rise above batch 1 smaller ("flatter",
batching pays more) or larger ("steeper") by the sources' disagreement (:data:`~workbench.earlyexit.gpu_curves.
BAND_FRACTION`): the band every goodput figure is given with."""


def _layer_flops(shape) -> float:
    """FLOPs of one sample through one layer of ``shape`` (every head)."""
    return shape.shard_flops() * shape.heads


def gpu_profile(gpu: str, shape: str | tuple = "bert-base", *, seq_len: int | None = None,
                batch_sizes: Sequence[int] = GPU_BATCH_SIZES, num_classes: int = NUM_CLASSES,
                saturation: str = "published") -> LayerProfile:
    """A :class:`LayerProfile` of ``shape`` (:func:`model_shape`) on E3's GPU type ``gpu``, from the published
    BERT-base batch curve of that GPU (:mod:`workbench.earlyexit.gpu_curves`, fp32; derived from a measured
    GPU's curve for the P100, K80 and A6000, as that module says).

    A layer of another shape or sequence length is read off the BERT-base curve at its work-equivalent batch:
    ``batch x`` its FLOPs per sample over a BERT-base layer's at 128 tokens, never below batch 1 (the fixed
    cost a GPU pays for any batch). A ramp (pooler, classifier, entropy, reading the exit decision back to the
    host: negligible FLOPs) costs :data:`RAMP_OVERHEAD_SHARE` and the embedding :data:`EMBED_OVERHEAD_SHARE` of
    a layer's batch-1 time, whatever the batch (assumed, not measured). ``saturation``: one of
    :data:`SATURATIONS`."""
    from dataclasses import replace

    from workbench.devices import LayerShape
    from workbench.earlyexit import gpu_curves

    if gpu not in gpu_curves.gpus("bert-base"):
        raise WorkbenchError(f"unknown GPU preset {gpu!r}; E3's: {', '.join(gpu_curves.gpus('bert-base'))}")
    if saturation not in SATURATIONS:
        raise WorkbenchError(f"saturation is one of {', '.join(SATURATIONS)}, got {saturation!r}")
    layer_shape, num_layers = model_shape(shape)
    if seq_len is not None:
        layer_shape = replace(layer_shape, seq_len=int(seq_len))
    sizes = _check_sizes(batch_sizes, MAX_GPU_BATCH)
    work = _layer_flops(layer_shape) / _layer_flops(LayerShape(768, 12, 3072, gpu_curves.SEQ_LEN))
    reference = gpu_curves.curve(gpu, "bert-base")
    per_layer = reference.num_layers

    def layer_s(b: int) -> float:
        eq = min(float(gpu_curves.MAX_BATCH), max(1.0, b * work))
        if saturation == "published":
            return gpu_curves.batch_latency_s(gpu, eq) / per_layer
        low, high = gpu_curves.saturation_band(gpu, eq)
        return (low if saturation == "flatter" else high) / per_layer

    layer = tuple(layer_s(b) for b in sizes)
    one = layer_s(1)
    ramp = (RAMP_OVERHEAD_SHARE * one,) * len(sizes)
    embed = (EMBED_OVERHEAD_SHARE * one,) * len(sizes)
    source = (f"published BERT-base batch curve of the {gpu} ({reference.source}; fp32, 128 tokens), a {layer_shape.hidden}-wide "
              f"layer at {layer_shape.seq_len} tokens read at {work:.3g} x the batch"
              + ("" if saturation == "published" else f", rise above batch 1 {saturation} by "
                 f"{100 * gpu_curves.BAND_FRACTION:.3g}%")
              + f"; a ramp {RAMP_OVERHEAD_SHARE:g} x and the embedding {EMBED_OVERHEAD_SHARE:g} x a layer at batch 1 "
                "(assumed)")
    return LayerProfile(sizes, (layer,) * num_layers, (ramp,) * num_layers, embed, gpu, layer_shape.seq_len, 0,
                        False, source, hidden=layer_shape.hidden)


def gpu_profiles(gpus: Iterable[str], shape: str | tuple = "bert-base", **kwargs) -> dict[str, LayerProfile]:
    """:func:`gpu_profile` of each GPU type."""
    return {g: gpu_profile(g, shape, **kwargs) for g in gpus}
