"""The elastic slice's prepared artifacts in the cache: where each lives, how it is built, how it is read.

Three artifacts per task, each built from the one before and cached by its inputs:
the elastic fine-tuned encoder (a checkpoint), its shard store, and its shard
importance on a seeded dev subset. ``prepare_*`` builds what is missing (a damaged
artifact is rebuilt); ``load_*`` reads what `workbench prepare` built and, when it is
absent, says which command builds it. The format modules (``finetune``, ``store``,
``importance``) know nothing of the cache.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from workbench.cache import cache_dir, fingerprint
from workbench.data import TaskSpec, load_task, task_spec
from workbench.elastic.costmodel import CostModel, device_cost_model
from workbench.elastic.importance import ShardImportance, measure_importance
from workbench.elastic.quantize import BITWIDTHS
from workbench.elastic.store import FORMAT as STORE_FORMAT, ShardStore, ShardStoreError, build_store
from workbench.elastic.trainconfig import FORMAT_VERSION, ElasticTrainConfig, train_config
from workbench.errors import WorkbenchError
from workbench.presets import check_preset, prepare_hint

IMPORTANCE_DEV_SIZES = {"full": 512, "quick": 24}
"""Dev examples the importance ablation runs on per preset (the full one takes minutes on 2 cores)."""


def _not_prepared(what: str, task: str, preset: str) -> WorkbenchError:
    return WorkbenchError(f"task {task!r} has no {what} (preset {preset!r}); run `{prepare_hint(preset)}` first")


# ----------------------------------------------------------------------------- the elastic encoder


def _model_key(cfg: ElasticTrainConfig) -> str:
    from workbench.train.checkpoints import training_key

    return training_key(cfg, FORMAT_VERSION)


def model_dir(task: str, preset: str = "full") -> Path:
    """Where the elastic encoder of ``task`` trained by ``preset`` lives (keyed by every training input)."""
    cfg = train_config(task, preset)
    return cache_dir() / "models" / f"elastic-{cfg.task}-{_model_key(cfg)}"


def _model_meta(em) -> dict:
    return {"task": em.task, "config": asdict(em.config), "accuracy_grid": em.accuracy_grid.tolist(),
            "head_order": em.head_order.tolist(), "train_seconds": em.train_seconds,
            "dev_examples": em.dev_examples, "encoder": asdict(em.encoder.cfg), "losses": list(em.losses),
            "format": FORMAT_VERSION}


def _model_from(state: dict, meta: dict):
    from workbench.elastic.finetune import ElasticModel
    from workbench.models.encoder import Encoder, EncoderConfig

    model = Encoder(EncoderConfig(**meta["encoder"]), len(task_spec(meta["task"]).labels))
    model.load_state_dict(state, strict=True)
    return ElasticModel(task=meta["task"], encoder=model.eval(), config=ElasticTrainConfig(**meta["config"]),
                        accuracy_grid=np.array(meta["accuracy_grid"]), head_order=np.array(meta["head_order"]),
                        train_seconds=meta["train_seconds"], dev_examples=meta["dev_examples"],
                        losses=tuple(meta["losses"]))


def prepare_model(task: str, preset: str = "full", progress: bool = True, force: bool = False):
    """Train (or load from the cache) the elastic encoder of ``task`` (an ``ElasticModel``)."""
    from workbench.elastic.finetune import train_elastic
    from workbench.train.checkpoints import cached_checkpoint
    from workbench.train.resume import progress_path

    path = model_dir(task, preset)
    kept = progress_path(path)

    def build():
        em = train_elastic(train_config(task, preset), progress=progress, resume_path=kept)
        return em.encoder.state_dict(), _model_meta(em)

    state, meta = cached_checkpoint(path, build, force=force, what=f"elastic model for {task!r}")
    kept.unlink(missing_ok=True)                  # the model is saved: the run's progress is not needed
    return _model_from(state, meta)


def load_model(task: str, preset: str = "full"):
    """The prepared elastic encoder of ``task`` (verified; an ``ElasticModel``)."""
    from workbench.train.checkpoints import is_checkpoint, load_checkpoint

    path = model_dir(task, preset)
    if not is_checkpoint(path):
        raise _not_prepared("prepared elastic model", task, preset)
    return _model_from(*load_checkpoint(path))


def model_summary(task: str, preset: str = "full") -> dict:
    """The prepared model's record (accuracy grid, head order, timings) without loading its weights."""
    from workbench.train.checkpoints import is_checkpoint, read_meta

    path = model_dir(task, preset)
    if not is_checkpoint(path):
        raise _not_prepared("prepared elastic model", task, preset)
    meta = read_meta(path)
    meta["accuracy_grid"] = np.array(meta["accuracy_grid"])
    return meta


# ----------------------------------------------------------------------------- the shard store


def store_root(task: str, preset: str = "full", threshold: float = -4.0, bitwidths=BITWIDTHS) -> Path:
    """Where the shard store of ``task``'s prepared encoder lives (keyed by the model and the store's settings)."""
    key = fingerprint({"model": model_dir(task, preset).name, "format": STORE_FORMAT, "threshold": threshold,
                       "bitwidths": sorted(int(b) for b in bitwidths)})
    return cache_dir() / "stores" / f"{task}-{key}"


def prepare_store(task: str, preset: str = "full", progress: bool = True, force: bool = False) -> ShardStore:
    """Open (or build) the shard store of ``task``'s prepared encoder; a damaged store is rebuilt."""
    root = store_root(task, preset)
    if not force and (root / "CURRENT").exists():
        try:
            return ShardStore.open(root)
        except ShardStoreError as exc:
            print(f"workbench: shard store for {task!r} is damaged ({exc}); building it again")
    em = prepare_model(task, preset, progress=progress)
    return build_store(em.encoder, root, progress=progress,
                       meta={"task": task, "preset": preset, "model": model_dir(task, preset).name})


def load_store(task: str, preset: str = "full", verify: bool = True) -> ShardStore:
    """The prepared shard store of ``task``."""
    root = store_root(task, preset)
    if not (root / "CURRENT").exists():
        raise _not_prepared("shard store", task, preset)
    return ShardStore.open(root, verify=verify)


# ----------------------------------------------------------------------------- shard importance


def prepare_importance(task: str, preset: str = "full", dev_size: int | None = None, seed: int = 0,
                       progress: bool = True) -> ShardImportance:
    """Shard importance of ``task``'s store on a seeded dev subset (cached by its inputs, resumable per layer)."""
    store = prepare_store(task, preset, progress=progress)
    dev_full = load_task(task).dev
    size = IMPORTANCE_DEV_SIZES[check_preset(preset)] if dev_size is None else int(dev_size)
    if size < 1:
        raise WorkbenchError(f"the importance dev subset needs at least 1 example, got dev_size={size}")
    dev = dev_full.sample(min(size, len(dev_full)), seed)
    return measure_importance(store, dev, task_spec(task).max_length, progress=progress,
                              resume_path=_importance_path(store, dev.ids, task, seed))


def load_importance(task: str, preset: str = "full", dev_size: int | None = None, seed: int = 0) -> ShardImportance:
    """The cached shard importance (computing any missing layer first)."""
    return prepare_importance(task, preset, dev_size, seed, progress=False)


# ----------------------------------------------------------------------------- readiness (no building, no heavy reads)


def model_ready(task: str, preset: str) -> bool:
    from workbench.train.checkpoints import is_checkpoint

    return is_checkpoint(model_dir(task, preset))


def store_ready(task: str, preset: str) -> bool:
    return model_ready(task, preset) and (store_root(task, preset) / "CURRENT").exists()


def task_ready(task: str, preset: str) -> bool:
    """Everything the elastic page reads for ``task``: its fine-tuned model, shard store and importance."""
    return importance_ready(task, preset)


def _importance_path(store: ShardStore, dev_ids, task: str, seed: int) -> Path:
    key = fingerprint({"store": store.version, "dev": list(dev_ids), "low": min(store.bitwidths), "high": 32,
                       "task": task, "seed": seed})
    return cache_dir() / "importance" / f"{key}.json"


def importance_ready(task: str, preset: str, seed: int = 0) -> bool:
    """The default importance run of ``task`` has every layer (its resume file is complete)."""
    if not store_ready(task, preset):
        return False
    try:
        store = ShardStore.open(store_root(task, preset), verify=False)
    except ShardStoreError:
        return False
    dev = load_task(task).dev
    dev = dev.sample(min(IMPORTANCE_DEV_SIZES[check_preset(preset)], len(dev)), seed)
    path = _importance_path(store, dev.ids, task, seed)
    try:
        done = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return all(str(n) in done for n in range(store.cfg.num_layers))


# ----------------------------------------------------------------------------- what a (task, device) pair needs


@dataclass(frozen=True, kw_only=True)
class ElasticContext:
    """Everything planning and running on one task and device needs, loaded once."""
    task: TaskSpec
    device: str
    preset: str
    store: ShardStore
    cost_model: CostModel
    importance: ShardImportance


def load_context(task: str, device: str, preset: str = "full") -> ElasticContext:
    """The prepared store, importance and the device's cost model for ``task`` (the one loader CLI, UI, bench use)."""
    spec = task_spec(task)
    store = load_store(task, preset, verify=False)          # every shard read checks its own CRC32
    return ElasticContext(task=spec, device=device, preset=preset, store=store,
                          cost_model=device_cost_model(device, store, spec.max_length),
                          importance=load_importance(task, preset))
