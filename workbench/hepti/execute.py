"""One rank's part of a Hepti run: report, decide with the others, then run the layer in its mode.

See :mod:`workbench.hepti.run` for the modes and the decisions; this module does the torch
work on the model's own layers (:mod:`workbench.models.slices`) and the counted collectives of
:class:`~workbench.distributed.execute.Comm`, walking :func:`~workbench.hepti.run.layer_steps`
so that emulation pads each step to its predicted seconds.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from workbench.devices import DeviceProfile, LayerShape
from workbench.models import slices as L
from workbench.distributed.execute import Clock, Comm, Count, RankResult, Walker
from workbench.hepti.run import Decision, LayerSplit, Reports, SpeedEstimate, decide, layer_steps
from workbench.distributed.steps import Step

REPORT_FLOATS = 3
"""free memory (bytes), speed estimate (FLOP/s), link (bytes/s: the profile's)."""


def execute_hepti(devices: Sequence[DeviceProfile], store, inputs: dict, comm: Comm, *, emulate: bool, ends=None,
                  memory_falls: dict, deadline_s: float, start_layer: int = 0, link: str = "emulated",
                  limited: bool = False,
                  mode: str | None = None, adapt: bool = True, fixed_shares=None, stalls: dict | None = None,
                  network: str = "shared",
                  progress: Callable[[int, str, dict], None] = lambda i, label, extra: None
                  ) -> tuple[RankResult, list[Decision]]:
    """Run the model's layers from ``start_layer`` on ``inputs["x"]`` (every rank holds it), deciding each
    layer's mode and split at its start; at each decision the rank cuts its slice of the weights out of
    ``store`` (:class:`~workbench.hepti.weights.SliceStore`) and fails, naming its device, when its
    reported free memory cannot hold it. Rank 0 (``ends``: its embeddings and head) ends with the hidden
    states and logits; ``result.memory`` lists each decision's held and resident bytes. ``stalls``: layer ->
    seconds this rank loses inside that layer's compute (a host hiccup, injected: it sleeps)."""
    rank, K = comm.rank, comm.world
    device = devices[rank]
    result = RankResult(rank, device.name)
    cfg = store.cfg
    shape = LayerShape(cfg.hidden, cfg.num_heads, cfg.ffn, inputs["x"].shape[-2])
    reports = Reports(devices, memory_falls)
    num_layers = cfg.num_layers
    x, split, speeds_at_decision = inputs["x"], None, None
    decisions: list[Decision] = []
    speed = SpeedEstimate(device.flops_per_s)
    has_x = [True] * K

    def hold(new, devices_now, layer) -> None:
        store.hold(new, rank)
        free = devices_now[rank].memory_bytes
        if store.held_bytes > free:
            raise RuntimeError(f"{device.name} cannot hold its slice of the {new.mode} split at layer {layer}: "
                               f"{store.held_bytes / 1e6:.1f} MB of weights against {free / 1e6:.1f} MB free")
        result.memory.append({"layer": layer, "held": store.held_bytes, "resident": store.resident_bytes()})

    # the first split is decided and its slice cut before the clock starts: Eq. 7 prices inference with the
    # weights in place, as Hepti plans before serving; a decision mid-run is timed in full
    first_now = [replace(d, memory_bytes=float(p[0])) for d, p in
                 zip(devices, _exchange(comm, [reports.free_bytes(rank, start_layer), device.flops_per_s,
                                               reports.link[rank]]))]
    first = decide(None, None, first_now, shape, num_layers, start_layer, deadline_s, list(range(K)), mode, adapt,
                   fixed_shares, network)
    hold(first[0], first_now, start_layer)
    if K > 1:
        dist.barrier()                                  # every rank's clock starts with its slice in place
    clock = Clock(emulate, link, limited)
    result.t0 = clock.t0
    walker = Walker(rank, device.name, comm, clock, result)
    with torch.no_grad():
        for layer in range(start_layer, num_layers):
            if rank == 0:
                progress(layer, f"layer {layer}", {"checkpoint": (layer, x)})
            devices_now = _gather_reports(comm, reports, rank, layer, speed.flops_per_s, walker)
            start = clock.now()
            if layer == start_layer:
                (new, why, partition), devices_now = first, first_now
            else:
                new, why, partition = decide(split, speeds_at_decision, devices_now, shape, num_layers, layer,
                                             deadline_s, list(range(K)), mode, adapt, fixed_shares, network)
            if new is not None:
                split, speeds_at_decision = new, [d.flops_per_s for d in devices_now]
                decisions.append(Decision(layer, new.mode, partition.shares, partition.reasons, why,
                                          tuple(d.memory_bytes for d in devices_now)))
                if rank == 0:
                    progress(layer, f"layer {layer} decided", {"decision": decisions[-1]})
                if layer != start_layer:
                    hold(new, devices_now, layer)
                walker.span("stall", start, f"Hepti decides: {new.mode} ({why})", layer, event="decision",
                            meta={"mode": new.mode, "why": why, "shares": list(partition.shares)})
            clock.schedule = time.perf_counter()           # each layer's schedule starts once it is decided
            x = _bring_x(comm, split, x, has_x, layer)
            steps = layer_steps(split, layer, shape, devices, batch=x.shape[0], network=network)   # padded to the devices themselves
            x = _run_layer(split, steps, layer, store.layers[layer], x, inputs, comm, walker, rank)
            lost = float((stalls or {}).get(layer, 0.0))
            if lost > 0:
                start = clock.now()
                time.sleep(lost)
                walker.span("compute", start, f"stall {layer} (injected)", layer, meta={"real_s": lost, "predicted_s": 0.0})
            has_x = [r in split.participants for r in range(K)]
            # the device's time for the layer's work: the real compute here, or the profile's where padding
            # stood in for a device slower than this host (a span's own length also holds lateness caught up)
            speed.add(sum(s.seconds[rank] for s in steps if s.kind == "compute") * device.flops_per_s,
                      sum(max(s.meta["real_s"], s.meta["predicted_s"] if emulate else 0.0)
                          for s in result.spans if s.layer == layer and s.kind == "compute"))
        x = _bring_x(comm, LayerSplit("serial", (0,), ()), x, has_x, num_layers - 1)
        if rank == 0:
            start = clock.now()
            result.hidden, result.logits = x, ends.logits(x, inputs)
            walker.span("compute", start, "head", None)
    result.counts = list(comm.counts)
    result.wall_s = clock.now()
    return result, decisions


def _exchange(comm: Comm, values: list[float]) -> list[torch.Tensor]:
    """Every rank's ``values``, gathered by all (float64)."""
    mine = torch.tensor(values, dtype=torch.float64)
    pieces = [torch.empty_like(mine) for _ in range(comm.world)]
    if comm.world > 1:
        dist.all_gather(pieces, mine)
    else:
        pieces = [mine]
    return pieces


def _gather_reports(comm: Comm, reports: Reports, rank: int, layer: int, speed: float, walker: Walker):
    """Every rank's report, gathered by all and counted: each device's free memory now, its speed estimate (the
    median of its last layers' compute; a padded run measures the profile itself unless this host falls behind
    it, a run under CPU limits the limited rank) and its profile's link."""
    start = walker.clock.now()
    pieces = _exchange(comm, [reports.free_bytes(rank, layer), speed, reports.link[rank]])
    nbytes = REPORT_FLOATS * pieces[0].element_size()
    comm.counts.append(Count(layer, "report", (comm.world - 1) * nbytes, (comm.world - 1) * nbytes))
    walker.span("comm", start, f"reports {layer}", layer, nbytes=2 * (comm.world - 1) * nbytes, event="report",
                meta={"sent": (comm.world - 1) * nbytes, "received": (comm.world - 1) * nbytes})
    return [replace(d, memory_bytes=float(p[0]), flops_per_s=float(p[1]), net_bytes_per_s=float(p[2]))
            for d, p in zip(reports.devices, pieces)]


def _bring_x(comm: Comm, split: LayerSplit, x, has_x: list[bool], layer: int):
    """Ranks that take part now but sat the last layer out get its output from rank 0 (which always has it)."""
    need = [r for r in split.participants if not has_x[r]]
    if need and not has_x[0]:
        raise RuntimeError("the primary (rank 0) sat the last layer out and holds no output to hand on")
    for r in need:
        if comm.rank == 0:
            comm.send(x, r, layer)
        elif comm.rank == r:
            x = comm.recv(x, 0, layer)
    return x


def _starts(values: Sequence[int], members: Sequence[int]) -> dict[int, int]:
    out, acc = {}, 0
    for m in members:
        out[m] = acc
        acc += values[m]
    return out


def _run_layer(split: LayerSplit, steps: list[Step], layer: int, lay, x, inputs, comm: Comm, walker: Walker,
               rank: int):
    """This rank's part of one layer in ``split.mode``, step by step (each padded by the walker), on ``lay``, the
    rank's slice of the layer (its heads are its slice's 0, 1, ...; its FFN columns likewise)."""
    bias = inputs.get("bias")
    members = list(split.participants)
    mine = rank in members
    queue = iter(steps)
    dh = lay.cfg.head_dim

    def compute(fn):
        return walker.compute(next(queue), fn if mine else None)

    def collective(fn, takes_part=mine):
        step = next(queue)
        if takes_part:
            return walker.collective(step, fn)
        walker.skip(step)
        return None

    own = list(range(split.heads[rank])) if mine else []          # its heads, as its slice numbers them
    if split.mode == "serial":
        return compute(lambda: L.partitioned_layer(lay, x, 0, x.shape[-2], "qk_first", bias)) if mine else x
    if split.mode == "ws":
        ctx = compute(lambda: L.head_context(lay, x, own, bias))
        ctx = collective(lambda: comm.all_gather(ctx, [split.heads[m] * dh for m in members], members, -1, layer))
        row_start = _starts(split.rows, members)
        r0 = row_start.get(rank, 0)
        r1 = r0 + (split.rows[rank] if mine else 0)

        def rows():
            h = L.finish_attention(lay, x[:, r0:r1], F.linear(ctx[:, r0:r1], lay.attn_out.weight))
            return L.ffn_rows(lay, h)
        out = compute(rows)
        out = collective(lambda: comm.all_gather(out, [split.rows[m] for m in members], members, -2, layer))
        return out if mine else x
    if split.mode == "1d":
        part = compute(lambda: L.tensor_parallel_attention(lay, x, own, bias))
        part = collective(lambda: comm.all_reduce(part, layer, members))
        h = L.finish_attention(lay, x, part) if mine else None
        part = compute(lambda: L.tensor_parallel_ffn(lay, h, slice(0, split.ffn[rank] if mine else 0)))
        part = collective(lambda: comm.all_reduce(part, layer, members))
        return L.finish_ffn(lay, h, part) if mine else x
    return _run_2d(split, layer, lay, x, bias, comm, rank, compute, collective, own, mine)


def _run_2d(split, layer, lay, x, bias, comm, rank, compute, collective, own, mine):
    """2D-tiled WS on an r x c grid; device (i, j) holds W_O[columns N_j, rows of its row group's heads],
    W_1[F_j, D_i] and W_2[D_i, F_j] (torch's weights are [out, in]) as its slice's whole matrices."""
    r_, c_ = split.grid
    dh = lay.cfg.head_dim
    i, j = split.position(rank) if mine else (0, 0)
    at = lambda sizes, k: sum(sizes[:k])
    D_i = slice(at(split.row_dims, i), at(split.row_dims, i) + split.row_dims[i])

    def in_row(k):
        return mine and i == k

    def in_col(k):
        return mine and j == k

    def rounds(count, member, value, fn):
        """One collective per row (or column) group in turn, walked by every rank; a member takes its result."""
        for k in range(count):
            got = collective(lambda: fn(k, value), member(k))
            value = got if member(k) else value
        return value

    def gather(group, sizes):
        return lambda k, value: comm.all_gather(value, [sizes(m) for m in group(k)], group(k), -1, layer)

    def reduce(group):
        return lambda k, value: comm.all_reduce(value, layer, group(k))

    ctx = compute(lambda: L.head_context(lay, x, own, bias))
    ctx = rounds(r_, in_row, ctx, gather(split.row_group, lambda m: split.heads[m] * dh))
    part = compute(lambda: F.linear(ctx, lay.attn_out.weight))
    part = rounds(c_, in_col, part, reduce(split.col_group))
    part = rounds(r_, in_row, part, gather(split.row_group, lambda m: split.col_dims[split.position(m)[1]]))
    h = L.finish_attention(lay, x, part) if mine else None
    inner = compute(lambda: F.linear(h[..., D_i], lay.ffn1.weight))
    inner = rounds(c_, in_col, inner, reduce(split.col_group))
    out = compute(lambda: F.linear(F.gelu(inner + lay.ffn1.bias), lay.ffn2.weight))
    out = rounds(r_, in_row, out, reduce(split.row_group))
    out = rounds(c_, in_col, out, gather(split.col_group, lambda m: split.row_dims[split.position(m)[0]]))
    return L.finish_ffn(lay, h, out) if mine else x
