"""Training the exit ramps the DeeBERT way, on the shared training loop.

Two stages: (1) fine-tune the encoder with its last ramp as the classifier (this is the stock model);
(2) freeze the encoder and train every other ramp on the hidden states after its layer (the sum of their
cross-entropies). Freezing keeps the stock model's accuracy intact; only early exits can cost accuracy.
Then every ramp is run on every dev example, so that exits for any threshold and any disabled ramps are
known without running the model again (:class:`RampRecord`).
"""
from __future__ import annotations

import time
from dataclasses import asdict

import numpy as np
import torch
import torch.nn.functional as F

from workbench.earlyexit.model import EarlyExitModel
from workbench.earlyexit.record import RampRecord, RampTrainConfig
from workbench.progress import progress_bar

@torch.no_grad()
def record_ramps(model: EarlyExitModel, split, max_length: int, batch_size: int = 64) -> RampRecord:
    """Run every ramp on every example of ``split`` (real inference, nobody leaving)."""
    from workbench.train.batching import by_length

    n, L = len(split), model.num_layers
    ents, preds, conf = np.zeros((L, n)), np.zeros((L, n), dtype=np.int64), np.zeros(n)
    for rows, ids, mask in by_length(split, batch_size, max_length):
        e, p = model.ramp_entropies(ids, mask)
        ents[:, rows], preds[:, rows] = e, p
        x = model.embed(ids, mask)
        for layer in model.encoder.layers:
            x = layer(x, model.encoder.attn_bias(mask))
        conf[rows] = torch.softmax(model.ramps[-1](x, mask), -1).max(-1).values.numpy()
    return RampRecord(ents, preds, np.asarray(split.labels, dtype=np.int64), conf, tuple(split.ids),
                      model.num_classes)


def _stage1_loss(model: EarlyExitModel, batch) -> torch.Tensor:
    ids, mask, y = batch
    x, bias = model.embed(ids, mask), model.encoder.attn_bias(mask)
    for layer in model.encoder.layers:
        x = layer(x, bias)
    loss = F.cross_entropy(model.ramps[-1](x, mask), y)
    loss.backward()
    return loss


def _stage2_loss(model: EarlyExitModel, batch) -> torch.Tensor:
    ids, mask, y = batch
    with torch.no_grad():
        x, bias = model.embed(ids, mask), model.encoder.attn_bias(mask)
        states = []
        for layer in model.encoder.layers[:-1]:
            x = layer(x, bias)
            states.append(x)
    loss = sum(F.cross_entropy(model.ramps[k](h, mask), y) for k, h in enumerate(states))
    loss.backward()
    return loss / len(states)


class _Named(torch.nn.Module):
    """Parameter groups for the shared AdamW helper: ``head.*`` (the trained ramps) and the body."""

    def __init__(self, body: torch.nn.Module, head: torch.nn.Module):
        super().__init__()
        self.body, self.head = body, head


def train_ramps(cfg: RampTrainConfig, progress: bool = True, resume_path=None,
                resume_every_s: float | None = None) -> tuple[EarlyExitModel, RampRecord, dict]:
    """Both stages, then the dev record; returns (model, record, timings and losses). With ``resume_path``,
    the run's progress is kept there and a run stopped earlier continues from it (:mod:`workbench.train.resume`)."""
    from workbench.earlyexit.record import FORMAT_VERSION
    from workbench.models.encoder import load_pretrained_encoder
    from workbench.train.batching import length_bucketed_batches
    from workbench.train.checkpoints import training_key
    from workbench.train.loop import adamw, start_training, train_steps
    from workbench.train.resume import TrainingProgress

    run = start_training(cfg)
    spec, train, dev, rng = run.spec, run.train, run.dev, run.rng
    pretrained = load_pretrained_encoder(0)
    model = EarlyExitModel(pretrained.cfg, len(spec.labels))
    model.encoder.load_state_dict(pretrained.state_dict())
    model.encoder.word.weight.requires_grad_(False)
    batches = length_bucketed_batches(train, cfg.batch_size, rng, spec.max_length)
    kept = TrainingProgress(resume_path, training_key(cfg, FORMAT_VERSION), ["encoder", "ramps"], model, rng,
                            batches, every_s=resume_every_s)
    start = time.perf_counter()

    for ramp in model.ramps[:-1]:
        ramp.requires_grad_(False)
    stage1 = adamw(_Named(model.encoder, model.ramps[-1]), cfg.lr, cfg.head_lr)
    losses = train_steps(model, batches, cfg.full_steps, stage1, _stage1_loss,
                         desc=f"{cfg.task}: encoder + classifier", progress=progress, resume=kept, phase="encoder")
    model.encoder.requires_grad_(False)
    model.ramps[-1].requires_grad_(False)
    for ramp in model.ramps[:-1]:
        ramp.requires_grad_(True)
    stage2 = adamw(_Named(torch.nn.Module(), model.ramps[:-1]), cfg.ramp_lr, cfg.ramp_lr)
    ramp_losses = train_steps(model, batches, cfg.ramp_steps, stage2, _stage2_loss,
                              desc=f"{cfg.task}: exit ramps", progress=progress, resume=kept, phase="ramps")
    train_s = time.perf_counter() - start
    model.requires_grad_(False)
    model.eval()
    with progress_bar(total=1, desc=f"{cfg.task}: ramps on the dev set", enabled=progress) as bar:
        record = record_ramps(model, dev, spec.max_length)
        bar.update(1)
    return model, record, {"train_seconds": train_s, "losses": losses, "ramp_losses": ramp_losses,
                           "config": asdict(cfg)}
