"""The baselines of WRX Table 4, planned on the same cost model and run on the same engine.

- ``Load&Exec``: load the whole submodel at 32 bits, then execute it; the submodel is
  the preferred one whose load plus compute time fits the target.
- ``StdPL-X``: a layerwise IO/compute pipeline with every shard at X bits; the
  submodel is the preferred one whose pipelined time fits.
- ``PreloadModel-X``: the whole N x M model is held in memory at X bits; the submodel
  is chosen by compute time alone.
- ``Ours-0MB`` and ``Ours``: WRX without and with a preload buffer.

If no submodel fits a baseline's model of time, it runs the smallest one
(1 x min_width) anyway and the plan says so (``valid`` is False): the measured
latency then shows by how much it misses the target.
"""
from __future__ import annotations

import time

import numpy as np

from workbench.elastic.planner import ElasticPlan, PlanMode, choose_submodel, plan_compute, plan_elastic, simulate
from workbench.elastic.costmodel import CostModel
from workbench.errors import UnknownNameError

METHODS = ("Load&Exec", "StdPL-2", "StdPL-6", "StdPL-32", "PreloadModel-6", "PreloadModel-32", "Ours-0MB", "Ours")


def _uniform(n: int, m: int, bits: int) -> np.ndarray:
    return np.full((n, m), int(bits), dtype=int)


def _fallback(method: str, cost_model: CostModel, target: float, min_width: int, bits: int, mode: PlanMode,
              memory: int, cp, t0: float) -> ElasticPlan:
    n, m = 1, max(1, min(min_width, cost_model.num_shards))
    b = _uniform(n, m, bits)
    pre = np.full((n, m), mode == "memory")
    tl = simulate(cost_model, b, pre, sequential=mode == "sequential", name=f"{method} {n}x{m}")
    return ElasticPlan(method=method, target_s=target, n=n, m=m, bits=b, preloaded=pre, preload=(), mode=mode,
                       timeline=tl, compute=cp, memory_bytes=memory, valid=False,
                       reason=f"no submodel fits {1e3 * target:.0f} ms; running the smallest ({n}x{m})",
                       plan_s=time.perf_counter() - t0)


def plan_load_exec(cost_model: CostModel, target_s: float, min_width: int = 3) -> ElasticPlan:
    t0 = time.perf_counter()
    t32 = cost_model.t_io(32)
    cp = choose_submodel(lambda n, m: n * m * t32 + n * cost_model.t_comp(m), target_s, cost_model.num_layers,
                         cost_model.num_shards, min_width)
    if not cp.found:
        return _fallback("Load&Exec", cost_model, cp.target_s, min_width, 32, "sequential", 0, cp, t0)
    b, pre = _uniform(cp.n, cp.m, 32), np.zeros((cp.n, cp.m), bool)
    tl = simulate(cost_model, b, pre, sequential=True, name=f"Load&Exec {cp.n}x{cp.m}")
    return ElasticPlan(method="Load&Exec", target_s=cp.target_s, n=cp.n, m=cp.m, bits=b, preloaded=pre, preload=(),
                       mode="sequential", timeline=tl, compute=cp, plan_s=time.perf_counter() - t0)


def plan_stdpl(cost_model: CostModel, target_s: float, bits: int, min_width: int = 3) -> ElasticPlan:
    t0 = time.perf_counter()
    method = f"StdPL-{bits}"
    cost_model.t_io(bits)                     # a cost model without this bitwidth fails here, with the name

    def pipelined(n, m):
        return simulate(cost_model, _uniform(n, m, bits), np.zeros((n, m), bool)).end

    cp = choose_submodel(pipelined, target_s, cost_model.num_layers, cost_model.num_shards, min_width)
    if not cp.found:
        return _fallback(method, cost_model, cp.target_s, min_width, bits, "pipeline", 0, cp, t0)
    b, pre = _uniform(cp.n, cp.m, bits), np.zeros((cp.n, cp.m), bool)
    tl = simulate(cost_model, b, pre, name=f"{method} {cp.n}x{cp.m}")
    return ElasticPlan(method=method, target_s=cp.target_s, n=cp.n, m=cp.m, bits=b, preloaded=pre, preload=(),
                       mode="pipeline", timeline=tl, compute=cp, plan_s=time.perf_counter() - t0)


def plan_preload_model(cost_model: CostModel, target_s: float, bits: int, min_width: int = 3) -> ElasticPlan:
    t0 = time.perf_counter()
    method = f"PreloadModel-{bits}"
    cost_model.t_io(bits)                     # a cost model without this bitwidth fails here, with the name
    memory = cost_model.num_layers * cost_model.num_shards * cost_model.shard_bytes[bits]
    cp = plan_compute(cost_model, target_s, min_width=min_width)
    if not cp.found:
        return _fallback(method, cost_model, cp.target_s, min_width, bits, "memory", memory, cp, t0)
    b, pre = _uniform(cp.n, cp.m, bits), np.ones((cp.n, cp.m), bool)
    whole = tuple((k, i, bits) for k in range(cost_model.num_layers) for i in range(cost_model.num_shards))
    tl = simulate(cost_model, b, pre, name=f"{method} {cp.n}x{cp.m}")
    return ElasticPlan(method=method, target_s=cp.target_s, n=cp.n, m=cp.m, bits=b, preloaded=pre, preload=whole,
                       mode="memory", timeline=tl, compute=cp, memory_bytes=memory, plan_s=time.perf_counter() - t0)


def plan_method(method: str, cost_model: CostModel, target_s: float, importance, preload_bytes: float,
                min_width: int = 3) -> ElasticPlan:
    """Plan any of :data:`METHODS` (``preload_bytes`` is used by ``Ours`` only)."""
    if method == "Load&Exec":
        return plan_load_exec(cost_model, target_s, min_width)
    if method.startswith("StdPL-") and method in METHODS:
        return plan_stdpl(cost_model, target_s, int(method.split("-")[1]), min_width)
    if method.startswith("PreloadModel-") and method in METHODS:
        return plan_preload_model(cost_model, target_s, int(method.split("-")[1]), min_width)
    if method == "Ours-0MB":
        return plan_elastic(cost_model, target_s, importance, 0.0, min_width=min_width, method=method)
    if method == "Ours":
        return plan_elastic(cost_model, target_s, importance, preload_bytes, min_width=min_width, method=method)
    raise UnknownNameError("method", method, METHODS)
