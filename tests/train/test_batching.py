import numpy as np
import pytest

from workbench.data import load_task
from workbench.models.tokenizer import encoder_tokenizer
from workbench.train.batching import by_length, length_bucketed_batches


def test_bucketed_batches_cover_each_epoch_once_with_similar_lengths_and_are_deterministic():
    split = load_task("sentiment").dev.subset(64)
    tok = encoder_tokenizer(64)
    lengths = np.array(tok.lengths(split.texts))

    def epoch(seed):
        gen = length_bucketed_batches(split, 8, np.random.default_rng(seed), 64, bucket_batches=4)
        return [next(gen) for _ in range(8)]                   # 64 examples = one epoch of 8 batches

    a, b = epoch(0), epoch(0)
    for (ia, ma, ya), (ib, mb, yb) in zip(a, b):
        assert (ia == ib).all() and (ya == yb).all()
    rows = [tuple(ids[j, :int(mask[j].sum())].tolist()) for ids, mask, _ in a for j in range(len(ids))]
    assert sorted(rows) == sorted(tuple(r) for r in (tok([t])[0][0, :n].tolist()
                                                     for t, n in zip(split.texts, lengths)))
    spreads = [int(mask.sum(1).max() - mask.sum(1).min()) for _, mask, _ in a]
    assert np.mean(spreads) < np.ptp(lengths)                  # sorted pools: less padding than random batches


def test_batch_size_is_checked():
    split = load_task("sentiment").dev.subset(4)
    with pytest.raises(ValueError, match=r"batch size must lie in 1..4"):
        next(length_bucketed_batches(split, 5, np.random.default_rng(0), 64))


def test_by_length_visits_every_row_once_shortest_first():
    split = load_task("bbc").dev.subset(20)
    seen = []
    for rows, ids, mask in by_length(split, 6, 128):
        seen += rows.tolist()
        assert ids.shape[0] == len(rows)
    assert sorted(seen) == list(range(20))
    lengths = [len(split.texts[j]) for j in seen]
    assert lengths == sorted(lengths)
