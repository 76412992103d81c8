"""Executing a plan: an IO thread streams shards from the store while the compute side runs layers.

:class:`ElasticEngine` holds what stays in memory whatever the plan (embeddings,
LayerNorms, biases, classifier) and a :class:`PreloadBuffer` of shard blobs. A run
(:meth:`ElasticEngine.run`) starts one IO thread that reads, layer after layer, the
plan's shards that are not in the buffer; the calling thread waits for layer k's
shards (a *stall* when they are late), decompresses them into the working buffer
with the Cython kernel (the GIL is released, so the IO thread keeps reading) and
runs the layer with torch. With an emulated profile every read is padded to the
profile's ``t_io`` and every layer (decompression plus compute) to its ``t_comp``,
so the run takes as long as it would on that device.

After a run the shards it loaded join the buffer, which then evicts from the top
layer down until it fits its capacity (WRX section 5.5); the next plan can take the
buffer's contents as its preload (``plan_elastic(..., cached=buffer.entries())``)
and spend the freed IO on upgrades.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from workbench.devices import emulated_name, pad_until
from workbench.elastic.planner import ElasticPlan, PreloadEntry
from workbench.elastic.costmodel import CostModel, drop_page_cache
from workbench.elastic.store import ShardStore
from workbench.errors import WorkbenchError
from workbench.models.encoder import Encoder, sharded_layer, stack_shards
from workbench.timeline import Span, Timeline


class PreloadBuffer:
    """Shard blobs kept in memory between runs, at most ``capacity`` bytes after :meth:`trim`."""

    def __init__(self, capacity: float = 0.0):
        if capacity is None or capacity < 0:
            raise WorkbenchError(f"preload buffer capacity must be >= 0 bytes, got {capacity!r}")
        self.capacity = float(capacity)
        self._blobs: dict[tuple[int, int], tuple[int, bytes]] = {}

    @property
    def nbytes(self) -> int:
        return sum(len(blob) for _, blob in self._blobs.values())

    def __len__(self) -> int:
        return len(self._blobs)

    def __contains__(self, key) -> bool:
        return tuple(key) in self._blobs

    def get(self, layer: int, shard: int):
        return self._blobs.get((layer, shard))

    def entries(self) -> list[tuple[int, int, int]]:
        """``(layer, shard, bits)`` of every buffered shard, in layer order."""
        return [(k, i, b) for (k, i), (b, _) in sorted(self._blobs.items())]

    def put(self, layer: int, shard: int, bits: int, blob: bytes) -> None:
        held = self._blobs.get((layer, shard))
        if held is None or held[0] <= bits:
            self._blobs[(layer, shard)] = (int(bits), blob)

    def fill(self, store: ShardStore, entries) -> None:
        """Load ``(layer, shard, bits)`` entries from the store (before the first run)."""
        for layer, shard, bits in entries:
            self.put(layer, shard, bits, store.read_blob(layer, shard, bits))

    def trim(self) -> list[tuple[int, int, int]]:
        """Evict from the top layer down (last shard first) until the buffer fits; returns what left."""
        evicted = []
        for key in sorted(self._blobs, reverse=True):
            if self.nbytes <= self.capacity:
                break
            bits, _ = self._blobs.pop(key)
            evicted.append((*key, bits))
        return evicted

    def clear(self) -> None:
        self._blobs.clear()


@dataclass(frozen=True, kw_only=True, eq=False)
class RunResult:
    """What one execution gives (compares by identity, ``eq=False``: ``logits`` is a tensor)."""
    logits: torch.Tensor                   # (batch, classes)
    timeline: Timeline                     # measured io, stall, decompress and compute spans
    latency_s: float                       # seconds from the start of the run to the logits
    loaded: tuple[PreloadEntry, ...]       # (layer, shard, bits) read from the store in this run
    evicted: tuple[PreloadEntry, ...]      # what the buffer dropped afterwards
    first_in_process: bool = False         # the process's first run (imports and kernels still warming up)
    emulated: str = ""                     # the device preset the run was padded to ('' on the host)

    def check(self, plan: ElasticPlan):
        """This run against ``plan``'s prediction (``workbench.prediction``): a note when it misses by > 20 %."""
        from workbench.prediction import check_prediction

        return check_prediction(self.timeline, plan.timeline, self.latency_s, plan.predicted_s,
                                first_run=self.first_in_process, emulated=self.emulated)


class ElasticEngine:
    """Resident weights of a store's model plus a preload buffer; runs plans on real inputs.

    Shards are decompressed on ``num_threads`` OpenMP threads (default 1): one shard is
    small, and on few cores the OpenMP workers that spin after a parallel region compete
    with torch's own pool (measured on 2 cores: layers delayed by up to 180 ms).
    """

    def __init__(self, store: ShardStore, buffer: PreloadBuffer | None = None, num_threads: int = 1):
        self.store, self.cfg = store, store.cfg
        self.model = Encoder(self.cfg, store.manifest["num_classes"]).eval()
        self.model.load_state_dict(store.resident_state(), strict=False)
        self.resident = [layer.resident() for layer in self.model.layers]
        self.biases = [[{k: v.detach() for k, v in layer.shard_biases(i).items()} for i in range(self.cfg.num_heads)]
                       for layer in self.model.layers]
        self.buffer = buffer if buffer is not None else PreloadBuffer(0)
        self.work = np.empty((self.cfg.num_heads, store.shard_params), np.float32)    # working buffer
        self.num_threads = num_threads

    runs_in_process = 0
    """Runs of every engine in this process, to tell the first (slow: kernels warm up) from the rest."""

    def resident_bytes(self) -> int:
        """Bytes of everything kept in memory besides shards (embeddings, LayerNorms, biases, head)."""
        return int(sum(v.numel() * v.element_size() for v in self.store.resident_state().values()))

    def prepare_buffer(self, plan: ElasticPlan) -> None:
        """Make the buffer hold the plan's preload (a whole-model plan: every shard at its bitwidth)."""
        missing = [(k, i, b) for k, i, b in plan.preload
                   if self.buffer.get(k, i) is None or self.buffer.get(k, i)[0] != b]
        self.buffer.fill(self.store, missing)

    @torch.no_grad()
    def run(self, plan: ElasticPlan, ids: torch.Tensor, mask: torch.Tensor, emulate: CostModel | None = None,
            cold: bool = True, keep_loaded: bool = True) -> RunResult:
        """Execute ``plan`` on one batch; see the module docstring."""
        if not plan.found:
            raise WorkbenchError(f"cannot run an empty plan: {plan.reason}")
        n, m = plan.n, plan.m
        first = ElasticEngine.runs_in_process == 0
        ElasticEngine.runs_in_process += 1
        device = "host" if emulate is None else emulated_name(emulate.device)
        self.prepare_buffer(plan)
        if cold:
            for layer in range(self.cfg.num_layers):
                drop_page_cache(self.store.layer_path(layer))
        plan_bits = plan.bits
        todo = []
        for k in range(n):
            todo.append([(i, int(plan_bits[k, i])) for i in range(m)
                         if not (self.buffer.get(k, i) and self.buffer.get(k, i)[0] == int(plan_bits[k, i]))])
        spans: list[Span] = []
        arrivals: queue.Queue = queue.Queue()
        loaded: list[tuple[int, int, int]] = []
        failure: list[BaseException] = []
        t0 = time.perf_counter()

        def io_worker():
            try:
                for k in range(n):
                    start = time.perf_counter()
                    blobs = {}
                    for i, bits in todo[k]:
                        blobs[i] = self.store.read_blob(k, i, bits)
                        if emulate is not None:
                            pad_until(start + sum(emulate.t_io(b) for j, b in todo[k] if j <= i))
                    end = time.perf_counter()
                    if todo[k]:
                        spans.append(Span("io", "io", start - t0, end - t0, f"layer {k}", {"shards": len(todo[k])},
                                          device, nbytes=sum(len(b) for b in blobs.values()), layer=k))
                    arrivals.put((k, blobs))
            except BaseException as exc:                      # surfaced in the calling thread
                failure.append(exc)
                arrivals.put((None, None))

        io_thread = threading.Thread(target=io_worker, name="wrx-io", daemon=True)
        io_thread.start()
        if plan.mode == "sequential":
            io_thread.join()
        x = self.model.embed(ids)
        bias = self.model.attn_bias(mask)
        ready: dict[int, dict] = {}
        for k in range(n):
            wait_start = time.perf_counter()
            while k not in ready:
                got, blobs = arrivals.get()
                if got is None:
                    raise failure[0]
                ready[got] = blobs
            waited = time.perf_counter()
            if waited - wait_start > 50e-6 and todo[k]:
                spans.append(Span("compute", "stall", wait_start - t0, waited - t0, f"wait for layer {k}",
                                  device=device, layer=k))
            start = time.perf_counter()
            shards = []
            for i in range(m):
                bits = int(plan_bits[k, i])
                blob = ready[k].get(i)
                if blob is None:
                    blob = self.buffer.get(k, i)[1]
                else:
                    loaded.append((k, i, bits))
                    if keep_loaded:
                        self.buffer.put(k, i, bits, blob)
                flat = self.store.decode(blob, bits, out=self.work[i], num_threads=self.num_threads)
                shards.append(self.store.split(flat))
            dec_end = time.perf_counter()
            x = sharded_layer(x, bias, self.resident[k], stack_shards(shards, self.biases[k][:m]),
                              self.cfg.head_dim, self.cfg.layer_norm_eps)
            if emulate is not None:
                pad_until(start + emulate.t_comp(m))
            end = time.perf_counter()
            spans.append(Span("compute", "decompress", start - t0, dec_end - t0, f"layer {k}", {"shards": m}, device,
                              layer=k))
            spans.append(Span("compute", "compute", dec_end - t0, end - t0, f"layer {k}", {"shards": m}, device,
                              layer=k))
            del ready[k]
        logits = self.model.classify(x, mask)
        latency = time.perf_counter() - t0
        io_thread.join()
        evicted = tuple(self.buffer.trim()) if keep_loaded else ()
        timeline = Timeline(tuple(sorted(spans, key=lambda s: (s.start, s.lane))), "measured",
                            name=f"{plan.method} {n}x{m}")
        return RunResult(logits=logits, timeline=timeline, latency_s=latency, loaded=tuple(loaded), evicted=evicted,
                         first_in_process=first, emulated="" if emulate is None else emulate.device)


def run_pipeline(plan: ElasticPlan, store: ShardStore, ids: torch.Tensor, mask: torch.Tensor,
                 engine: ElasticEngine | None = None, emulate: CostModel | None = None) -> RunResult:
    """Run ``plan`` once on (ids, mask) from ``store`` with a fresh engine (or ``engine``, keeping its buffer)."""
    if not isinstance(plan, ElasticPlan) or not isinstance(store, ShardStore):
        raise WorkbenchError("run_pipeline takes (plan, store, ids, mask): got "
                             f"({type(plan).__name__}, {type(store).__name__}, ...)")
    engine = engine or ElasticEngine(store, PreloadBuffer(plan.memory_bytes))
    return engine.run(plan, ids, mask, emulate=emulate)


def run_repeatedly(engine: ElasticEngine, plan: ElasticPlan, inputs, runs: int, emulate: CostModel | None = None,
                   warmup: int = 0, on_run=None, should_stop=None) -> list[RunResult]:
    """``warmup`` untimed runs, then ``runs`` timed ones, input r being ``inputs[r % len(inputs)]`` (ids, mask).

    The one run loop of the CLI, the dashboard and the evaluation: the buffer is left as
    the plan's preload after each run (``keep_loaded=False``), so every run starts alike.
    ``on_run(r, result)`` is called after each timed run; ``should_stop()`` is asked
    before each run and ends the loop early (a dashboard's Cancel).
    """
    if runs < 1 or warmup < 0:
        raise WorkbenchError(f"runs must be >= 1 and warm-up runs >= 0, got {runs} and {warmup}")
    results: list[RunResult] = []
    for r in range(warmup + runs):
        if should_stop is not None and should_stop():
            break
        ids, mask = inputs[r % len(inputs)]
        result = engine.run(plan, ids, mask, emulate=emulate, keep_loaded=False)
        if r >= warmup:
            results.append(result)
            if on_run is not None:
                on_run(len(results) - 1, result)
    return results
