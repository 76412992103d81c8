import numpy as np
import pytest
import torch

from workbench.elastic.shardblob import blob_nbytes
from workbench.elastic.store import ShardStore, ShardStoreError, build_store
from workbench.models.encoder import Encoder, EncoderConfig

CFG = EncoderConfig(vocab_size=50, hidden=32, num_layers=2, num_heads=4, ffn=64, max_positions=16)


@pytest.fixture
def model():
    torch.manual_seed(0)
    return Encoder(CFG, 2).eval()


def test_fp32_shards_rebuild_the_model_exactly(model, tmp_path):
    store = build_store(model, tmp_path / "s", progress=False)
    rebuilt = store.model_with_bits(np.full((2, 4), 32))
    ids, mask = torch.randint(0, 50, (2, 7)), torch.ones(2, 7, dtype=torch.long)
    with torch.no_grad():
        assert torch.equal(rebuilt(ids, mask), model(ids, mask))
        assert torch.equal(rebuilt(ids, mask, shards=[[3, 1]] * 2), model(ids, mask, shards=[[3, 1]] * 2))


def test_k_bit_shards_are_about_k_over_32_of_fp32(model, tmp_path):
    store = build_store(model, tmp_path / "s", progress=False)
    params = store.shard_params
    for bits in (2, 3, 4, 5, 6):
        nbytes = store.shard_nbytes(bits)
        assert nbytes == blob_nbytes(params, bits, store.entry(0, 0, bits).outliers)
        assert blob_nbytes(params, bits) <= nbytes <= blob_nbytes(params, bits, outliers=params // 50)
    assert store.shard_nbytes(32) == 4 * params


def test_damaged_shard_is_named_and_nothing_else_changes(model, tmp_path):
    store = build_store(model, tmp_path / "s", progress=False)
    e = store.entry(1, 2, 4)
    path = store.layer_path(1)
    data = bytearray(path.read_bytes())
    data[e.offset + 3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ShardStoreError, match="layer-01.bin: shard 2 of layer 1 at 4 bits fails its CRC32"):
        ShardStore.open(tmp_path / "s")
    unchecked = ShardStore.open(tmp_path / "s", verify=False)
    assert torch.equal(unchecked.shard_weights(0, 2, 4)["q"], store.shard_weights(0, 2, 4)["q"])
    path.write_bytes(bytes(data[: e.offset + 10]))
    with pytest.raises(ShardStoreError, match="layer-01.bin: shard 2 of layer 1 at 4 bits is truncated"):
        ShardStore.open(tmp_path / "s")
    path.unlink()
    with pytest.raises(ShardStoreError, match="layer-01.bin is missing"):
        ShardStore.open(tmp_path / "s")


def test_interrupted_write_leaves_the_previous_store_readable(model, tmp_path, monkeypatch):
    first = build_store(model, tmp_path / "s", progress=False)
    import workbench.elastic.store as store_mod

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(store_mod, "outlier_mask", crash)
    with pytest.raises(KeyboardInterrupt):
        build_store(model, tmp_path / "s", progress=False)
    again = ShardStore.open(tmp_path / "s")
    assert again.version == first.version


def test_unknown_bitwidth_and_shard_are_named(model, tmp_path):
    store = build_store(model, tmp_path / "s", bitwidths=(2, 4), progress=False)
    with pytest.raises(ValueError, match=r"holds bitwidths \[2, 4, 32\], not 3"):
        store.read_blob(0, 0, 3)
    with pytest.raises(ValueError, match="no shard 4 of layer 0"):
        store.read_blob(0, 4, 2)
