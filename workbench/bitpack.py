"""Bit packing and shard decompression: validating wrappers over the Cython kernels.

``pack_bits``/``unpack_bits`` store k-bit indexes (1 <= k <= 8) tightly, LSB first,
so 3-, 5- and 6-bit indexes cross byte boundaries. ``decompress`` turns packed
indexes, a centroid table and (position, value) outliers into float32 weights,
with the GIL released. Each has a NumPy reference (``*_reference``) that the tests
compare bit for bit.

Threads: ``num_threads=None`` lets :func:`choose_threads` decide per call. A shard
whose output fits in cache decodes in tens of microseconds, about what starting an
OpenMP team costs, and a team whose member is descheduled by another busy process
waits at its closing barrier for whole time slices (measured on 2 cores: a 2-thread
decode 400x below its 1-thread speed while two other processes kept both busy). So
small outputs, and any output while the CPUs are busy, decode on one thread, which
runs no OpenMP region at all. "Busy" means now (:func:`busy_cpus`), not the load average.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import NamedTuple

import numpy as np

from workbench import _ext

if sys.byteorder != "little":
    raise ImportError("workbench.bitpack: the decompression kernels read 64-bit little-endian words; "
                      f"this machine is {sys.byteorder}-endian")

MAX_BITS = 8
_UINT8, _INT32, _INT64, _FLOAT32 = (np.dtype(t) for t in (np.uint8, np.int32, np.int64, np.float32))
SIMD = _ext.SIMD_AVAILABLE
"""Whether the AVX2 decompression kernels run on this CPU (else the portable ones do)."""
KERNELS = _ext.KERNELS
"""Decompression kernel families this CPU runs, slowest first: ``"portable"``, then ``"avx2"``
and ``"avx512vbmi"`` where the CPU has them; :func:`decompress` uses the last."""
PARALLEL_MIN_COUNT = 1 << 20
"""Outputs below this many floats (4 MiB, several times a core's L2) decode on one thread."""
TEAM_SPIN_S = 0.05
"""After a parallel region libgomp's idle workers keep spinning (measured: ~15 ms; 50 ms
allowed): they show as runnable and busy but are this process's own, not other work."""
STAT_WINDOW_S = (0.1, 1.0)
"""CPU use is measured over the time since the previous ``/proc/stat`` sample: at least
0.1 s, since it counts 10 ms ticks, and at most 1 s, since older use says little about now."""
FREE_CPU_SLACK = 0.1
"""A CPU that other work uses for less than this fraction (daemons, timer ticks) counts as free."""
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100      # /proc/stat's unit
_threads_state = {"fds": {}, "sample": None, "busy": None, "threads": 1, "ended": 0.0, "team_s": 0.0}


class _CpuSample(NamedTuple):
    at: float                 # time.monotonic()
    busy_ticks: int           # over the CPUs this process may use: not idle, not waiting for IO
    all_ticks: int
    cpus: int                 # how many CPU lines were summed
    thread: int               # the sampling thread, and its CPU seconds so far
    thread_s: float
    team_s: float             # this process's OpenMP workers' CPU seconds so far


def packed_nbytes(count: int, bits: int) -> int:
    """Bytes that ``count`` indexes of ``bits`` bits take when packed."""
    return (count * bits + 7) // 8


def _cpu_set() -> set[int]:
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def default_threads() -> int:
    """CPUs this process may run on."""
    return len(_cpu_set())


def _read_proc(name: str) -> bytes:
    """``/proc/<name>``, read through a descriptor kept open (a pread costs microseconds)."""
    fds = _threads_state["fds"]
    if name not in fds:
        fds[name] = os.open(f"/proc/{name}", os.O_RDONLY)
    return os.pread(fds[name], 1 << 16, 0)


def _team_cpu_s(now: float) -> float:
    """CPU seconds this process's OpenMP workers have used by ``now``: each parallel region's
    wall time, then its spin (at most TEAM_SPIN_S, cut short by the next region), per worker."""
    state = _threads_state
    return state["team_s"] + min(TEAM_SPIN_S, max(0.0, now - state["ended"])) * (state["threads"] - 1)


def _team_ran(threads: int, started: float, ended: float) -> None:
    state = _threads_state
    state["team_s"] = _team_cpu_s(started) + (ended - started) * (threads - 1)
    state["threads"], state["ended"] = threads, ended


def _cpu_sample(now: float) -> _CpuSample:
    """Tick counts of ``/proc/stat``'s lines for the CPUs this process may use (fields: user nice
    system idle iowait irq softirq steal; steal is busy: a hypervisor gave the CPU away)."""
    cpus = _cpu_set()
    busy = total = found = 0
    for line in _read_proc("stat").splitlines():
        name, _, rest = line.partition(b" ")
        if not name.startswith(b"cpu"):
            break
        if name == b"cpu" or int(name[3:]) not in cpus:
            continue
        ticks = [int(t) for t in rest.split()[:8]]
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
        found += 1
    if not found:
        raise ValueError("/proc/stat has no line for this process's CPUs")
    return _CpuSample(now, busy, total, found, threading.get_ident(), time.thread_time(), _team_cpu_s(now))


def _runnable_others(now: float) -> float:
    """Tasks runnable at this instant (``/proc/loadavg``) other than the caller and its spinning workers."""
    running = int(_read_proc("loadavg").split()[3].split(b"/")[0])
    own = _threads_state["threads"] - 1 if now - _threads_state["ended"] < TEAM_SPIN_S else 0
    return max(0, running - 1 - own)


def busy_cpus() -> float:
    """How many of the CPUs this process may use are kept busy right now by work other than
    the caller and its own OpenMP workers.

    Measured from ``/proc/stat`` over the time since the previous sample (see
    :data:`STAT_WINDOW_S`; within 0.1 s of it, the last result), less the calling thread's CPU
    time and the team's. Before there is such a window, the tasks runnable at this instant
    (``/proc/loadavg``), which also counts tasks on CPUs this process may not use. Without
    ``/proc``: every CPU but the caller's. Not the load average: after a busy minute it would
    keep a quiet machine single-threaded, and the reverse would start a team on busy CPUs.
    """
    state = _threads_state
    now = time.monotonic()
    prev = state["sample"]
    age = now - prev.at if prev is not None else float("inf")
    try:
        if age < STAT_WINDOW_S[0]:
            return state["busy"] if state["busy"] is not None else _runnable_others(now)
        state["sample"] = sample = _cpu_sample(now)
        state["busy"] = None
        if age > STAT_WINDOW_S[1] or sample.all_ticks <= prev.all_ticks:
            return _runnable_others(now)
    except (OSError, ValueError, IndexError):
        return default_threads() - 1
    own = (sample.thread_s - prev.thread_s if sample.thread == prev.thread else 0.0) + sample.team_s - prev.team_s
    elapsed = (sample.all_ticks - prev.all_ticks) / _TICKS_PER_S / sample.cpus
    others = (sample.busy_ticks - prev.busy_ticks) / _TICKS_PER_S - own
    state["busy"] = min(float(sample.cpus), max(0.0, others / elapsed))
    return state["busy"]


def choose_threads(count: int, max_threads: int | None = None, busy: float | None = None) -> int:
    """Threads worth using to decode ``count`` floats: 1 below :data:`PARALLEL_MIN_COUNT`,
    else the CPUs that other work leaves free (``busy`` of them in use; default
    :func:`busy_cpus`; see :data:`FREE_CPU_SLACK`), at most ``max_threads`` (default: every
    CPU this process may use), at least 1."""
    if count < PARALLEL_MIN_COUNT:
        return 1
    cpus = default_threads()
    limit = cpus if max_threads is None else min(int(max_threads), cpus)
    idle = cpus - (busy_cpus() if busy is None else busy)
    return max(1, min(limit, int(idle + FREE_CPU_SLACK)))


def _check_bits(bits: int) -> int:
    if type(bits) is int and 1 <= bits <= MAX_BITS:
        return bits
    if not isinstance(bits, (int, np.integer)) or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be an integer in 1..{MAX_BITS}, got {bits!r}")
    return int(bits)


def _simd_level(simd: bool | str) -> int:
    if simd is True or simd is False:
        return len(KERNELS) - 1 if simd else 0
    if simd not in KERNELS:
        raise ValueError(f"simd must be True, False or one of {KERNELS} (what this CPU runs), got {simd!r}")
    return KERNELS.index(simd)


def _threads(num_threads: int | None, count: int) -> int:
    n = choose_threads(count) if num_threads is None else int(num_threads)
    if n < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}")
    return n


def pack_bits(indexes: np.ndarray, bits: int, num_threads: int | None = None) -> np.ndarray:
    """Pack a 1-D array of indexes, each < 2**bits, into a uint8 array."""
    bits = _check_bits(bits)
    idx = np.asarray(indexes)
    if idx.ndim != 1:
        raise ValueError(f"indexes must be 1-D, got shape {idx.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= (1 << bits)):
        raise ValueError(f"indexes must lie in 0..{(1 << bits) - 1} for {bits}-bit packing")
    idx = np.ascontiguousarray(idx, dtype=np.uint8)
    out = np.empty(packed_nbytes(idx.size, bits), dtype=np.uint8)
    _ext.pack_bits(idx, bits, out, _threads(num_threads, idx.size))
    return out


def _check_packed(packed: np.ndarray, count: int, bits: int) -> np.ndarray:
    packed = packed if type(packed) is np.ndarray else np.asarray(packed)
    if packed.dtype != _UINT8 or packed.ndim != 1:
        raise ValueError(f"packed must be a 1-D uint8 array, got {packed.dtype} {packed.shape}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    need = (count * bits + 7) // 8
    if packed.shape[0] < need:
        raise ValueError(f"{count} {bits}-bit indexes need {need} packed bytes, got {packed.size}")
    return np.ascontiguousarray(packed)


def unpack_bits(packed: np.ndarray, count: int, bits: int, num_threads: int | None = None) -> np.ndarray:
    """The first ``count`` indexes stored in ``packed`` as a uint8 array."""
    bits = _check_bits(bits)
    packed = _check_packed(packed, count, bits)
    out = np.empty(count, dtype=np.uint8)
    _ext.unpack_bits(packed, bits, out, _threads(num_threads, count))
    return out


def decompress(packed: np.ndarray, bits: int, centroids: np.ndarray, outlier_pos: np.ndarray,
               outlier_val: np.ndarray, out: np.ndarray, num_threads: int | None = None,
               simd: bool | str = True) -> np.ndarray:
    """Fill the float32 working buffer ``out`` (1-D, caller-provided) with the decoded weights.

    ``out.size`` indexes are read from ``packed``; each becomes ``centroids[index]``;
    then ``out[outlier_pos] = outlier_val``. ``num_threads=None`` chooses per call
    (:func:`choose_threads`); an integer uses exactly that many threads.
    ``simd=False`` forces the portable kernels and a name from :data:`KERNELS` caps the
    family used (the result is the same bit for bit).
    """
    bits = _check_bits(bits)
    if type(out) is not np.ndarray or out.dtype != _FLOAT32 or out.ndim != 1 or not out.flags.c_contiguous:
        raise ValueError("out must be a 1-D C-contiguous float32 array (the working buffer)")
    count = out.shape[0]
    packed = _check_packed(packed, count, bits)
    centroids = np.ascontiguousarray(centroids, dtype=_FLOAT32)
    if centroids.ndim != 1 or centroids.shape[0] != (1 << bits):
        raise ValueError(f"{bits}-bit decompression needs {1 << bits} centroids, got {centroids.size}")
    pos = np.asarray(outlier_pos)
    pos = np.ascontiguousarray(pos, dtype=_INT32 if pos.dtype == _INT32 else _INT64)    # int32: as the store keeps them
    val = np.ascontiguousarray(outlier_val, dtype=_FLOAT32)
    if pos.ndim != 1 or pos.shape != val.shape:
        raise ValueError(f"outlier positions {pos.shape} and values {val.shape} must be 1-D of equal length")
    threads = _threads(num_threads, count)
    started = time.monotonic() if threads > 1 else 0.0
    bad = _ext.decompress(packed, bits, centroids, pos, val, out, threads, _simd_level(simd))
    if threads > 1:
        _team_ran(threads, started, time.monotonic())
    if bad >= 0:
        raise ValueError(f"outlier positions must lie in 0..{count - 1}, got {pos[bad]}")
    return out


# ----------------------------------------------------------------------------- NumPy references


def pack_bits_reference(indexes: np.ndarray, bits: int) -> np.ndarray:
    idx = np.asarray(indexes, dtype=np.uint8)
    bit_matrix = (idx[:, None] >> np.arange(bits, dtype=np.uint8)) & 1          # (n, bits), LSB first
    return np.packbits(bit_matrix.reshape(-1), bitorder="little")


def unpack_bits_reference(packed: np.ndarray, count: int, bits: int) -> np.ndarray:
    """Vectorised NumPy unpacking: every 8 indexes fill ``bits`` bytes, read as one 64-bit word."""
    packed = np.asarray(packed, dtype=np.uint8)
    blocks = count // 8
    out = np.empty(count, dtype=np.uint8)
    if blocks:
        raw = packed[: blocks * bits].reshape(blocks, bits).astype(np.uint64)
        words = (raw << (np.arange(bits, dtype=np.uint64) * np.uint64(8))).sum(axis=1, dtype=np.uint64)
        shifts = np.arange(8, dtype=np.uint64) * np.uint64(bits)
        out[: blocks * 8] = ((words[:, None] >> shifts) & np.uint64((1 << bits) - 1)).reshape(-1)
    tail = count - blocks * 8
    if tail:
        stream = np.unpackbits(packed[blocks * bits: packed_nbytes(count, bits)], bitorder="little")
        weights = (1 << np.arange(bits)).astype(np.uint16)
        out[blocks * 8:] = (stream[: tail * bits].reshape(tail, bits).astype(np.uint16) @ weights).astype(np.uint8)
    return out


def decompress_reference(packed, bits, centroids, outlier_pos, outlier_val, count: int) -> np.ndarray:
    """NumPy twin of :func:`decompress`: centroid lookup, then the outlier scatter."""
    out = np.asarray(centroids, dtype=np.float32)[unpack_bits_reference(packed, count, bits)]
    out[np.asarray(outlier_pos, dtype=np.int64)] = np.asarray(outlier_val, dtype=np.float32)
    return out
