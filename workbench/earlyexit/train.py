"""Training the exit ramps the DeeBERT way, on the shared training loop.

Two stages: (1) fine-tune the encoder with its last ramp as the classifier (this is the stock model);
(2) freeze the encoder and train every other ramp on the hidden states after its layer (the sum of their
cross-entropies). Freezing keeps the stock model's accuracy intact; only early exits can cost accuracy.
Then every ramp is run on every dev example, so that exits for any threshold and any disabled ramps are
known without running the model again (:class:`RampRecord`).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from workbench.data import load_task, task_spec
from workbench.earlyexit.model import EarlyExitModel, exits_from_entropies
from workbench.presets import check_preset
from workbench.progress import progress_bar

FORMAT_VERSION = 2

def thresholds(num_classes: int, steps: int = 20) -> tuple[float, ...]:
    """Entropy thresholds (nats) from 0 (nobody exits early) to ln(classes) (everyone leaves at the first ramp)."""
    top = float(np.ceil(np.log(num_classes) * 1e4) / 1e4)
    return tuple(round(top * i / steps, 4) if i < steps else top for i in range(steps + 1))


@dataclass(frozen=True, kw_only=True)
class RampTrainConfig:
    """Settings of one ramp training run (all part of the cache key)."""
    task: str
    seed: int = 0
    batch_size: int = 32
    lr: float = 8e-5
    head_lr: float = 1e-3
    full_steps: int = 150           # stage 1: encoder + last ramp
    ramp_steps: int = 150           # stage 2: the other ramps, encoder frozen
    ramp_lr: float = 1e-3
    max_train: int | None = None
    max_dev: int | None = None
    threads: int = 2


PRESET_CONFIGS: dict[str, dict[str, dict]] = {
    "full": {"sentiment": {}, "bbc": {"batch_size": 16, "full_steps": 90}},
    "quick": {name: {"batch_size": 8, "full_steps": 6, "ramp_steps": 6, "max_train": 256, "max_dev": 96}
              for name in ("sentiment", "bbc")},
}


def ramp_config(task: str, preset: str = "full") -> RampTrainConfig:
    task_spec(task)
    return RampTrainConfig(task=task, **PRESET_CONFIGS[check_preset(preset)][task])


@dataclass(frozen=True)
class RampRecord:
    """Every ramp on every dev example: entropies and predictions (layers x examples), the true labels, and
    the stock model's confidence (softmax maximum of the last ramp) that bins examples into easy and hard."""
    entropies: np.ndarray          # (L, n) nats
    predictions: np.ndarray        # (L, n)
    labels: np.ndarray             # (n,)
    confidence: np.ndarray         # (n,)
    dev_ids: tuple[str, ...] = field(default=())
    classes: int = 0               # how many classes the task has (0: inferred from the labels seen)

    @property
    def num_layers(self) -> int:
        return self.entropies.shape[0]

    def exits(self, threshold: float, disabled=()) -> np.ndarray:
        return exits_from_entropies(self.entropies, threshold, disabled)

    def accuracy(self, threshold: float, disabled=(), rows=None) -> float:
        rows = np.arange(len(self.labels)) if rows is None else np.asarray(rows)
        exits = self.exits(threshold, disabled)[rows]
        return float((self.predictions[exits, rows] == self.labels[rows]).mean())

    def stock_accuracy(self, rows=None) -> float:
        return self.accuracy(0.0, rows=rows)

    def ramp_accuracy(self) -> np.ndarray:
        """Accuracy of each ramp if every example left there."""
        return (self.predictions == self.labels[None]).mean(axis=1)

    @property
    def num_classes(self) -> int:
        return self.classes or int(max(self.predictions.max(initial=0), self.labels.max(initial=0))) + 1

    def table(self, values=None, disabled=()) -> list[dict]:
        """Per threshold: accuracy, its loss against the stock model, mean layers run (1..L)."""
        stock = self.stock_accuracy()
        return [{"threshold": t, "accuracy": self.accuracy(t, disabled), "loss": stock - self.accuracy(t, disabled),
                 "mean_layers": float(self.exits(t, disabled).mean() + 1)}
                for t in (values or thresholds(self.num_classes))]

    def easy_hard(self) -> tuple[np.ndarray, np.ndarray]:
        """Dev rows binned by the stock model's confidence: the more confident half is easy."""
        order = np.argsort(-self.confidence, kind="stable")
        half = (len(order) + 1) // 2
        return np.sort(order[:half]), np.sort(order[half:])

    def to_dict(self) -> dict:
        return {"entropies": self.entropies.tolist(), "predictions": self.predictions.tolist(),
                "labels": self.labels.tolist(), "confidence": self.confidence.tolist(), "dev_ids": list(self.dev_ids),
                "classes": self.classes}

    @classmethod
    def from_dict(cls, d: dict) -> RampRecord:
        return cls(np.array(d["entropies"], dtype=np.float64), np.array(d["predictions"], dtype=np.int64),
                   np.array(d["labels"], dtype=np.int64), np.array(d["confidence"], dtype=np.float64),
                   tuple(d.get("dev_ids", ())), int(d.get("classes", 0)))


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


def train_ramps(cfg: RampTrainConfig, progress: bool = True) -> tuple[EarlyExitModel, RampRecord, dict]:
    """Both stages, then the dev record; returns (model, record, timings and losses)."""
    from workbench.models.encoder import load_pretrained_encoder
    from workbench.train.batching import length_bucketed_batches
    from workbench.train.loop import adamw, train_steps

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    spec = task_spec(cfg.task)
    data = load_task(cfg.task)
    train = data.train.subset(cfg.max_train) if cfg.max_train else data.train
    dev = data.dev.subset(cfg.max_dev) if cfg.max_dev else data.dev
    pretrained = load_pretrained_encoder(0)
    model = EarlyExitModel(pretrained.cfg, len(spec.labels))
    model.encoder.load_state_dict(pretrained.state_dict())
    model.encoder.word.weight.requires_grad_(False)
    batches = length_bucketed_batches(train, cfg.batch_size, rng, spec.max_length)
    start = time.perf_counter()

    for ramp in model.ramps[:-1]:
        ramp.requires_grad_(False)
    stage1 = adamw(_Named(model.encoder, model.ramps[-1]), cfg.lr, cfg.head_lr)
    losses = train_steps(model, batches, cfg.full_steps, stage1, _stage1_loss,
                         desc=f"{cfg.task}: encoder + classifier", progress=progress)
    model.encoder.requires_grad_(False)
    model.ramps[-1].requires_grad_(False)
    for ramp in model.ramps[:-1]:
        ramp.requires_grad_(True)
    stage2 = adamw(_Named(torch.nn.Module(), model.ramps[:-1]), cfg.ramp_lr, cfg.ramp_lr)
    ramp_losses = train_steps(model, batches, cfg.ramp_steps, stage2, _stage2_loss,
                              desc=f"{cfg.task}: exit ramps", progress=progress)
    train_s = time.perf_counter() - start
    model.requires_grad_(False)
    model.eval()
    with progress_bar(total=1, desc=f"{cfg.task}: ramps on the dev set", enabled=progress) as bar:
        record = record_ramps(model, dev, spec.max_length)
        bar.update(1)
    return model, record, {"train_seconds": train_s, "losses": losses, "ramp_losses": ramp_losses,
                           "config": asdict(cfg)}
