"""Training batches of similar token lengths, so little compute goes to padding."""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from workbench.data import Split
from workbench.models.tokenizer import encoder_tokenizer

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]      # ids (B, T), mask (B, T), labels (B,)


def length_bucketed_batches(split: Split, batch_size: int, rng: np.random.Generator, max_length: int,
                            bucket_batches: int = 50) -> Iterator[Batch]:
    """Endless shuffled batches whose examples have similar lengths.

    Each epoch is shuffled and cut into pools of ``bucket_batches`` batches; a pool is
    sorted by token length and cut into batches, and the epoch's batches are shuffled
    again, so the order stays random while padding stays small. Deterministic for a
    given ``rng`` state.
    """
    if batch_size < 1 or batch_size > len(split):
        raise ValueError(f"batch size must lie in 1..{len(split)} (the split's size), got {batch_size}")
    tok = encoder_tokenizer(max_length)
    lengths = np.array(tok.lengths(split.texts))
    pool = bucket_batches * batch_size
    while True:
        order = rng.permutation(len(split))
        batches = []
        for s in range(0, len(order), pool):
            chunk = order[s:s + pool]
            chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
            batches += [chunk[b:b + batch_size] for b in range(0, len(chunk) - batch_size + 1, batch_size)]
        for i in rng.permutation(len(batches)):
            idx = batches[i]
            ids, mask = tok([split.texts[j] for j in idx])
            yield ids, mask, torch.from_numpy(split.labels[idx])


def by_length(split: Split, batch_size: int, max_length: int) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
    """The whole split once, in batches of similar lengths: (row indexes, ids, mask). For evaluation."""
    tok = encoder_tokenizer(max_length)
    order = sorted(range(len(split)), key=lambda j: (len(split.texts[j]), j))
    for s in range(0, len(split), batch_size):
        rows = np.array(order[s:s + batch_size])
        ids, mask = tok([split.texts[j] for j in rows])
        yield rows, ids, mask
