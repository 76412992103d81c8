"""What bringing missing chunks back costs (LLMS 3.3, "Profiling"): recompute and swap-in times.

LLMS approximates both with linear functions fitted to a one-shot measurement at installation:

- ``T_re(x) = a + b x``: seconds to recompute x chunks (layer by layer, as the loader does);
- ``T_IO(m) = c + m / bandwidth``: seconds to read m bytes of chunks from their swap files.

Here the read line has one more term, ``k`` seconds per chunk file read (its open and per-layer
calls): this host's reads of the shipped decoder's small chunks (230 KB at 8 bits) are not bound by
bytes alone. With ``k = 0`` it is the paper's line; every term is linear, so the planner's program
stays linear. Doing no work costs nothing (``T_re(0) = T_IO(0) = 0``); the planner counts the
intercepts only when a side has work.

:func:`profile_host` measures both on this machine with the real decoder and real reads of swap
files dropped from the page cache (``posix_fadvise(DONTNEED)``) and caches the result, with the
points the lines are fitted to, in the workbench cache. :func:`device_cost_model` derives a preset
for one of the LLMS paper's devices ("mi14", "orin-nx", "jetson-tx2"); its docstring has the numbers.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

from workbench.cache import cache_dir, fingerprint
from workbench.devices import emulated_name, get_profile, profile_names
from workbench.hostprofile import cached_measurement
from workbench.errors import UnknownNameError, WorkbenchError
from workbench.kvcache.chunks import CHUNK_SIZE, LEVELS, RAW_BITS, ChunkedKV, chunk_nbytes, recompress
from workbench.kvcache.swapfile import COLD_READS, read_chunk_layers, write_chunk

PROFILE_FORMAT = 3
"""Version of the saved JSON; format 1 had no per-chunk read term, format 2 measured chunks whose values
had per-channel scales (either is measured again when found)."""

# The paper's setting the presets reproduce: Llama2-7B (32 layers, hidden 4096, 6.74e9 parameters,
# full multi-head attention), 16-token chunks, KV at 8 bits, a 4K-token context.
PAPER_CHUNK_TOKENS = 16
PAPER_CONTEXT_TOKENS = 4096
PAPER_CHUNK_BYTES_8BIT = 32 * 2 * 4096 * PAPER_CHUNK_TOKENS            # 4,194,304 bytes of K and V codes
PAPER_CHUNK_FLOPS = 2 * 6.74e9 * PAPER_CHUNK_TOKENS                    # 2.16e11 FLOPs to recompute a chunk
MI14_CONTEXT_RECOMPUTE_S = 22.92                                       # the paper's Figure 2
MI14_DECODE_TOKEN_S = 0.05                                             # the paper's Figure 2: one decoded token
PAPER_LAYERS = 32


@dataclass(frozen=True, kw_only=True)
class SwapCostModel:
    """Recompute and swap-in times of one model's chunks on one device."""
    device: str                                        # "host" or a preset name
    source: Literal["measured", "emulated", "paper"]   # real runs here, a preset emulated on them, or the
                                                       # paper's device at its own model's dimensions
    num_layers: int                                    # layers the pipeline steps through
    chunk_size: int                                    # tokens per chunk
    chunk_bytes: dict[int, int]                        # bits -> bytes of one full chunk at that level
    recompute_fixed_s: float                           # a: seconds of any recompute, whatever its size
    recompute_per_chunk_s: float                       # b: seconds per chunk recomputed
    io_fixed_s: float                                  # c: seconds of any swap-in, whatever its size
    read_bytes_per_s: float                            # bandwidth of swap-in reads (inf: bytes cost nothing)
    io_per_chunk_s: float = 0.0                        # k: seconds per chunk read besides its bytes (paper: 0)
    recompute_points: tuple[tuple[float, ...], ...] = ()     # measured (chunks, seconds) the line fits
    io_points: tuple[tuple[float, ...], ...] = ()            # measured (chunks, bytes, seconds) the line fits
    notes: str = ""                                    # how the figures were obtained
    title: str = ""                                    # the preset's long name

    def __post_init__(self):
        object.__setattr__(self, "chunk_bytes", {int(k): int(v) for k, v in self.chunk_bytes.items()})
        object.__setattr__(self, "recompute_points", tuple(tuple(map(float, p)) for p in self.recompute_points))
        object.__setattr__(self, "io_points", tuple(tuple(map(float, p)) for p in self.io_points))
        if min(self.recompute_fixed_s, self.recompute_per_chunk_s, self.io_fixed_s, self.io_per_chunk_s) < 0 or \
                not self.read_bytes_per_s > 0:
            raise WorkbenchError("swap cost model: times must be >= 0 and the read bandwidth > 0, got "
                                 f"a={self.recompute_fixed_s}, b={self.recompute_per_chunk_s}, c={self.io_fixed_s}, "
                                 f"k={self.io_per_chunk_s}, bandwidth={self.read_bytes_per_s}")

    def t_re(self, chunks: float) -> float:
        """Seconds to recompute ``chunks`` chunks (0 for none)."""
        return 0.0 if chunks <= 0 else self.recompute_fixed_s + self.recompute_per_chunk_s * chunks

    def t_io(self, nbytes: float, chunks: int = 1) -> float:
        """Seconds to swap ``nbytes`` bytes in, held in ``chunks`` chunk files (0 for none)."""
        if nbytes <= 0:
            return 0.0
        return self.io_fixed_s + self.io_per_chunk_s * chunks + nbytes / self.read_bytes_per_s

    def recompute_to_load_ratio(self, bits: int = 8) -> float:
        """Seconds per further chunk recomputed (the slope b) over seconds to load one chunk at ``bits``."""
        return self.recompute_per_chunk_s / self.t_io(self.chunk_bytes[bits], 1)

    def to_dict(self) -> dict:
        return {"format": PROFILE_FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, raw: dict) -> SwapCostModel:
        raw = dict(raw)
        if raw.pop("format", None) != PROFILE_FORMAT:
            raise WorkbenchError("swap cost model has an unknown format; measure it again")
        return cls(**raw)


def device_label(costs: SwapCostModel | None) -> str:
    """The device a timeline's spans belong to: "host", or "<preset> emulated on this host"."""
    return "host" if costs is None or costs.source == "measured" else emulated_name(costs.device)


def fit_linear(points) -> tuple[float, ...]:
    """Non-negative least squares of seconds on an intercept and the other coordinates: ``points`` are
    (x_1, ..., x_n, seconds); returns (intercept, coefficient of x_1, ..., coefficient of x_n)."""
    from scipy.optimize import nnls

    data = np.asarray(points, dtype=float)
    features = np.column_stack([np.ones(len(data)), data[:, :-1]])
    scale = np.abs(features).max(axis=0)                       # bytes and counts differ by 1e5
    coef, _ = nnls(features / scale, data[:, -1])
    return tuple(float(v) for v in coef / scale)


def model_chunk_bytes(cfg, chunk_size: int = CHUNK_SIZE) -> dict[int, int]:
    """Bytes of one full chunk of the decoder ``cfg`` at every level."""
    shape = (cfg.num_layers, 2, cfg.num_kv_heads, chunk_size, cfg.head_dim)
    return {bits: chunk_nbytes(shape, bits) for bits in (*RAW_BITS, *LEVELS)}


def synthetic_context(model, num_chunks: int, chunk_size: int = CHUNK_SIZE, bits: int = 8, seed: int = 0):
    """A context of ``num_chunks`` full chunks of seeded random token ids, prefilled and held at ``bits``."""
    import torch

    from workbench.models.decoder import KVCache

    ids = np.random.default_rng(seed).integers(3, model.cfg.vocab_size, num_chunks * chunk_size).tolist()
    cache = KVCache.empty(model.cfg, len(ids))
    model.forward_tokens(torch.tensor(ids), cache)
    kv = ChunkedKV.for_decoder(model.cfg, chunk_size)
    kv.absorb(cache, ids, bits=bits)
    return kv


def timed_rounds(tasks, repeats: int) -> list[float]:
    """Median seconds of each ``(prepare, run)`` task's ``run``. Every round times each task once, so a
    burst of other work on a shared machine spoils one sample of several tasks, not all of one."""
    samples: list[list[float]] = [[] for _ in tasks]
    for _ in range(repeats):
        for collected, (prepare, run) in zip(samples, tasks):
            prepare()
            t = time.perf_counter()
            run()
            collected.append(time.perf_counter() - t)
    return [float(np.median(s)) for s in samples]


def measure_recompute(model, chunk_size: int = CHUNK_SIZE, context_chunks: int = 8,
                      counts=(1, 2, 4, 8), repeats: int = 3) -> list[tuple[int, float]]:
    """(x, median seconds) to recompute the first x chunks of an 8-bit context of ``context_chunks`` chunks,
    per x in ``counts`` (the planner recomputes the earliest chunks), after one untimed warm-up."""
    from workbench.kvcache.recompute import recompute_chunks

    kv = synthetic_context(model, context_chunks, chunk_size)
    kept = list(kv.chunks)
    recompute_chunks(model, kv.tokens, kv, [0])

    def reset():
        kv.chunks = list(kept)

    tasks = [(reset, lambda x=x: recompute_chunks(model, kv.tokens, kv, range(x))) for x in counts]
    return [(int(x), s) for x, s in zip(counts, timed_rounds(tasks, repeats))]


def measure_swap_in(model, chunk_size: int = CHUNK_SIZE, counts=(1, 2, 4, 8), levels=LEVELS,
                    repeats: int = 3, directory: Path | None = None) -> tuple[list[tuple[int, int, float]], bool]:
    """(x, bytes, median seconds) to read x chunk files layer by layer, as the loader's IO thread does, each
    file dropped from the page cache first; per level and x in ``counts``. Also whether the cache could be dropped."""

    kv = synthetic_context(model, max(counts), chunk_size)
    shape = kv.chunks[0].shape
    with tempfile.TemporaryDirectory(dir=directory or cache_dir(), prefix=".swapprobe-") as tmp:
        files = {}
        for bits in levels:
            files[bits] = [(Path(tmp) / f"{bits}-{i}.bin", bits, shape) for i in range(len(kv.chunks))]
            for (path, _, _), chunk in zip(files[bits], kv.chunks):
                write_chunk(path, recompress(chunk, bits))
        cases = [(bits, x) for bits in levels for x in counts]
        tasks = [(lambda: None, lambda bits=bits, x=x: read_chunk_layers(files[bits][:x], cold=True))
                 for bits, x in cases]
        seconds = timed_rounds(tasks, repeats)
    return [(x, x * chunk_nbytes(shape, bits), s) for (bits, x), s in zip(cases, seconds)], COLD_READS


def _check_measured_chunk_size(model, chunk_size: int) -> None:
    """The measurement prefills 8 chunks: they must fit the decoder's context (checked before any work)."""
    from workbench.kvcache.limits import measured_chunk_size_for

    measured_chunk_size_for(model.cfg.max_positions).check("chunk_size", chunk_size)


def measure_host(model, chunk_size: int = CHUNK_SIZE, repeats: int = 3) -> SwapCostModel:
    """Measure and fit both lines on this machine (about 10 s on 2 cores for the shipped decoder)."""
    _check_measured_chunk_size(model, chunk_size)
    re_points = measure_recompute(model, chunk_size, repeats=repeats)
    io_points, dropped = measure_swap_in(model, chunk_size, repeats=repeats)
    a, b = fit_linear(re_points)
    c, k, per_byte = fit_linear(io_points)
    notes = (f"measured: recompute of the first 1-8 chunks of a {8 * chunk_size}-token 8-bit context; "
             "reads of 8/4/2-bit swap files layer by layer after posix_fadvise(DONTNEED)" if dropped else
             "measured, but the page cache could not be dropped: reads may come from memory")
    return SwapCostModel(device="host", source="measured", num_layers=model.cfg.num_layers, chunk_size=chunk_size,
                         chunk_bytes=model_chunk_bytes(model.cfg, chunk_size), recompute_fixed_s=a,
                         recompute_per_chunk_s=b, io_fixed_s=c, io_per_chunk_s=k,
                         read_bytes_per_s=1.0 / per_byte if per_byte > 0 else float("inf"),
                         recompute_points=re_points, io_points=io_points, notes=notes, title="This machine")


def host_cost_path(model, chunk_size: int = CHUNK_SIZE) -> Path:
    """Where the host's measured model for this decoder and chunk size is cached."""
    key = fingerprint({"cfg": asdict(model.cfg), "chunk_size": chunk_size, "format": PROFILE_FORMAT})
    return cache_dir() / "profiles" / f"kvcache-host-{key}.json"


def host_costs_cached(model, chunk_size: int = CHUNK_SIZE) -> bool:
    """Whether :func:`profile_host` will read the host's model from the cache rather than measure it."""
    return host_cost_path(model, chunk_size).exists()


def profile_host(model, chunk_size: int = CHUNK_SIZE, remeasure: bool = False, repeats: int = 3) -> SwapCostModel:
    """The host's measured swap cost model, from the cache or measured once (``repeats`` per point) and cached."""
    _check_measured_chunk_size(model, chunk_size)
    return cached_measurement(host_cost_path(model, chunk_size), lambda: measure_host(model, chunk_size, repeats),
                              SwapCostModel.from_dict, SwapCostModel.to_dict, remeasure)


SWAP_PRESETS = tuple(profile_names("llms", host=False))


def paper_recompute_line(device: str) -> tuple[float, float, str]:
    """The paper's recompute line on ``device`` for Llama2-7B: ``(a, b, source)``, ``T_re(x) = a + b x``
    seconds for x 16-token chunks.

    MI14, from the paper's Figure 2: a forward pass of one token takes 0.05 s whatever the context (the
    weights streamed once), a whole 4,096-token context 22.92 s, so a = 0.05 s and b = (22.92 - 0.05) / 256
    = 89.3 ms per chunk. The paper gives no recompute figures for the Jetsons: b is a chunk's FLOPs at
    the preset's FLOP/s and a keeps MI14's proportion a / b (estimates, not measured)."""
    if device not in SWAP_PRESETS:
        raise UnknownNameError("swap device preset", device, profile_names("llms"))
    chunks = PAPER_CONTEXT_TOKENS / PAPER_CHUNK_TOKENS
    b_mi14 = (MI14_CONTEXT_RECOMPUTE_S - MI14_DECODE_TOKEN_S) / chunks
    if device == "mi14":
        return MI14_DECODE_TOKEN_S, b_mi14, (
            f"LLMS paper Figure 2: one decoded token {MI14_DECODE_TOKEN_S} s (the fixed term), a "
            f"{PAPER_CONTEXT_TOKENS}-token Llama2-7B context {MI14_CONTEXT_RECOMPUTE_S} s on MI14, "
            f"{b_mi14 * 1e3:.1f} ms per further chunk")
    b = PAPER_CHUNK_FLOPS / get_profile(device).flops_per_s
    a = b * MI14_DECODE_TOKEN_S / b_mi14
    return a, b, (f"{PAPER_CHUNK_FLOPS:.3g} FLOPs per Llama2-7B chunk at the preset's "
                  f"{get_profile(device).flops_per_s:.3g} FLOP/s, {b * 1e3:.1f} ms per chunk, and MI14's "
                  f"fixed-to-per-chunk proportion, {a * 1e3:.1f} ms (estimates, not measured)")


def paper_chunk_times(device: str) -> tuple[float, float, str]:
    """(seconds per chunk recomputed, the slope b of :func:`paper_recompute_line`; seconds to load one 8-bit
    Llama2-7B chunk) on ``device``, and their source."""
    _, recompute_s, how = paper_recompute_line(device)
    dev = get_profile(device)
    load_s = PAPER_CHUNK_BYTES_8BIT / dev.read_bytes_per_s
    how += (f"; loading its {PAPER_CHUNK_BYTES_8BIT / 1e6:.2f} MB of 8-bit K/V at the preset's "
            f"{dev.read_bytes_per_s / 1e9:.2f} GB/s takes {load_s * 1e3:.2f} ms ({dev.source})")
    return recompute_s, load_s, how


def paper_cost_model(device: str) -> SwapCostModel:
    """``device``'s cost model at the paper's own dimensions (Llama2-7B: 32 layers, 4 MB 8-bit chunks of 16
    tokens), from the paper's figures and the preset's read bandwidth; for predictions only (nothing
    runs at this size here). Chunk bytes per level are the codes alone, as the paper counts them."""
    a, b, how = paper_recompute_line(device)
    dev = get_profile(device)
    chunk_bytes = {bits: PAPER_CHUNK_BYTES_8BIT * bits // 8 for bits in (*RAW_BITS, *LEVELS)}
    return SwapCostModel(device=device, source="paper", num_layers=PAPER_LAYERS, chunk_size=PAPER_CHUNK_TOKENS,
                         chunk_bytes=chunk_bytes, recompute_fixed_s=a, recompute_per_chunk_s=b, io_fixed_s=0.0,
                         read_bytes_per_s=dev.read_bytes_per_s, title=dev.title,
                         notes=f"Llama2-7B at the paper's dimensions: {how}; reads at {dev.read_bytes_per_s / 1e9:.2f} "
                               f"GB/s ({dev.source})")


def pipeline_bound(costs: SwapCostModel, bits: int = 8) -> float:
    """The most the swapping-recompute pipeline can speed up a load of many ``bits``-bit chunks against
    reading them all: 1 + 1/R, R = seconds per chunk recomputed / seconds per chunk read (overlapping y
    recomputed with x - y read is best when both sides take as long: y = x / (R + 1))."""
    return 1.0 + 1.0 / costs.recompute_to_load_ratio(bits)


def device_cost_model(device: str, host: SwapCostModel) -> SwapCostModel:
    """The cost model of ``device`` emulated on the host measured as ``host`` ("host" gives ``host``).

    The paper's pipeline decides by how dear recomputing a chunk is against loading it, and by the fixed
    cost of any recompute. A preset keeps both proportions of the paper's Llama2-7B on that device
    (:func:`paper_recompute_line`, :func:`paper_chunk_times`): R = b / (one 8-bit chunk's load time) and
    rho = a / b. MI14: b 89.3 ms, a 50 ms, load 2.10 ms (R 42.5, rho 0.56; UFS 4.0 at 2 GB/s an
    estimate); Orin NX: 53.9 ms, load 2.80 ms (R 19.3; 4 TFLOP/s and NVMe at 1.5 GB/s, estimates); TX2:
    431 ms, load 41.9 ms (R 10.3; 0.5 TFLOP/s and a SATA HDD at 0.1 GB/s, estimates).

    A preset's reads are bound by bandwidth, as the paper's 4 MB chunks are on those devices: no fixed
    or per-file term, so a 2-bit chunk loads in its share of an 8-bit chunk's time. (This host's reads
    of the shipped decoder's 0.1-0.2 MB chunk files are bound by per-file costs instead: a 2-bit chunk
    reads almost as slowly as an 8-bit one, which would hide what compression saves.)

    Emulation can only slow the host down (padding compute, throttling reads), so the preset is the
    fastest line with the paper's proportions that is nowhere faster than the host: b is the least that
    keeps a + b x >= the host's recompute for every x >= 1 chunks and keeps the 8-bit load b / R no
    shorter than the host's slowest read per byte; a = rho b.
    """
    if device == "host":
        return host
    a_paper, b_paper, _ = paper_recompute_line(device)
    recompute_s, load_s, how = paper_chunk_times(device)
    ratio, rho = recompute_s / load_s, a_paper / b_paper
    bytes8 = host.chunk_bytes[8]
    per_byte = max(host.t_io(n, 1) / n for n in host.chunk_bytes.values())
    b = max(host.recompute_per_chunk_s, host.t_re(1) / (1 + rho), ratio * per_byte * bytes8)
    load8 = b / ratio
    return replace(host, device=device, source="emulated", title=get_profile(device).title,
                   recompute_fixed_s=rho * b, recompute_per_chunk_s=b,
                   io_fixed_s=0.0, io_per_chunk_s=0.0, read_bytes_per_s=bytes8 / load8,
                   recompute_points=(), io_points=(),
                   notes=f"the paper's proportions, recompute/load {ratio:.1f} per 8-bit chunk and fixed/per-chunk "
                         f"recompute {rho:.2f}, from: {how}; as slow as needed to stay at or above this host: "
                         f"recompute {rho * b * 1e3:.0f} ms + {b * 1e3:.0f} ms per chunk (host {host.recompute_fixed_s * 1e3:.0f} "
                         f"+ {host.recompute_per_chunk_s * 1e3:.0f}), reads bound by bandwidth at "
                         f"{bytes8 / load8 / 1e6:.0f} MB/s (an 8-bit chunk {load8 * 1e3:.2f} ms against "
                         f"{host.t_io(bytes8, 1) * 1e3:.2f} ms on the host); writes of evicted chunks are taken to "
                         f"run at the same bandwidth")
