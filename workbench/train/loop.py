"""The fine-tuning loop every mechanism trains with: AdamW, linear warm-up then linear decay."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from workbench.progress import progress_bar


def warmup_linear(step: int, total: int, warmup: int) -> float:
    """Learning-rate factor at ``step``: linear warm-up over ``warmup`` steps, then linear decay to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def adamw(model: torch.nn.Module, lr: float, head_lr: float | None = None,
          weight_decay: float = 0.01) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters; parameters named ``head.*`` (a fresh classifier) get ``head_lr``."""
    body = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("head.")]
    head = [p for n, p in model.named_parameters() if p.requires_grad and n.startswith("head.")]
    groups = [{"params": body, "lr": lr, "base_lr": lr}]
    if head:
        groups.append({"params": head, "lr": head_lr or lr, "base_lr": head_lr or lr})
    return torch.optim.AdamW(groups, weight_decay=weight_decay)


def train_steps(model: torch.nn.Module, batches: Iterator, steps: int, optimizer: torch.optim.Optimizer,
                step_loss: Callable[[torch.nn.Module, tuple], torch.Tensor], desc: str = "training",
                progress: bool = True, warmup_fraction: float = 0.1, *, resume=None, phase: str = "") -> list[float]:
    """Run ``steps`` optimizer steps; returns the loss of each.

    ``step_loss(model, batch)`` computes the step's loss and calls ``backward`` on
    whatever it trains (one loss, or several as the sandwich rule does); its returned
    value is what the progress bar and the returned list show. With ``resume`` (a
    :class:`~workbench.train.resume.TrainingProgress`), this is its ``phase``: it starts
    where a saved run of it stopped (or not at all when a later phase was saved) and saves
    as it goes.
    """
    warmup = max(1, int(steps * warmup_fraction))
    first = 0 if resume is None else resume.start(phase, optimizer)
    losses: list[float] = [] if resume is None else resume.losses.setdefault(phase, [])
    if first is None or first >= steps:
        model.eval()
        return list(losses)
    del losses[first:]
    model.train()
    with progress_bar(total=steps, desc=desc, enabled=progress) as bar:
        if first:
            bar.update(first, loss="resumed")
        for step in range(first, steps):
            factor = warmup_linear(step, steps, warmup)
            for group in optimizer.param_groups:
                group["lr"] = group["base_lr"] * factor
            optimizer.zero_grad(set_to_none=True)
            loss = step_loss(model, next(batches))
            optimizer.step()
            losses.append(float(loss.detach()))
            bar.update(1, loss=f"{losses[-1]:.3f}")
            if resume is not None and resume.due(step + 1, steps):
                resume.save(phase, step + 1, optimizer)
    model.eval()
    return list(losses)


@dataclass(frozen=True)
class TrainingData:
    """A training run's task, its (possibly capped) train and dev splits and its random generator."""
    spec: object            # workbench.data.TaskSpec
    train: object           # workbench.data.Split
    dev: object
    rng: np.random.Generator


def start_training(cfg) -> TrainingData:
    """Threads and seeds from ``cfg`` (``task``, ``seed``, ``threads``, ``max_train``, ``max_dev``), and its data."""
    from workbench.data import load_task, task_spec

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    data = load_task(cfg.task)
    return TrainingData(task_spec(cfg.task), data.train.subset(cfg.max_train) if cfg.max_train else data.train,
                        data.dev.subset(cfg.max_dev) if cfg.max_dev else data.dev, np.random.default_rng(cfg.seed))
