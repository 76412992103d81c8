"""What the early-exit model's training produces, without torch: the exit rule, the training settings per
preset, and the record of every ramp on every dev example (from which accuracy, mean exit layer and batch
profiles for any threshold and any disabled ramps follow). Pages and commands read these without loading
the model."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from workbench.data import task_spec
from workbench.errors import WorkbenchError
from workbench.presets import check_preset

FORMAT_VERSION = 2

DEFAULT_THRESHOLD = 0.4
"""Entropy (nats) below which a ramp's prediction is confident enough to exit (DeeBERT's setting)."""


def check_threshold(threshold) -> float:
    """``threshold`` as a float if it is an exit threshold (``limits.threshold``: an entropy in nats, 0 to 10;
    0: nobody exits early), else ``OutOfRangeError`` naming the range."""
    from workbench.earlyexit import limits

    return float(limits.threshold.check("the exit threshold (an entropy; 0: nobody exits early)", threshold))


def exits_from_entropies(entropies: np.ndarray, threshold: float,
                         disabled: Iterable[int] = ()) -> np.ndarray:
    """The exit layer of each row (entropies (L, n)) under ``threshold`` with ``disabled`` ramps off."""
    threshold = check_threshold(threshold)
    L = entropies.shape[0]
    can = entropies < threshold
    off = sorted({int(k) for k in disabled})
    if any(not 0 <= k < L - 1 for k in off):
        raise WorkbenchError(f"ramps {off} cannot all be disabled: ramps 0..{L - 2} can (ramp {L - 1} is the "
                             "classifier)")
    can[off] = False
    can[L - 1] = True
    return np.argmax(can, axis=0)


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
