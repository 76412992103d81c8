"""Which missing chunks to recompute and which to swap in (LLMS 3.3, "Planning", equation 4).

Recompute and swap-in run side by side in the pipeline, so a load takes the longer of the two:

    min over x_w of  max(T_re(sum_w x_w), T_IO(m - sum_w bytes_w * x_w)),  0 <= x_w <= count_w

where x_w chunks of level w are recomputed instead of read, m is the bytes of all missing chunks
and bytes_w the size of one chunk of level w (``T_IO`` also counts the chunks read when the cost
model has a per-chunk read term, see :mod:`workbench.kvcache.costmodel`). The paper prints the
bound as x_w < count_w; read literally it would forbid recomputing every chunk of a level (and,
with one chunk, any), so it is read as <=. Levels are split further by chunk size (a context's last
chunk may be short), which keeps the bytes of recomputed chunks exactly linear in x.

It is solved as a mixed-integer program with SciPy's HiGHS: integer x per group, an epigraph
variable t >= both terms, and one binary per side that switches its fixed cost on only when that
side has work (``T_re(0) = T_IO(0) = 0``).

Within a group the earliest chunks are recomputed. Recompute works with any set of chunks, but a
chunk attends only to positions before it, so an early chunk is the cheapest to rebuild and the
recompute needs the K/V of fewer loaded chunks.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, NamedTuple

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from workbench.errors import WorkbenchError
from workbench.kvcache.costmodel import SwapCostModel, device_label
from workbench.timeline import Span, Timeline

EPS = 1e-12


class MissingChunk(NamedTuple):
    """A chunk a load must bring back, as the planner sees it: its index, level and bytes as stored."""
    index: int
    bits: int
    nbytes: int


def _missing(chunks: Iterable) -> list[MissingChunk]:
    """``chunks`` as :class:`MissingChunk` (plain ``(index, bits, bytes)`` tuples are taken too)."""
    return [MissingChunk(int(i), int(b), int(n)) for i, b, n in chunks]


@dataclass(frozen=True, kw_only=True)
class SwapPlan:
    """How one load brings a context's missing chunks back, and how long it should take."""
    recompute: tuple[int, ...]              # chunk indices rebuilt from their tokens
    load: tuple[int, ...]                   # chunk indices read from their swap files
    recompute_counts: dict[int, int]        # bits -> chunks of that level recomputed
    missing_counts: dict[int, int]          # bits -> chunks of that level missing
    load_bytes: int                         # bytes read from swap files
    recompute_s: float                      # T_re(chunks recomputed)
    load_s: float                           # T_IO(load_bytes)
    objective_s: float                      # the solver's optimum of equation 4 (max of the two terms)
    predicted_s: float                      # end of the predicted pipeline (adds the fill of its first layer)
    timeline: Timeline                      # predicted: "swap_in" on lane "io", "recompute" on "compute"
    device: str                             # the cost model's device


def _groups(missing: list[MissingChunk]) -> dict[tuple[int, int], list[int]]:
    """(bits, bytes) -> chunk indices of that level and size, earliest first."""
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    seen = set()
    for m in missing:
        if m.index in seen:
            raise WorkbenchError(f"chunk {m.index} is listed twice among the missing chunks")
        seen.add(m.index)
        groups[(m.bits, m.nbytes)].append(m.index)
    return {key: sorted(chunks) for key, chunks in sorted(groups.items())}


def solve_counts(costs: SwapCostModel, sizes: list[int], counts: list[int]) -> tuple[list[int], float]:
    """Chunks to recompute per group (sizes[g] bytes each, counts[g] missing) minimising equation 4,
    and the solver's objective in seconds."""
    total, nbytes = sum(counts), float(np.dot(sizes, counts))
    scale = max(costs.t_re(total), costs.t_io(nbytes, total), EPS)   # times in units of the worst side
    per_byte = 1.0 / costs.read_bytes_per_s / scale
    per_chunk = costs.io_per_chunk_s / scale
    g = len(sizes)
    # variables: x_0 .. x_{g-1}, recompute switch, load switch, t
    objective = np.zeros(g + 3)
    objective[-1] = 1.0
    rows = np.zeros((4, g + 3))
    rows[0, :g], rows[0, g], rows[0, -1] = costs.recompute_per_chunk_s / scale, costs.recompute_fixed_s / scale, -1
    rows[1, :g] = -per_byte * np.asarray(sizes, float) - per_chunk
    rows[1, g + 1], rows[1, -1] = costs.io_fixed_s / scale, -1
    rows[2, :g], rows[2, g] = 1.0, -total                     # any recompute switches its fixed cost on
    rows[3, :g], rows[3, g + 1] = 1.0, total                  # any chunk left to load switches the IO's on
    lower = [-np.inf, -np.inf, -np.inf, total]
    upper = [0.0, -per_byte * nbytes - per_chunk * total, 0.0, np.inf]
    result = milp(objective, constraints=LinearConstraint(rows, lower, upper),
                  integrality=np.r_[np.ones(g + 2), 0], bounds=Bounds(np.zeros(g + 3), np.r_[counts, 1, 1, np.inf]),
                  options={"mip_rel_gap": 0.0})
    if not result.success:
        raise WorkbenchError(f"the swap/recompute planner found no solution: {result.message}")
    return [int(round(v)) for v in result.x[:g]], float(result.fun) * scale


def fixed_plan(costs: SwapCostModel, recompute: Iterable[MissingChunk], load: Iterable[MissingChunk]) -> SwapPlan:
    """A plan that recomputes ``recompute`` and reads ``load`` as given, with the pipeline's predicted
    timeline on ``costs``: for chunks that have no file (they can only be recomputed) or a loader told to
    read everything."""
    recompute, load = _missing(recompute), _missing(load)
    _groups(recompute + load)                                   # a chunk listed twice is refused
    load_bytes = sum(m.nbytes for m in load)
    done: dict[int, int] = defaultdict(int)
    missing: dict[int, int] = defaultdict(int)
    for m in recompute:
        done[m.bits] += 1
        missing[m.bits] += 1
    for m in load:
        missing[m.bits] += 1
    re_s, io_s = costs.t_re(len(recompute)), costs.t_io(load_bytes, len(load))
    timeline = pipeline_timeline(costs, len(recompute), load_bytes, len(load))
    return SwapPlan(recompute=tuple(sorted(m.index for m in recompute)),
                    load=tuple(sorted(m.index for m in load)), recompute_counts=dict(done),
                    missing_counts=dict(missing), load_bytes=load_bytes, recompute_s=re_s, load_s=io_s,
                    objective_s=max(re_s, io_s), predicted_s=timeline.end, timeline=timeline, device=costs.device)


def plan_swap_recompute(costs: SwapCostModel, missing: Iterable[MissingChunk]) -> SwapPlan:
    """Plan one load of the chunks ``missing`` (bytes as stored).

    When recomputing a single chunk already takes as long as reading every missing chunk, reading all
    is optimal (any plan that recomputes takes at least ``T_re(1)``), and the solver, which costs
    milliseconds, as much as a small load, is skipped. Equation 4 leaves out the pipeline's fill (the
    recompute of the last layer starts only once that layer is read): where the fill makes the solver's
    split slower than reading everything, reading everything is the plan."""
    missing = _missing(missing)
    groups = _groups(missing)
    if not missing or costs.t_re(1) >= costs.t_io(sum(m.nbytes for m in missing), len(missing)):
        return fixed_plan(costs, (), missing)
    keys = list(groups)
    x, objective = solve_counts(costs, [k[1] for k in keys], [len(groups[k]) for k in keys])
    recompute = sorted(i for k, n in zip(keys, x) for i in groups[k][:n])
    load = sorted(i for k, n in zip(keys, x) for i in groups[k][n:])
    recompute_counts: dict[int, int] = defaultdict(int)
    missing_counts: dict[int, int] = defaultdict(int)
    load_bytes = 0
    for key, n in zip(keys, x):
        recompute_counts[key[0]] += n
        missing_counts[key[0]] += len(groups[key])
        load_bytes += key[1] * (len(groups[key]) - n)
    recompute_s, load_s = costs.t_re(len(recompute)), costs.t_io(load_bytes, len(load))
    timeline = pipeline_timeline(costs, len(recompute), load_bytes, len(load))
    read_all = fixed_plan(costs, (), missing)
    if recompute and read_all.predicted_s <= timeline.end:          # the fill equation 4 leaves out tipped it
        return read_all
    return SwapPlan(recompute=tuple(recompute), load=tuple(load), recompute_counts=dict(recompute_counts),
                    missing_counts=dict(missing_counts), load_bytes=int(load_bytes), recompute_s=recompute_s,
                    load_s=load_s, objective_s=objective, predicted_s=timeline.end, timeline=timeline,
                    device=costs.device)


def pipeline_timeline(costs: SwapCostModel, num_recompute: int, load_bytes: int, num_load: int) -> Timeline:
    """The predicted pipeline: the IO lane reads layer after layer; the compute lane recomputes layer l
    once its own layer l-1 is done and layer l is read (a stall when the read is late)."""
    layers, device = costs.num_layers, device_label(costs)
    io_s, re_s = costs.t_io(load_bytes, num_load) / layers, costs.t_re(num_recompute) / layers
    spans, io_end, t = [], 0.0, 0.0
    for layer in range(layers):
        label = f"layer {layer}"
        if num_load:
            spans.append(Span("io", "swap_in", io_end, io_end + io_s, label, {"chunks": num_load}, device,
                              nbytes=load_bytes // layers, layer=layer))
            io_end += io_s
        if num_recompute:
            if num_load and io_end > t + EPS:
                spans.append(Span("compute", "stall", t, io_end, f"wait for {label}", device=device, layer=layer))
                t = io_end
            spans.append(Span("compute", "recompute", t, t + re_s, label, {"chunks": num_recompute}, device,
                              layer=layer))
            t += re_s
    return Timeline(tuple(spans), "predicted", name=f"swap-in {num_load} / recompute {num_recompute} chunks")
