"""Hepti: how much of each matrix product each unequal device computes, and in which weight-stationary mode.

The cost model of Hepti §4.3 over one transformer layer of a :class:`~workbench.devices.LayerShape`
(T positions, hidden d, H heads, FFN width f), split by shares lambda_i (sum 1):

- The blocks of each mode (§4.2), each a MatMul [m, k] x [k, n] split one way, whose workload on device
  i is Eq. (3): L row-wise ``k n a_i``, R column-wise ``k m a_i``, block-wise ``a_i m n``, with
  ``a_i = lambda_i x`` (the split dimension). Compute is Eq. (5), ``rho_i r / f_i``: a dot-product element
  is one multiply-add, two FLOPs of the device's ``flops_per_s``.

  ====== ==================================================================================================
  ws     Q/K/V R column-wise by heads, All-Gather of the heads' outputs, then the output projection and the
         MLP L row-wise (each device its rows, every weight whole), All-Gather of the rows
  1d     Q/K/V R column-wise by heads, output projection block-wise (All-Reduce), redundant LayerNorm, MLP
         first product R column-wise, second block-wise (All-Reduce): Megatron's split
  2d     as 1d for Q/K/V; the output projection and both MLP products split by rows and columns over an
         r x c grid: All-Gather within a row group, All-Reduce of partial sums within a column group
  serial the primary alone
  ====== ==================================================================================================

- Communication is Eq. (6): per collective, the bytes ``c_b,i`` each device receives over its bandwidth,
  summed over the devices (the paper's shared medium). An All-Gather of rows or heads gives device i
  ``(1 - lambda_i) T d`` floats; an All-Reduce of partial sums ``2 (K - 1) / K T d`` whatever the shares.
- Latency is Eq. (7): per block the slowest device's compute plus the block's communication, summed over
  blocks and layers. Memory: the weights a device holds for all ``num_layers`` layers, since weights stay
  resident (WS needs the output projection and the MLP whole; the tiled modes only their share), plus one
  layer's activations at T (the attention scores grow with T squared).

:func:`hepti_partition` solves P2 as the paper states it, a mixed-integer program (:func:`solve_sizes`,
HiGHS): integer units and binary participation per device, memory bounds, Eq. 7 as the objective. The LP
relaxation (:func:`solve_shares`: shares in [0, 1], devices with share 0 dropped, a greedy search over leaving
out the worst-linked, shares rounded by largest remainder) stays as a baseline (``solver="lp"``) and solves
each axis of 2D-tiled WS. Pure Python + SciPy.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from workbench.devices import DeviceProfile, LayerShape
from workbench.errors import WorkbenchError
from workbench.network import check_network

MODES = ("ws", "1d", "2d", "serial")
MODE_TITLES = {"ws": "weight-stationary (WS)", "1d": "1D-tiled WS", "2d": "2D-tiled WS", "serial": "serial"}
TILED_2D_FROM = 16
"""Hepti uses 2D-tiled WS from 16 devices (the study it cites), 1D-tiled below."""
FLOAT_BYTES = 4
ZERO_SHARE = 1e-9


@dataclass(frozen=True)
class Block:
    """One MatMul of a layer in a mode: its split, its work per unit of share, and the collective after it."""
    name: str
    split: str                      # "row" (L row-wise), "column" (R column-wise) or "block"
    work: float                     # r_b,i at lambda_i = 1: dot-product elements (multiply-adds)
    collective: str = ""            # "all_gather", "all_reduce" or ""
    gather_floats: float = 0.0      # an All-Gather's whole tensor (a device receives (1 - lambda_i) of it)
    reduce_floats: float = 0.0      # an All-Reduce's tensor (a device moves 2 (K-1)/K of it)
    group: int = 0                  # 2D: the devices taking part in the collective (0: all)


def mode_blocks(mode: str, shape: LayerShape, K: int, grid: tuple[int, int] = (1, 1)) -> list[Block]:
    """The blocks of one layer in ``mode`` over K devices (Eq. 3's workloads at lambda_i = 1)."""
    T, d, f = shape.seq_len, shape.hidden, shape.ffn
    qkv = Block("Q, K, V (R column-wise)", "column", 3 * d * T * d)
    attention = Block("attention of its heads", "column", 2 * T * T * d)
    if mode == "ws":
        return [qkv, Block(attention.name, "column", attention.work, "all_gather", gather_floats=T * d),
                Block("output projection (L row-wise)", "row", d * d * T),
                Block("MLP (L row-wise)", "row", 2 * d * f * T, "all_gather", gather_floats=T * d)]
    if mode == "1d":
        return [qkv, attention,
                Block("output projection (block-wise)", "block", d * T * d, "all_reduce", reduce_floats=T * d),
                Block("MLP first product (R column-wise)", "column", d * T * f),
                Block("MLP second product (block-wise)", "block", f * T * d, "all_reduce", reduce_floats=T * d)]
    if mode == "2d":
        r, c = grid
        return [qkv, Block(attention.name + ", gathered in its row group", "column", attention.work, "all_gather",
                           gather_floats=T * d / r, group=c),
                Block("output projection (2D: partial sums reduced in the column group)", "block", d * T * d,
                      "all_reduce", reduce_floats=T * d / c, group=r),
                Block("its columns gathered in the row group", "block", 0, "all_gather", gather_floats=T * d, group=c),
                Block("MLP first product (2D: reduced in the column group)", "block", d * T * f, "all_reduce",
                      reduce_floats=T * f / c, group=r),
                Block("MLP second product (2D: reduced in the row group)", "block", f * T * d, "all_reduce",
                      reduce_floats=T * d / r, group=c),
                Block("its rows gathered in the column group", "block", 0, "all_gather", gather_floats=T * d, group=r)]
    if mode == "serial":
        return [Block("whole layer", "row", 4 * d * d * T + 2 * T * T * d + 2 * d * f * T)]
    raise WorkbenchError(f"Hepti's mode must be one of {', '.join(MODES)}, got {mode!r}")


def layer_weights(shape: LayerShape) -> tuple[float, float]:
    """Floats of one layer: (Q, K, V and the output projection, the MLP)."""
    d, f = shape.hidden, shape.ffn
    return 4 * d * d, 2 * d * f


def activation_bytes(mode: str, shape: LayerShape, share: float) -> float:
    """Bytes of one layer's activations on a device with ``share`` at the workload's T (one layer runs at a
    time): the attention scores of its heads (share H T x T, the term that grows with T squared), their Q, K
    and V (3 share T d), its part of the FFN's hidden (share T f), and the layer's input, gathered context and
    output (3 T d)."""
    T, d, H, f = shape.seq_len, shape.hidden, shape.heads, shape.ffn
    if mode == "serial":
        share = 1.0 if share > 0 else 0.0
    floats = share * (H * T * T + 3 * T * d + T * f) + 3 * T * d
    return floats * FLOAT_BYTES if share > 0 or mode != "serial" else 0.0


def memory_bytes(mode: str, shape: LayerShape, share: float, num_layers: int = 1) -> float:
    """Bytes a device with ``share`` must hold in ``mode``: the weights of ``num_layers`` layers (WS keeps its
    share of Q/K/V and the output projection and the MLP whole; the tiled modes their share of every weight),
    and one layer's activations (:func:`activation_bytes`). Heads are whole, so a device may get one head more
    than its share: one head's Q, K, V (and, tiled, W_O) columns are counted on top; the biases and LayerNorms
    are kept whole. What a rank really holds is never more (its slice is counted to the float when it is cut)."""
    d, f, H = shape.hidden, shape.ffn, shape.heads
    attention, mlp = layer_weights(shape)
    small = 9 * d + f
    if mode == "ws":
        floats = share * 3 * d * d + d * d + mlp + 3 * d * d / H + small
    elif mode in ("1d", "2d"):
        floats = share * (attention + mlp) + attention / H + small
    elif mode == "serial":
        floats = attention + mlp + small if share > 0 else 0.0
    else:
        raise WorkbenchError(f"Hepti's mode must be one of {', '.join(MODES)}, got {mode!r}")
    return floats * FLOAT_BYTES * num_layers + activation_bytes(mode, shape, share)


def ws_fixed_bytes(shape: LayerShape, num_layers: int = 1) -> float:
    """What WS needs on a device whatever its share: the output projection and the MLP of every layer."""
    return memory_bytes("ws", shape, 0.0, num_layers)


def ws_minimum_bytes(shape: LayerShape, num_layers: int = 1) -> float:
    """What a secondary needs to take part in WS at all: :func:`ws_fixed_bytes` plus one head of Q, K, V."""
    return memory_bytes("ws", shape, 1.0 / shape.heads, num_layers)


def compute_s(device: DeviceProfile, work: float) -> float:
    """Eq. (5): rho_i r / f_i, a dot-product element being two of the device's FLOPs."""
    return 2 * work / device.flops_per_s


def comm_s(block: Block, shares: Sequence[float], devices: Sequence[DeviceProfile], network: str = "shared") -> float:
    """Eq. (6) on a ``shared`` medium: the bytes each device taking part receives over its bandwidth, summed
    over the devices; on a ``switch`` the largest of them (each device its own link).

    A whole-group All-Gather gives device i the others' (1 - lambda_i) of the tensor; an All-Reduce moves
    2 (G-1)/G of it through each of the G devices of its group (a ring), whatever the shares."""
    check_network(network)
    K = sum(1 for s in shares if s > ZERO_SHARE)
    if not block.collective or K <= 1:
        return 0.0
    group = block.group or K
    each = []
    for s, dev in zip(shares, devices):
        if s <= ZERO_SHARE:
            continue
        if block.collective == "all_gather" and not block.group:
            received = (1.0 - s) * block.gather_floats
        elif block.collective == "all_gather":
            received = (group - 1) / group * block.gather_floats
        else:
            received = 2 * (group - 1) / group * block.reduce_floats
        each.append(received * FLOAT_BYTES / dev.net_bytes_per_s)
    return sum(each) if network == "shared" else max(each)


def layer_latency(mode: str, shape: LayerShape, shares: Sequence[float], devices: Sequence[DeviceProfile],
                  grid: tuple[int, int] = (1, 1), network: str = "shared") -> tuple[float, list[dict]]:
    """Eq. (7) for one layer: per block the slowest device's compute plus the block's communication.
    Also each block's per-device compute and its communication (for the dashboard's breakdown)."""
    K = len(devices)
    total, rows = 0.0, []
    for block in mode_blocks(mode, shape, K, grid):
        per_device = [compute_s(d, block.work * s) for d, s in zip(devices, shares)]
        comm = comm_s(block, shares, devices, network)
        total += max(per_device) + comm
        rows.append({"block": block.name, "compute_s": per_device, "comm_s": comm})
    return total, rows


@dataclass(frozen=True)
class Partition:
    """Hepti's decision for ``devices`` (in the order given; the first is the primary)."""
    mode: str                                   # "ws", "1d", "2d" or "serial"
    shares: tuple[float, ...]                   # lambda_i per device given, 0 where it takes no part; sum 1
    sizes: tuple[int, ...]                      # the integer split of ``dimension``, same order, summing to it
    dimension: str                              # what ``sizes`` splits: "rows" (WS), "FFN columns" (tiled), ...
    predicted_latency_s: float                  # Eq. (7) over ``num_layers`` layers, with the integer sizes
    reasons: tuple[str, ...]
    heads: tuple[int, ...] = ()                 # heads per device (Q/K/V split)
    grid: tuple[int, int] = (1, 1)              # 2D: rows x columns of devices
    axis_shares: tuple = ()                     # 2D: (row-group shares, column-group shares); device (i, j) gets both
    binding: str = ""                           # the constraint that sets the latency
    breakdown: tuple[dict, ...] = field(default=(), compare=False)   # per block: compute per device, communication
    devices: tuple[DeviceProfile, ...] = field(default=(), compare=False)
    num_layers: int = 1
    network: str = "shared"                     # how collectives cross the links (the cluster's)

    @property
    def participants(self) -> list[int]:
        return [i for i, s in enumerate(self.shares) if s > 0]


def largest_remainder(total: int, shares: Sequence[float]) -> list[int]:
    """Non-negative integers summing to ``total`` in proportion to ``shares`` (largest remainder; a share
    of 0 gets 0)."""
    s = sum(shares)
    if s <= 0:
        raise WorkbenchError("shares sum to 0; at least one device must take part")
    exact = [total * x / s for x in shares]
    sizes = [math.floor(e) for e in exact]
    order = sorted(range(len(exact)), key=lambda i: (sizes[i] - exact[i], i))
    for i in order[: total - sum(sizes)]:
        sizes[i] += 1
    return sizes


def _check(devices: Sequence[DeviceProfile], workload: LayerShape, deadline_s: float, num_layers: int) -> None:
    if not devices:
        raise WorkbenchError("Hepti needs at least one device (the primary); got none")
    for d in devices:
        if not (d.flops_per_s > 0 and math.isfinite(d.flops_per_s)):
            raise WorkbenchError(f"device {d.name!r}: speed must be a finite number above 0 FLOP/s, got {d.flops_per_s!r}")
        if not (d.memory_bytes >= 0 and math.isfinite(d.memory_bytes)):
            raise WorkbenchError(f"device {d.name!r}: free memory must be 0 or more bytes, got {d.memory_bytes!r}")
        if len(devices) > 1 and not (d.net_bytes_per_s > 0 and math.isfinite(d.net_bytes_per_s)):
            raise WorkbenchError(f"device {d.name!r}: bandwidth must be above 0 Mbit/s, got "
                                 f"{d.net_bytes_per_s * 8 / 1e6:g} Mbit/s")
    if not (deadline_s > 0):
        raise WorkbenchError(f"the deadline must be above 0 s, got {deadline_s!r}")
    if not (isinstance(num_layers, int) and num_layers >= 1):
        raise WorkbenchError(f"num_layers must be a whole number >= 1, got {num_layers!r}")
    for name in ("seq_len", "hidden", "heads", "ffn"):
        if getattr(workload, name) < 1:
            raise WorkbenchError(f"the workload's {name} must be at least 1, got {getattr(workload, name)}")


def solve_shares(mode: str, shape: LayerShape, devices: Sequence[DeviceProfile], num_layers: int = 1,
                 grid: tuple[int, int] = (1, 1), first_at_least: float = 0.0,
                 network: str = "shared") -> tuple[np.ndarray, float, str] | None:
    """P2 over continuous shares for ``devices`` all taking part: (shares, latency, binding constraint), or
    None when no shares fit the memory. Variables: lambda_1..K, one epigraph t_b per block, then one c_b per
    block for its communication (above the sum of the devices' terms on a shared medium, above each on a
    switch). ``first_at_least``: the primary's smallest share (it always computes part of the layer)."""
    from scipy.optimize import linprog

    check_network(network)
    K = len(devices)
    blocks = mode_blocks(mode, shape, K, grid)
    B = len(blocks)
    c = np.concatenate([np.zeros(K), np.full(B, float(num_layers)), np.zeros(B)])
    A, b, labels = [], [], []
    for bi, block in enumerate(blocks):
        # t_b >= compute_i(lambda_i) + c_b; c_b >= the devices' received bytes over their links (linear in lambda)
        terms = []                                      # per device: (constant, coefficient of its share)
        if block.collective and K > 1:
            for dev in devices:
                if block.collective == "all_gather":
                    per = block.gather_floats * FLOAT_BYTES / dev.net_bytes_per_s
                    terms.append((per, -per))
                else:
                    terms.append((2 * (K - 1) / K * block.reduce_floats * FLOAT_BYTES / dev.net_bytes_per_s, 0.0))
        groups = [list(range(len(terms)))] if network == "shared" else [[j] for j in range(len(terms))]
        for members in groups if terms else []:
            row = np.zeros(K + 2 * B)
            for j in members:
                row[j] += terms[j][1]
            row[K + B + bi] = -1.0
            A.append(row)
            b.append(-sum(terms[j][0] for j in members))
            labels.append(None)
        for i, dev in enumerate(devices):
            row = np.zeros(K + 2 * B)
            row[i] += 2 * block.work / dev.flops_per_s
            row[K + bi] = -1.0
            row[K + B + bi] = 1.0
            A.append(row)
            b.append(0.0)
            labels.append((bi, i, block.name))
    bounds = []
    for dev in devices:
        fixed = memory_bytes(mode, shape, 0.0, num_layers)
        per_share = memory_bytes(mode, shape, 1.0, num_layers) - fixed
        top = 1.0 if per_share <= 0 else (dev.memory_bytes - fixed) / per_share
        if top < 0:
            return None
        bounds.append((0.0, min(1.0, top)))
    bounds[0] = (min(first_at_least, bounds[0][1]), bounds[0][1])
    bounds += [(0.0, None)] * (2 * B)
    if sum(hi for _, hi in bounds[:K]) < 1.0 - 1e-12:
        return None
    res = linprog(c, A_ub=np.array(A), b_ub=np.array(b), A_eq=[np.concatenate([np.ones(K), np.zeros(2 * B)])], b_eq=[1.0],
                  bounds=bounds, method="highs")
    if res.status != 0:
        return None
    shares = np.clip(res.x[:K], 0.0, 1.0)
    binding = _binding(res, labels, bounds, devices, K)
    return shares / shares.sum(), float(res.fun), binding


def link_against_compute(mode: str, shape: LayerShape, device: DeviceProfile,
                         kept: Sequence[DeviceProfile]) -> tuple[float, float]:
    """What taking part would cost ``device`` and bring, per layer, beside the devices ``kept``: (seconds to
    receive its part of the layer's collectives over its own link, seconds its speed would take off the
    layer's compute, shared by speed). The two terms Eq. 6 and Eq. 7 weigh when they leave a device out."""
    blocks = mode_blocks(mode, shape, len(kept) + 1)
    work = sum(2 * block.work for block in blocks)
    speed = sum(dev.flops_per_s for dev in kept)
    floats = sum(block.gather_floats if block.collective == "all_gather" else
                 2 * block.reduce_floats if block.collective == "all_reduce" else 0.0 for block in blocks)
    return floats * FLOAT_BYTES / device.net_bytes_per_s, work / speed - work / (speed + device.flops_per_s)


def dropped_reason(name: str, mode: str, shape: LayerShape, device: DeviceProfile,
                   kept: Sequence[DeviceProfile], otherwise: str) -> str:
    """Why ``device`` takes no share, in its own numbers (:func:`link_against_compute`) where they say it;
    else ``otherwise``."""
    receive_s, saves_s = link_against_compute(mode, shape, device, kept)
    if receive_s <= saves_s:
        return f"{name} dropped: {otherwise}"
    return (f"{name} dropped: receiving its part of each layer over its {8 * device.net_bytes_per_s / 1e6:.3g} "
            f"Mbit/s link takes about {1e3 * receive_s:.3g} ms, more than the {1e3 * saves_s:.3g} ms its "
            f"{device.flops_per_s / 1e9:.3g} GFLOP/s would take off the layer's compute")


def split_units(mode: str, shape: LayerShape) -> int:
    """How many whole units the mode's split dimension has: rows (WS, serial) or FFN columns (the tiled modes)."""
    return shape.seq_len if mode in ("ws", "serial") else shape.ffn


def solve_sizes(mode: str, shape: LayerShape, devices: Sequence[DeviceProfile], num_layers: int = 1,
                deadline_s: float = math.inf, network: str = "shared", *,
                feasible_only: bool = False) -> tuple[list[int], float, str] | None:
    """P2 as the paper states it, a mixed-integer program (HiGHS through ``scipy.optimize.milp``): integer
    units a_i of the split dimension per device, a binary z_i for taking part (the primary always does, with at
    least one unit), memory per device, Eq. 7 as the objective, Eq. 6 summed over the devices taking part, and
    T <= D. Returns (units per device, Eq. 7 over ``num_layers`` layers, the binding constraint), or None when
    nothing fits.

    In WS and 1D-tiled every block of a layer splits one dimension by the same units, so the slowest device
    of every block is the one with the largest a_i / f_i: Eq. 7 is ``W M + comm`` with one variable
    M >= a_i / f_i (no epigraph per block). Eq. 6 makes every device taking part pay for what it receives,
    which is why participation must be an integer decision: an All-Gather gives device i (z_i - a_i/U) of its
    tensor; an All-Reduce 2 (G-1)/G of its tensor for each of the G devices taking part, linearised exactly
    as 2 z_i - 2 y_i with y_i = z_i / G (y_i <= z_i, y_i <= g, y_i >= g - (1 - z_i), sum y_i = 1, where g
    is 1/G). On a ``shared`` medium these terms are summed into the objective; on a ``switch`` each
    collective's time is one more variable above every device's term. ``feasible_only``: any split within the
    deadline, not the best (HiGHS stops at its first; a deadline that none meets is proven so in milliseconds)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    if mode not in ("ws", "1d"):
        raise WorkbenchError(f"the mixed-integer program splits one axis (ws or 1d), got {mode!r}")
    check_network(network)
    K = len(devices)
    U, caps = unit_caps(mode, shape, devices, num_layers)
    blocks = mode_blocks(mode, shape, K)
    A_, Z, Y, G, M, C = 0, K, 2 * K, 3 * K, 3 * K + 1, 3 * K + 2     # where each kind of variable starts
    n = 3 * K + 2 + len(blocks)
    rows, lows, highs = [], [], []

    def add(coef: dict[int, float], low: float, high: float) -> None:
        row = np.zeros(n)
        for j, v in coef.items():
            row[j] += v
        rows.append(row)
        lows.append(low)
        highs.append(high)

    add({A_ + i: 1.0 for i in range(K)}, U, U)
    add({Y + i: 1.0 for i in range(K)}, 1.0, 1.0)
    if caps[0] < 1:
        return None
    # times in units of the primary's whole layer: HiGHS's tolerances are absolute, and a layer takes microseconds
    work = sum(2 * block.work / U for block in blocks)                     # seconds x FLOP/s of one unit, all blocks
    scale = 1.0 / (work * U / devices[0].flops_per_s)
    speed = [dev.flops_per_s / devices[0].flops_per_s for dev in devices]  # M counts units of the primary's time
    c = np.zeros(n)
    c[M] = scale * work / devices[0].flops_per_s
    switch_rows = []
    for b, block in enumerate(blocks):
        for j, dev in enumerate(devices):
            term: dict[int, float] = {}
            if block.collective == "all_gather":
                per = scale * block.gather_floats * FLOAT_BYTES / dev.net_bytes_per_s
                term = {Z + j: per, A_ + j: -per / U}
            elif block.collective == "all_reduce":
                per = scale * 2 * block.reduce_floats * FLOAT_BYTES / dev.net_bytes_per_s
                term = {Z + j: per, Y + j: -per}
            if term and network == "shared":
                for k, v in term.items():
                    c[k] += v
            elif term:
                switch_rows.append({**term, C + b: -1.0})
        if network == "switch" and block.collective:
            c[C + b] = 1.0
    for i in range(K):
        add({A_ + i: 1.0, Z + i: -float(max(caps[i], 0))}, -np.inf, 0.0)   # no units unless taking part
        add({A_ + i: 1.0, Z + i: -1.0}, 0.0, np.inf)                     # taking part: one unit at least
        add({A_ + i: 1.0, M: -speed[i]}, -np.inf, 0.0)                   # M: the slowest device's units
        add({Y + i: 1.0, Z + i: -1.0}, -np.inf, 0.0)
        add({Y + i: 1.0, G: -1.0}, -np.inf, 0.0)
        add({Y + i: 1.0, G: -1.0, Z + i: -1.0}, -1.0, np.inf)
    for row in switch_rows:
        add(row, -np.inf, 0.0)
    bound = deadline_s / num_layers
    if math.isfinite(bound):
        add({j: v for j, v in enumerate(c) if v}, -np.inf, scale * bound)
    # a secondary at least as fast, as well linked and as roomy as another can take its place: whenever the
    # other takes part, it does (valid for every optimum's set; identical ones are ordered by index, the first
    # of a kind also holding the most), which prunes most of the search over sets
    kind = [(devices[i].flops_per_s, devices[i].net_bytes_per_s, caps[i]) for i in range(K)]
    for i in range(1, K):
        for j in range(1, K):
            if i == j or not all(x >= y for x, y in zip(kind[i], kind[j])):
                continue
            if kind[i] == kind[j]:
                if i < j:
                    add({Z + i: 1.0, Z + j: -1.0}, 0.0, np.inf)
                    add({A_ + i: 1.0, A_ + j: -1.0}, 0.0, np.inf)
            else:
                add({Z + i: 1.0, Z + j: -1.0}, 0.0, np.inf)
    low = np.zeros(n)
    high = np.concatenate([np.array([max(cap, 0) for cap in caps], float), np.array([float(cap >= 1) for cap in caps]),
                           np.ones(K), [1.0, np.inf], np.full(len(blocks), np.inf)])
    low[Z] = 1.0                                                        # the primary always takes part
    integrality = np.concatenate([np.ones(2 * K), np.zeros(n - 2 * K)])
    res = milp(np.zeros(n) if feasible_only else num_layers * c,
               constraints=LinearConstraint(np.array(rows), lows, highs), integrality=integrality,
               bounds=Bounds(low, high))
    if res.status != 0 or res.x is None:
        return None
    units = [int(round(v)) for v in res.x[A_:A_ + K]]
    latency, breakdown = layer_latency(mode, shape, [a / U for a in units], devices, network=network)
    costliest = max(breakdown, key=lambda row: max(row["compute_s"]) + row["comm_s"])
    slowest = int(np.argmax(costliest["compute_s"]))
    binding = (f"{costliest['block']}: {devices[slowest].name} sets the time "
               f"({1e3 * (max(costliest['compute_s']) + costliest['comm_s']):.2f} ms a layer)")
    at_memory = [devices[i].name for i in range(K) if units[i] and units[i] == caps[i] < U]
    if at_memory:
        binding = f"memory of {', '.join(at_memory)} (no room for another unit); {binding}"
    return units, latency * num_layers, binding


def unit_caps(mode: str, shape: LayerShape, devices: Sequence[DeviceProfile], num_layers: int = 1
              ) -> tuple[int, list[int]]:
    """(units of the split dimension, the units each device's free memory holds: -1 where it holds none)."""
    U = split_units(mode, shape)
    fixed = memory_bytes(mode, shape, 0.0, num_layers)
    per_unit = (memory_bytes(mode, shape, 1.0, num_layers) - fixed) / U
    return U, [(U if fixed <= dev.memory_bytes else -1) if per_unit <= 0
               else int(min(U, max(-1.0, (dev.memory_bytes - fixed) / per_unit))) for dev in devices]


def fits_memory(mode: str, shape: LayerShape, devices: Sequence[DeviceProfile], num_layers: int = 1) -> bool:
    """Whether some integer split holds in the devices' memory (the primary with one unit at least): what
    tells a deadline the mixed-integer program cannot meet from weights that fit nowhere."""
    U, caps = unit_caps(mode, shape, devices, num_layers)
    return caps[0] >= 1 and sum(max(c, 0) for c in caps) >= U


OPTIMA_KEPT = 64


class Optima:
    """The optima solved last (the last :data:`OPTIMA_KEPT`, by their inputs) and, per device set whatever the
    workload, which devices took part in the last one: where the next optimum is looked for first."""

    def __init__(self):
        self.solved: OrderedDict = OrderedDict()
        self.taking: OrderedDict = OrderedDict()

    def get(self, key: tuple):
        """(found, the optimum or None where none exists)."""
        if key not in self.solved:
            return False, None
        self.solved.move_to_end(key)
        return True, self.solved[key]

    def remember(self, key: tuple, solved):
        """Keeps ``solved`` (a :func:`solve_sizes` answer) under ``key``; returns it as kept."""
        mode, _, devices, num_layers, network = key
        self.solved[key] = None if solved is None else (tuple(solved[0]), solved[1], solved[2])
        if solved is not None:
            self.taking[(mode, devices, num_layers, network)] = tuple(i for i, a in enumerate(solved[0]) if a)
        kept = self.solved[key]
        for memo in (self.solved, self.taking):
            while len(memo) > OPTIMA_KEPT:
                memo.popitem(last=False)
        return kept


OPTIMA = Optima()


def optimal_sizes(mode: str, shape: LayerShape, devices: tuple[DeviceProfile, ...], num_layers: int = 1,
                  network: str = "shared", *, known_only: bool = False) -> tuple[tuple[int, ...], float, str] | None:
    """:func:`solve_sizes` without a deadline, remembered in :data:`OPTIMA`: a page asks the same optimum for its
    decision, its comparison and each mode forced, and the solve takes a fraction of a second at 32 devices.
    ``known_only``: the remembered answer or None, never a solve."""
    key = (mode, shape, tuple(devices), num_layers, network)
    found, optimum = OPTIMA.get(key)
    if found or known_only:
        return optimum
    return OPTIMA.remember(key, solve_sizes(mode, shape, devices, num_layers, network=network))


PROOF_MARGIN = 1e-6
"""A latency this much (relative) below a reachable one that no split meets proves the reachable one best."""


def proven_best(mode: str, shape: LayerShape, devices: tuple[DeviceProfile, ...], num_layers: int = 1,
                network: str = "shared") -> tuple[int, float] | None:
    """(devices taking part, latency) of the best split, found without the full solve when the devices that
    took part in the last optimum for these devices (another workload) still give it: their own program
    (a few devices: milliseconds) gives a reachable latency, and the full program given a deadline just
    below it finds no split (HiGHS proves that in milliseconds too). None when there is no such set or the
    proof fails, or when one device alone is best (the page then says serial, from the full solve)."""
    taking = OPTIMA.taking.get((mode, tuple(devices), num_layers, network))
    if taking is None:
        return None
    reachable = solve_sizes(mode, shape, [devices[i] for i in taking], num_layers, network=network)
    count = 0 if reachable is None else sum(1 for a in reachable[0] if a)
    if count < 2:
        return None
    below = solve_sizes(mode, shape, devices, num_layers, reachable[1] * (1 - PROOF_MARGIN), network,
                        feasible_only=True)
    return (count, reachable[1]) if below is None else None


class DeadlineMissed(WorkbenchError):
    """No partition meets the deadline, proven by the mixed-integer program given it (``quote_best=False``).
    ``best_s``: the best reachable latency where :func:`proven_best` found it without the full solve, else
    None (``str`` then says only that the deadline is missed)."""

    def __init__(self, deadline_s: float, mode: str, best: tuple[int, float] | None = None, K: int = 1):
        self.deadline_s, self.mode = deadline_s, mode
        self.best_s = None if best is None else best[1]
        if best is None:
            said = f" ({MODE_TITLES[mode]}: the mixed-integer program has no solution within it)"
        else:
            said = f": the best reachable is {1e3 * best[1]:.1f} ms ({MODE_TITLES[mode]} over {_taking(best[0], K)})"
        super().__init__(f"no partition meets the deadline of {1e3 * deadline_s:.1f} ms{said}")


def _binding(res, labels, bounds, devices, K) -> str:
    """The constraint that sets the latency: a memory bound at its limit, and the device whose compute plus
    communication is tight in the costliest block."""
    at_memory = [devices[i].name for i in range(K) if bounds[i][1] < 1.0 and res.x[i] >= bounds[i][1] - 1e-9]
    B = (len(res.x) - K) // 2
    t = res.x[K:K + B]
    costliest = int(np.argmax(t))
    slack = np.asarray(res.ineqlin.residual)
    rows = [n for n, label in enumerate(labels) if label and label[0] == costliest]
    tight = min(rows, key=lambda n: slack[n])
    parts = [f"{labels[tight][2]}: {devices[labels[tight][1]].name} sets the time ({1e3 * t[costliest]:.2f} ms a layer)"]
    if at_memory:
        parts.insert(0, f"memory of {', '.join(at_memory)} (share at its limit)")
    return "; ".join(parts)


def grid_for(K: int) -> tuple[int, int]:
    """The most square r x c <= K with r >= 2 (devices beyond r c take no part)."""
    best = (1, K)
    for r in range(2, int(math.isqrt(K)) + 1):
        c = K // r
        if (r * c, -abs(c - r)) > (best[0] * best[1], -abs(best[1] - best[0])) or best[0] == 1:
            best = (r, c)
    return best


def _fixed(devices, workload, deadline_s, num_layers, mode, fixed_shares, reasons, grid, network) -> Partition:
    from workbench.distributed.shares import check_shares

    shares = list(check_shares(fixed_shares, len(devices), "fixed shares"))
    if mode == "2d":
        raise WorkbenchError("fixed shares split one axis; 2D-tiled WS solves its two axes itself")
    if mode == "serial":
        shares = [1.0] + [0.0] * (len(devices) - 1)
    for d, s in zip(devices, shares):
        if s > 0 and memory_bytes(mode, workload, s, num_layers) > d.memory_bytes:
            raise WorkbenchError(f"{d.name} cannot hold its share {s:.3f} in {MODE_TITLES[mode]} mode: it needs "
                                 f"{memory_bytes(mode, workload, s, num_layers) / 1e6:.1f} MB, has {d.memory_bytes / 1e6:.1f} MB")
    dimension, total = "rows" if mode in ("ws", "serial") else "FFN columns", split_units(mode, workload)
    sizes = largest_remainder(total, shares)
    heads = largest_remainder(workload.heads, shares)
    latency, breakdown = layer_latency(mode, workload, [n / total for n in sizes], devices, grid, network)
    latency *= num_layers
    if latency > deadline_s:
        raise WorkbenchError(f"these shares miss the deadline of {1e3 * deadline_s:.1f} ms: they take {1e3 * latency:.1f} ms")
    return Partition(mode=mode, shares=tuple(shares), sizes=tuple(sizes), dimension=dimension,
                     predicted_latency_s=latency, reasons=(*reasons, "shares given, not solved"), heads=tuple(heads),
                     grid=grid, binding="shares given", breakdown=tuple(breakdown), devices=tuple(devices),
                     num_layers=num_layers, network=network)


def _solve_2d(shape: LayerShape, devices: Sequence[DeviceProfile], num_layers: int, grid: tuple[int, int],
              network: str = "shared"):
    """The split run once per axis (Hepti §4.3): row groups and column groups each solved as devices of their
    own (a group as fast as its slowest member times its size, holding what its smallest member holds
    times its size); device (i, j) gets row share i times column share j."""
    from dataclasses import replace

    r, c = grid
    cell = [[devices[i * c + j] for j in range(c)] for i in range(r)]

    def virtual(members, count, name):
        return replace(members[0], name=name, flops_per_s=count * min(m.flops_per_s for m in members),
                       memory_bytes=count * min(m.memory_bytes for m in members),
                       net_bytes_per_s=min(m.net_bytes_per_s for m in members))

    rows = [virtual(cell[i], c, f"row group {i}") for i in range(r)]
    cols = [virtual([cell[i][j] for i in range(r)], r, f"column group {j}") for j in range(c)]
    solved_rows = solve_shares("1d", shape, rows, num_layers, network=network)
    solved_cols = solve_shares("1d", shape, cols, num_layers, network=network)
    if solved_rows is None or solved_cols is None:
        return None, ()
    mu, nu = solved_rows[0], solved_cols[0]
    shares = np.array([mu[i] * nu[j] for i in range(r) for j in range(c)])
    for n, dev in enumerate(devices):
        if memory_bytes("2d", shape, shares[n], num_layers) > dev.memory_bytes:
            return None, ()
    binding = f"rows: {solved_rows[2]}; columns: {solved_cols[2]}"
    return (shares, 0.0, binding), (tuple(float(x) for x in mu), tuple(float(x) for x in nu))


SOLVERS = ("milp", "lp")
"""P2's solvers: the mixed-integer program (:func:`solve_sizes`, the paper's P2, exact over integer units and
participation; the default), and the LP relaxation with a greedy participation search and rounding (the
older heuristic, kept as a compared baseline: milliseconds where the MILP takes tenths of a second at 16
devices and seconds at 64, and up to several times slower predictions)."""


def _taking(n: int, K: int) -> str:
    """"16 of the 32 devices (the other 16 take no share)", or "4 devices" when all take part."""
    return f"{n} devices" if n == K else f"{n} of the {K} devices (the other {K - n} take no share)"


def hepti_partition(devices: Sequence[DeviceProfile], workload: LayerShape, deadline_s: float = math.inf, *,
                    num_layers: int = 1, mode: str | None = None,
                    fixed_shares: Sequence[float] | None = None, solver: str = "milp",
                    network: str = "shared", quote_best: bool = True) -> Partition:
    """Hepti's partition of ``workload`` over ``devices`` (the first the primary) within ``deadline_s``.

    Mode: serial when no secondary device can take part; WS when every secondary taking part holds what WS
    needs (the output projection and the MLP of ``num_layers`` layers, plus its share of Q/K/V); otherwise
    1D-tiled below 16 devices and 2D-tiled from 16. ``mode`` forces one (it must still fit). A device
    with no free memory is dropped; so is one whose share solves to 0, and the rest are solved again.
    ``fixed_shares`` (one per device, summing to 1) replaces the LP: the baselines (even shares, shares
    in proportion to speed) in the same mode, their memory checked the same way. ``solver`` (:data:`SOLVERS`):
    "milp" (default) solves WS and 1D-tiled as the mixed-integer program; 2D-tiled solves each axis as an LP;
    "lp" is the relaxation with the greedy participation search (a baseline). ``network``: how collectives
    cross the links (:data:`~workbench.network.NETWORKS`; a cluster's ``network`` says which):
    Eq. 6's shared medium, or a switch. A deadline no partition meets raises an error quoting the best
    reachable latency; with ``quote_best=False`` the mixed-integer program is given the deadline and an
    infeasible one raises :class:`DeadlineMissed` at once, without the full solve (a page's first answer)."""
    check_network(network)
    if solver not in SOLVERS:
        raise WorkbenchError(f"Hepti's solver must be one of {', '.join(SOLVERS)}, got {solver!r}")
    devices = tuple(devices)
    _check(devices, workload, deadline_s, num_layers)
    K = len(devices)
    reasons: list[str] = []
    names = [d.name for d in devices]
    presolved = None
    if devices[0].memory_bytes <= 0:
        raise WorkbenchError(f"the primary {devices[0].name!r} has no free memory: it always takes part and must hold "
                             "its share of the weights; give it memory or make another device the primary")
    taking = [0] + [i for i in range(1, K) if devices[i].memory_bytes > 0]
    for i in range(1, K):
        if i not in taking:
            reasons.append(f"{names[i]} dropped: no free memory")
    whole = memory_bytes("serial", workload, 1.0, num_layers)
    if mode is None:
        if len(taking) == 1:
            mode = "serial"
            reasons.append("serial: no secondary device can take part")
        elif all(devices[i].memory_bytes >= ws_minimum_bytes(workload, num_layers) for i in taking[1:]):
            mode = "ws"
            reasons.append(f"WS: every secondary holds the output projection and the MLP and a head of Q, K, V "
                           f"({ws_minimum_bytes(workload, num_layers) / 1e6:.1f} MB for {num_layers} layers)")
        else:
            short = [names[i] for i in taking[1:] if devices[i].memory_bytes < ws_minimum_bytes(workload, num_layers)]
            mode = "1d" if len(taking) < TILED_2D_FROM else "2d"
            reasons.append(f"{MODE_TITLES[mode]}: {', '.join(short)} cannot hold what WS needs "
                           f"({ws_minimum_bytes(workload, num_layers) / 1e6:.1f} MB with one head); "
                           f"{len(taking)} devices {'< 16' if mode == '1d' else '>= 16'}")
        if mode == "2d" and solver == "milp" and fixed_shares is None:
            # the rule counts the devices taking part, which the mixed-integer program decides
            tiled = presolved = optimal_sizes("1d", workload, tuple(devices[i] for i in taking), num_layers,
                                              network)
            few = sum(1 for a in tiled[0] if a) if tiled is not None else TILED_2D_FROM
            if few < TILED_2D_FROM:
                mode = "1d"
                reasons.append(f"1D-tiled after all: the mixed-integer optimum takes {few} of them part (< 16)")
    elif mode not in MODES:
        raise WorkbenchError(f"Hepti's mode must be one of {', '.join(MODES)}, got {mode!r}")
    else:
        reasons.append(f"{MODE_TITLES[mode]} forced")
    if mode == "serial":
        if devices[0].memory_bytes < whole:
            raise WorkbenchError(f"the primary {names[0]!r} holds {devices[0].memory_bytes / 1e6:.1f} MB, less than "
                                 f"the {whole / 1e6:.1f} MB of {num_layers} layers, and no secondary can help")
        taking = [0]
    grid = (1, 1)
    if mode == "2d":
        grid = grid_for(len(taking))
        if grid[0] * grid[1] < len(taking):
            slow = sorted(taking[1:], key=lambda i: devices[i].flops_per_s)[: len(taking) - grid[0] * grid[1]]
            for i in slow:
                reasons.append(f"{names[i]} dropped: the {grid[0]} x {grid[1]} grid has no place for it (slowest)")
            taking = [i for i in taking if i not in slow]
        reasons.append(f"2D grid {grid[0]} x {grid[1]} from {len(taking)} devices")
    axis_shares: tuple = ()
    if fixed_shares is not None:
        return _fixed(devices, workload, deadline_s, num_layers, mode, fixed_shares, reasons, grid, network)
    unit = {"ws": workload.seq_len, "1d": workload.ffn}.get(mode, 1)

    def solve(taking):
        """Shares of the devices ``taking`` part (continuous, per device given), Eq. 7 with integer sizes,
        the binding constraint, the 2D axis shares; None when the weights fit nowhere."""
        subset = [devices[i] for i in taking]
        axis = ()
        if mode == "2d":
            solved, axis = _solve_2d(workload, subset, num_layers, grid, network)
        elif mode == "serial":
            solved = (np.ones(1), 0.0, f"{names[0]} computes everything")
        else:
            solved = solve_shares(mode, workload, subset, num_layers, grid, first_at_least=1.0 / unit, network=network)
        if solved is None:
            return None
        full = [0.0] * K
        for n, i in enumerate(taking):
            full[i] = float(solved[0][n])
        total = split_units(mode, workload)
        latency, _ = layer_latency(mode, workload, [n / total for n in largest_remainder(total, full)], devices, grid,
                                   network)
        return full, latency * num_layers, solved[2], axis

    exact = solver == "milp" and mode in ("ws", "1d") and len(taking) > 1     # the MILP decides participation
    if exact:
        subset = tuple(devices[i] for i in taking)
        if mode == "1d" and presolved is not None:
            solved = presolved
        elif quote_best or not math.isfinite(deadline_s):
            solved = optimal_sizes(mode, workload, subset, num_layers, network)
        else:
            solved = optimal_sizes(mode, workload, subset, num_layers, network, known_only=True)
            if solved is None and fits_memory(mode, workload, subset, num_layers) and \
                    solve_sizes(mode, workload, subset, num_layers, deadline_s, network, feasible_only=True) is None:
                raise DeadlineMissed(deadline_s, mode, proven_best(mode, workload, subset, num_layers, network), K)
            solved = solved or optimal_sizes(mode, workload, subset, num_layers, network)
        if solved is None:
            have = ", ".join(f"{devices[i].name} {devices[i].memory_bytes / 1e6:.1f} MB" for i in taking)
            raise WorkbenchError(f"the weights of {num_layers} layers ({whole / 1e6:.1f} MB) fit nowhere in "
                                 f"{MODE_TITLES[mode]} mode: free memory {have}")
        units, _, binding = solved
        full = [0.0] * K
        for n, i in enumerate(taking):
            full[i] = units[n] / unit
        kept = [devices[i] for i in taking if full[i]]
        for i in taking:
            if not full[i]:
                reasons.append(dropped_reason(names[i], mode, workload, devices[i], kept,
                                              "the mixed-integer optimum leaves it out"))
        taking = [i for i in taking if full[i]]
    elif mode in ("ws", "1d") and len(taking) > 2:
        # Eq. 6 charges every device taking part for what it receives, which the LP cannot weigh against
        # leaving a device out (a share on a slow link even looks cheap to it, as the device then receives
        # less): try leaving out the 1, 2, 4, ... secondaries that bring least (speed times link) and keep
        # the fastest set.
        whole_set = solve(taking)
        if whole_set is not None:
            by_link = sorted(taking[1:], key=lambda i: devices[i].net_bytes_per_s * devices[i].flops_per_s)
            best, best_set, n = whole_set[1], taking, 1
            while n < len(by_link) + 1:
                trial = [i for i in taking if i not in by_link[:n]]
                tried = solve(trial)
                if tried is None or tried[1] >= best * (1 - 1e-9):
                    break                       # leaving out more would not help either: one solve in the usual case
                best, best_set = tried[1], trial
                n *= 2
            kept = [devices[i] for i in best_set]
            for i in taking:
                if i not in best_set:
                    reasons.append(dropped_reason(
                        names[i], mode, workload, devices[i], kept, f"leaving the {len(taking) - len(best_set)} "
                        f"slowest-linked out together is faster ({1e3 * best:.1f} ms against "
                        f"{1e3 * whole_set[1]:.1f} ms)"))
            taking = best_set
    while not exact:
        solved = solve(taking)
        if solved is None:
            have = ", ".join(f"{devices[i].name} {devices[i].memory_bytes / 1e6:.1f} MB" for i in taking)
            raise WorkbenchError(f"the weights of {num_layers} layers ({whole / 1e6:.1f} MB) fit nowhere in "
                                 f"{MODE_TITLES[mode]} mode: free memory {have}")
        full, latency, binding, axis_shares = solved
        zero = [i for i in taking if i != 0 and full[i] * unit < 0.5]
        if not zero or mode == "2d":
            break
        for i in zero:
            reasons.append(f"{names[i]} dropped: its share solved to less than half a unit of the split")
        taking = [i for i in taking if i not in zero]
    if len(taking) == 1 and mode != "serial":
        mode, grid = "serial", (1, 1)
        full = [1.0] + [0.0] * (K - 1)
        binding = f"{names[0]} computes everything"
        reasons.append("serial: no secondary is worth its link")
    shares = full
    dimension, total = "rows" if mode in ("ws", "serial") else "FFN columns", split_units(mode, workload)
    sizes = largest_remainder(total, shares)
    heads = largest_remainder(workload.heads, shares)
    rounded = [s / total for s in sizes]
    latency, breakdown = layer_latency(mode, workload, rounded, devices, grid, network)
    latency *= num_layers
    if mode == "serial":
        binding = f"{names[0]} computes everything"
    if latency > deadline_s:
        raise WorkbenchError(f"no partition meets the deadline of {1e3 * deadline_s:.1f} ms: the best reachable is "
                             f"{1e3 * latency:.1f} ms ({MODE_TITLES[mode]} over {_taking(len(taking), K)})")
    return Partition(mode=mode, shares=tuple(shares), sizes=tuple(sizes), dimension=dimension,
                     predicted_latency_s=latency, reasons=tuple(reasons), heads=tuple(heads), grid=grid,
                     binding=binding, breakdown=tuple(breakdown), devices=devices, num_layers=num_layers,
                     axis_shares=axis_shares, network=network)
