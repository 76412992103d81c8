import numpy as np
import pytest
import torch

from workbench.bitpack import pack_bits
from workbench.elastic.quantize import QuantizedTensor, gobo_quantize
from workbench.elastic.shardblob import (FP32, ShardBlob, blob_nbytes, decode_blob, encode_fp32, flatten_shard,
                                         parse_blob, quantized_blob)
from workbench.elastic.store import build_store
from workbench.models.encoder import SHARD_KEYS, Encoder, EncoderConfig


def _tiny():
    indexes = np.array([0, 7, 3, 3, 0, 5, 1, 2, 6, 4], np.uint8)
    centroids = np.linspace(-1, 1, 8).astype(np.float32)
    return QuantizedTensor((10,), 3, centroids, indexes, np.array([1, 8], np.int64), np.array([9.5, -7.25], np.float32))


def test_blob_bytes_are_the_store_format_byte_for_byte():
    """FORMAT 1: packed indexes | 2^k float32 centroids | int32 positions | float32 values."""
    q = _tiny()
    expected = (pack_bits(q.indexes, 3).tobytes() + q.centroids.tobytes()
                + np.array([1, 8], "<i4").tobytes() + np.array([9.5, -7.25], "<f4").tobytes())
    blob = quantized_blob(q).to_bytes()
    assert blob == expected and len(blob) == blob_nbytes(10, 3, outliers=2) == 4 + 32 + 8 + 8


def test_parse_gives_views_of_the_blob_and_decodes_like_dequantize():
    q = gobo_quantize(np.random.default_rng(0).standard_t(3, 5000).astype(np.float32), 5)
    blob = quantized_blob(q).to_bytes()
    parts = parse_blob(blob, 5000, 5)
    assert parts.outlier_pos.size == q.outlier_pos.size > 0
    assert parts.outlier_pos.tolist() == q.outlier_pos.tolist()
    assert np.shares_memory(parts.packed, np.frombuffer(blob, np.uint8))
    assert parts.decode().tobytes() == q.dequantize().tobytes()
    out = np.empty(5000, np.float32)
    assert decode_blob(blob, 5000, 5, out=out, num_threads=1) is out
    assert out.tobytes() == q.dequantize().tobytes()


def test_sizes_that_do_not_fit_the_layout_are_named():
    blob = quantized_blob(_tiny()).to_bytes()
    with pytest.raises(ValueError, match="a 3-bit blob of 10 weights has 36 \\+ 8 \\* outliers bytes, not 51"):
        parse_blob(blob[:-1], 10, 3)
    with pytest.raises(ValueError, match="not 28"):
        parse_blob(blob[:28], 10, 3)
    with pytest.raises(ValueError, match="has no parts"):
        parse_blob(blob, 10, FP32)
    with pytest.raises(ValueError, match="a 32-bit blob of 10 weights has 40 bytes, not 36"):
        decode_blob(b"\0" * 36, 10, FP32)


def test_fp32_blob_is_the_raw_weights():
    w = np.random.default_rng(1).standard_normal(12).astype(np.float32)
    blob = encode_fp32(w.astype(np.float64))
    assert len(blob) == blob_nbytes(12, FP32) and decode_blob(blob, 12, FP32).tobytes() == w.tobytes()
    out = np.zeros(12, np.float32)
    assert decode_blob(blob, 12, FP32, out=out) is out and out.tobytes() == w.tobytes()


def test_flatten_shard_concatenates_the_shard_keys_in_order():
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=50, hidden=32, num_layers=1, num_heads=4, ffn=64, max_positions=16)
    shard = Encoder(cfg, 2).layers[0].shard(1)
    flat = flatten_shard(shard)
    assert flat.dtype == np.float32 and flat.size == sum(shard[k].numel() for k in SHARD_KEYS)
    start = 0
    for key in SHARD_KEYS:
        size = shard[key].numel()
        assert flat[start:start + size].tolist() == shard[key].detach().reshape(-1).tolist()
        start += size


def test_store_blobs_parse_with_the_manifest_outlier_counts(tmp_path):
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=50, hidden=32, num_layers=1, num_heads=4, ffn=64, max_positions=16)
    store = build_store(Encoder(cfg, 2).eval(), tmp_path / "s", bitwidths=(2, 6), progress=False)
    for bits in (2, 6):
        for shard in range(4):
            blob = store.read_blob(0, shard, bits)
            parts = parse_blob(blob, store.shard_params, bits)
            assert isinstance(parts, ShardBlob) and parts.outlier_pos.size == store.entry(0, shard, bits).outliers
            assert parts.to_bytes() == blob
            assert parts.decode().tobytes() == store.decode(blob, bits).tobytes()
