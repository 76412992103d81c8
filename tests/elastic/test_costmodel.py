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
    assert again == prof and again.store_version == store.version and again.repeats == 2


def test_preset_profile_uses_real_shard_sizes(store):
    prof = device_cost_model("odroid-n2", store, 16)
    dev = PRESETS["odroid-n2"]
    for bits in prof.bitwidths:
        assert prof.t_io(bits) == pytest.approx(prof.shard_bytes[bits] / dev.read_bytes_per_s)
    assert np.all(np.diff(prof.comp_s) > 0) and prof.source == "emulated"
    assert prof.title == dev.title and prof.notes == dev.source and prof.store_version == store.version
    with pytest.raises(WorkbenchError, match="unknown device profile 'pixel'"):
        device_cost_model("pixel", store, 16)


def tiny(io_s=None, comp_s=(1.0, 1.0)) -> CostModel:
    return CostModel(device="x", seq_len=8, num_layers=1, num_shards=2, io_s=io_s or {2: 1.0}, comp_s=comp_s,
                     shard_bytes={2: 1})


def test_profile_validation_names_the_problem():
    with pytest.raises(ValueError, match="profile times must be positive"):
        tiny(io_s={2: 0.0})
    with pytest.raises(ValueError, match="one time per width 1..2"):
        tiny(comp_s=[1.0])
    prof = tiny()
    with pytest.raises(WorkbenchError, match="profile 'x' has no 4-bit shards; it has 2"):
        prof.t_io(4)


def test_format_1_profiles_still_load(tmp_path):
    raw = {**tiny().to_dict(), "format": 1, "extra": {"store": "v-1", "repeats": 3}}
    for name in ("store_version", "repeats", "title"):
        del raw[name]
    old = CostModel.from_dict(raw)
    assert (old.store_version, old.repeats, old.title) == ("v-1", 3, "") and old.io_s == {2: 1.0}
    with pytest.raises(WorkbenchError, match="unknown format"):
        CostModel.from_dict({**raw, "format": 99})
    assert tiny().replace_bits({2}) == tiny() and tiny().replace_bits(()).bitwidths == ()
