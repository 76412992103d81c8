"""Hepti executed for real: the three weight-stationary modes on the runtime's processes, decided layer by layer.

At the start of every layer's self-attention (when every rank holds the whole input) each rank reports
its free memory (from an emulated schedule the caller can lower mid-run), its speed as its own compute
measured it (smoothed: :class:`SpeedEstimate`) and its link (the profile's: links are not re-estimated);
every rank gathers the reports and runs the
same deterministic partitioner (:func:`workbench.hepti.plan.hepti_partition`), so all agree on the
next layer's mode and split without a coordinator. The layer is then executed in that mode:

- ``ws``: Q/K/V by heads, the heads' outputs All-Gathered, the rest of the layer by rows, the rows All-Gathered.
- ``1d``: Megatron's split with Hepti's sizes: heads, the output projection by its rows, the FFN by
  columns then rows, two All-Reduces (the workbench's tensor-parallel layer).
- ``2d``: an r x c grid; device (i, j) computes heads of its row group's block; the output projection,
  the FFN's first and second products are split by rows and columns, their partial sums All-Reduced in a
  column (or row) group and the pieces All-Gathered in the other group.
- ``serial``: the primary alone.

Every collective's bytes are counted as it moves them and equal :func:`layer_steps`' (the cost model of
the executed split); compute and links are padded to the devices' profiles when emulating (links by
Eq. 6, the bytes each device receives over its bandwidth, summed over the devices, plus one latency).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Sequence

from workbench.devices import DeviceProfile, LayerShape
from workbench.distributed import limits as bounds
from workbench.distributed.ranks import RankGroup
from workbench.errors import WorkbenchError
from workbench.network import Traffic, all_gather_traffic, all_reduce_traffic, collective_s
from workbench.hepti.plan import MODE_TITLES, Partition, hepti_partition, largest_remainder, memory_bytes
from workbench.distributed.steps import Step

REESTIMATE_THRESHOLD = 0.5
"""Re-partition when a device's smoothed speed moved by more than half from the one the split was decided on
(a band: anything within it keeps the split)."""
SPEED_WINDOW = 3
"""A rank's speed estimate is the median of its last three layers' samples (the profile's speed standing in
for layers not yet run), so one stalled layer never moves it and two slow layers in three do."""


class SpeedEstimate:
    """A rank's speed as the partitioner reads it: the median of the last :data:`SPEED_WINDOW` per-layer
    samples (the work of the rank's own compute steps over their time), starting from the profile."""

    def __init__(self, profile_flops_per_s: float):
        self.samples = [profile_flops_per_s] * (SPEED_WINDOW - 1)

    def add(self, work: float, compute_s: float) -> None:
        if work > 0 and compute_s > 0:
            self.samples.append(work / compute_s)

    @property
    def flops_per_s(self) -> float:
        import statistics

        return statistics.median(self.samples[-SPEED_WINDOW:])


@dataclass(frozen=True)
class LayerSplit:
    """How one layer is split over the ranks (global rank order; 0 for a rank that takes no part)."""
    mode: str
    participants: tuple[int, ...]
    heads: tuple[int, ...]                  # heads of Q/K/V per rank
    rows: tuple[int, ...] = ()              # ws: positions per rank
    ffn: tuple[int, ...] = ()               # 1d: FFN columns per rank
    grid: tuple[int, int] = (1, 1)          # 2d: participants[i * c + j] is device (i, j)
    row_heads: tuple[int, ...] = ()         # 2d: heads of each row group's block
    row_dims: tuple[int, ...] = ()          # 2d: hidden features per row group (W_1's rows, W_2's columns)
    col_dims: tuple[int, ...] = ()          # 2d: hidden features per column group (W_O's columns)
    col_ffn: tuple[int, ...] = ()           # 2d: FFN columns per column group
    shares: tuple[float, ...] = ()          # the partitioner's shares per rank (its memory bounds hold for them)

    def position(self, rank: int) -> tuple[int, int]:
        """2d: (row group, column group) of ``rank``."""
        p = self.participants.index(rank)
        return divmod(p, self.grid[1])

    def row_group(self, i: int) -> list[int]:
        c = self.grid[1]
        return list(self.participants[i * c:(i + 1) * c])

    def col_group(self, j: int) -> list[int]:
        c = self.grid[1]
        return list(self.participants[j::c])


def split_of(partition: Partition, ranks: Sequence[int], shape: LayerShape) -> LayerSplit:
    """The executed split of a partition whose devices are the ranks ``ranks`` (in order)."""
    K = max(ranks) + 1 if ranks else 1
    full = lambda values: tuple(_spread(values, ranks, K))
    part = [r for r, s in zip(ranks, partition.shares) if s > 0]
    shares = tuple(float(x) for x in _spread(partition.shares, ranks, K))
    if partition.mode == "serial":
        heads = [0] * K
        heads[ranks[0]] = shape.heads
        return LayerSplit("serial", (ranks[0],), tuple(heads), shares=shares)
    if partition.mode == "ws":
        return LayerSplit("ws", tuple(part), full(partition.heads), rows=full(partition.sizes), shares=shares)
    if partition.mode == "1d":
        return LayerSplit("1d", tuple(part), full(partition.heads), ffn=full(partition.sizes), shares=shares)
    mu, nu = partition.axis_shares
    r, c = partition.grid
    row_heads = largest_remainder(shape.heads, mu)
    heads = [0] * K
    for i in range(r):
        for j, n in enumerate(largest_remainder(row_heads[i], nu) if row_heads[i] else [0] * c):
            heads[part[i * c + j]] = n
    return LayerSplit("2d", tuple(part), tuple(heads), grid=(r, c), row_heads=tuple(row_heads),
                      row_dims=tuple(largest_remainder(shape.hidden, mu)), col_dims=tuple(largest_remainder(shape.hidden, nu)),
                      col_ffn=tuple(largest_remainder(shape.ffn, nu)), shares=shares)


def _spread(values, ranks, K):
    out = [0] * K
    for r, v in zip(ranks, values):
        out[r] = v
    return out


def _group_traffic(K, members, traffic):
    out = [Traffic(0, 0)] * K
    for r, t in zip(members, traffic):
        out[r] = t
    return out


def layer_steps(split: LayerSplit, layer: int, shape: LayerShape, devices: Sequence[DeviceProfile],
                batch: int = 1, network: str = "shared") -> list[Step]:
    """The executed schedule of one layer: compute steps with each rank's Eq. (5) seconds, collectives with
    each rank's exact bytes (float32) and the seconds of :func:`~workbench.network.collective_s` on
    ``network`` (Eq. 6 on a shared medium; the model Voltage's plans use too): one latency for an
    All-Gather, 2 (G - 1) for a ring All-Reduce over G. ``devices[r]`` is rank r's current profile."""
    K, N, d, f, dh = len(devices), shape.seq_len, shape.hidden, shape.ffn, shape.hidden // shape.heads
    secs = lambda work: tuple(2 * w / dev.flops_per_s for w, dev in zip(work, devices))
    steps: list[Step] = []

    def collective(kind, label, members, traffic):
        full = _group_traffic(K, members, traffic)
        latency = max(devices[m].net_latency_s for m in members)
        hops = 2 * (len(members) - 1) if kind == "all_reduce" else 1
        seconds = collective_s(full, [d.net_bytes_per_s for d in devices], latency, hops, network)
        steps.append(Step(kind, layer, label, (seconds,) * K, tuple(full), latency_s=hops * latency if seconds else 0.0))

    qkv_attention = [split.heads[r] * dh * (3 * N * d + 2 * N * N) * batch for r in range(K)]
    if split.mode == "serial":
        work = [0] * K
        work[split.participants[0]] = (4 * N * d * d + 2 * N * N * d + 2 * N * d * f) * batch
        steps.append(Step("compute", layer, f"layer {layer} (serial)", secs(work)))
        return steps
    if split.mode == "ws":
        steps.append(Step("compute", layer, f"heads {layer}", secs(qkv_attention)))
        collective("all_gather", f"All-Gather heads {layer}", split.participants,
                   all_gather_traffic([split.heads[r] * dh * N * batch for r in split.participants]))
        steps.append(Step("compute", layer, f"rows {layer}", secs([split.rows[r] * (d * d + 2 * d * f) * batch
                                                                     for r in range(K)])))
        collective("all_gather", f"All-Gather rows {layer}", split.participants,
                   all_gather_traffic([split.rows[r] * d * batch for r in split.participants]))
        return steps
    if split.mode == "1d":
        attention = [q + split.heads[r] * dh * N * d * batch for r, q in enumerate(qkv_attention)]
        steps.append(Step("compute", layer, f"attention {layer}", secs(attention)))
        collective("all_reduce", f"All-Reduce {layer} (attention)", split.participants,
                   all_reduce_traffic(N * d * batch, len(split.participants)))
        steps.append(Step("compute", layer, f"FFN {layer}", secs([2 * N * d * split.ffn[r] * batch for r in range(K)])))
        collective("all_reduce", f"All-Reduce {layer} (FFN)", split.participants,
                   all_reduce_traffic(N * d * batch, len(split.participants)))
        return steps
    r_, c_ = split.grid
    steps.append(Step("compute", layer, f"heads {layer}", secs(qkv_attention)))
    for i in range(r_):
        members = split.row_group(i)
        collective("all_gather", f"All-Gather heads {layer} (row {i})", members,
                   all_gather_traffic([split.heads[m] * dh * N * batch for m in members]))
    pos = {m: split.position(m) for m in split.participants}
    work = [0] * K
    for m, (i, j) in pos.items():
        work[m] = N * split.row_heads[i] * dh * split.col_dims[j] * batch
    steps.append(Step("compute", layer, f"output projection {layer}", secs(work)))
    for j in range(c_):
        members = split.col_group(j)
        collective("all_reduce", f"All-Reduce projection {layer} (column {j})", members,
                   all_reduce_traffic(N * split.col_dims[j] * batch, len(members)))
    for i in range(r_):
        members = split.row_group(i)
        collective("all_gather", f"All-Gather projection {layer} (row {i})", members,
                   all_gather_traffic([N * split.col_dims[pos[m][1]] * batch for m in members]))
    for m, (i, j) in pos.items():
        work[m] = N * split.row_dims[i] * split.col_ffn[j] * batch
    steps.append(Step("compute", layer, f"FFN first {layer}", secs(work)))
    for j in range(c_):
        members = split.col_group(j)
        collective("all_reduce", f"All-Reduce FFN first {layer} (column {j})", members,
                   all_reduce_traffic(N * split.col_ffn[j] * batch, len(members)))
    steps.append(Step("compute", layer, f"FFN second {layer}", secs(work)))
    for i in range(r_):
        members = split.row_group(i)
        collective("all_reduce", f"All-Reduce FFN second {layer} (row {i})", members,
                   all_reduce_traffic(N * split.row_dims[i] * batch, len(members)))
    for j in range(c_):
        members = split.col_group(j)
        collective("all_gather", f"All-Gather FFN second {layer} (column {j})", members,
                   all_gather_traffic([N * split.row_dims[pos[m][0]] * batch for m in members]))
    return steps


@dataclass(frozen=True)
class Decision:
    """What the ranks decided at a layer's start."""
    layer: int
    mode: str
    shares: tuple[float, ...]
    reasons: tuple[str, ...]
    changed: str                            # "" (kept), "first", or why it re-partitioned
    free_bytes: tuple[float, ...]


class Reports:
    """What a rank reports at every layer's start, and the estimates the partitioner reads from the reports."""

    def __init__(self, devices: Sequence[DeviceProfile], memory_falls: dict[str, tuple[int, float]]):
        self.devices = list(devices)
        self.memory_falls = memory_falls
        self.speed = [d.flops_per_s for d in devices]
        self.link = [d.net_bytes_per_s for d in devices]

    def free_bytes(self, rank: int, layer: int) -> float:
        device = self.devices[rank]
        fall = self.memory_falls.get(device.name)
        return fall[1] if fall is not None and layer >= fall[0] else device.memory_bytes


def shape_of(model_shape, seq_len: int) -> LayerShape:
    """The layer shape Hepti splits: ``model_shape``'s at ``seq_len`` positions (1 to the model's positions)."""
    if not 1 <= seq_len <= model_shape.max_positions:
        raise WorkbenchError(f"sequence length must be 1 to {model_shape.max_positions} positions for "
                             f"{model_shape.name} (its position embeddings end there), got {seq_len}")
    return LayerShape(model_shape.hidden, model_shape.heads, model_shape.ffn, seq_len)


def decide(previous: LayerSplit | None, previous_speed, devices_now: Sequence[DeviceProfile], shape: LayerShape,
           num_layers: int, layer: int, deadline_s: float, ranks: Sequence[int],
           mode: str | None = None, adapt: bool = True, fixed_shares: Sequence[float] | None = None,
           network: str = "shared", quote_best: bool = True) -> tuple[LayerSplit | None, str, Partition | None]:
    """(split, why it changed, partition) for the next layer; (None, "", None) when the current split holds.
    ``quote_best``: as :func:`hepti_partition`'s, for the first decision (the one held to the deadline).

    Re-partitions when there is none yet, when a participant's free memory no longer holds what its share
    of the current mode needs, or when a speed estimate (:class:`SpeedEstimate`) moved by more than
    :data:`REESTIMATE_THRESHOLD` since the last decision (unless ``adapt`` is off: memory alone decides)."""
    why = ""
    if previous is None:
        why = "first"
    else:
        for r in previous.participants:
            share = _share_of(previous, r, shape)
            need = memory_bytes(previous.mode, shape, share, num_layers)
            if devices_now[r].memory_bytes < need:
                why = (f"{devices_now[r].name}'s free memory fell to {devices_now[r].memory_bytes / 1e6:.1f} MB, "
                       f"below the {need / 1e6:.1f} MB {MODE_TITLES[previous.mode]} needs")
                break
        if not why and adapt and previous_speed is not None:
            for r, (old, dev) in enumerate(zip(previous_speed, devices_now)):
                if old and abs(dev.flops_per_s - old) > REESTIMATE_THRESHOLD * old:
                    why = (f"{dev.name}'s measured speed (median of its last {SPEED_WINDOW} layers) moved from "
                           f"{old / 1e9:.1f} to {dev.flops_per_s / 1e9:.1f} GFLOP/s")
                    break
    if not why:
        return None, "", None
    # the deadline is checked when the run is planned; a later decision must carry on whatever it costs
    partition = hepti_partition(devices_now, shape, deadline_s if previous is None else math.inf,
                                num_layers=num_layers, mode=mode, fixed_shares=fixed_shares, network=network,
                                quote_best=quote_best or previous is not None)
    return split_of(partition, list(ranks), shape), why, partition


def _share_of(split: LayerSplit, rank: int, shape: LayerShape) -> float:
    return split.shares[rank] if split.shares else 1.0


def predicted_steps(partition: Partition, shape: LayerShape, num_layers: int) -> list[Step]:
    """The schedule of every layer under one partition (no re-partitioning)."""
    K = len(partition.devices)
    split = split_of(partition, list(range(K)), shape)
    return [step for layer in range(num_layers)
            for step in layer_steps(split, layer, shape, partition.devices, network=partition.network)]


@dataclass(frozen=True)
class HeptiRun:
    """A Hepti inference on real processes, with every decision and fault on the way."""
    partition: Partition                    # the first decision, over every device given
    hidden: object                          # np.ndarray: the terminal's final hidden states
    logits: object
    timeline: object                        # measured Timeline on one clock, restarts included
    predicted: object                       # predicted Timeline of the first decision kept to the end
    decisions: tuple[Decision, ...]
    faults: tuple[str, ...]
    latency_s: float                        # inference time on the primary: runs a fault cut short, then the last
                                            # run's (process restarts apart, which the timeline shows)
    counts: tuple[tuple[dict, ...], ...]    # per segment's ranks, their collectives
    started_at: float = 0.0                 # time.perf_counter() at the measured timeline's 0 (the primary's first report)
    emulated: bool = True                   # compute and links padded to the profiles: a replay, not a measurement
    limited: bool = False                   # every rank under its device's CPU limit, its link shaped: measured
    note: str = ""                          # why a run asked to be measured was not
    memory: tuple = ()                      # per rank of the last segment: per decision {layer, held, resident} bytes

    def switches(self) -> list[Decision]:
        return [d for d in self.decisions if d.changed not in ("", "first")]

    @property
    def label(self) -> str:
        """"measured" (ranks under CPU limits on shaped links), "replayed" (padded to the profiles) or
        "unlimited" (this host's speed)."""
        return "measured" if self.limited else "replayed" if self.emulated else "unlimited"

    def check(self, load=None):
        """The shared prediction check against Eq. 7 (the partitioner's latency), with what Hepti can tell of
        a miss beyond the busy kinds of work: the link latencies, report gathers and decisions Eq. 7 leaves
        out, re-partitions the first decision's prediction does not hold, and faults."""
        from dataclasses import replace as _replace

        from workbench.prediction import check_prediction

        predicted_s = self.partition.predicted_latency_s
        check = check_prediction(self.timeline, self.predicted, self.latency_s, predicted_s, load=load,
                                 emulated=self.partition.devices[0].name if self.emulated and not self.limited else "",
                                 label=self.label)
        causes = list(check.causes)
        lane = "device 0"
        gathers = sum(x.duration for x in self.timeline.spans if x.lane == lane and x.event == "report")
        decides = sum(x.duration for x in self.timeline.spans if x.lane == lane and x.event == "decision")
        if gathers + decides > 0.05 * predicted_s:
            causes.append(f"the primary's report gathers ({1e3 * gathers:.0f} ms) and decisions ({1e3 * decides:.0f} ms), "
                          "which Eq. 7 leaves out")
        schedule = self.predicted.end
        if abs(schedule - predicted_s) > 0.05 * predicted_s:
            causes.append(f"the executed split's schedule is {1e3 * schedule:.0f} ms against Eq. 7's "
                          f"{1e3 * predicted_s:.0f} ms (link latencies, whole heads and rows)")
        if self.switches():
            causes.append(f"{len(self.switches())} re-partitions (at layers "
                          f"{', '.join(str(d.layer) for d in self.switches())}); the prediction keeps the first split")
        if self.faults:
            causes.append(f"{len(self.faults)} fault(s): the run a fault cut short counts in the latency")
        stalls = [x for x in self.timeline.spans if x.label.endswith("(injected)")]
        if stalls:
            causes.append(f"{len(stalls)} injected stall(s), {1e3 * sum(x.duration for x in stalls):.0f} ms")
        return _replace(check, causes=tuple(causes))


def run_hepti(devices: Sequence[DeviceProfile], model: str = "encoder", seq_len: int = 128, *,
              deadline_s: float = math.inf, memory_falls: dict[str, tuple[int, float]] | None = None,
              emulate: bool = True, measured: bool = False, kill_at: tuple[str, int] | None = None, seed: int = 0,
              mode: str | None = None, adapt: bool = True, shares: Sequence[float] | None = None,
              stalls: dict[str, dict[int, float]] | None = None, network: str = "shared", progress=None,
              should_stop=None) -> HeptiRun:
    """Hepti on real processes, one per device (the first the primary).

    ``memory_falls``: device name -> (layer, free bytes from that layer on), the emulated memory reports.
    ``measured``: each rank computes under a CPU cgroup calibrated to its device's speed and its link is shaped
    by ``tc`` to its bandwidth (issue 30's runtime; root and iproute2 needed, otherwise the run is made at this
    host's speed and ``note`` says why); else ``emulate`` pads compute and links to the profiles (a replay)
    or, off, runs at this host's speed.
    ``kill_at``: (device name, layer): that device's process is killed with SIGKILL when the primary starts
    that layer. The primary holds the request: it checkpoints each layer's input in its own storage (a
    directory only it writes), so a secondary's death re-partitions over the devices left from that
    checkpoint (the failed device is named in ``faults``), and the primary's death fails the request with
    :class:`PrimaryLost`. A device outside the first plan cannot be named; one that a later decision left
    out is not killed (its failure would change nothing) and ``faults`` says so. ``mode``
    forces one mode at every decision (it must fit; ``"2d"`` on 4 devices shows the grid). ``adapt=False``
    re-partitions on memory reports only, not on measured speeds. ``shares`` replaces the LP's (a baseline:
    even, or in proportion to speed) in the mode Hepti picks or ``mode`` forces. ``stalls``: device name ->
    {layer: seconds} that device's rank loses inside that layer's compute (injected host hiccups: one is
    smoothed away, a run of them re-partitions). ``network``: the cluster's (how collectives are priced)."""
    from workbench.models.shapes import get_shape

    model_shape = get_shape(model)
    shape = shape_of(model_shape, seq_len)
    devices = list(devices)
    if shares is not None and mode is None:
        mode = hepti_partition(devices, shape, deadline_s, num_layers=model_shape.num_layers, network=network).mode
    first = hepti_partition(devices, shape, deadline_s, num_layers=model_shape.num_layers, mode=mode,
                            fixed_shares=shares, network=network)
    check_faults(first, model_shape.num_layers, kill_at, memory_falls)
    import shutil
    import tempfile

    primary_dir = tempfile.mkdtemp(prefix="hepti-primary-")       # the primary device's own storage
    try:
        from workbench.hepti.weights import stored_weights

        weights = stored_weights(model, 0)      # the model file the devices load their slices from
        return _run(devices, model, seq_len, model_shape, shape, first, primary_dir, deadline_s=deadline_s,
                    memory_falls=memory_falls, emulate=emulate, measured=measured, kill_at=kill_at, seed=seed, mode=mode,
                    adapt=adapt, weights=str(weights),
                    shares=shares, stalls=stalls, progress=progress, should_stop=should_stop)
    finally:
        shutil.rmtree(primary_dir, ignore_errors=True)


class PrimaryLost(WorkbenchError):
    """The primary died: it holds the request, so the request fails (Hepti does not resume without it)."""


def check_faults(partition: Partition, num_layers: int, kill_at, memory_falls) -> None:
    """Faults must name a device of the plan and a layer of the model (one line each, before any work)."""
    names = [d.name for d in partition.devices]
    taking = [d.name for d, s in zip(partition.devices, partition.shares) if s > 0]
    wanted = [("kill", *kill_at)] if kill_at is not None else []
    wanted += [("memory fall", name, layer) for name, (layer, _) in (memory_falls or {}).items()]
    for what, name, layer in wanted:
        if name not in names:
            raise WorkbenchError(f"the {what} names {name!r}, which is none of the devices ({', '.join(names)})")
        if what == "kill" and name not in taking:
            raise WorkbenchError(f"the kill names {name!r}, which takes no part in the plan (it takes "
                                 f"{', '.join(taking)}): its failure would change nothing")
        if not (isinstance(layer, int) and 0 <= layer < num_layers):
            raise WorkbenchError(f"the {what} on {name} is at layer {layer!r}; the model's layers are 0 to "
                                 f"{num_layers - 1}")


class HeptiGroup(RankGroup):
    """One process per device running :mod:`workbench.hepti.worker`; the options are :class:`RankGroup`'s
    (``cpu`` limits and ``shaped`` links for a measured run)."""

    def __init__(self, size: int, **options):
        bounds.ranks.check("worker processes", size)
        super().__init__(size, "workbench.hepti.worker", name="hepti", **options)


def _run(devices, model, seq_len, model_shape, shape, first, primary_dir, *, deadline_s, memory_falls, emulate, measured,
         weights,
         kill_at, seed, mode, adapt, shares, stalls, progress, should_stop) -> HeptiRun:
    import os
    import signal

    import numpy as np

    from workbench.distributed.ranks import DEADLINE_MARGIN_S, RunFailed
    from workbench.timeline import Span, Timeline
    from workbench.distributed.steps import steps_timeline

    predicted = steps_timeline(predicted_steps(first, shape, model_shape.num_layers), [d.name for d in devices],
                               "hepti predicted")
    falls = {name: [layer, nbytes] for name, (layer, nbytes) in (memory_falls or {}).items()}
    resume, start_layer = False, 0
    spans, decisions, faults, counts = [], [], [], []
    note = ""
    if measured:
        from workbench.distributed.cpulimit import limit_speed, limits_problem

        problem = limits_problem()
        if problem:
            note, emulate = f"cannot emulate the devices ({problem}): ran at this host's full speed", False
    lost_s = 0.0                                # inference time of runs a fault cut short
    lost_names: list[str] = []
    lane_of = {d.name: f"device {i}" for i, d in enumerate(devices)}    # the prediction's lanes, by device
    t_zero = None                               # the primary's first report: time 0 of the measured timeline
    while True:
        names = [d.name for d in devices]
        limits = {}
        if measured and not note:
            limits = {"cpu": [limit_speed(d, seq_len) for d in devices], "shaped": [d.net_bytes_per_s for d in devices],
                      "probe_layer": (shape.hidden, shape.heads, shape.ffn, seq_len)}
        runtime = HeptiGroup(len(devices), **limits)
        spec = {"scheme": "hepti", "model": model, "seq_len": seq_len, "devices": [d.to_dict() for d in devices],
                "memory_falls": falls, "deadline_s": None if math.isinf(deadline_s) else deadline_s,
                "checkpoint_dir": primary_dir, "resume": resume, "emulate": emulate and not limits, "weights": weights,
                "limited": bool(limits),
                "seed": seed, "mode": mode, "adapt": adapt, "shares": None if shares is None else list(shares),
                "stalls": {name: {str(k): v for k, v in by.items()} for name, by in (stalls or {}).items()},
                "network": first.network}
        victim = None
        if kill_at is not None and kill_at[0] in names:
            victim = (names.index(kill_at[0]), kill_at[1])

        def hook(done, total, runtime=runtime, victim=victim):
            nonlocal kill_at
            primary_at = runtime.steps[0] if runtime.steps else -1
            if victim is not None and kill_at is not None and primary_at >= victim[1] \
                    and runtime.group is not None and runtime.group.workers[victim[0]].process.poll() is None:
                latest = [r["decision"] for r in runtime.reports if "decision" in r]
                if latest and not latest[-1]["shares"][victim[0]]:
                    faults.append(f"{kill_at[0]} was not killed at layer {primary_at}: the decision at layer "
                                  f"{latest[-1]['layer']} left it out, so its failure would change nothing")
                else:
                    os.kill(runtime.group.workers[victim[0]].process.pid, signal.SIGKILL)
                kill_at = None
            if progress is not None:
                progress(done, total)

        try:
            with runtime:
                job_start = time.perf_counter()
                results = runtime.run_spec(spec, names, model_shape.num_layers - start_layer,
                                           predicted.end * 5 + DEADLINE_MARGIN_S, hook, should_stop)
                timeline, origin = runtime.merge(results, "hepti measured")
        except RunFailed as failure:
            if failure.kind not in ("died", "hung") or failure.rank is None or len(devices) == 1:
                raise                                   # an error in the code or a cancel is no device fault
            lost = devices[failure.rank].name
            start_layer = checkpoint_layer(primary_dir)
            if failure.rank == 0:
                at = f"at layer {start_layer}" if start_layer is not None else "before its first layer"
                raise PrimaryLost(f"the primary {lost} died {at}: it holds the request (its input and each "
                                  f"layer's checkpoint), so the request fails; nothing is resumed ({failure})") from None
            lost_s += time.perf_counter() - (runtime.first_progress_at or job_start)
            t_zero = t_zero if t_zero is not None else (runtime.first_progress_at or job_start)
            decisions.extend(_decisions([r["decision"] for r in runtime.reports if "decision" in r]))
            resume = start_layer is not None
            start_layer = start_layer or 0
            now = time.perf_counter() - t_zero
            faults.append(f"{failure}; resumed at layer {start_layer} over the {len(devices) - 1} devices left")
            spans.append(Span(lane_of[lost], "stall", now, now, f"fault: {lost} lost at layer {start_layer}; "
                              f"re-partition over {len(devices) - 1} devices", device=lost, layer=start_layer,
                              event="fault"))
            devices = [d for i, d in enumerate(devices) if i != failure.rank]
            lost_names.append(lost)
            continue
        t_zero = t_zero if t_zero is not None else origin
        shift = origin - t_zero
        spans.extend(replace(s, start=s.start + shift, end=s.end + shift, lane=lane_of[names[s.rank]])
                     for s in timeline.spans)
        resumed = _decisions(results[0]["decisions"])
        if faults and resumed and resumed[0].changed == "first":
            resumed[0] = replace(resumed[0], changed=f"re-partition after the fault: {lost_names[-1]} lost")
        decisions.extend(resumed)
        counts.append(tuple(tuple(results[r]["counts"]) for r in range(len(devices))))
        latency = lost_s + results[0]["wall_s"]
        measured = Timeline(tuple(sorted(spans, key=lambda s: s.start)), "measured", name="hepti measured")
        return HeptiRun(partition=first, hidden=np.asarray(decode(results[0]["hidden"])),
                        logits=np.asarray(decode(results[0]["logits"])), timeline=measured, predicted=predicted,
                        decisions=tuple(decisions), faults=tuple(faults), latency_s=latency, counts=tuple(counts),
                        started_at=t_zero, emulated=emulate and not limits, limited=bool(limits), note=note,
                        memory=tuple(tuple(results[r]["memory"]) for r in range(len(devices))))


CHECKPOINT = "layer-{:04d}.npy"


def save_checkpoint(directory: str, layer: int, x) -> None:
    """The primary's checkpoint of the request: the input of ``layer``, written whole (a temporary file renamed
    over) into the primary's own storage, the previous layer's removed."""
    import os

    import numpy as np

    path = os.path.join(directory, CHECKPOINT.format(layer))
    with open(path + ".tmp", "wb") as handle:
        np.save(handle, np.ascontiguousarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x))
    os.replace(path + ".tmp", path)
    for name in os.listdir(directory):
        if name != os.path.basename(path) and name.startswith("layer-"):
            os.remove(os.path.join(directory, name))


def checkpoint_layer(directory: str) -> int | None:
    """The layer whose input the primary's checkpoint holds; None before the first."""
    import os

    names = sorted(n for n in os.listdir(directory) if n.startswith("layer-") and n.endswith(".npy"))
    return int(names[-1][6:10]) if names else None


def load_checkpoint(directory: str):
    """(layer, its input) from the primary's checkpoint."""
    import os

    import numpy as np

    layer = checkpoint_layer(directory)
    if layer is None:
        raise RuntimeError(f"the primary holds no checkpoint in {directory}")
    return layer, np.load(os.path.join(directory, CHECKPOINT.format(layer)))


def _decisions(raw: Sequence[dict]) -> list[Decision]:
    return [Decision(r["layer"], r["mode"], tuple(r["shares"]), tuple(r["reasons"]), r["changed"],
                     tuple(r["free_bytes"])) for r in raw]


def decode(d):
    from workbench.distributed.wire import decode_array

    return decode_array(d)
