import numpy as np
import pytest
import torch

from workbench.devices import PRESETS
from workbench.elastic.costmodel import CostModel, device_cost_model, measure_cost_model
from workbench.elastic.store import build_store
from workbench.errors import WorkbenchError
from workbench.models.encoder import Encoder, EncoderConfig

CFG = EncoderConfig(vocab_size=50, hidden=32, num_layers=2, num_heads=4, ffn=64, max_positions=16)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    torch.manual_seed(0)
    return build_store(Encoder(CFG, 2).eval(), tmp_path_factory.mktemp("s") / "store", progress=False)


def test_measured_profile_round_trips(store, tmp_path):
    prof = measure_cost_model(store, seq_len=16, repeats=2)
    assert prof.bitwidths == (2, 3, 4, 5, 6, 32) and len(prof.comp_s) == 4
    assert all(v > 0 for v in prof.io_s.values()) and all(v > 0 for v in prof.comp_s)
    assert prof.shard_bytes[32] == 4 * store.shard_params
    again = CostModel.load(prof.save(tmp_path / "p.json"))
    assert again == prof


def test_preset_profile_uses_real_shard_sizes(store):
    prof = device_cost_model("odroid-n2", store, 16)
    dev = PRESETS["odroid-n2"]
    for bits in prof.bitwidths:
        assert prof.t_io(bits) == pytest.approx(prof.shard_bytes[bits] / dev.read_bytes_per_s)
    assert np.all(np.diff(prof.comp_s) > 0) and prof.source == "emulated"
    with pytest.raises(WorkbenchError, match="unknown device profile 'pixel'"):
        device_cost_model("pixel", store, 16)


def test_profile_validation_names_the_problem():
    with pytest.raises(ValueError, match="profile times must be positive"):
        CostModel("x", 8, 1, 2, {2: 0.0}, [1.0, 1.0], {2: 1})
    with pytest.raises(ValueError, match="one time per width 1..2"):
        CostModel("x", 8, 1, 2, {2: 1.0}, [1.0], {2: 1})
    prof = CostModel("x", 8, 1, 2, {2: 1.0}, [1.0, 1.0], {2: 1})
    with pytest.raises(WorkbenchError, match="profile 'x' has no 4-bit shards; it has 2"):
        prof.t_io(4)
