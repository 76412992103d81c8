"""Early-exit models served the E3 way: split the layers where the batch shrinks, replicate each split so that
its batch stays full, pipeline the splits over (possibly mixed) GPUs.

The public names are importable from here, each loaded on first use; the optimizer needs only NumPy, the batch
profiles statsmodels, the simulator SimPy, the serving Ray Serve (what a served run takes and gives back, in ``served``, does not).
"""
from workbench.lazy import lazy_exports

_EXPORTS = {
    "optimize_splits": "optimizer", "brute_force_splits": "optimizer", "SplitPlan": "optimizer",
    "bert_problem": "evaluation", "time_optimizer": "evaluation", "data_parallel": "optimizer",
    "largest_batch": "optimizer", "DataParallelPlan": "optimizer",
    "BatchProfile": "batchprofile", "BatchProfileEstimator": "batchprofile", "split_windows": "batchprofile",
    "simulate": "simulator", "simulate_plan": "simulator", "ArrivalProcess": "simulator",
    "LayerProfile": "profiles", "host_layer_profile": "profiles", "measure_layer_profile": "profiles",
    "gpu_profile": "profiles", "gpu_profiles": "profiles", "latency_by_type": "profiles",
    "EvalSettings": "pools", "goodput_table": "evaluation", "cost_table": "evaluation",
    "misprediction_table": "evaluation", "ramp_table": "evaluation", "validate_simulator": "validation",
    "Validation": "validation", "parametric_mix": "evaluation", "sustained_goodput": "pools",
    "serve_plan": "serve", "ServeRun": "served", "ServedRequest": "served", "Workload": "served", "ModelSpec": "served",
    "ray_session": "serve", "RaySession": "serve",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
