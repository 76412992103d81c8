"""Elastic fine-tuning: one encoder whose every n x m submodel classifies well.

The WRX paper runs DynaBERT models, trained so that the first n layers with the
first m heads/FFN slices of each layer form a usable submodel. We follow the same
recipe on the shipped MiniLM encoder:

1. *Full fine-tuning* of the whole model and a fresh classification head.
2. *Importance reordering*: with the fine-tuned model, score every head and every
   FFN neuron by the first-order Taylor estimate of the loss change when it is
   removed, |sum(w * dL/dw)| over its output weights, and permute heads and
   neurons so that shard i holds the i-th most important head and FFN block. The
   permutation leaves the full model's function unchanged.
3. *Elastic training*: every step trains the full model and, with in-place
   distillation from its logits, the smallest submodel and a few random n x m ones
   (the sandwich rule), so width m uses the m most important shards.

Training is deterministic for a given config (seeded sampling, fixed batch order,
fixed thread count) and cached by its inputs; see :func:`prepare_task`.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from workbench.cache import atomic_path, cache_dir, fingerprint, record, verify
from workbench.data import Split, load_task, task_spec
from workbench.errors import CorruptArtifactError, WorkbenchError
from workbench.models.encoder import Encoder, EncoderConfig, load_pretrained_encoder
from workbench.models.tokenizer import encoder_tokenizer

FORMAT_VERSION = 2


@dataclass(frozen=True)
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
    max_train: int | None = None    # cap on training examples (quick profile)
    max_dev: int | None = None      # cap on dev examples for the accuracy grid
    threads: int = 2


PROFILES: dict[str, dict[str, dict]] = {
    # "full": what `workbench prepare` trains; sized to finish in about 15 minutes on 2 cores.
    "full": {"sentiment": {}, "bbc": {"batch_size": 16, "full_steps": 90, "elastic_steps": 160}},
    # "quick": every code path of the full profile on a few batches; used by the test suite.
    "quick": {name: {"batch_size": 8, "full_steps": 6, "importance_batches": 2, "elastic_steps": 6,
                     "max_train": 256, "max_dev": 48} for name in ("sentiment", "bbc")},
}


def train_config(task: str, profile: str = "full") -> ElasticTrainConfig:
    task_spec(task)
    if profile not in PROFILES:
        raise WorkbenchError(f"unknown prepare profile {profile!r}; known: {', '.join(PROFILES)}")
    return ElasticTrainConfig(task=task, **PROFILES[profile][task])


@dataclass
class ElasticModel:
    """A fine-tuned elastic encoder and what its preparation measured."""
    task: str
    encoder: Encoder
    config: ElasticTrainConfig
    accuracy_grid: np.ndarray              # (N, M): dev accuracy of the first n layers x first m shards
    head_order: np.ndarray                 # (N, M): original head index now at shard position i
    train_seconds: float
    dev_examples: int
    path: Path | None = None
    losses: list[float] = field(default_factory=list)

    @property
    def full_accuracy(self) -> float:
        return float(self.accuracy_grid[-1, -1])


# ----------------------------------------------------------------------------- batching


def _batches(split: Split, batch_size: int, rng: np.random.Generator, max_length: int, bucket_batches: int = 50):
    """Endless shuffled batches (ids, mask, labels) of similar lengths, so little compute goes to padding.

    Each epoch is shuffled, cut into pools of ``bucket_batches`` batches, each pool sorted by
    token length and cut into batches; the batches of an epoch are then shuffled again.
    """
    tok = encoder_tokenizer(max_length)
    lengths = np.array(tok.lengths(split.texts))
    while True:
        order = rng.permutation(len(split))
        pool = bucket_batches * batch_size
        batches = []
        for s in range(0, len(order), pool):
            chunk = order[s:s + pool]
            chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
            batches += [chunk[b:b + batch_size] for b in range(0, len(chunk) - batch_size + 1, batch_size)]
        for i in rng.permutation(len(batches)):
            idx = batches[i]
            ids, mask = tok([split.texts[j] for j in idx])
            yield ids, mask, torch.from_numpy(split.labels[idx])


def _schedule(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def _optimizer(model: Encoder, cfg: ElasticTrainConfig) -> torch.optim.Optimizer:
    body = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("head.")]
    return torch.optim.AdamW([{"params": body, "lr": cfg.lr}, {"params": model.head.parameters(), "lr": cfg.head_lr}],
                             weight_decay=0.01)


def _set_lr(opt, cfg: ElasticTrainConfig, factor: float) -> None:
    opt.param_groups[0]["lr"] = cfg.lr * factor
    opt.param_groups[1]["lr"] = cfg.head_lr * factor


# ----------------------------------------------------------------------------- importance reordering


def head_neuron_importance(model: Encoder, batches) -> tuple[np.ndarray, np.ndarray]:
    """Taylor importance per head (N, M) and per FFN neuron (N, d_ff), from gradients of the loss."""
    cfg = model.cfg
    heads = np.zeros((cfg.num_layers, cfg.num_heads))
    neurons = np.zeros((cfg.num_layers, cfg.ffn))
    for ids, mask, y in batches:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(ids, mask), y).backward()
        for n, layer in enumerate(model.layers):
            wg = (layer.attn_out.weight * layer.attn_out.weight.grad).sum(0)          # (d,) per input column
            heads[n] += wg.view(cfg.num_heads, cfg.head_dim).sum(1).abs().detach().numpy()
            ng = (layer.ffn2.weight * layer.ffn2.weight.grad).sum(0)                  # (d_ff,)
            neurons[n] += ng.abs().detach().numpy()
    model.zero_grad(set_to_none=True)
    return heads, neurons


@torch.no_grad()
def reorder_by_importance(model: Encoder, heads: np.ndarray, neurons: np.ndarray) -> np.ndarray:
    """Permute heads and FFN neurons of every layer, most important first; returns the head order."""
    cfg = model.cfg
    dh = cfg.head_dim
    orders = []
    for n, layer in enumerate(model.layers):
        head_order = np.argsort(-heads[n], kind="stable")
        rows = torch.from_numpy((head_order[:, None] * dh + np.arange(dh)).reshape(-1))
        nrn = torch.from_numpy(np.argsort(-neurons[n], kind="stable").copy())
        for lin in (layer.query, layer.key, layer.value):
            lin.weight.copy_(lin.weight[rows])
            lin.bias.copy_(lin.bias[rows])
        layer.attn_out.weight.copy_(layer.attn_out.weight[:, rows])
        layer.ffn1.weight.copy_(layer.ffn1.weight[nrn])
        layer.ffn1.bias.copy_(layer.ffn1.bias[nrn])
        layer.ffn2.weight.copy_(layer.ffn2.weight[:, nrn])
        orders.append(head_order)
    return np.stack(orders)


# ----------------------------------------------------------------------------- evaluation


@torch.no_grad()
def accuracy_grid(model: Encoder, split: Split, max_length: int, batch_size: int = 64,
                  progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """Dev accuracy of every n x m submodel, (N, M); one pass of all layers per width m."""
    cfg = model.cfg
    tok = encoder_tokenizer(max_length)
    correct = np.zeros((cfg.num_layers, cfg.num_heads))
    model.eval()
    for m in range(1, cfg.num_heads + 1):
        for s in range(0, len(split), batch_size):
            ids, mask = tok(split.texts[s:s + batch_size])
            y = split.labels[s:s + batch_size]
            x, bias = model.embed(ids), model.attn_bias(mask)
            for n, layer in enumerate(model.layers):
                x = layer(x, bias, range(m))
                pred = model.classify(x, mask).argmax(-1).numpy()
                correct[n, m - 1] += (pred == y).sum()
        if progress:
            progress(m, cfg.num_heads)
    return correct / len(split)


@torch.no_grad()
def evaluate(model: Encoder, split: Split, max_length: int, depth: int | None = None, width: int | None = None,
             batch_size: int = 64) -> float:
    """Accuracy of the ``depth`` x ``width`` submodel (default: the whole model) on ``split``."""
    tok = encoder_tokenizer(max_length)
    model.eval()
    by_length = sorted(range(len(split)), key=lambda j: (len(split.texts[j]), j))      # less padding
    correct = 0
    for s in range(0, len(split), batch_size):
        rows = by_length[s:s + batch_size]
        ids, mask = tok([split.texts[j] for j in rows])
        logits = model(ids, mask, depth=depth, width=width)
        correct += int((logits.argmax(-1).numpy() == split.labels[rows]).sum())
    return correct / len(split)


# ----------------------------------------------------------------------------- training


def _sample_submodels(rng: np.random.Generator, cfg: EncoderConfig, k: int) -> list[tuple[int, int]]:
    subs = [(1, 1)]
    while len(subs) < k + 1:
        n, m = int(rng.integers(1, cfg.num_layers + 1)), int(rng.integers(1, cfg.num_heads + 1))
        if (n, m) != (cfg.num_layers, cfg.num_heads):
            subs.append((n, m))
    return subs


def train_elastic(cfg: ElasticTrainConfig, progress: bool = True) -> ElasticModel:
    """Run the three stages of elastic fine-tuning and measure the accuracy grid."""
    from tqdm.auto import tqdm

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    spec = task_spec(cfg.task)
    data = load_task(cfg.task)
    train = data.train.subset(cfg.max_train) if cfg.max_train else data.train
    dev = data.dev.subset(cfg.max_dev) if cfg.max_dev else data.dev
    model = load_pretrained_encoder(len(spec.labels))
    model.word.weight.requires_grad_(False)   # the large embedding table stays as pretrained
    batches = _batches(train, cfg.batch_size, rng, spec.max_length)
    start = time.perf_counter()
    losses: list[float] = []

    model.train()
    opt = _optimizer(model, cfg)
    bar = tqdm(range(cfg.full_steps), desc=f"{cfg.task}: full fine-tuning", disable=not progress)
    for step in bar:
        ids, mask, y = next(batches)
        _set_lr(opt, cfg, _schedule(step, cfg.full_steps, max(1, cfg.full_steps // 10)))
        loss = F.cross_entropy(model(ids, mask), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{loss.item():.3f}")

    model.eval()
    heads, neurons = head_neuron_importance(model, (next(batches) for _ in range(cfg.importance_batches)))
    head_order = reorder_by_importance(model, heads, neurons)

    model.train()
    opt = _optimizer(model, cfg)
    bar = tqdm(range(cfg.elastic_steps), desc=f"{cfg.task}: elastic training", disable=not progress)
    for step in bar:
        ids, mask, y = next(batches)
        _set_lr(opt, cfg, _schedule(step, cfg.elastic_steps, max(1, cfg.elastic_steps // 10)))
        opt.zero_grad(set_to_none=True)
        full = model(ids, mask)
        loss = F.cross_entropy(full, y)
        loss.backward()
        teacher = full.detach().log_softmax(-1)
        subs = _sample_submodels(rng, model.cfg, cfg.random_submodels)
        for n, m in subs:
            logits = model(ids, mask, depth=n, width=m)
            kd = F.kl_div(logits.log_softmax(-1), teacher, log_target=True, reduction="batchmean")
            (F.cross_entropy(logits, y) + cfg.distill_weight * kd).div(len(subs)).backward()
        opt.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{loss.item():.3f}")
    train_seconds = time.perf_counter() - start

    model.eval()
    bar = tqdm(total=model.cfg.num_heads, desc=f"{cfg.task}: accuracy grid", disable=not progress)
    grid = accuracy_grid(model, dev, spec.max_length, progress=lambda i, n: bar.update(1))
    bar.close()
    return ElasticModel(cfg.task, model, cfg, grid, head_order, train_seconds, len(dev), losses=losses)


# ----------------------------------------------------------------------------- cache


def _cache_key(cfg: ElasticTrainConfig) -> str:
    from workbench.assets import MINILM

    data_sig = json.loads((Path(__file__).resolve().parents[2] / "data" / "splits" / f"{cfg.task}.json")
                          .read_text())["source_sha256"]
    return fingerprint({"cfg": asdict(cfg), "format": FORMAT_VERSION, "model": f"{MINILM.package}=={MINILM.version}",
                        "data": data_sig, "torch": torch.__version__})


def artifact_dir(cfg: ElasticTrainConfig) -> Path:
    return cache_dir() / "models" / f"elastic-{cfg.task}-{_cache_key(cfg)}"


def save_elastic(em: ElasticModel, path: Path) -> Path:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    with atomic_path(path / "model.safetensors") as tmp:
        save_file({k: v.contiguous() for k, v in em.encoder.state_dict().items()}, str(tmp))
    meta = {"task": em.task, "config": asdict(em.config), "accuracy_grid": em.accuracy_grid.tolist(),
            "head_order": em.head_order.tolist(), "train_seconds": em.train_seconds,
            "dev_examples": em.dev_examples, "encoder": asdict(em.encoder.cfg), "losses": em.losses,
            "format": FORMAT_VERSION}
    with atomic_path(path / "meta.json") as tmp:
        tmp.write_text(json.dumps(meta))
    record([path / "model.safetensors", path / "meta.json"], path / "manifest.json", {"task": em.task})
    em.path = path
    return path


def load_elastic_dir(path: Path) -> ElasticModel:
    """Load a prepared elastic model after verifying its checksums."""
    from safetensors.torch import load_file

    verify(path / "manifest.json")
    meta = json.loads((path / "meta.json").read_text())
    enc_cfg = EncoderConfig(**meta["encoder"])
    model = Encoder(enc_cfg, len(task_spec(meta["task"]).labels))
    model.load_state_dict(load_file(path / "model.safetensors"), strict=True)
    model.eval()
    return ElasticModel(meta["task"], model, ElasticTrainConfig(**meta["config"]), np.array(meta["accuracy_grid"]),
                        np.array(meta["head_order"]), meta["train_seconds"], meta["dev_examples"], path, meta["losses"])


def prepare_task(task: str, profile: str = "full", progress: bool = True, force: bool = False) -> ElasticModel:
    """Train (or load from the cache) the elastic model of ``task``; a damaged cache entry is rebuilt."""
    cfg = train_config(task, profile)
    path = artifact_dir(cfg)
    if not force and (path / "manifest.json").exists():
        try:
            return load_elastic_dir(path)
        except CorruptArtifactError as exc:
            print(f"workbench: cached elastic model for {task!r} is damaged ({exc}); training it again")
    em = train_elastic(cfg, progress=progress)
    save_elastic(em, path)
    return em


def _not_prepared(task: str, profile: str) -> str:
    flag = "" if profile == "full" else f" --profile {profile}"
    return f"task {task!r} has no prepared elastic model (profile {profile!r}); run `workbench prepare{flag}` first"


def load_elastic(task: str, profile: str = "full") -> ElasticModel:
    """The prepared elastic model of ``task``; tells the user to run `workbench prepare` if absent."""
    path = artifact_dir(train_config(task, profile))
    if not (path / "manifest.json").exists():
        raise WorkbenchError(_not_prepared(task, profile))
    return load_elastic_dir(path)


def elastic_summary(task: str, profile: str = "full") -> dict:
    """The prepared model's recorded facts (accuracy grid, head order, timings) without loading weights."""
    cfg = train_config(task, profile)
    meta_path = artifact_dir(cfg) / "meta.json"
    if not meta_path.exists():
        raise WorkbenchError(_not_prepared(task, profile))
    meta = json.loads(meta_path.read_text())
    meta["accuracy_grid"] = np.array(meta["accuracy_grid"])
    return meta
