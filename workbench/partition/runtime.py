"""The partition runtime, parent side: a group of real worker processes, kept while its settings hold.

:class:`PartitionRuntime` is a :class:`workbench.distributed.ranks.RankGroup` of
:mod:`workbench.partition.worker` ranks (gloo, rendezvous on 127.0.0.1, or inside network namespaces with
shaped links, each rank optionally held to its device by a CPU limit); it sends each run's plan to every
rank, follows their progress step by step, and returns a :class:`RunResult`:
the terminal's outputs, the bytes every rank counted per layer and per kind, and one measured
timeline on the parent's clock (per-rank clocks aligned by the group's ping offsets).

A worker that dies is reported at once with its rank and device; one that stops answering is
named when the run's deadline passes (its last step said). Either way the whole group is stopped,
no process is left, and the next run starts a fresh group. :func:`shared_runtime` keeps one group
per process and reuses it while the device count and the link set-up stay the same.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from workbench.distributed.cpulimit import limit_speed, limits_problem  # noqa: F401  (the partition API names them)
from workbench.distributed.ranks import DEADLINE_FACTOR, DEADLINE_MARGIN_S, RankGroup
from workbench.distributed.ranks import RunFailed  # noqa: F401  (the partition API names it here)
from workbench.distributed.wire import decode_array
from workbench.errors import WorkbenchError
from workbench.partition.cost import Traffic
from workbench.partition.plan import PartitionPlan
from workbench.timeline import Timeline


@dataclass(frozen=True)
class RunResult:
    plan: PartitionPlan
    hidden: np.ndarray                     # final hidden states on the terminal (rank 0)
    logits: np.ndarray
    timeline: Timeline                     # measured, every rank on one clock
    counts: tuple[tuple[dict, ...], ...]   # per rank: every collective's {layer, kind, sent, received}
    latency_s: float                       # the terminal's (rank 0's) time from its start to its logits
    emulated: bool                         # padded to the cost model's schedule: a replay of the prediction
    shaped: bool
    rank_wall_s: tuple[float, ...] = ()
    limited: bool = False                  # every rank computed under its device's CPU limit
    calibrations: tuple = ()               # per rank: cpulimit.Calibration of its limit
    note: str = ""                         # why a run asked to be measured was not
    wire: tuple = ()                       # shaped links: per rank, Traffic read off its veth during the run

    def wire_over_counted(self) -> list[float]:
        """Per rank that sent anything: bytes its link carried out over the bytes it counted sending (framing,
        acknowledgements and protocol messages make it a little above 1); [] without shaped links."""
        return [w.sent / c.sent for w, c in zip(self.wire, self.total_traffic()) if c.sent] if self.wire else []

    @property
    def mode(self) -> str:
        """"measured" (ranks under their devices' CPU limits), "replay" (padded to the prediction) or
        "unlimited" (this host's full speed); see :data:`workbench.partition.execute.MODES`."""
        return "measured" if self.limited else "replay" if self.emulated else "unlimited"

    def traffic(self) -> list[list[Traffic]]:
        """Per layer, per rank: bytes counted by the runtime, in the shape of :meth:`PartitionPlan.traffic`."""
        K, L = self.plan.K, self.plan.shape.num_layers
        table = [[Traffic(0, 0)] * K for _ in range(L)]
        for rank, counts in enumerate(self.counts):
            for c in counts:
                if c["layer"] is not None:
                    table[c["layer"]][rank] = table[c["layer"]][rank] + Traffic(c["sent"], c["received"])
        return table

    def total_traffic(self) -> list[Traffic]:
        """Per rank: bytes counted over the whole run, the input's broadcast included
        (:meth:`PartitionPlan.total_traffic`'s shape)."""
        return [Traffic(sum(c["sent"] for c in counts), sum(c["received"] for c in counts)) for counts in self.counts]

    def sent_by_kind(self) -> dict[str, list[int]]:
        """Per collective kind, per rank: bytes sent over the whole run."""
        out: dict[str, list[int]] = {}
        for rank, counts in enumerate(self.counts):
            for c in counts:
                out.setdefault(c["kind"], [0] * self.plan.K)[rank] += c["sent"]
        return out

    def check(self):
        """The shared prediction check of this run against its plan."""
        from workbench.prediction import check_prediction

        device = self.plan.devices[0].name if self.emulated and not self.limited else ""
        predicted = self.plan.timeline
        if self.plan.scheme == "torch_tp":
            # PyTorch's collectives run inside its layers, measured as one span a layer: compare them whole
            predicted = Timeline(tuple(replace(s, kind="compute") if s.kind == "comm" else s for s in predicted.spans),
                                 predicted.source, predicted.counters, predicted.name)
        return check_prediction(self.timeline, predicted, self.latency_s, self.plan.predicted_s, emulated=device,
                                label="replayed" if self.mode == "replay" else "measured")


class PartitionRuntime(RankGroup):
    """K ranks of :mod:`workbench.partition.worker` (at most this machine's limit), started once and reused for
    runs with the same device count, links and CPU limits; the options are :class:`RankGroup`'s."""

    def __init__(self, size: int, *, shaped: Sequence[float] | None = None, threads: int | None = None,
                 logs: Path | None = None, should_stop: Callable[[], bool] | None = None,
                 rank_timeout_s: float = 120.0, cpu: Sequence[float] | None = None,
                 probe_layer: Sequence[int] = (384, 12, 1536, 128)):
        from workbench.distributed import limits

        limits.ranks.check("worker processes", size)
        super().__init__(size, "workbench.partition.worker", shaped=shaped, threads=threads, logs=logs,
                         should_stop=should_stop, rank_timeout_s=rank_timeout_s, cpu=cpu, probe_layer=probe_layer,
                         name="partition")

    def run(self, plan: PartitionPlan, *, emulate: bool = True, seed: int = 0, model_seed: int = 0,
            progress: Callable[[int, int], None] | None = None, deadline_s: float | None = None,
            should_stop: Callable[[], bool] | None = None) -> RunResult:
        """Run ``plan`` on the ranks; ``progress(done, total)`` after each step every rank finished;
        ``should_stop()`` true cancels the run (and stops the group). On shaped links the collectives are
        timed for real and only their latency is emulated."""
        if plan.K != self.size:
            raise WorkbenchError(f"the plan has {plan.K} devices but this runtime {self.size} worker processes")
        spec = {"scheme": plan.scheme, "model": plan.shape.name, "seq_len": plan.seq_len,
                "devices": [d.to_dict() for d in plan.devices], "shares": [list(v) for v in plan.shares] or "even",
                "order": plan.order, "network": plan.network, "emulate": emulate and self.cpu is None,
                "limited": self.cpu is not None,
                "seed": seed, "model_seed": model_seed}
        deadline = deadline_s or DEADLINE_FACTOR * plan.predicted_s + DEADLINE_MARGIN_S
        before = self.network.wire_bytes() if self.network is not None else None
        results = self.run_spec(spec, [d.name for d in plan.devices], len(plan.steps), deadline, progress, should_stop)
        result = self._result(plan, results, emulate)
        if before is not None and self.network is not None:
            after = self.network.wire_bytes()
            result = replace(result, wire=tuple(Traffic(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before)))
        return result

    def _result(self, plan: PartitionPlan, results: dict[int, dict], emulate: bool) -> RunResult:
        what = "measured" if self.cpu is not None else "replay of the prediction" if emulate else "unlimited"
        merged, _ = self.merge(results, f"{plan.scheme} {what}")
        counts = tuple(tuple(results[r]["counts"]) for r in range(self.size))
        latency = results[0]["wall_s"]
        return RunResult(plan=plan, hidden=decode_array(results[0]["hidden"]), logits=decode_array(results[0]["logits"]),
                         timeline=merged, counts=counts, latency_s=latency, emulated=emulate and self.cpu is None,
                         shaped=self.shaped is not None, rank_wall_s=tuple(results[r]["wall_s"] for r in range(self.size)),
                         limited=self.cpu is not None, calibrations=self.calibrations)


_SHARED: dict[str, PartitionRuntime] = {}
_LOCK = threading.Lock()


def shared_runtime(size: int, *, shaped: Sequence[float] | None = None, threads: int | None = None,
                   key: str = "default", cpu: Sequence[float] | None = None,
                   probe_layer: Sequence[int] = (384, 12, 1536, 128)) -> PartitionRuntime:
    """The process's runtime under ``key``, reused while its settings hold (a new one replaces it, and the
    old group is stopped, when the device count, the links or the threads change, or a rank died)."""
    with _LOCK:
        want = PartitionRuntime(size, shaped=shaped, threads=threads, cpu=cpu, probe_layer=probe_layer)
        have = _SHARED.get(key)
        if have is not None and have.settings == want.settings and have.alive:
            return have
        if have is not None:
            have.close()
        _SHARED[key] = want
        return want


def close_shared() -> None:
    with _LOCK:
        for runtime in _SHARED.values():
            runtime.close()
        _SHARED.clear()


def probe_shape(plan: PartitionPlan) -> tuple[int, int, int, int]:
    """The layer a measured run's CPU limits are calibrated on: the plan's model's, at the plan's positions."""
    shape = plan.shape
    return (shape.hidden, shape.heads, shape.ffn, plan.seq_len)


def limit_speeds(plan: PartitionPlan) -> list[float]:
    """Per rank, :func:`limit_speed` of its device at the plan's positions."""
    return [limit_speed(d, plan.seq_len) for d in plan.devices]


def run_partition(plan: PartitionPlan, *, mode: str = "measured", shaped: bool | None = None, seed: int = 0,
                  progress: Callable[[int, int], None] | None = None,
                  should_stop: Callable[[], bool] | None = None) -> RunResult:
    """Run ``plan`` on real processes: the shared group of its device count and mode, started or reused.

    ``mode`` (:data:`~workbench.partition.execute.MODES`): "measured" holds each rank to its device's speed with
    a CPU cgroup and shapes its link with ``tc`` (root and iproute2 needed; where they are missing the run is
    made at full speed and says why, its mode "unlimited"); "replay" pads to the prediction; "unlimited" runs
    at this host's speed. ``shaped`` (default: in measured mode) puts each rank in a network namespace with its
    link limited to its device's bandwidth; otherwise the links are emulated in the application."""
    from workbench.partition.execute import MODES

    if mode not in MODES:
        raise WorkbenchError(f"a run's mode is one of {', '.join(MODES)}, got {mode!r}")
    note = ""
    if mode == "measured":
        problem = limits_problem()
        if problem:
            mode, note = "unlimited", f"cannot emulate the devices ({problem}): ran at this host's full speed"
    shaped = mode == "measured" if shaped is None else shaped
    bandwidths = [d.net_bytes_per_s for d in plan.devices] if shaped else None
    if shaped:
        from workbench.distributed.shaping import check_shaping_available

        check_shaping_available()
    cpu = limit_speeds(plan) if mode == "measured" else None
    runtime = shared_runtime(plan.K, shaped=bandwidths, cpu=cpu, probe_layer=probe_shape(plan))
    result = runtime.run(plan, emulate=mode == "replay", seed=seed, progress=progress, should_stop=should_stop)
    return replace(result, note=note) if note else result
