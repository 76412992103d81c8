"""Settings of the elastic fine-tuning, per task and prepare preset (torch-free: they key the cache)."""
from __future__ import annotations

from dataclasses import dataclass

from workbench.data import task_spec
from workbench.presets import check_preset

FORMAT_VERSION = 2


@dataclass(frozen=True, kw_only=True)
class ElasticTrainConfig:
    """Settings of one elastic fine-tuning run (all part of the cache key)."""
    task: str
    seed: int = 0
    batch_size: int = 32
    lr: float = 8e-5                # AdamW peak learning rate (linear warm-up then decay)
    head_lr: float = 1e-3           # the fresh classification head learns faster
    full_steps: int = 150           # stage 1: full-model steps
    importance_batches: int = 8     # stage 2: batches scored for head/neuron importance
    elastic_steps: int = 350        # stage 3: sandwich-rule steps
    random_submodels: int = 2       # random n x m submodels per elastic step (besides the smallest)
    distill_weight: float = 1.0     # weight of KL(submodel || full) in stage 3
    max_train: int | None = None    # cap on training examples (quick preset)
    max_dev: int | None = None      # cap on dev examples for the accuracy grid
    threads: int = 2


PRESET_CONFIGS: dict[str, dict[str, dict]] = {
    # "full": what `workbench prepare` trains; sized to finish in about 15 minutes on 2 cores.
    "full": {"sentiment": {}, "bbc": {"batch_size": 16, "full_steps": 90, "elastic_steps": 160}},
    # "quick": every code path of the full preset on a few batches; used by the test suite.
    "quick": {name: {"batch_size": 8, "full_steps": 6, "importance_batches": 2, "elastic_steps": 6,
                     "max_train": 256, "max_dev": 48} for name in ("sentiment", "bbc")},
}


def train_config(task: str, preset: str = "full") -> ElasticTrainConfig:
    """The training settings ``preset`` uses for ``task``."""
    task_spec(task)
    return ElasticTrainConfig(task=task, **PRESET_CONFIGS[check_preset(preset)][task])
