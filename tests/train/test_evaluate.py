import numpy as np
import pytest
import torch

from workbench.data import load_task
from workbench.models.tokenizer import encoder_tokenizer
from workbench.train.evaluate import accuracy_grid, evaluate


def test_grid_and_single_evaluation_agree_with_a_direct_forward_pass(prepared):
    model = prepared["sentiment"].encoder
    dev = load_task("sentiment").dev.subset(40)
    grid = accuracy_grid(model, dev, 64, batch_size=16)
    ids, mask = encoder_tokenizer(64)(dev.texts)
    with torch.no_grad():
        for n, m in [(6, 12), (1, 1), (3, 7)]:
            direct = (model(ids, mask, depth=n, width=m).argmax(-1).numpy() == dev.labels).mean()
            assert grid[n - 1, m - 1] == pytest.approx(direct)
            assert evaluate(model, dev, 64, depth=n, width=m, batch_size=16) == pytest.approx(direct)
    assert grid.shape == (6, 12) and np.all((grid >= 0) & (grid <= 1))
