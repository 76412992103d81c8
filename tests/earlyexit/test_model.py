"""The early-exit model: exits where the entropy rule says, the same through any cut into splits."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from workbench.earlyexit.model import EarlyExitModel, entropy, untrained_model
from workbench.earlyexit.record import exits_from_entropies
from workbench.errors import WorkbenchError


@pytest.fixture(scope="module")
def model():
    m = untrained_model(num_classes=2, seed=3)
    # spread the ramps' confidence so that rows leave at several layers under one threshold
    torch.manual_seed(5)
    for ramp in m.ramps:
        ramp.classifier.weight.data.mul_(40.0)
    return m


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 8000, (12, 24), generator=g)
    mask = torch.ones(12, 24, dtype=torch.long)
    mask[2, 10:] = 0
    mask[7, 5:] = 0
    ids[mask == 0] = 0
    return ids, mask


def _expected_exits(model: EarlyExitModel, ids, mask, threshold, disabled=()):
    """Row by row, layer by layer, without the batch machinery: the first enabled ramp under the threshold."""
    out = []
    for i in range(ids.shape[0]):
        x = model.encoder.embed(ids[i:i + 1])
        bias = model.encoder.attn_bias(mask[i:i + 1])
        for k, layer in enumerate(model.encoder.layers):
            x = layer(x, bias)
            logits = model.ramps[k](x, mask[i:i + 1])
            last = k == model.num_layers - 1
            p = torch.softmax(logits[0].double(), -1)
            h = float(-(p * p.log()).sum())
            if last or (k not in disabled and h < threshold):
                out.append((k, int(logits.argmax())))
                break
    return out


def _threshold_with_spread(model, ids, mask):
    ent, _ = model.ramp_entropies(ids, mask)
    return float(np.median(ent[:-1]))


def test_rows_leave_at_the_first_enabled_ramp_under_the_threshold(model, batch):
    ids, mask = batch
    t = _threshold_with_spread(model, ids, mask)
    model.configure(threshold=t, disabled=())
    out = model(ids, mask)
    expected = _expected_exits(model, ids, mask, t)
    assert [(int(e), int(label)) for e, label in zip(out.exit_layers, out.labels)] == expected
    assert len(set(out.exit_layers.tolist())) >= 3


def test_disabled_ramps_let_nobody_leave_there(model, batch):
    ids, mask = batch
    t = _threshold_with_spread(model, ids, mask)
    before = model.configure(threshold=t, disabled=()).forward(ids, mask).exit_layers
    off = sorted(set(before.tolist()) - {model.num_layers - 1})[:2]
    after = model.configure(disabled=off).forward(ids, mask)
    assert not set(after.exit_layers.tolist()) & set(off)
    assert [(int(e), int(y)) for e, y in zip(after.exit_layers, after.labels)] == \
        _expected_exits(model, ids, mask, t, disabled=off)
    model.configure(disabled=())


@settings(max_examples=8, deadline=None)
@given(cuts=st.sets(st.integers(1, 5), max_size=5))
def test_any_cut_into_splits_gives_the_same_exits_labels_and_logits(model, batch, cuts):
    ids, mask = batch
    model.configure(threshold=_threshold_with_spread(model, ids, mask), disabled=())
    bounds = [0, *sorted(cuts), model.num_layers]
    splits = list(zip(bounds[:-1], bounds[1:]))
    whole, cut = model(ids, mask), model(ids, mask, splits=splits)
    assert np.array_equal(whole.exit_layers, cut.exit_layers)
    assert np.array_equal(whole.labels, cut.labels)
    assert torch.equal(whole.logits, cut.logits)


def test_threshold_zero_is_the_stock_model(model, batch):
    ids, mask = batch
    out = model.configure(threshold=0.0).forward(ids, mask)
    assert set(out.exit_layers.tolist()) == {model.num_layers - 1}
    x = model.encoder.embed(ids)
    for layer in model.encoder.layers:
        x = layer(x, model.encoder.attn_bias(mask))
    assert torch.allclose(out.logits, model.ramps[-1](x, mask), atol=1e-6)


def test_a_split_reports_the_shrinking_batch(model, batch):
    ids, mask = batch
    model.configure(threshold=_threshold_with_spread(model, ids, mask), disabled=())
    res = model.run_split(model.embed(ids, mask), mask, 0, 3)
    exits = model(ids, mask).exit_layers
    assert res.layer_rows == tuple(int((exits >= k).sum()) for k in range(3))
    assert sorted(res.exited.tolist() + res.survivors.tolist()) == list(range(12))
    assert res.hidden.shape[0] == len(res.survivors) == int((exits >= 3).sum())


def test_exits_from_entropies_takes_the_first_ramp_below():
    ent = np.array([[0.5, 0.1, 0.9], [0.2, 0.9, 0.9], [0.9, 0.9, 0.9]])
    assert exits_from_entropies(ent, 0.3).tolist() == [1, 0, 2]
    assert exits_from_entropies(ent, 0.3, disabled=[0]).tolist() == [1, 2, 2]
    assert entropy(torch.zeros(1, 4)).item() == pytest.approx(math.log(4))


@pytest.mark.parametrize("threshold, said", [(-0.1, "must be at least 0 nats, got -0.1"),
                                              (float("nan"), "expected a finite number of nats, got nan"),
                                              (float("inf"), "expected a finite number of nats, got inf"),
                                              (11, "must be at most 10 nats"), ("0.5", "expected a number of nats")])
def test_a_bad_threshold_is_refused(model, threshold, said):
    with pytest.raises(WorkbenchError, match=r"the exit threshold \(an entropy; 0: nobody exits early\): " + said):
        model.configure(threshold=threshold)


def test_the_last_ramp_cannot_be_disabled(model):
    with pytest.raises(WorkbenchError, match="ramps 0..4 can"):
        model.configure(disabled=[5])


def test_a_split_outside_the_model_is_refused(model, batch):
    ids, mask = batch
    with pytest.raises(WorkbenchError, match="0 <= start < end <= 6"):
        model.run_split(model.embed(ids, mask), mask, 4, 7)
