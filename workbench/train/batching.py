"""Training batches of similar token lengths, so little compute goes to padding."""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from workbench.data import Split
from workbench.models.tokenizer import encoder_tokenizer

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]      # ids (B, T), mask (B, T), labels (B,)


class BucketedBatches:
    """Endless shuffled batches whose examples have similar lengths.

    Each epoch is shuffled and cut into pools of ``bucket_batches`` batches; a pool is
    sorted by token length and cut into batches, and the epoch's batches are shuffled
    again, so the order stays random while padding stays small. Deterministic for a
    given ``rng`` state; :meth:`state` and :meth:`restore` carry where it is in its epoch,
    so a stopped training run resumes on the same batches.
    """

    def __init__(self, split: Split, batch_size: int, rng: np.random.Generator, max_length: int,
                 bucket_batches: int = 50):
        if batch_size < 1 or batch_size > len(split):
            raise ValueError(f"batch size must lie in 1..{len(split)} (the split's size), got {batch_size}")
        self.split, self.batch_size, self.rng, self.pool = split, batch_size, rng, bucket_batches * batch_size
        self.tok = encoder_tokenizer(max_length)
        self.lengths = np.array(self.tok.lengths(split.texts))
        self.epoch: list[np.ndarray] = []          # this epoch's batches (row indexes), in the order served
        self.served = 0

    def _new_epoch(self) -> None:
        order = self.rng.permutation(len(self.split))
        batches = []
        for s in range(0, len(order), self.pool):
            chunk = order[s:s + self.pool]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches += [chunk[b:b + self.batch_size] for b in range(0, len(chunk) - self.batch_size + 1,
                                                                    self.batch_size)]
        self.epoch = [batches[i] for i in self.rng.permutation(len(batches))]
        self.served = 0

    def __iter__(self) -> BucketedBatches:
        return self

    def __next__(self) -> Batch:
        if self.served == len(self.epoch):
            self._new_epoch()
        idx = self.epoch[self.served]
        self.served += 1
        ids, mask = self.tok([self.split.texts[j] for j in idx])
        return ids, mask, torch.from_numpy(self.split.labels[idx])

    def state(self) -> dict:
        """Where the iterator is: this epoch's batches and how many were served (the rng is saved apart)."""
        return {"epoch": [b.tolist() for b in self.epoch], "served": self.served}

    def restore(self, state: dict) -> None:
        self.epoch = [np.array(b, dtype=np.int64) for b in state["epoch"]]
        self.served = int(state["served"])


def length_bucketed_batches(split: Split, batch_size: int, rng: np.random.Generator, max_length: int,
                            bucket_batches: int = 50) -> BucketedBatches:
    """:class:`BucketedBatches` over ``split``."""
    return BucketedBatches(split, batch_size, rng, max_length, bucket_batches)


def by_length(split: Split, batch_size: int, max_length: int) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
    """The whole split once, in batches of similar lengths: (row indexes, ids, mask). For evaluation."""
    tok = encoder_tokenizer(max_length)
    order = sorted(range(len(split)), key=lambda j: (len(split.texts[j]), j))
    for s in range(0, len(split), batch_size):
        rows = np.array(order[s:s + batch_size])
        ids, mask = tok([split.texts[j] for j in rows])
        yield rows, ids, mask
