import ctypes
import mmap
import os
import sys
import time
import types

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
@pytest.mark.parametrize("simd", bitpack.KERNELS)
@pytest.mark.parametrize("threads", [1, 2])
def test_every_kernel_path_equals_reference_at_every_length(bits, simd, threads):
    """Vector groups of 16 and 32, blocks the vector kernels leave to scalar code near the
    stream's end (no slack after it), partial blocks, 4096-float scatter slices and 2048-block chunks."""
    for count in (1, 8, 31, 32, 33, 64 * 8 + 3, 4095, 4096, 4097, 2 * 2048 * 8 + 77):
        packed, centroids, pos, val = _case(bits, count, seed=count)
        ref = bitpack.decompress_reference(packed, bits, centroids, pos, val, count)
        out = np.full(count, np.nan, np.float32)
        bitpack.decompress(packed, bits, centroids, pos, val, out, num_threads=threads, simd=simd)
        assert out.tobytes() == ref.tobytes(), (count, simd, threads)


def test_simd_flag_names_what_runs():
    assert bitpack.SIMD in (True, False)
    assert bitpack.KERNELS[0] == "portable" and (len(bitpack.KERNELS) > 1) == bitpack.SIMD
    packed, centroids, pos, val = _case(6, 1000, seed=1)
    outs = []
    for simd in (True, False, *bitpack.KERNELS):
        outs.append(np.empty(1000, np.float32))
        bitpack.decompress(packed, 6, centroids, pos, val, outs[-1], simd=simd)
    assert len({o.tobytes() for o in outs}) == 1
    with pytest.raises(ValueError, match="simd must be"):
        bitpack.decompress(packed, 6, centroids, pos, val, outs[0], simd="neon")


def _before_a_guard_page(data: np.ndarray) -> np.ndarray:
    """A copy of ``data`` that ends where an unreadable page begins: a read past its end faults."""
    page = mmap.PAGESIZE
    area = mmap.mmap(-1, 2 * page)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    if libc.mprotect(ctypes.c_void_p(base + page), page, 0) != 0:
        pytest.skip("mprotect is not available")
    view = np.frombuffer(area, np.uint8, count=data.size, offset=page - data.size)
    view[:] = data
    return view


@pytest.mark.skipif(sys.platform != "linux", reason="guard pages via mprotect")
@pytest.mark.parametrize("bits", [3, 4, 5, 6])
@pytest.mark.parametrize("simd", bitpack.KERNELS)
def test_kernels_read_nothing_past_the_stream_and_decode_every_tail(bits, simd):
    """Every count 0..200 (each tail of a 16- or 32-index vector step, partial blocks),
    decoded from a stream that ends at an unreadable page, equals the NumPy reference."""
    for count in range(201):
        packed, centroids, pos, val = _case(bits, count, seed=1000 * bits + count, outliers=3)
        guarded = _before_a_guard_page(packed)
        out = np.full(count, np.nan, np.float32)
        bitpack.decompress(guarded, bits, centroids, pos, val, out, num_threads=1, simd=simd)
        ref = bitpack.decompress_reference(packed, bits, centroids, pos, val, count)
        assert out.tobytes() == ref.tobytes(), count


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


class FakeMachine:
    """What bitpack's thread choice reads, faked: ``/proc`` files, the load average, the CPUs
    this process may use, the clock and the calling thread's CPU time."""

    def __init__(self, monkeypatch, cpus=2, allowed=None, loadavg="0.00 0.00 0.00 1/300 99", proc=True):
        self.loadavg, self.proc = loadavg.encode(), proc
        self.ticks = {cpu: [0] * 8 for cpu in range(cpus)}    # user nice system idle iowait irq softirq steal
        self.now, self.thread_s = 1000.0, 0.0
        self.fds = {}
        fake_os = types.ModuleType("os")
        fake_os.__dict__.update(os.__dict__)
        fake_os.open = self._open
        fake_os.pread = self._pread
        fake_os.getloadavg = lambda: tuple(float(x) for x in loadavg.split()[:3])
        fake_os.sched_getaffinity = lambda pid: set(range(cpus) if allowed is None else allowed)
        fake_time = types.ModuleType("time")
        fake_time.__dict__.update(time.__dict__)
        fake_time.monotonic = lambda: self.now
        fake_time.thread_time = lambda: self.thread_s
        monkeypatch.setattr(bitpack, "os", fake_os)
        monkeypatch.setattr(bitpack, "time", fake_time)
        monkeypatch.setattr(bitpack, "_threads_state", {**bitpack._threads_state, "fds": {}, "sample": None,
                                                        "busy": None, "threads": 1, "ended": 0.0, "team_s": 0.0})

    def _open(self, path, flags):
        if not self.proc or path not in ("/proc/stat", "/proc/loadavg"):
            raise FileNotFoundError(path)
        fd = 1000 + len(self.fds)
        self.fds[fd] = path
        return fd

    def _pread(self, fd, size, offset):
        if fd not in self.fds:
            raise OSError(f"fd {fd} is not a fake /proc file")
        if self.fds[fd] == "/proc/loadavg":
            return self.loadavg
        lines = [f"cpu{cpu} " + " ".join(map(str, t)) for cpu, t in self.ticks.items()]
        total = [sum(col) for col in zip(*self.ticks.values())]
        return ("cpu  " + " ".join(map(str, total)) + "\n" + "\n".join(lines) + "\nintr 12345 0 0\n").encode()

    def run(self, seconds, busy):
        """Let ``seconds`` pass, CPU c busy for ``busy[c]`` of them (the rest idle)."""
        self.now += seconds
        for cpu, t in self.ticks.items():
            used = round(bitpack._TICKS_PER_S * busy.get(cpu, 0.0))
            t[0] += used
            t[3] += round(bitpack._TICKS_PER_S * seconds) - used


BIG = bitpack.PARALLEL_MIN_COUNT


def test_quiet_cpus_after_a_busy_minute_get_a_team(monkeypatch):
    """A 1-minute load average of 7.9 and tasks runnable on CPUs this process may not use
    (it may use 0 and 1 of 4): its CPUs are idle now, so both decode."""
    machine = FakeMachine(monkeypatch, cpus=4, allowed={0, 1}, loadavg="7.90 7.50 6.00 3/300 99")
    bitpack.choose_threads(BIG)
    machine.run(0.2, {0: 0.01, 2: 0.2, 3: 0.2})
    assert bitpack.busy_cpus() < 0.1
    assert bitpack.choose_threads(BIG) == 2


def test_cpus_busy_now_after_a_quiet_minute_decode_on_one_thread(monkeypatch):
    """Load average 0 and only the caller runnable at the instant of the read, yet another
    process kept CPU 1 busy for most of the last 0.2 s: one thread."""
    machine = FakeMachine(monkeypatch, cpus=2, loadavg="0.00 0.00 0.00 1/300 99")
    bitpack.choose_threads(BIG)
    machine.run(0.2, {1: 0.17})
    assert bitpack.choose_threads(BIG) == 1
    machine.run(0.05, {})
    assert bitpack.choose_threads(BIG) == 1                 # within 0.1 s of the last sample: its result
    machine.run(0.2, {})
    assert bitpack.choose_threads(BIG) == 2


def test_the_caller_and_its_own_team_are_not_other_work(monkeypatch):
    machine = FakeMachine(monkeypatch, cpus=2)
    bitpack.busy_cpus()
    bitpack._team_ran(2, machine.now + 0.05, machine.now + 0.15)        # worker: 0.1 s decoding, then 0.05 s spinning
    machine.thread_s += 0.2
    machine.run(0.3, {0: 0.2, 1: 0.15})
    assert bitpack.busy_cpus() == 0
    assert bitpack.choose_threads(BIG) == 2
    machine.run(0.3, {0: 0.3, 1: 0.3})                                  # now someone else's
    assert bitpack.busy_cpus() == 2


def test_before_a_window_the_runnable_tasks_count_less_the_caller_and_its_spinning_workers(monkeypatch):
    machine = FakeMachine(monkeypatch, cpus=4, loadavg="0.50 0.40 0.30 4/311 9876")
    assert bitpack.busy_cpus() == 3                                     # 4 runnable, one of them the caller
    machine.run(2.0, {})                                                # the last sample is too old to say what happens now
    bitpack._team_ran(2, machine.now - 0.01, machine.now)
    assert bitpack.busy_cpus() == 2                                     # ... and one our idle worker, spinning


def test_without_proc_every_other_cpu_counts_as_busy_whatever_the_load_average(monkeypatch):
    FakeMachine(monkeypatch, cpus=2, loadavg="0.00 0.00 0.00 1/300 99", proc=False)
    assert bitpack.busy_cpus() == 1
    assert bitpack.choose_threads(BIG) == 1


@pytest.mark.parametrize("threads", [1, 2])
def test_pack_and_unpack_agree_on_one_and_many_threads(threads):
    idx = np.random.default_rng(9).integers(0, 32, 10_003)
    packed = bitpack.pack_bits(idx, 5, num_threads=threads)
    assert packed.tobytes() == bitpack.pack_bits_reference(idx, 5).tobytes()
    assert bitpack.unpack_bits(packed, idx.size, 5, num_threads=threads).tolist() == idx.tolist()
