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

The loop, batching, evaluation and checkpoints are the shared ones of
:mod:`workbench.train`; this module holds only what is WRX's: the importance reordering
and the sandwich rule. Training is deterministic for a given config (seeded sampling,
fixed batch order, fixed thread count); :mod:`workbench.elastic.artifacts` caches it by
its inputs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from workbench.elastic.trainconfig import (FORMAT_VERSION, PRESET_CONFIGS, ElasticTrainConfig,  # noqa: F401
                                           train_config)
from workbench.models.encoder import Encoder, EncoderConfig, load_pretrained_encoder
from workbench.progress import progress_bar
from workbench.train.batching import length_bucketed_batches
from workbench.train.evaluate import accuracy_grid
from workbench.train.loop import adamw, start_training, train_steps

@dataclass(frozen=True, kw_only=True)
class ElasticModel:
    """A fine-tuned elastic encoder and what its preparation measured."""
    task: str
    encoder: Encoder
    config: ElasticTrainConfig
    accuracy_grid: np.ndarray              # (N, M): dev accuracy of the first n layers x first m shards
    head_order: np.ndarray                 # (N, M): original head index now at shard position i
    train_seconds: float
    dev_examples: int
    losses: tuple[float, ...] = ()


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


# ----------------------------------------------------------------------------- the sandwich rule


def sample_submodels(rng: np.random.Generator, cfg: EncoderConfig, k: int) -> list[tuple[int, int]]:
    """The smallest submodel (1 x 1) and ``k`` random n x m ones other than the full model."""
    subs = [(1, 1)]
    while len(subs) < k + 1:
        n, m = int(rng.integers(1, cfg.num_layers + 1)), int(rng.integers(1, cfg.num_heads + 1))
        if (n, m) != (cfg.num_layers, cfg.num_heads):
            subs.append((n, m))
    return subs


def sandwich_loss(rng: np.random.Generator, cfg: ElasticTrainConfig):
    """One elastic step's loss: the full model's, then (backpropagated in turn) each sampled submodel's
    cross-entropy plus its KL divergence from the full model's logits (in-place distillation)."""
    def step_loss(model: Encoder, batch) -> torch.Tensor:
        ids, mask, y = batch
        full = model(ids, mask)
        loss = F.cross_entropy(full, y)
        loss.backward()
        teacher = full.detach().log_softmax(-1)
        subs = sample_submodels(rng, model.cfg, cfg.random_submodels)
        for n, m in subs:
            logits = model(ids, mask, depth=n, width=m)
            kd = F.kl_div(logits.log_softmax(-1), teacher, log_target=True, reduction="batchmean")
            (F.cross_entropy(logits, y) + cfg.distill_weight * kd).div(len(subs)).backward()
        return loss
    return step_loss


def full_model_loss(model: Encoder, batch) -> torch.Tensor:
    ids, mask, y = batch
    loss = F.cross_entropy(model(ids, mask), y)
    loss.backward()
    return loss


def train_elastic(cfg: ElasticTrainConfig, progress: bool = True, resume_path=None,
                  resume_every_s: float | None = None) -> ElasticModel:
    """Run the three stages of elastic fine-tuning and measure the accuracy grid. With ``resume_path``, the
    run's progress is kept there and a run stopped earlier continues from it (:mod:`workbench.train.resume`)."""
    from workbench.train.checkpoints import training_key
    from workbench.train.resume import TrainingProgress

    run = start_training(cfg)
    spec, train, dev, rng = run.spec, run.train, run.dev, run.rng
    model = load_pretrained_encoder(len(spec.labels))
    model.word.weight.requires_grad_(False)   # the large embedding table stays as pretrained
    batches = length_bucketed_batches(train, cfg.batch_size, rng, spec.max_length)
    kept = TrainingProgress(resume_path, training_key(cfg, FORMAT_VERSION), ["full", "elastic"], model, rng, batches,
                            every_s=resume_every_s)
    start = time.perf_counter()

    losses = train_steps(model, batches, cfg.full_steps, adamw(model, cfg.lr, cfg.head_lr), full_model_loss,
                         desc=f"{cfg.task}: full fine-tuning", progress=progress, resume=kept, phase="full")
    if "head_order" not in kept.extras:        # not done before the saved point
        heads, neurons = head_neuron_importance(model, (next(batches) for _ in range(cfg.importance_batches)))
        kept.extras["head_order"] = reorder_by_importance(model, heads, neurons).tolist()
    head_order = np.array(kept.extras["head_order"])
    losses += train_steps(model, batches, cfg.elastic_steps, adamw(model, cfg.lr, cfg.head_lr),
                          sandwich_loss(rng, cfg), desc=f"{cfg.task}: elastic training", progress=progress,
                          resume=kept, phase="elastic")
    train_seconds = time.perf_counter() - start

    with progress_bar(total=model.cfg.num_heads, desc=f"{cfg.task}: accuracy grid", enabled=progress) as bar:
        grid = accuracy_grid(model, dev, spec.max_length, progress=lambda i, n: bar.update(1))
    return ElasticModel(task=cfg.task, encoder=model, config=cfg, accuracy_grid=grid, head_order=head_order,
                        train_seconds=train_seconds, dev_examples=len(dev), losses=tuple(losses))
