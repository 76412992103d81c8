"""Partitioned inference over several devices: Voltage (position-wise), tensor parallelism, the layer
pipeline, on one torch.distributed runtime of real worker processes.

The public names are importable from here, each loaded on first use: the cost model and the plans need
no torch; the partitioned layers and the runtime load it.
"""
from workbench.lazy import lazy_exports

_EXPORTS = {
    "attention_order": "cost", "order_threshold": "cost", "attention_flops": "cost", "comm_bytes": "cost", "candidate_gammas": "cost",
    "ModelShape": "cost", "SHAPES": "cost", "get_shape": "cost", "Traffic": "cost",
    "plan_partition": "plan", "PartitionPlan": "plan", "Step": "plan", "SCHEMES": "plan", "devices_like": "plan",
    "devices_from_table": "plan", "DeviceRow": "plan", "even_shares": "plan", "proportional_shares": "plan",
    "partitioned_layer": "workbench.models.slices", "partitioned_decoder_layer": "workbench.models.slices",
    "PartitionModel": "workbench.models.split",
    "PartitionRuntime": "runtime", "RunResult": "runtime", "RunFailed": "runtime", "run_partition": "runtime",
    "ShapedNetwork": "workbench.distributed.shaping",
    "paper_figures": "reference", "paper_value": "reference",
    "paper_ratio_device": "ratio", "paper_speed_gflops": "ratio", "fit_half_peak": "ratio",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
