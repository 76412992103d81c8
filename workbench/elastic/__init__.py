"""Elastic pipelining (WRX): shards, quantization, the shard store, importance, cost models, the
two-stage planner, the IO/compute pipeline, the baselines and the evaluation.

The public names are importable from here; each is loaded on first use, so importing the
package stays cheap (the pipeline pulls in torch, the quantizer scikit-learn).
"""
from workbench.lazy import lazy_exports

_EXPORTS = {
    "gobo_quantize": "quantize", "QuantizedTensor": "quantize", "decompress_reference": "quantize",
    "ShardStore": "store", "build_store": "store", "ShardStoreError": "store",
    "profile_importance": "importance", "measure_importance": "importance", "ShardImportance": "importance",
    "load_store": "artifacts", "prepare_store": "artifacts", "load_importance": "artifacts",
    "prepare_importance": "artifacts", "load_model": "artifacts", "prepare_model": "artifacts",
    "load_context": "artifacts", "ElasticContext": "artifacts",
    "CostModel": "costmodel", "measure_cost_model": "costmodel", "device_cost_model": "costmodel",
    "plan_compute": "planner", "ComputePlan": "planner", "plan_io": "planner", "IOPlan": "planner",
    "AllocationStep": "planner", "select_preload": "planner", "simulate": "planner",
    "plan_elastic": "planner", "ElasticPlan": "planner", "PlanningError": "planner",
    "ElasticEngine": "pipeline", "PreloadBuffer": "pipeline", "RunResult": "pipeline", "run_pipeline": "pipeline",
    "METHODS": "baselines", "plan_method": "baselines",
}
_ALIASES = {"plan": ("planner", "plan_elastic")}       # DESIGN.md's name for running both stages

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, _ALIASES)
