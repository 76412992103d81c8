"""E3's pipelined early-exit serving for real, on Ray Serve (E3 §3.2, §4).

A split plan (``.splits``, ``.replicas``, ``.batch_sizes``; e.g. the optimizer's ``SplitPlan``) becomes one
Ray Serve application: one deployment per split, with the plan's number of replicas, each replica holding
the whole early-exit model but running only its split's layers. A replica's handler is
``@serve.batch(max_batch_size=<the split's batch size>, batch_wait_timeout_s=batch_wait_s)``: requests
queue per replica and are served as one batch once the batch is full or the oldest has waited
``batch_wait_s``. The survivors of a batch are sent one by one to the next split through its deployment
handle (bound in with ``.bind(next_app)``), where they queue again, so the survivors of several upstream
batches are re-formed into full batches. A sample that exits answers at once: its result travels back up
the chain of awaiting calls to the driver, whichever split it left by (at the end of its batch's run of
that split, like the simulator's per-split service times).

Vocabulary and result shapes mirror :mod:`workbench.earlyexit.simulator`: per request ``exit_layer``,
``latency_s``, ``met_slo``; ``goodput`` (requests meeting the SLO per second, from the first arrival at 0
to the last completion), ``p50_latency_s``/``p95_latency_s`` (NumPy's linear interpolation),
``batch_counts`` per split ({batch size: times served}) and a measured :class:`~workbench.timeline.Timeline`
with a lane ``"split i · replica r"`` of ``compute`` spans (one per batch, its layers and size) and a lane
``"split i · replica r queue"`` of ``queue`` spans (from the batch's first sample entering the replica to
the batch's compute start). Nothing is dropped (``drop_rate`` is 0): every request is served.

Choices where the issue leaves room:

- **The model** is rebuilt inside every replica from a picklable :class:`ModelSpec`: either the untrained
  model of a seed (cheap: the shipped encoder plus ramps drawn from the seed) or a full state dict, which
  the driver puts once into Ray's object store. Either way the replicas hold the caller's weights.
- **Fixed length.** Every request is one row of the workload's (n, T) token ids, so every hidden state
  that travels between splits is (T, d) with its (T,) mask, and a batch is a plain stack: no request's
  padding depends on who it was batched with.
- **Threads and CPUs.** A replica runs ``torch.set_num_threads(REPLICA_THREADS)`` (1), like the layer
  profiles, and asks Ray for ``REPLICA_CPUS`` (0.25) of a CPU, so 8 replicas fit on a 2-core local
  cluster. That share is only for Ray's placement: replicas on one host contend for its cores, so the
  measured compute spans, latencies and goodput are those of single-threaded replicas time-sharing the
  host's cores (on 2 cores, more than 2 busy replicas slow each other down); they match the single-thread
  layer profiles only while no more replicas compute at once than there are cores.
- **Clock.** Replicas stamp ``time.time()``; they run on the same host as the driver (a local cluster), so
  the driver subtracts its own start time and every time is seconds after the first arrival. On a
  multi-host cluster the spans carry each host's clock error.
- **Arrivals** come from :class:`~workbench.earlyexit.simulator.ArrivalProcess` (see
  :meth:`Workload.from_arrivals`, which draws them as the simulator does for the same seed); the driver
  sends each request through the first split's handle at its arrival time from one asyncio loop, and its
  latency counts from that scheduled time (``sent_s`` records when it was actually sent).
"""
from __future__ import annotations

import asyncio
import logging
import math
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from workbench.earlyexit.simulator import ArrivalProcess, _check_splits, _whole_positive
from workbench.errors import WorkbenchError
from workbench.timeline import Span, Timeline

REPLICA_THREADS = 1
"""Torch threads per replica (the layer profiles are measured with the same single thread)."""
REPLICA_CPUS = 0.25
"""Ray CPUs each replica asks for: 8 replicas fit on a 2-core local cluster (placement only; see above)."""
APP_NAME = "workbench-e3"
"""The Ray Serve application a run deploys; the next run replaces it, and a run deletes it when done."""
DEFAULT_BATCH_WAIT_S = 0.05
REACH_TIMEOUT_S = 3.0
START_ATTEMPTS = 2
OBJECT_STORE_BYTES = 512 * 1024 ** 2
MAX_ONGOING = 100_000
"""A replica's request limit: a request stays 'ongoing' while its sample runs downstream, so it is large."""


# -- the model, rebuilt in each replica ------------------------------------------------------------

@dataclass(frozen=True)
class ModelSpec:
    """What a replica needs to rebuild the caller's :class:`~workbench.earlyexit.model.EarlyExitModel`:
    its config, classes, threshold and disabled ramps, and either ``seed`` (the untrained model of
    :func:`~workbench.earlyexit.model.untrained_model`) or ``state`` (its state dict, or a Ray object
    reference to one)."""
    cfg: Any
    num_classes: int
    threshold: float
    disabled: tuple[int, ...] = ()
    seed: int | None = None
    state: Any = field(default=None, repr=False, compare=False)

    @property
    def num_layers(self) -> int:
        return int(self.cfg.num_layers)

    @classmethod
    def untrained(cls, num_classes: int = 2, seed: int = 0, threshold: float | None = None,
                  disabled: Sequence[int] = ()) -> ModelSpec:
        """The model ``untrained_model(num_classes, seed, threshold)`` with ``disabled`` ramps."""
        from workbench.assets import minilm_dir
        from workbench.earlyexit.model import DEFAULT_THRESHOLD, check_threshold
        from workbench.models.encoder import EncoderConfig

        cfg = EncoderConfig.from_hf_json(minilm_dir() / "config.json")
        threshold = DEFAULT_THRESHOLD if threshold is None else check_threshold(threshold)
        return cls(cfg, int(num_classes), threshold, tuple(sorted(int(k) for k in disabled)), seed=int(seed))

    @classmethod
    def of(cls, model) -> ModelSpec:
        """The spec of an existing model: its weights travel as a state dict."""
        state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        return cls(model.cfg, int(model.num_classes), float(model.threshold), tuple(sorted(model.disabled)),
                   state=state)

    def build(self):
        """The model, in eval mode."""
        from workbench.earlyexit.model import EarlyExitModel, untrained_model

        if self.state is None:
            if self.seed is None:
                raise WorkbenchError("a ModelSpec needs a seed (untrained model) or a state dict")
            model = untrained_model(self.num_classes, self.seed, self.threshold)
        else:
            state = self.state
            if not isinstance(state, dict):
                import ray
                state = ray.get(state)
            model = EarlyExitModel(self.cfg, self.num_classes, threshold=self.threshold)
            model.load_state_dict(state)
        return model.configure(disabled=self.disabled).eval()


def as_spec(model_or_spec) -> ModelSpec:
    if isinstance(model_or_spec, ModelSpec):
        return model_or_spec
    if hasattr(model_or_spec, "run_split") and hasattr(model_or_spec, "state_dict"):
        return ModelSpec.of(model_or_spec)
    raise WorkbenchError(f"serve_plan needs a ModelSpec or an EarlyExitModel; got {type(model_or_spec).__name__}")


# -- the workload -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    """The requests: token ids (n, T) int64, attention mask (n, T) and arrival times (n,) in seconds."""
    ids: torch.Tensor
    mask: torch.Tensor
    arrival_s: np.ndarray

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    @property
    def length(self) -> int:
        """Every request's padded length T."""
        return int(self.ids.shape[1])

    @classmethod
    def from_arrivals(cls, ids: torch.Tensor, mask: torch.Tensor, arrivals: ArrivalProcess | Sequence[float],
                      seed: int = 0) -> Workload:
        """Requests at the times of ``arrivals`` (an ArrivalProcess drawn with ``seed`` exactly as
        ``simulate(..., arrivals=..., seed=seed)`` draws them, or explicit times); request j is row
        ``j % len(ids)`` of the token tensors."""
        if isinstance(arrivals, ArrivalProcess):
            times = arrivals.times(np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[0]))
        else:
            times = np.asarray(list(arrivals), dtype=float)
        ids, mask = torch.as_tensor(ids), torch.as_tensor(mask)
        if ids.ndim != 2 or ids.shape[0] == 0:
            raise WorkbenchError(f"token ids are an (n, T) tensor with n >= 1; got shape {tuple(ids.shape)}")
        rows = torch.as_tensor(np.arange(times.size) % ids.shape[0])
        return cls(ids[rows], mask[rows], times)

    def check(self, max_positions: int | None = None) -> None:
        ids, mask, t = self.ids, self.mask, np.asarray(self.arrival_s, dtype=float)
        if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.dtype != torch.int64:
            raise WorkbenchError("workload.ids must be an (n, T) int64 tensor of token ids")
        if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(ids.shape):
            raise WorkbenchError(f"workload.mask must be a tensor shaped like ids {tuple(ids.shape)}")
        if ids.shape[0] == 0 or ids.shape[1] == 0:
            raise WorkbenchError("the workload has no requests (or no tokens): give at least one row of ids")
        if t.shape != (ids.shape[0],):
            raise WorkbenchError(f"{t.size} arrival times for {ids.shape[0]} requests: give one per request")
        if not (np.all(np.isfinite(t)) and np.all(t >= 0)):
            raise WorkbenchError("arrival times are finite seconds >= 0")
        if max_positions is not None and ids.shape[1] > max_positions:
            raise WorkbenchError(f"requests are {ids.shape[1]} tokens long; the model takes at most {max_positions}")


# -- results ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ServedRequest:
    """One request as served: when it came, where it left the model, its label, and when it answered."""
    id: int
    arrival_s: float                  # scheduled arrival (seconds from the run's start)
    exit_layer: int
    exit_split: int
    label: int
    completion_s: float               # when the driver's awaited result resolved
    latency_s: float                  # completion - arrival
    met_slo: bool
    sent_s: float = 0.0               # when the driver actually sent it
    exited_s: float = 0.0             # when its last batch ended on the replica it left by
    dropped: bool = False             # never: every request is served


@dataclass(frozen=True)
class ServeRun:
    """A served run: per request, per split's batch sizes, a measured Timeline and the summary figures."""
    requests: tuple[ServedRequest, ...]
    timeline: Timeline = field(repr=False)
    batch_counts: tuple[dict[int, int], ...]     # per split: batch size served -> how many times
    splits: tuple[tuple[int, int], ...]
    replicas: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    slo_s: float
    duration_s: float                 # 0 (first arrival) to the last completion
    goodput: float                    # requests meeting the SLO per second of the run
    throughput: float                 # requests completed per second of the run
    p50_latency_s: float
    p95_latency_s: float
    drop_rate: float = 0.0
    deploy_s: float = 0.0             # seconds to deploy the application (not in duration_s)
    logits: torch.Tensor | None = field(default=None, repr=False, compare=False)   # (n, classes)

    @property
    def met(self) -> int:
        return sum(r.met_slo for r in self.requests)

    @property
    def exit_layers(self) -> np.ndarray:
        return np.array([r.exit_layer for r in self.requests], dtype=np.int64)

    @property
    def labels(self) -> np.ndarray:
        return np.array([r.label for r in self.requests], dtype=np.int64)


# -- Ray -------------------------------------------------------------------------------------------

@dataclass
class RaySession:
    """The Ray this process uses: the address asked for (None: a local one), its CPUs, and whether this
    call started it (then :meth:`close` stops Serve and Ray)."""
    address: str | None
    num_cpus: float
    started: bool
    start_s: float

    def close(self) -> None:
        import ray

        if self.started and ray.is_initialized():
            ray.shutdown()      # takes Serve's actors with it (serve.shutdown first only adds noise)


class _WarningsOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


def _quiet() -> None:
    """No INFO lines from Ray or Serve in the driver (Serve resets its logger's level when it starts, so a
    filter, which it leaves alone, does the work)."""
    for name in ("ray", "ray.serve"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        if not any(isinstance(f, _WarningsOnly) for f in logger.filters):
            logger.addFilter(_WarningsOnly())


def _check_reachable(address: str) -> None:
    """A host:port address must accept a TCP connection within REACH_TIMEOUT_S."""
    target = address.split("://", 1)[-1]
    if address in ("auto", "local") or ":" not in target:
        return
    host, _, port = target.rpartition(":")
    try:
        port_no = int(port)
    except ValueError:
        raise WorkbenchError(f"Ray address {address!r} is not host:port (e.g. 127.0.0.1:6379)") from None
    try:
        with socket.create_connection((host or "127.0.0.1", port_no), timeout=REACH_TIMEOUT_S):
            pass
    except OSError as err:
        raise WorkbenchError(
            f"no Ray cluster answers at {address} ({err.strerror or err}); start one on that machine with "
            f"`ray start --head --port={port_no}`, or pass address=None to start a local Ray") from None


def _check_same_cluster(address: str | None) -> None:
    """This process is already connected to a Ray: an explicit host:port must name that one (same port)."""
    import ray

    if address is None or address in ("auto", "local") or "://" in address or ":" not in address:
        return
    current = ray.get_runtime_context().gcs_address
    if current.rpartition(":")[2] != address.rpartition(":")[2]:
        raise WorkbenchError(f"this process is already connected to the Ray at {current}, not {address}: "
                             f"call ray.shutdown() first (or pass address=None to use the current one)")


_LAUNCHER = None


def _launcher():
    """One thread that lives as long as the process, for starting Ray: Ray's head processes die with the
    *thread* that forked them (PR_SET_PDEATHSIG), so a Ray started from a page's background run would vanish
    when that run's thread ends, and take the kernel's connection with it."""
    global _LAUNCHER
    if _LAUNCHER is None:
        from concurrent.futures import ThreadPoolExecutor

        _LAUNCHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="workbench-ray")
    return _LAUNCHER


def _start_local(num_cpus: float, attempts: int = START_ATTEMPTS) -> None:
    if threading.current_thread() is threading.main_thread():
        _start_local_here(num_cpus, attempts)
    else:
        _launcher().submit(_start_local_here, num_cpus, attempts).result()


def _start_local_here(num_cpus: float, attempts: int = START_ATTEMPTS) -> None:
    """``ray.init`` of a new local Ray (address "local": never someone else's cluster on this host), tried
    again when its node does not register in time (Ray allows 30 s, which a loaded 2-core host can miss)."""
    import ray

    for attempt in range(attempts):
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level="ERROR",
                     log_to_driver=False, object_store_memory=OBJECT_STORE_BYTES)
            return
        except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception when its node does not come up
            if "timed out during startup" not in str(err):
                raise
            ray.shutdown()
            if attempt == attempts - 1:
                raise WorkbenchError(
                    f"the local Ray did not come up in {attempts} tries: its node must register within 30 s "
                    f"({err}); the machine is probably overloaded: retry when it is quieter, or start Ray once "
                    f"with `ray start --head --num-cpus={num_cpus:g}` and pass address='127.0.0.1:6379'") from None


def ray_session(address: str | None = None, num_cpus: float = 2) -> RaySession:
    """Connect to the Ray at ``address`` (host:port, ray://host:port or "auto"), or start a local one with
    ``num_cpus`` CPUs (address None); a Ray already initialised in this process is reused as it is."""
    import ray

    _quiet()
    begin = time.perf_counter()
    if address is not None:
        _check_reachable(str(address))
    if ray.is_initialized():
        _check_same_cluster(address)
        return RaySession(address, float(ray.cluster_resources().get("CPU", 0.0)), False, 0.0)
    if address is None:
        if not (isinstance(num_cpus, (int, float)) and not isinstance(num_cpus, bool) and num_cpus > 0):
            raise WorkbenchError(f"num_cpus {num_cpus!r} must be a number of CPUs > 0")
        _start_local(num_cpus)
    else:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except ConnectionError as err:
            raise WorkbenchError(f"could not connect to Ray at {address}: {err}; start one there with "
                                 f"`ray start --head`") from None
    return RaySession(address, float(ray.cluster_resources().get("CPU", 0.0)), True,
                      time.perf_counter() - begin)


# -- the deployments --------------------------------------------------------------------------------

def _split_deployment(index: int, layers: tuple[int, int], replicas: int, batch_size: int, batch_wait_s: float):
    """The Serve deployment of split ``index``: its batch handler is decorated with the split's batch size."""
    from ray import serve

    start, end = layers

    class SplitReplica:
        def __init__(self, spec: ModelSpec, next_split=None):
            torch.set_num_threads(REPLICA_THREADS)
            self.model = spec.build()
            self.next = next_split
            context = serve.get_replica_context()
            rank = getattr(context, "rank", None)
            self.replica = int(getattr(rank, "rank", rank)) if rank is not None else 0
            self.served = 0

        async def __call__(self, item: dict) -> dict:
            item = dict(item, entered=time.time())
            outcome, record = await self.run_batch(item)
            if isinstance(outcome, dict):
                return dict(outcome, trace=[record])
            later = await outcome            # the next split's answer for this sample
            return dict(later, trace=[record] + later["trace"])

        @serve.batch(max_batch_size=batch_size, batch_wait_timeout_s=batch_wait_s)
        async def run_batch(self, items: list[dict]) -> list[tuple]:
            began = time.time()
            mask = torch.stack([it["mask"] for it in items])
            if start == 0:
                hidden = self.model.embed(torch.stack([it["ids"] for it in items]), mask)
            else:
                hidden = torch.stack([it["hidden"] for it in items])
            out = self.model.run_split(hidden, mask, start, end)
            ended = time.time()
            record = {"split": index, "replica": self.replica, "index": self.served, "size": len(items),
                      "queued": min(it["entered"] for it in items), "start": began, "end": ended,
                      "ids": [it["id"] for it in items], "rows": list(out.layer_rows)}
            self.served += 1
            answers: list = [None] * len(items)
            for j, row in enumerate(out.exited):
                answers[row] = ({"id": items[row]["id"], "exit_layer": int(out.exit_layers[j]),
                                 "label": int(out.labels[j]), "logits": out.logits[j].clone(), "exited": ended},
                                record)
            for j, row in enumerate(out.survivors):
                sent = {"id": items[row]["id"], "hidden": out.hidden[j].clone(), "mask": out.mask[j].clone()}
                answers[row] = (self.next.remote(sent), record)
            return answers

    SplitReplica.__name__ = SplitReplica.__qualname__ = f"Split{index}"
    return serve.deployment(SplitReplica, name=f"split{index}", num_replicas=replicas,
                            max_ongoing_requests=MAX_ONGOING, graceful_shutdown_timeout_s=0.5,
                            graceful_shutdown_wait_loop_s=0.1,
                            ray_actor_options={"num_cpus": REPLICA_CPUS})


# -- checks, the run, the results -----------------------------------------------------------------

def check_plan(plan: Any, num_layers: int) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...], tuple[int, ...]]:
    """The plan's splits, replicas and batch sizes, checked to cover layers 0..num_layers-1 contiguously."""
    for attr in ("splits", "replicas", "batch_sizes"):
        if not hasattr(plan, attr):
            raise WorkbenchError(f"the plan has no .{attr}: serve_plan needs a SplitPlan-like object")
    if not list(plan.splits):
        reason = getattr(plan, "reason", "")
        raise WorkbenchError("the plan is empty (no splits): nothing to serve" + (f" ({reason})" if reason else ""))
    splits = _check_splits(plan.splits)
    n = len(splits)
    replicas = _whole_positive(plan.replicas, "replicas", n)
    batch_sizes = _whole_positive(plan.batch_sizes, "batch size", n)
    if splits[-1][1] != num_layers:
        raise WorkbenchError(f"the splits end at layer {splits[-1][1] - 1} but the model has {num_layers} layers "
                             f"(0..{num_layers - 1}): the last split must end at {num_layers}")
    return splits, replicas, batch_sizes


def _positive_seconds(value, what: str, allow_zero: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if isinstance(value, bool) or not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise WorkbenchError(f"{what} {value!r} must be a finite number of seconds {'>= 0' if allow_zero else '> 0'}")
    return v


def _drive(handle, workload: Workload, timeout_s: float,
           progress: Callable[[int, int], None] | None) -> tuple[float, list]:
    """Send each request at its arrival time; returns the start time and (sent, done, answer) per request."""
    n = len(workload)
    out: list = [None] * n
    done_count = 0

    async def one(j: int, t0: float) -> None:
        nonlocal done_count
        delay = t0 + float(workload.arrival_s[j]) - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        sent = time.time()
        # clone: a row view would pickle the whole (n, T) storage
        request = {"id": j, "ids": workload.ids[j].clone(), "mask": workload.mask[j].clone()}
        answer = await handle.remote(request)
        out[j] = (sent, time.time(), answer)
        done_count += 1
        if progress is not None:
            progress(done_count, n)

    async def main() -> float:
        t0 = time.time()
        try:
            await asyncio.wait_for(asyncio.gather(*(one(j, t0) for j in range(n))), timeout_s)
        except asyncio.TimeoutError:
            raise WorkbenchError(f"the served run did not finish within {timeout_s:.0f} s "
                                 f"({done_count} of {n} requests answered)") from None
        return t0

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main()), out
    # Called from a running event loop (a notebook): drive from a thread with its own loop.
    box: dict = {}

    def worker():
        try:
            box["t0"] = asyncio.run(main())
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=worker, name="e3-serve-driver")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["t0"], out


def _results(out: list, t0: float, workload: Workload, splits, replicas, batch_sizes, slo_s: float,
             num_classes: int, deploy_s: float) -> ServeRun:
    n = len(workload)
    requests, logits = [], torch.zeros(n, num_classes)
    batches: dict[tuple[int, int, int], dict] = {}
    for j, (sent, done, answer) in enumerate(out):
        arrival = float(workload.arrival_s[j])
        completion = done - t0
        layer = answer["exit_layer"]
        split = next(i for i, (a, b) in enumerate(splits) if a <= layer < b)
        requests.append(ServedRequest(j, arrival, layer, split, answer["label"], completion, completion - arrival,
                                      completion - arrival <= slo_s, sent - t0, answer["exited"] - t0))
        logits[j] = answer["logits"]
        for record in answer["trace"]:
            batches[(record["split"], record["replica"], record["index"])] = record
    counts = [Counter() for _ in splits]
    spans = []
    for (i, r, k), rec in sorted(batches.items(), key=lambda kv: kv[1]["start"]):
        a, b = splits[i]
        counts[i][rec["size"]] += 1
        meta = {"split": i, "replica": r, "batch": rec["size"], "layers": f"{a}-{b - 1}", "index": k,
                "requests": list(rec["ids"]), "rows": list(rec["rows"])}
        lane = f"split {i} · replica {r}"
        spans.append(Span(lane + " queue", "queue", rec["queued"] - t0, rec["start"] - t0,
                          f"batch of {rec['size']} waiting", dict(meta)))
        spans.append(Span(lane, "compute", rec["start"] - t0, rec["end"] - t0,
                          f"layers {a}-{b - 1} · batch of {rec['size']}", meta))
    spans.sort(key=lambda s: s.start)
    timeline = Timeline(tuple(spans), "measured", name="E3 served run (Ray Serve)")
    duration = max(r.completion_s for r in requests)
    latencies = np.array([r.latency_s for r in requests])
    met = sum(r.met_slo for r in requests)
    return ServeRun(
        requests=tuple(requests), timeline=timeline,
        batch_counts=tuple(dict(sorted(c.items())) for c in counts),
        splits=splits, replicas=replicas, batch_sizes=batch_sizes, slo_s=slo_s, duration_s=duration,
        goodput=met / duration if duration > 0 else 0.0, throughput=n / duration if duration > 0 else 0.0,
        p50_latency_s=float(np.percentile(latencies, 50)), p95_latency_s=float(np.percentile(latencies, 95)),
        drop_rate=0.0, deploy_s=deploy_s, logits=logits)


def serve_plan(model_spec: ModelSpec | Any, plan: Any, workload: Workload, *, slo_s: float,
               address: str | None = None, num_cpus: float = 2, batch_wait_s: float = DEFAULT_BATCH_WAIT_S,
               timeout_s: float | None = None, progress: Callable[[int, int], None] | None = None) -> ServeRun:
    """Deploy ``plan`` on Ray Serve with the model of ``model_spec`` (a :class:`ModelSpec` or an
    EarlyExitModel), send ``workload``'s requests at their arrival times, and measure the run.

    - ``plan``: anything with ``.splits`` (contiguous (start, end) layer ranges covering the model),
      ``.replicas`` and ``.batch_sizes`` (whole numbers >= 1 per split).
    - ``slo_s``: the latency objective; a request meets it when its latency is <= slo_s.
    - ``address``/``num_cpus``: as :func:`ray_session` (a Ray already initialised here is reused).
    - ``batch_wait_s``: how long a replica waits for its batch to fill (``batch_wait_timeout_s``).
    - ``timeout_s``: give up (WorkbenchError) if the requests are not all answered by then (default: the
      last arrival plus 120 s).
    - ``progress(done, total)``: called as requests are answered.

    Every input is checked before Ray is touched. The application replaces any earlier one of this
    module's and is deleted when the run ends.
    """
    spec = as_spec(model_spec)
    splits, replicas, batch_sizes = check_plan(plan, spec.num_layers)
    slo_s = _positive_seconds(slo_s, "slo_s")
    batch_wait_s = _positive_seconds(batch_wait_s, "batch_wait_s", allow_zero=True)
    if not isinstance(workload, Workload):
        raise WorkbenchError(f"workload must be a Workload (ids, mask, arrival_s); got {type(workload).__name__}")
    workload.check(getattr(spec.cfg, "max_positions", None))
    last = float(np.max(workload.arrival_s))
    timeout_s = last + 120.0 if timeout_s is None else _positive_seconds(timeout_s, "timeout_s")
    need = sum(replicas) * REPLICA_CPUS
    import ray

    if not ray.is_initialized() and address is None and need > num_cpus + 1e-9:
        raise WorkbenchError(f"the plan has {sum(replicas)} replicas x {REPLICA_CPUS} CPU = {need:g} CPUs, more "
                             f"than the {num_cpus:g} of the local Ray it would start: give fewer replicas or "
                             f"more num_cpus")
    session = ray_session(address, num_cpus)
    if need > session.num_cpus + 1e-9:
        raise WorkbenchError(f"the plan has {sum(replicas)} replicas x {REPLICA_CPUS} CPU = {need:g} CPUs, more "
                             f"than the Ray cluster's {session.num_cpus:g}: give fewer replicas or a larger cluster")

    from ray import serve

    if spec.state is not None and isinstance(spec.state, dict):
        spec = ModelSpec(spec.cfg, spec.num_classes, spec.threshold, spec.disabled, spec.seed, ray.put(spec.state))
    serve.start(proxy_location="Disabled", logging_config={"log_level": "WARNING", "enable_access_log": False})
    _quiet()
    app = None
    for i in reversed(range(len(splits))):
        deployment = _split_deployment(i, splits[i], replicas[i], batch_sizes[i], batch_wait_s)
        app = deployment.bind(spec) if app is None else deployment.bind(spec, app)
    begin = time.perf_counter()
    handle = serve.run(app, name=APP_NAME, route_prefix=None,
                       logging_config={"log_level": "WARNING", "enable_access_log": False})
    deploy_s = time.perf_counter() - begin
    try:
        t0, out = _drive(handle, workload, timeout_s, progress)
    finally:
        try:
            serve.delete(APP_NAME)
        except Exception:  # noqa: BLE001 - the run's own error matters more
            pass
    return _results(out, t0, workload, splits, replicas, batch_sizes, slo_s, spec.num_classes, deploy_s)
