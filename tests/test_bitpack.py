import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from workbench import bitpack


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 63, 64, 1001])
def test_pack_round_trip_and_size(bits, count):
    idx = np.random.default_rng(bits * 1000 + count).integers(0, 1 << bits, count)
    packed = bitpack.pack_bits(idx, bits)
    assert packed.size == (count * bits + 7) // 8
    np.testing.assert_array_equal(packed, bitpack.pack_bits_reference(idx, bits))
    np.testing.assert_array_equal(bitpack.unpack_bits(packed, count, bits), idx)


def test_three_bit_indexes_cross_byte_boundaries():
    packed = bitpack.pack_bits(np.array([0b101, 0b011, 0b110]), 3)
    # LSB first, 5 | 3 | 6 -> stream bits 1,0,1, 1,1,0, 0,1 | 1: the third index spans both bytes
    assert packed.tolist() == [0b10011101, 0b1]


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(1, 8), count=st.integers(0, 300), threads=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_cython_decompress_equals_reference_bit_for_bit(bits, count, threads, seed):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, 1 << bits, count)
    packed = bitpack.pack_bits(idx, bits, num_threads=threads)
    centroids = rng.standard_normal(1 << bits).astype(np.float32)
    pos = rng.choice(count, size=min(count, rng.integers(0, 5)), replace=False) if count else np.array([], int)
    val = rng.standard_normal(pos.size).astype(np.float32) * 10
    out = np.full(count, np.nan, np.float32)
    bitpack.decompress(packed, bits, centroids, pos, val, out, num_threads=threads)
    ref = bitpack.decompress_reference(packed, bits, centroids, pos, val, count)
    assert out.tobytes() == ref.tobytes()


@pytest.mark.parametrize("call, message", [
    (lambda: bitpack.pack_bits(np.array([4]), 2), "0..3"),
    (lambda: bitpack.pack_bits(np.array([1]), 9), "bits must be an integer in 1..8"),
    (lambda: bitpack.unpack_bits(np.zeros(1, np.uint8), 3, 4), "need 2 packed bytes"),
    (lambda: bitpack.decompress(np.zeros(1, np.uint8), 2, np.zeros(3), [], [], np.zeros(4, np.float32)),
     "needs 4 centroids"),
    (lambda: bitpack.decompress(np.zeros(1, np.uint8), 2, np.zeros(4), [], [], np.zeros(4)), "float32"),
    (lambda: bitpack.decompress(np.zeros(1, np.uint8), 2, np.zeros(4), [9], [1.0], np.zeros(4, np.float32)),
     "outlier positions"),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("threads", [1, 2])
def test_decompress_over_many_chunks_equals_reference(bits, threads):
    """Large enough for several 2048-block chunks, with a partial last chunk and a tail."""
    count = 3 * 2048 * 8 + 1005
    rng = np.random.default_rng(bits)
    packed = bitpack.pack_bits(rng.integers(0, 1 << bits, count), bits)
    padded = np.concatenate([packed, rng.integers(0, 256, 11).astype(np.uint8)])   # trailing bytes must not leak in
    centroids = rng.standard_normal(1 << bits).astype(np.float32)
    pos = np.sort(rng.choice(count, 50, replace=False))
    val = rng.standard_normal(50).astype(np.float32)
    ref = bitpack.decompress_reference(packed, bits, centroids, pos, val, count)
    for stream in (packed, padded):
        out = np.empty(count, np.float32)
        bitpack.decompress(stream, bits, centroids, pos, val, out, num_threads=threads)
        assert out.tobytes() == ref.tobytes()
