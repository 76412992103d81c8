"""Accuracy of a classifier, of one depth x width submodel or of all of them at once."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from workbench.data import Split
from workbench.models.encoder import Encoder
from workbench.train.batching import by_length


@torch.no_grad()
def evaluate(model: Encoder, split: Split, max_length: int, depth: int | None = None, width: int | None = None,
             batch_size: int = 64) -> float:
    """Accuracy of the ``depth`` x ``width`` submodel (default: the whole model) on ``split``."""
    model.eval()
    correct = 0
    for rows, ids, mask in by_length(split, batch_size, max_length):
        logits = model(ids, mask, depth=depth, width=width)
        correct += int((logits.argmax(-1).numpy() == split.labels[rows]).sum())
    return correct / len(split)


@torch.no_grad()
def accuracy_grid(model: Encoder, split: Split, max_length: int, batch_size: int = 64,
                  progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """Accuracy of every depth n x width m submodel, shape (layers, widths); one pass of all layers per width."""
    cfg = model.cfg
    correct = np.zeros((cfg.num_layers, cfg.num_heads))
    model.eval()
    for m in range(1, cfg.num_heads + 1):
        for rows, ids, mask in by_length(split, batch_size, max_length):
            y = split.labels[rows]
            x, bias = model.embed(ids), model.attn_bias(mask)
            for n, layer in enumerate(model.layers):
                x = layer(x, bias, range(m))
                correct[n, m - 1] += int((model.classify(x, mask).argmax(-1).numpy() == y).sum())
        if progress:
            progress(m, cfg.num_heads)
    return correct / len(split)
