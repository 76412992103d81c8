"""Bit packing and shard decompression: validating wrappers over the Cython kernels.

``pack_bits``/``unpack_bits`` store k-bit indexes (1 <= k <= 8) tightly, LSB first,
so 3-, 5- and 6-bit indexes cross byte boundaries. ``decompress`` turns packed
indexes, a centroid table and (position, value) outliers into float32 weights,
in parallel over OpenMP threads with the GIL released. Each has a NumPy reference
(``*_reference``) that the tests compare bit for bit.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from workbench import _ext

if sys.byteorder != "little":
    raise ImportError("workbench.bitpack: the decompression kernels read 64-bit little-endian words; "
                      f"this machine is {sys.byteorder}-endian")

MAX_BITS = 8


def packed_nbytes(count: int, bits: int) -> int:
    """Bytes that ``count`` indexes of ``bits`` bits take when packed."""
    return (count * bits + 7) // 8


def default_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _check_bits(bits: int) -> int:
    if not isinstance(bits, (int, np.integer)) or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be an integer in 1..{MAX_BITS}, got {bits!r}")
    return int(bits)


def _threads(num_threads: int | None) -> int:
    n = default_threads() if num_threads is None else int(num_threads)
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
    _ext.pack_bits(idx, bits, out, _threads(num_threads))
    return out


def _check_packed(packed: np.ndarray, count: int, bits: int) -> np.ndarray:
    packed = np.asarray(packed)
    if packed.dtype != np.uint8 or packed.ndim != 1:
        raise ValueError(f"packed must be a 1-D uint8 array, got {packed.dtype} {packed.shape}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    need = packed_nbytes(count, bits)
    if packed.size < need:
        raise ValueError(f"{count} {bits}-bit indexes need {need} packed bytes, got {packed.size}")
    return np.ascontiguousarray(packed)


def unpack_bits(packed: np.ndarray, count: int, bits: int, num_threads: int | None = None) -> np.ndarray:
    """The first ``count`` indexes stored in ``packed`` as a uint8 array."""
    bits = _check_bits(bits)
    packed = _check_packed(packed, count, bits)
    out = np.empty(count, dtype=np.uint8)
    _ext.unpack_bits(packed, bits, out, _threads(num_threads))
    return out


def decompress(packed: np.ndarray, bits: int, centroids: np.ndarray, outlier_pos: np.ndarray,
               outlier_val: np.ndarray, out: np.ndarray, num_threads: int | None = None) -> np.ndarray:
    """Fill the float32 working buffer ``out`` (1-D, caller-provided) with the decoded weights.

    ``out.size`` indexes are read from ``packed``; each becomes ``centroids[index]``;
    then ``out[outlier_pos] = outlier_val``.
    """
    bits = _check_bits(bits)
    if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.ndim != 1 or not out.flags.c_contiguous:
        raise ValueError("out must be a 1-D C-contiguous float32 array (the working buffer)")
    packed = _check_packed(packed, out.size, bits)
    centroids = np.ascontiguousarray(centroids, dtype=np.float32)
    if centroids.ndim != 1 or centroids.size != (1 << bits):
        raise ValueError(f"{bits}-bit decompression needs {1 << bits} centroids, got {centroids.size}")
    pos = np.ascontiguousarray(outlier_pos, dtype=np.int64)
    val = np.ascontiguousarray(outlier_val, dtype=np.float32)
    if pos.shape != val.shape or pos.ndim != 1:
        raise ValueError(f"outlier positions {pos.shape} and values {val.shape} must be 1-D of equal length")
    if pos.size and (pos.min() < 0 or pos.max() >= out.size):
        raise ValueError(f"outlier positions must lie in 0..{out.size - 1}")
    _ext.decompress(packed, bits, centroids, pos, val, out, _threads(num_threads))
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
