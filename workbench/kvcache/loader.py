"""Bringing a context's missing chunks back with the swapping-recompute pipeline (LLMS 3.3 and 4).

An IO thread reads the plan's to-load chunks from their swap files one layer at a time (every
file's layer l, then layer l + 1, ...), while the calling thread recomputes the to-recompute
chunks layer by layer (:class:`~workbench.kvcache.recompute.LayerRecompute`). Recomputing layer l
attends to every other chunk's K/V of layer l, so the compute thread starts layer l only once the
IO thread has read it: as in the paper, the next layer is read while the current one is recomputed.

With ``emulate`` (a preset :class:`~workbench.kvcache.costmodel.SwapCostModel`) each layer's reads
and recompute are padded to the preset's share of ``T_IO`` and ``T_re`` per layer, so the run takes
as long as it would on that device; a host slower than the preset stays as slow as it is.

While the IO thread reads and nothing is to be recomputed, the calling thread runs the caller's
``meanwhile`` work (the service writes the chunks already in memory into its working cache).

Loaded chunks are kept as stored (their level, codes and scales as in the file);
recomputed chunks are stored at the level they were swapped out with, encoded as every route encodes it
(``encode_at_level``: 8 bits first, then the lower level), so reading and recomputing agree.
"""
from __future__ import annotations

import queue
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from workbench.devices import pad_until, profile_names
from workbench.errors import UnknownNameError, WorkbenchError
from workbench.kvcache.chunks import CHUNK_SIZE, ChunkedKV, encode_at_level
from workbench.kvcache.costmodel import SwapCostModel, device_cost_model, device_label, profile_host
from workbench.kvcache.planner import MissingChunk, SwapPlan, fixed_plan, plan_swap_recompute
from workbench.kvcache.recompute import LayerRecompute, held_layers
from workbench.kvcache.swapfile import DamagedChunkFileError, LayerBytes, file_size, stack_layers, stream_layers
from workbench.timeline import Span, Timeline


def missing_chunks(kv: ChunkedKV, files: Mapping[int, tuple[Path, int]]) -> list[MissingChunk]:
    """Every chunk of ``kv`` not in memory, for the planner; ``files`` maps each to its swap file and level."""
    absent = [i for i in kv.missing() if i not in files]
    if absent:
        raise WorkbenchError(f"chunks {absent} are not in memory and have no swap file")
    return [MissingChunk(i, int(files[i][1]), file_size(int(files[i][1]), chunk_shape(kv, i))) for i in kv.missing()]


def chunk_shape(kv: ChunkedKV, index: int) -> tuple[int, ...]:
    start, end = kv.span(index)
    return kv.layers, 2, kv.kv_heads, end - start, kv.head_dim


@dataclass(frozen=True, kw_only=True)
class LoadResult:
    """What one load did, measured, beside the plan's prediction."""
    timeline: Timeline                  # measured: "swap_in" on lane "io"; "recompute", "stall" and the
                                        # meanwhile work ("decompress") on "compute"
    predicted: Timeline                 # the plan's timeline
    latency_s: float                    # seconds from the start of the load to the last chunk in memory
    predicted_s: float                  # the plan's predicted seconds
    recomputed: tuple[int, ...]         # chunks rebuilt from their tokens
    loaded: tuple[int, ...]             # chunks read from swap files
    bytes_read: int                     # bytes of the swap files read
    emulated: str = ""                  # the preset the run was padded to ('' on the host)
    missing_bits: tuple[int, ...] = ()  # the level of every chunk brought back, in chunk order

    def check(self):
        """This load against its plan (``workbench.prediction``): a note when it misses by more than 20 %."""
        from workbench.prediction import check_prediction

        return check_prediction(self.timeline, self.predicted, self.latency_s, self.predicted_s,
                                emulated=self.emulated)


def _check_plan(kv: ChunkedKV, files: Mapping[int, tuple[Path, int]], plan: SwapPlan) -> None:
    planned = set(plan.recompute) | set(plan.load)
    if set(plan.recompute) & set(plan.load):
        raise WorkbenchError(f"chunks {sorted(set(plan.recompute) & set(plan.load))} are planned both ways")
    if planned != set(kv.missing()):
        raise WorkbenchError(f"the plan brings back chunks {sorted(planned)}, but chunks {kv.missing()} are missing")
    absent = sorted(i for i in planned if i not in files)
    if absent:
        raise WorkbenchError(f"chunks {absent} have no swap file (needed for their level, or to read them)")


def _check_sizes(to_load, indices) -> None:
    """Every file to read exists with the size its level and shape make; else the chunks are named."""
    bad = {}
    for (path, bits, shape), i in zip(to_load, indices):
        try:
            size = path.stat().st_size
        except OSError as exc:
            bad[i] = f"{path} cannot be read ({exc.strerror or exc})"
            continue
        if size != file_size(bits, shape):
            bad[i] = f"{path} holds {size} bytes, expected {file_size(bits, shape)}"
    if bad:
        raise DamagedChunkFileError(bad)


def _check_crcs(to_load, indices, stored: list[list[LayerBytes]], crcs: Mapping[int, int | None]) -> None:
    """Each read file's CRC-32 over its bytes in file order (payloads, minima, steps) equals the index's."""
    bad = {}
    for (path, _, _), i, parts in zip(to_load, indices, stored):
        expected = crcs.get(i)
        if expected is None:
            continue
        crc = 0
        for part in range(3):
            for layer in parts:
                crc = zlib.crc32(layer[part], crc)
        if crc != expected:
            bad[i] = f"{path} fails its CRC-32 check ({crc:#010x}, the index says {expected:#010x})"
    if bad:
        raise DamagedChunkFileError(bad)


@torch.no_grad()
def load_context(model, kv: ChunkedKV, missing_files: Mapping[int, tuple[Path, int]], plan: SwapPlan,
                 emulate: SwapCostModel | None = None, cold: bool = True,
                 crcs: Mapping[int, int | None] | None = None,
                 meanwhile: Callable[[], None] | None = None) -> LoadResult:
    """Bring every missing chunk of ``kv`` back following ``plan``; ``missing_files`` maps each missing chunk
    to ``(swap file, bits)``. ``cold`` drops the files to read from the page cache as they are opened.

    ``crcs``: the index's CRC-32 per chunk file; a file of the wrong size, or whose bytes fail the check,
    raises :class:`DamagedChunkFileError` naming every such chunk, and ``kv`` is left as it was.
    ``meanwhile``: work for this thread while the reads are in flight, run once when chunks are read and
    none recomputed (a "decompress" span on the compute lane), else not at all."""
    _check_plan(kv, missing_files, plan)
    device = device_label(emulate)
    layers = kv.layers
    to_load = [(Path(missing_files[i][0]), int(missing_files[i][1]), chunk_shape(kv, i)) for i in plan.load]
    _check_sizes(to_load, plan.load)
    bytes_read = sum(file_size(bits, shape) for _, bits, shape in to_load)
    job = LayerRecompute(model, kv.tokens, kv, plan.recompute)
    needed = set(job.needed)
    from_memory = sorted(needed - set(plan.load))            # in memory: _check_plan covers every missing chunk
    spans: list[Span] = []
    arrivals: queue.Queue = queue.Queue()
    failure: list[BaseException] = []
    io_layer_s = emulate.t_io(bytes_read, len(to_load)) / layers if emulate is not None else 0.0
    re_layer_s = emulate.t_re(len(plan.recompute)) / layers if emulate is not None else 0.0
    t0 = time.perf_counter()

    def io_worker():
        try:
            start = time.perf_counter()
            for layer, parts, values in stream_layers(to_load, cold):
                pad_until(start + io_layer_s)
                end = time.perf_counter()
                spans.append(Span("io", "swap_in", start - t0, end - t0, f"layer {layer}", {"chunks": len(to_load)},
                                  device, nbytes=bytes_read // layers, layer=layer))
                arrivals.put((layer, parts, values))
                start = end
        except BaseException as exc:                      # surfaced in the calling thread
            failure.append(exc)
            arrivals.put((None, None, None))

    io_thread = threading.Thread(target=io_worker, name="llms-io", daemon=True)
    io_thread.start()
    if meanwhile is not None and to_load and not job.missing:
        start = time.perf_counter()
        meanwhile()
        spans.append(Span("compute", "decompress", start - t0, time.perf_counter() - t0,
                          "rebuild the chunks in memory", device=device))
    held = held_layers(kv, from_memory)                   # dequantized while the first layer is read
    stored: list[list[LayerBytes]] = [[] for _ in to_load]
    outputs = []
    for layer in range(layers if to_load or job.missing else 0):
        wait_start = time.perf_counter()
        values = None
        if to_load:
            got, parts, values = arrivals.get()
            if got is None:
                raise failure[0]
            for collected, part in zip(stored, parts):
                collected.append(part)
        if not job.missing:
            continue
        start = time.perf_counter()
        if to_load and start - wait_start > 50e-6:
            spans.append(Span("compute", "stall", wait_start - t0, start - t0, f"wait for layer {layer}",
                              device=device, layer=layer))
        context = {i: a[layer] for i, a in held.items()}
        context.update((i, v) for i, v in zip(plan.load, values or ()) if i in needed)
        outputs.append(job.step(context))
        pad_until(start + re_layer_s)
        spans.append(Span("compute", "recompute", start - t0, time.perf_counter() - t0, f"layer {layer}",
                          {"chunks": len(job.missing)}, device, layer=layer))
    io_thread.join()
    if failure:
        raise failure[0]
    _check_crcs(to_load, plan.load, stored, crcs or {})
    for (_, bits, shape), i, parts in zip(to_load, plan.load, stored):
        kv.chunks[i] = stack_layers(bits, shape[1:], parts)
    for i, array in (job.chunk_arrays(outputs).items() if job.missing else ()):
        kv.chunks[i] = encode_at_level(array, int(missing_files[i][1]))
    latency = time.perf_counter() - t0
    timeline = Timeline(tuple(sorted(spans, key=lambda s: (s.start, s.lane))), "measured",
                        name=f"swap-in {len(plan.load)} / recompute {len(plan.recompute)} chunks")
    return LoadResult(timeline=timeline, predicted=plan.timeline, latency_s=latency, predicted_s=plan.predicted_s,
                      recomputed=tuple(plan.recompute), loaded=tuple(plan.load), bytes_read=bytes_read,
                      emulated="" if emulate is None else emulate.device,
                      missing_bits=tuple(int(missing_files[i][1]) for i in sorted(missing_files)))


# ----------------------------------------------------------------------------- the service's loaders

@dataclass(frozen=True, kw_only=True)
class ChunkSpec:
    """A missing chunk: its level and shape, and its file (None when it has none and must be recomputed)
    with the CRC-32 the index recorded for it (None: not checked)."""
    bits: int
    shape: tuple[int, ...]
    path: Path | None
    crc32: int | None = None

    def missing(self, index: int) -> MissingChunk:
        """This chunk, as chunk ``index`` of its context, for the planner (its bytes as its file holds them)."""
        return MissingChunk(index, self.bits, file_size(self.bits, self.shape))


@dataclass(frozen=True, kw_only=True)
class LoadRequest:
    """Bring ``specs``' chunks of ``kv`` into memory (fill ``kv.chunks[i]``), at their recorded levels.
    ``loading``: the service's ``pipeline`` or ``swap_only`` (read every chunk that has a file).
    ``meanwhile``: work the loader may run once on the calling thread while reads are in flight
    (:func:`load_context`); a loader that does not leaves it to the service, which runs it after."""
    model: object
    kv: ChunkedKV
    specs: dict[int, ChunkSpec]
    loading: str
    meanwhile: Callable[[], None] | None = None


@dataclass(frozen=True, kw_only=True)
class LoadReport:
    """What a loader did, for the service's counters and the call's statistics."""
    loaded: tuple[int, ...] = ()          # read from files
    recomputed: tuple[int, ...] = ()      # recomputed from tokens
    bytes_read: int = 0
    io_s: float = 0.0
    recompute_s: float = 0.0
    restored: tuple[int, ...] = ()        # set by the service: damaged files restored from their intact base
    recovered: tuple[str, ...] = ()       # set by the service: each damaged file, and how its chunk came back


Loader = Callable[[LoadRequest], LoadReport]
"""What :class:`~workbench.kvcache.service.LLMService` calls to bring a context's missing chunks back."""


def loader_name(loader: Loader) -> str:
    """A loader's ``name``, else its function or class name."""
    return getattr(loader, "name", None) or getattr(loader, "__name__", None) or type(loader).__name__


class PipelineLoader:
    """The service's default loader: the swapping-recompute pipeline (LLMS 3.3).

    Chunks that have a file are planned by equation 4 (:func:`~workbench.kvcache.planner.plan_swap_recompute`)
    on ``device``'s cost model and brought back by :func:`load_context`, reads and recompute overlapped
    layer by layer. Chunks without a file (killed) are always recomputed, at the level they were dropped
    at; with them, or with ``loading="swap_only"``, every chunk that has a file is read.

    ``device``: ``"host"`` (this machine's measured model, :func:`~workbench.kvcache.costmodel.profile_host`),
    a preset (``"mi14"``, ``"orin-nx"``, ``"jetson-tx2"``; loads are padded to it) or a
    :class:`~workbench.kvcache.costmodel.SwapCostModel`. A name is resolved at the first load that needs
    it (the host is measured once, about 10 s, unless ``workbench prepare`` cached it), or by :meth:`costs_for`.
    ``last`` keeps the last load's plan and measured run."""

    def __init__(self, device: str | SwapCostModel = "host"):
        if isinstance(device, str) and device not in profile_names("llms"):
            raise UnknownNameError("swap device preset", device, profile_names("llms"))
        self.device = device
        self.costs: SwapCostModel | None = device if isinstance(device, SwapCostModel) else None
        self.last: LoadResult | None = None

    @property
    def name(self) -> str:
        """How the service's statistics name this loader."""
        return f"pipeline on {self.device if isinstance(self.device, str) else self.device.device}"

    def costs_for(self, model, chunk_size: int = CHUNK_SIZE) -> SwapCostModel:
        """The cost model this loader plans with for ``chunk_size``-token chunks, measured or read from the
        cache on first use."""
        if self.costs is None or (self.costs.chunk_size != chunk_size and isinstance(self.device, str)):
            self.costs = device_cost_model(self.device, profile_host(model, chunk_size))
        return self.costs

    def write_seconds(self, nbytes: int, chunks: int) -> float:
        """Seconds the service's writes of ``nbytes`` in ``chunks`` chunk files at eviction should take: on an
        emulated device its read line (the presets take writes to run at read bandwidth), so baselines that
        swap out at eviction pay for it as they would there; 0 on the host (writes take what they take)."""
        costs = self.costs
        return costs.t_io(nbytes, chunks) if costs is not None and costs.source == "emulated" and chunks else 0.0

    def __call__(self, request: LoadRequest) -> LoadReport:
        costs = self.costs_for(request.model, request.kv.chunk_size)
        specs = request.specs
        with_file = [s.missing(i) for i, s in sorted(specs.items()) if s.path is not None]
        fileless = [s.missing(i) for i, s in sorted(specs.items()) if s.path is None]
        if fileless or request.loading != "pipeline":
            plan = fixed_plan(costs, fileless, with_file)
        else:
            plan = plan_swap_recompute(costs, with_file)
        files = {i: (s.path, s.bits) for i, s in specs.items()}       # a fileless chunk's entry only gives its level
        self.last = None
        emulate = costs if costs.source == "emulated" else None
        result = load_context(request.model, request.kv, files, plan, emulate=emulate,
                              crcs={i: s.crc32 for i, s in specs.items()}, meanwhile=request.meanwhile)
        self.last = result
        spans = result.timeline.spans
        return LoadReport(loaded=result.loaded, recomputed=result.recomputed, bytes_read=result.bytes_read,
                          io_s=sum(s.duration for s in spans if s.kind == "swap_in"),
                          recompute_s=sum(s.duration for s in spans if s.kind == "recompute"))

