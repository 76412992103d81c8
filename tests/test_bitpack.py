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


def _case(bits, count, seed, outliers=40, ascending=True):
    rng = np.random.default_rng(seed)
    packed = bitpack.pack_bits(rng.integers(0, 1 << bits, count), bits)
    centroids = rng.standard_normal(1 << bits).astype(np.float32)
    pos = rng.choice(count, size=min(count, outliers), replace=False)
    pos = np.sort(pos) if ascending else pos
    val = (rng.standard_normal(pos.size) * 10).astype(np.float32)
    return packed, centroids, pos, val


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("simd", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_every_kernel_path_equals_reference_at_every_length(bits, simd, threads):
    """Vector groups of 32, blocks the vector kernels leave to scalar code near the stream's
    end (no slack after it), partial blocks, 4096-float scatter slices and 2048-block chunks."""
    for count in (1, 8, 31, 32, 33, 64 * 8 + 3, 4095, 4096, 4097, 2 * 2048 * 8 + 77):
        packed, centroids, pos, val = _case(bits, count, seed=count)
        ref = bitpack.decompress_reference(packed, bits, centroids, pos, val, count)
        out = np.full(count, np.nan, np.float32)
        bitpack.decompress(packed, bits, centroids, pos, val, out, num_threads=threads, simd=simd)
        assert out.tobytes() == ref.tobytes(), (count, simd, threads)


def test_simd_flag_names_what_runs():
    assert bitpack.SIMD in (True, False)
    packed, centroids, pos, val = _case(4, 1000, seed=1)
    a, b = np.empty(1000, np.float32), np.empty(1000, np.float32)
    bitpack.decompress(packed, 4, centroids, pos, val, a, simd=True)
    bitpack.decompress(packed, 4, centroids, pos, val, b, simd=False)
    assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("ascending", [True, False])
def test_outliers_at_slice_edges_and_in_the_tail_land_in_any_order(ascending):
    count = 3 * 4096 + 5
    packed, centroids, _, _ = _case(3, count, seed=7)
    pos = np.array([0, 4095, 4096, 8191, 8192, count - 5, count - 1])
    pos = pos if ascending else pos[::-1].copy()
    val = np.arange(1, pos.size + 1, dtype=np.float32) * 100
    ref = bitpack.decompress_reference(packed, 3, centroids, pos, val, count)
    for dtype in (np.int32, np.int64):
        out = np.empty(count, np.float32)
        bitpack.decompress(packed, 3, centroids, pos.astype(dtype), val, out, num_threads=1)
        assert out.tobytes() == ref.tobytes()
        assert out[pos].tolist() == val.tolist()


@pytest.mark.parametrize("positions, bad", [([5, 17, 900, 1000], 1000), ([-1, 5, 17, 900], -1),
                                             ([5, 1000, 900, 17], 1000), ([5, -1, 900, 17], -1)])
def test_outlier_out_of_range_is_named_and_nothing_is_written(positions, bad):
    packed, centroids, _, _ = _case(4, 1000, seed=3)
    out = np.full(1000, 7.0, np.float32)
    with pytest.raises(ValueError, match=f"outlier positions must lie in 0..999, got {bad}"):
        bitpack.decompress(packed, 4, centroids, np.array(positions), np.ones(4, np.float32), out)
    assert (out == 7.0).all()


def test_automatic_threads_decode_a_large_output_exactly():
    count = bitpack.PARALLEL_MIN_COUNT + 1001
    packed, centroids, pos, val = _case(5, count, seed=5, outliers=300)
    out = np.empty(count, np.float32)
    bitpack.decompress(packed, 5, centroids, pos, val, out)
    assert out.tobytes() == bitpack.decompress_reference(packed, 5, centroids, pos, val, count).tobytes()


def test_thread_choice_one_below_the_threshold_else_idle_cpus(monkeypatch):
    monkeypatch.setattr(bitpack, "default_threads", lambda: 4)
    big = bitpack.PARALLEL_MIN_COUNT
    assert bitpack.choose_threads(big - 1, busy=0) == 1
    assert bitpack.choose_threads(big, busy=0) == 4
    assert bitpack.choose_threads(big, max_threads=2, busy=0) == 2
    assert bitpack.choose_threads(big, busy=1) == 3
    assert bitpack.choose_threads(big, busy=2.5) == 1
    assert bitpack.choose_threads(big, busy=9) == 1
    monkeypatch.setattr(bitpack, "busy_cpus", lambda: 3)
    assert bitpack.choose_threads(big) == 1


def test_busy_cpus_leaves_out_the_caller_and_its_own_spinning_workers(monkeypatch):
    monkeypatch.setitem(bitpack._threads_state, "loadavg", -1)
    monkeypatch.setattr(bitpack.os, "pread", lambda fd, n, offset: b"0.50 0.40 0.30 4/311 9876\n")
    monkeypatch.setitem(bitpack._threads_state, "ended", 0.0)
    assert bitpack.busy_cpus() == 3                                   # 4 runnable, one of them the caller
    monkeypatch.setitem(bitpack._threads_state, "threads", 2)
    monkeypatch.setitem(bitpack._threads_state, "ended", bitpack.time.monotonic())
    assert bitpack.busy_cpus() == 2                                   # ... and one our idle worker, spinning

    def unreadable(fd, n, offset):
        raise OSError("no /proc")

    monkeypatch.setattr(bitpack.os, "pread", unreadable)
    monkeypatch.setattr(bitpack.os, "getloadavg", lambda: (1.5, 1.0, 0.5))
    assert bitpack.busy_cpus() == 1.5


@pytest.mark.parametrize("threads", [1, 2])
def test_pack_and_unpack_agree_on_one_and_many_threads(threads):
    idx = np.random.default_rng(9).integers(0, 32, 10_003)
    packed = bitpack.pack_bits(idx, 5, num_threads=threads)
    assert packed.tobytes() == bitpack.pack_bits_reference(idx, 5).tobytes()
    assert bitpack.unpack_bits(packed, idx.size, 5, num_threads=threads).tolist() == idx.tolist()
