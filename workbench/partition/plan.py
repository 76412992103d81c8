"""Partition plans: which device computes what, in which order, and the schedule the runtime follows.

A :class:`PartitionPlan` is the decision (share vectors, position ranges, attention orders, heads
per device, layers per device), its reasons, and its schedule: a list of :class:`Step` (a compute
step with each device's predicted seconds, or a collective with each device's bytes and its
predicted seconds). The predicted :class:`~workbench.timeline.Timeline` is drawn from the schedule,
and the runtime walks the same steps, so the counted bytes and the padded seconds of an emulated
run come from the very numbers the prediction shows.

Schemes, all on the same devices and runtime:

- ``voltage``: every layer split by position (Algorithm 1), one All-Gather per layer (Algorithm 2).
- ``tensor_parallel``: Megatron-style; heads split for attention, the FFN by columns then rows,
  two All-Reduces per layer.
- ``torch_tp``: the same split done by PyTorch's own ``ColwiseParallel``/``RowwiseParallel``.
- ``pipeline``: contiguous layers per device in proportion to its memory (exo's ring), the
  activation passed device to device and back to the first.
- ``single``: the first device computes everything.

Pure Python (no torch).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from workbench.devices import DeviceProfile
from workbench.errors import WorkbenchError
from workbench.distributed import limits
from workbench.partition.cost import (DTYPE_BYTES, ModelShape, Traffic, all_gather_traffic, all_reduce_traffic,
                                      check_network, collective_s, gather_traffic, layer_orders, split_counts,
                                      tensor_parallel_gammas, voltage_layer_gamma)
from workbench.distributed.shares import (DEFAULT_DEVICE, SHARE_TOLERANCE, DeviceRow, check_shares,  # noqa: F401
                                         devices_from_table, devices_like, even_shares, largest_remainder,
                                         proportional_shares)
from workbench.distributed.steps import Step, steps_timeline
from workbench.timeline import Timeline

SCHEMES: dict[str, str] = {
    "voltage": "Voltage: positions split, one All-Gather per layer",
    "tensor_parallel": "tensor parallel (Megatron): heads and FFN split, two All-Reduces per layer",
    "torch_tp": "tensor parallel by PyTorch (ColwiseParallel / RowwiseParallel)",
    "pipeline": "layer pipeline (exo's ring): contiguous layers per device by memory",
    "single": "one device",
}
SHARE_RULES = ("even", "proportional")
MAX_DEVICES = limits.MAX_DEVICES


@dataclass(frozen=True)
class PartitionPlan:
    scheme: str
    shape: ModelShape
    seq_len: int                                       # N
    devices: tuple[DeviceProfile, ...]                 # K of them; the first is the terminal
    shares: tuple[tuple[float, ...], ...]              # per layer, per device: fraction of positions (voltage)
    bounds: tuple[tuple[int, ...], ...]                # per layer: K+1 position boundaries
    orders: tuple[tuple[str, ...], ...]                # per layer, per device: the attention order (voltage)
    heads: tuple[int, ...]                             # per device: heads it computes (tensor parallel)
    ffn_columns: tuple[int, ...]                       # per device: FFN columns it computes (tensor parallel)
    layers: tuple[int, ...]                            # per device: layers it holds (pipeline)
    steps: tuple[Step, ...]
    reasons: tuple[str, ...]
    latency_s: float = 0.0                             # links' one-way latency used for every collective
    order: str = "auto"                                # the attention order policy (voltage)
    network: str = "switch"                            # how collectives cross the links (cost.NETWORKS)
    timeline: Timeline = field(default=None, compare=False)

    @property
    def K(self) -> int:
        return len(self.devices)

    @property
    def predicted_s(self) -> float:
        return self.timeline.end

    def positions(self, layer: int, device: int) -> tuple[int, int]:
        """The position range [start, end) ``device`` computes at ``layer`` (voltage)."""
        b = self.bounds[layer]
        return b[device], b[device + 1]

    def traffic(self) -> list[list[Traffic]]:
        """Per layer, per device: bytes sent and received in that layer's collectives."""
        per_layer = [[Traffic(0, 0)] * self.K for _ in range(self.shape.num_layers)]
        for step in self.steps:
            if step.traffic and step.layer is not None:
                per_layer[step.layer] = [a + b for a, b in zip(per_layer[step.layer], step.traffic)]
        return per_layer

    def total_traffic(self) -> list[Traffic]:
        """Per device: bytes sent and received over the whole run, the input's broadcast included."""
        total = [Traffic(0, 0)] * self.K
        for step in self.steps:
            if step.traffic:
                total = [a + b for a, b in zip(total, step.traffic)]
        return total

    def compute_s(self) -> list[float]:
        """Per device: predicted seconds of compute."""
        return [sum(s.seconds[i] for s in self.steps if s.kind == "compute") for i in range(self.K)]

    def comm_s(self) -> float:
        return sum(s.seconds[0] for s in self.steps if s.kind != "compute")


def position_bounds(N: int, shares: Sequence[float]) -> tuple[int, ...]:
    """Boundaries of each device's positions: device i computes [b_i, b_i+1), b_i = round(N * sum of shares
    before i) (the paper's N sum_{j<i} p_j), so shares that sum to 1 cover all N positions once."""
    bounds, acc = [0], 0.0
    for s in shares[:-1]:
        acc += s
        bounds.append(min(N, max(bounds[-1], round(N * acc))))
    return (*bounds, N)


def resolve_shares(rule, devices: Sequence[DeviceProfile], num_layers: int) -> tuple[tuple[float, ...], ...]:
    """Per-layer share vectors from ``"even"``, ``"proportional"``, one vector for every layer, or one vector
    per layer."""
    K = len(devices)
    if isinstance(rule, str):
        if rule not in SHARE_RULES:
            raise WorkbenchError(f"shares must be one of {', '.join(SHARE_RULES)} or a vector, got {rule!r}")
        vector = even_shares(K) if rule == "even" else proportional_shares(devices)
        return (vector,) * num_layers
    rule = list(rule)
    if rule and not isinstance(rule[0], (int, float)):
        if len(rule) != num_layers:
            raise WorkbenchError(f"per-layer shares: {len(rule)} vectors for {num_layers} layers; give one per layer")
        return tuple(check_shares(v, K, f"layer {i}'s shares") for i, v in enumerate(rule))
    return (check_shares(rule, K),) * num_layers


def check_devices(devices: Sequence[DeviceProfile], scheme: str) -> None:
    K = len(devices)
    if not 1 <= K <= MAX_DEVICES:
        raise WorkbenchError(f"the cost model takes 1 to {MAX_DEVICES} devices, got {K}")
    if K > 1 and scheme != "single":
        for d in devices:
            if not d.net_bytes_per_s > 0 or not math.isfinite(d.net_bytes_per_s):
                raise WorkbenchError(f"device {d.name!r} has a link bandwidth of {d.net_bytes_per_s * 8 / 1e6:g} "
                                     "Mbit/s; give a bandwidth above 0 Mbit/s to every device of a partition")


def _latency(devices: Sequence[DeviceProfile]) -> float:
    return max(d.net_latency_s for d in devices)


def _layer_s(device: DeviceProfile, gamma: float, rows: int) -> float:
    return device.layer_overhead_s + device.work_s(2 * gamma, rows) if gamma else 0.0


def plan_partition(scheme: str, shape: ModelShape, seq_len: int, devices: Sequence[DeviceProfile], *,
                   shares="even", order: str = "auto", network: str = "switch") -> PartitionPlan:
    """The plan of ``scheme`` for ``shape`` at ``seq_len`` positions over ``devices`` (the first the terminal).

    ``shares`` (voltage): "even", "proportional" (to each device's FLOP/s), a vector, or one per layer.
    ``order`` (voltage): "auto" (Theorem 2, per head), or "qk_first" / "x_first" for every head.
    ``network``: the cluster's (:data:`~workbench.partition.cost.NETWORKS`; a ``Cluster`` says which).
    Every input is checked before anything is computed."""
    if scheme not in SCHEMES:
        raise WorkbenchError(f"scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    check_network(network)
    devices = tuple(devices)
    check_devices(devices, scheme)
    N = int(seq_len)
    if not 1 <= N <= shape.max_positions:
        raise WorkbenchError(f"sequence length must be 1 to {shape.max_positions} positions for the "
                             f"{shape.title} (its position limit), got {seq_len}")
    build = {"voltage": _voltage, "tensor_parallel": _tensor_parallel, "torch_tp": _tensor_parallel,
             "pipeline": _pipeline, "single": _single}[scheme]
    parts = build(scheme, shape, N, devices, shares=shares, order=order, network=network)
    steps = tuple(parts.pop("steps"))
    plan = PartitionPlan(scheme=scheme, shape=shape, seq_len=N, devices=devices, steps=steps, order=order, network=network,
                         latency_s=_latency(devices), **{"shares": (), "bounds": (), "orders": (), "heads": (),
                                                         "ffn_columns": (), "layers": (), **parts})
    object.__setattr__(plan, "timeline", predicted_timeline(plan))
    return plan


def _voltage(scheme, shape, N, devices, *, shares, order, network):
    K, L = len(devices), shape.num_layers
    if N < K:
        raise WorkbenchError(f"a sequence of {N} positions is shorter than the {K} devices it is split over; "
                             f"give at least {K} positions or fewer devices")
    vectors = resolve_shares(shares, devices, L)
    bounds = tuple(position_bounds(N, v) for v in vectors)
    orders, steps = [], []
    bws, lat = [d.net_bytes_per_s for d in devices], _latency(devices)
    if K > 1:                                   # Algorithm 2, line 3: the terminal distributes the input features
        nbytes = N * shape.hidden * DTYPE_BYTES
        traffic = (Traffic((K - 1) * nbytes, 0),) + (Traffic(0, nbytes),) * (K - 1)
        s = collective_s(traffic, bws, lat, network=network)
        steps.append(Step("broadcast", None, "broadcast the input", (s,) * K, traffic,
                          src=0, latency_s=lat))
    for layer, b in enumerate(bounds):
        rows = [b[i + 1] - b[i] for i in range(K)]
        layer_orders_ = [layer_orders(shape, N, P, order)[0] if P else "none" for P in rows]
        orders.append(tuple(layer_orders_))
        seconds = tuple(_layer_s(d, voltage_layer_gamma(shape, N, P, layer_orders(shape, N, P, order)), P) if P else 0.0
                        for d, P in zip(devices, rows))
        steps.append(Step("compute", layer, f"layer {layer}", seconds))
        if K > 1 and layer < L - 1:
            traffic = tuple(all_gather_traffic([P * shape.hidden for P in rows]))
            s = collective_s(traffic, bws, lat, network=network)
            steps.append(Step("all_gather", layer, f"All-Gather {layer}", (s,) * K, traffic, latency_s=lat))
        elif K > 1:                             # lines 7-8 and 16: the last layer's parts go to the terminal only
            traffic = tuple(gather_traffic([P * shape.hidden for P in rows]))
            s = collective_s(traffic, bws, lat, network=network)
            steps.append(Step("gather", layer, f"gather {layer} to the terminal", (s,) * K,
                              traffic, dst=0, latency_s=lat))
    even = all(v == vectors[0] for v in vectors)
    rule = shares if isinstance(shares, str) else ("given" if even else "given per layer")
    F, F_H = shape.hidden, shape.head_dim
    reasons = [f"{rule} shares: device i computes positions [N sum(p_<i), N sum(p_<=i)) of every layer"
               + ("" if even else " (shares change per layer)")]
    if shape.rotary:
        reasons.append("rotary keys: every head keeps Eq. (3) (x W_K is rotated per position before Q K^T)")
    else:
        threshold = (F - F_H) / (F * F_H)
        sizes = sorted({b[i + 1] - b[i] for b in bounds for i in range(K) if b[i + 1] > b[i]})
        picks = "; ".join(f"P = {P}: 1/P - 1/N = {1 / P - 1 / N:.4f} -> "
                          f"{'Eq. (8), x multiplied in last' if layer_orders(shape, N, P, order)[0] == 'x_first' else 'Eq. (3), Q, K, V first'}"
                          for P in sizes[:3])
        forced = "" if order == "auto" else f" (forced: {order} for every head)"
        reasons.append(f"Theorem 2 threshold (F - F_H)/(F F_H) = {threshold:.4f}; {picks}{forced}")
    if K > 1:
        reasons.append(f"Algorithm 2: the terminal broadcasts the {N} x {F} input; one All-Gather per layer but the "
                       f"last (a device sends its {F}-wide rows to the {K - 1} others); the last layer's rows go to "
                       f"the terminal only")
    return {"shares": vectors, "bounds": bounds, "orders": tuple(orders), "reasons": tuple(reasons), "steps": steps}


def _tensor_parallel(scheme, shape, N, devices, *, shares, order, network):
    K, L = len(devices), shape.num_layers
    if K > shape.heads:
        raise WorkbenchError(f"tensor parallelism splits {shape.heads} heads over at most {shape.heads} devices, "
                             f"got {K}")
    if shape.num_kv_heads != shape.heads:
        raise WorkbenchError(f"tensor parallelism here splits encoder-style layers; {shape.title} groups its "
                             "queries over shared key/value heads: use voltage, pipeline or single for it")
    if scheme == "torch_tp" and (shape.heads % K or shape.ffn % K):
        raise WorkbenchError(f"PyTorch's tensor parallelism needs the {shape.heads} heads and {shape.ffn} FFN "
                             f"columns to divide by the device count; {K} does not divide both")
    heads, ffn = split_counts(shape.heads, K), split_counts(shape.ffn, K)
    bws, lat = [d.net_bytes_per_s for d in devices], _latency(devices)
    steps = []
    for layer in range(L):
        parts = [tensor_parallel_gammas(shape, N, h, f) for h, f in zip(heads, ffn)]
        steps.append(Step("compute", layer, f"attention {layer}",
                          tuple(_layer_s(d, a, N) for d, (a, _) in zip(devices, parts)), part="attention"))
        for half in ("attention", "FFN"):
            if half == "FFN":
                steps.append(Step("compute", layer, f"FFN {layer}",
                                  tuple(d.work_s(2 * f, N) for d, (_, f) in zip(devices, parts)), part="ffn"))
            traffic = tuple(all_reduce_traffic(N * shape.hidden, K))    # K = 1 too: the step ends the block
            s = collective_s(traffic, bws, lat, steps=2 * (K - 1), network=network)
            steps.append(Step("all_reduce", layer, f"All-Reduce {layer} ({half})", (s,) * K, traffic,
                              latency_s=2 * (K - 1) * lat if K > 1 else 0.0, part=half.lower()))
    reasons = (f"heads split {'/'.join(map(str, heads))}, FFN columns {'/'.join(map(str, ffn))}",
               "two ring All-Reduces per layer (after the attention's output projection and after the FFN)",
               "done by PyTorch's ColwiseParallel / RowwiseParallel" if scheme == "torch_tp" else
               "done by the workbench's own Megatron-style layer")
    return {"heads": tuple(heads), "ffn_columns": tuple(ffn), "reasons": reasons, "steps": steps}


def _pipeline(scheme, shape, N, devices, *, shares, order, network):
    K, L = len(devices), shape.num_layers
    counts = largest_remainder(L, [d.memory_bytes or 1.0 for d in devices])
    owner = [i for i, c in enumerate(counts) for _ in range(c)]
    steps, full = [], voltage_layer_gamma(shape, N, N, ("qk_first",) * shape.heads)
    nbytes = N * shape.hidden * DTYPE_BYTES
    lat = _latency(devices)

    def send(src, dst, layer):
        traffic = [Traffic(0, 0)] * K
        traffic[src], traffic[dst] = Traffic(nbytes, 0), Traffic(0, nbytes)
        s = lat + nbytes / min(devices[src].net_bytes_per_s, devices[dst].net_bytes_per_s)
        steps.append(Step("send", layer, f"send {src}->{dst}", (s,) * K, tuple(traffic), src, dst, lat))

    for layer in range(L):
        if layer and owner[layer] != owner[layer - 1]:
            send(owner[layer - 1], owner[layer], layer - 1)
        seconds = [0.0] * K
        seconds[owner[layer]] = _layer_s(devices[owner[layer]], full, N)
        steps.append(Step("compute", layer, f"layer {layer}", tuple(seconds)))
    if owner[-1] != 0:
        send(owner[-1], 0, L - 1)
    reasons = (f"layers per device by memory: {'/'.join(map(str, counts))}",
               "a single request runs the devices one after another: no faster than one device, plus transfers")
    return {"layers": tuple(counts), "reasons": reasons, "steps": steps}


def _single(scheme, shape, N, devices, *, shares, order, network):
    K = len(devices)
    full = voltage_layer_gamma(shape, N, N, ("qk_first",) * shape.heads)
    steps = [Step("compute", layer, f"layer {layer}", (_layer_s(devices[0], full, N),) + (0.0,) * (K - 1))
             for layer in range(shape.num_layers)]
    return {"layers": (shape.num_layers,) + (0,) * (K - 1), "reasons": ("the first device computes every layer",),
            "steps": steps}


def predicted_timeline(plan: PartitionPlan) -> Timeline:
    """The plan's schedule drawn per device (:func:`steps_timeline`)."""
    return steps_timeline(plan.steps, [d.name for d in plan.devices], f"{plan.scheme} predicted")
