"""What an E3 served run takes and gives back (:func:`workbench.earlyexit.serve.serve_plan`).

Kept apart from the run itself, which needs Ray: the model a replica rebuilds (:class:`ModelSpec`), the requests
(:class:`Workload`), the result (:class:`ServeRun` with its :class:`ServedRequest` rows, :class:`Window`
observations and :class:`Replan` records) and the check of a split plan (:func:`check_plan`). The field
vocabulary mirrors :mod:`workbench.earlyexit.simulator`.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from workbench.earlyexit.raycluster import type_resource
from workbench.earlyexit.simulator import ArrivalProcess, RequestTally, _check_splits, _whole_positive
from workbench.errors import WorkbenchError
from workbench.timeline import Timeline

__all__ = ["ModelSpec", "Workload", "ServedRequest", "ServeRun", "Replan", "Window", "check_plan", "as_spec"]


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
    """One request as served (or dropped): when it came, where it left the model, its label, when it answered."""
    id: int
    arrival_s: float                  # scheduled arrival (seconds from the run's start)
    exit_layer: int                   # -1 if dropped
    exit_split: int                   # the split it left by (in the plan it ran under); -1 if dropped
    label: int                        # -1 if dropped
    completion_s: float               # when the driver's awaited answer (result or drop) resolved
    latency_s: float                  # completion - arrival; NaN if dropped
    met_slo: bool
    sent_s: float = 0.0               # when the driver actually sent it
    exited_s: float = 0.0             # when its last batch ended on the replica it left by
    dropped: bool = False
    dropped_split: int | None = None  # the split it was dropped before (-1: refused at the ingress)
    drop_reason: str = ""             # "deadline" (could not return in time) or "queue full" (backpressure)
    plan: int = 0                     # which plan (0: the first, k: after the k-th re-plan) it entered under

    @property
    def late(self) -> bool:
        """Served, but after its SLO."""
        return not self.dropped and not self.met_slo


@dataclass(frozen=True)
class Replan:
    """One re-plan of a served run: when, after which window, the plans before and after, and the forecast."""
    at_s: float                       # when the new plan was deployed (seconds from the run's start)
    window: int                       # the window whose observation moved the forecast (0-based)
    old: dict
    new: dict
    forecast: tuple[float, ...]       # the forecast batch profile the new plan was made for
    deploy_s: float                   # seconds serve.run took


@dataclass(frozen=True)
class Window:
    """One observation window: the served requests' batch profile, and the next window's ARIMA forecast."""
    index: int
    start_s: float
    end_s: float
    served: int                       # requests served in the window (their exits make the observation)
    observed: tuple[float, ...]
    forecast: tuple[float, ...]
    methods: tuple[str, ...] = ()     # how each ramp's forecast was made (ARIMA, constant, last value)
    note: str = ""                    # a re-plan that could not be used, and why


@dataclass(frozen=True)
class ServeRun(RequestTally):
    """A served run: per request, per split's batch sizes, a measured Timeline and the summary figures."""
    requests: tuple[ServedRequest, ...]
    timeline: Timeline = field(repr=False)
    batch_counts: tuple[dict[int, int], ...]     # per split: batch size served -> how many times
    splits: tuple[tuple[int, int], ...]          # the first plan's (re-plans: see ``replans``)
    replicas: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    slo_s: float
    duration_s: float                 # 0 (first arrival) to the last answer
    goodput: float                    # requests meeting the SLO per second of the run
    throughput: float                 # requests served (in time or not) per second of the run
    p50_latency_s: float              # over served requests; NaN if none was served
    p95_latency_s: float
    drop_rate: float = 0.0            # dropped / all requests
    deploy_s: float = 0.0             # seconds to deploy the application (not in duration_s)
    logits: torch.Tensor | None = field(default=None, repr=False, compare=False)   # (n, classes); NaN if dropped
    gpu_types: tuple = ()             # the first plan's GPU type per split (None: untyped)
    replans: tuple[Replan, ...] = ()
    windows: tuple[Window, ...] = ()
    stragglers: tuple[dict, ...] = ()  # replicas excluded: at_s, split, replica, node, slowdown, batches
    replica_nodes: dict = field(default_factory=dict)   # (split, replica) -> {"node": id, "ip": address}

    @property
    def late(self) -> int:
        return sum(r.late for r in self.requests)

    @property
    def served(self) -> np.ndarray:
        """Boolean mask of the requests that were served (not dropped)."""
        return np.array([not r.dropped for r in self.requests], dtype=bool)

    @property
    def drop_reasons(self) -> dict[str, int]:
        return dict(Counter(r.drop_reason for r in self.requests if r.dropped))

    @property
    def exit_layers(self) -> np.ndarray:
        return np.array([r.exit_layer for r in self.requests], dtype=np.int64)

    @property
    def labels(self) -> np.ndarray:
        return np.array([r.label for r in self.requests], dtype=np.int64)


# -- checks -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Plan:
    splits: tuple[tuple[int, int], ...]
    replicas: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    gpu_types: tuple                  # str per split, or None per split (untyped)
    stage_s: tuple | None = None

    def to_dict(self) -> dict:
        return {"splits": [list(s) for s in self.splits], "replicas": list(self.replicas),
                "batch_sizes": list(self.batch_sizes), "gpu_types": list(self.gpu_types)}

    def key(self) -> tuple:
        return (self.splits, self.replicas, self.batch_sizes, self.gpu_types)

    def type_needs(self) -> dict[str, int]:
        needs: Counter = Counter()
        for gpu, r in zip(self.gpu_types, self.replicas):
            if gpu is not None:
                needs[gpu] += r
        return dict(needs)


def check_plan(plan: Any, num_layers: int) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...], tuple[int, ...]]:
    """The plan's splits, replicas and batch sizes, checked to cover layers 0..num_layers-1 contiguously."""
    p = _read_plan(plan, num_layers)
    return p.splits, p.replicas, p.batch_sizes


def _read_plan(plan: Any, num_layers: int) -> _Plan:
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
    types = getattr(plan, "gpu_types", None)
    if types is None or len(list(types)) == 0:
        gpu_types: tuple = (None,) * n
    else:
        gpu_types = tuple(None if t is None else str(t) for t in types)
        if len(gpu_types) != n:
            raise WorkbenchError(f"the plan has {len(gpu_types)} GPU types for {n} splits: give one per split")
        for t in gpu_types:
            if t is not None:
                type_resource(t)
    stage = getattr(plan, "stage_s", None)
    stage_s = None
    if stage is not None and len(list(stage)) == n:
        values = [float(v) for v in stage]
        if all(math.isfinite(v) and v >= 0 for v in values):
            stage_s = tuple(values)
    return _Plan(splits, replicas, batch_sizes, gpu_types, stage_s)
