"""Elastic pipelining (WRX): shards, quantization, the shard store, importance, profiles, the
two-stage planner, the IO/compute pipeline, the baselines and the evaluation.

The public names are importable from here; each is loaded on first use, so importing the
package stays cheap (the pipeline pulls in torch, the quantizer scikit-learn).
"""
from importlib import import_module

_EXPORTS = {
    "gobo_quantize": "quantize", "QuantizedTensor": "quantize", "decompress_reference": "quantize",
    "ShardStore": "store", "build_store": "store", "load_store": "store", "prepare_store": "store",
    "ShardStoreError": "store",
    "profile_importance": "importance", "importance_profile": "importance", "ImportanceProfile": "importance",
    "load_importance": "importance", "prepare_importance": "importance",
    "ElasticProfile": "profile", "measure_profile": "profile", "device_profile": "profile",
    "plan_compute": "planner", "ComputePlan": "planner", "plan_io": "planner", "IOPlan": "planner",
    "AllocationStep": "planner", "select_preload": "planner", "simulate": "planner",
    "plan_elastic": "planner", "ElasticPlan": "planner", "PlanningError": "planner",
    "ElasticEngine": "pipeline", "PreloadBuffer": "pipeline", "RunResult": "pipeline", "run_pipeline": "pipeline",
    "METHODS": "baselines", "plan_method": "baselines",
}
_ALIASES = {"plan": ("planner", "plan_elastic")}       # DESIGN.md's name for running both stages

__all__ = sorted([*_EXPORTS, *_ALIASES])


def __getattr__(name: str):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name], name
    elif name in _ALIASES:
        module, attr = _ALIASES[name]
    else:
        raise AttributeError(f"module 'workbench.elastic' has no attribute {name!r}")
    value = getattr(import_module(f"workbench.elastic.{module}"), attr)
    globals()[name] = value
    return value


def __dir__():
    return __all__
