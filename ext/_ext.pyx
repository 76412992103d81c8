# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Bit packing and shard decompression kernels (private: use workbench.bitpack).

Design
------
A k-bit index stream (1 <= k <= 8) is stored LSB-first: index j occupies bits
[j*k, (j+1)*k) of the stream, bit b living in byte b // 8 at position b % 8.
Eight consecutive indexes therefore fill exactly k bytes, so the stream splits
into independent 8-index blocks that start on byte boundaries. Every kernel
works block by block: a block's k bytes are read into one 64-bit word and its
eight indexes are shifted out. Blocks are spread over OpenMP threads with
``prange`` and the GIL released, so a Python IO thread keeps reading while a
layer decompresses. A final partial block (n % 8 indexes) is handled serially.

Decompression is ``out[j] = centroids[index[j]]`` followed by a scatter of the
outliers, ``out[pos[o]] = value[o]``; outliers also occupy an index slot in the
stream (any value), which keeps the stream's layout independent of them.

The Python layer validates shapes, dtypes and ranges; these functions trust it.
"""
from cython.parallel cimport prange
from libc.stdint cimport uint8_t, uint64_t, int64_t


cdef inline uint64_t _load_word(const uint8_t[::1] packed, Py_ssize_t start, int nbytes) noexcept nogil:
    cdef uint64_t word = 0
    cdef int i
    for i in range(nbytes):
        word |= (<uint64_t>packed[start + i]) << (8 * i)
    return word


cdef inline int _index_at(const uint8_t[::1] packed, int bits, Py_ssize_t j) noexcept nogil:
    """Index j of the stream, read bit by bit (for the final partial block)."""
    cdef Py_ssize_t bit = j * bits
    cdef int i, v = 0
    for i in range(bits):
        v |= ((packed[(bit + i) >> 3] >> ((bit + i) & 7)) & 1) << i
    return v


def pack_bits(const uint8_t[::1] indexes, int bits, uint8_t[::1] out, int num_threads=1):
    """Pack ``indexes`` (each < 2**bits) into ``out`` (ceil(n*bits/8) bytes, zeroed tail)."""
    cdef Py_ssize_t n = indexes.shape[0]
    cdef Py_ssize_t num_blocks = n // 8
    cdef Py_ssize_t b, j, bit, start
    cdef uint64_t word
    cdef int i
    with nogil:
        for b in prange(num_blocks, num_threads=num_threads, schedule="static"):
            word = 0
            for i in range(8):
                word = word | ((<uint64_t>indexes[b * 8 + i]) << (i * bits))
            start = b * bits
            for i in range(bits):
                out[start + i] = <uint8_t>((word >> (8 * i)) & 0xFF)
        for j in range(num_blocks * bits, out.shape[0]):
            out[j] = 0
        for j in range(num_blocks * 8, n):
            bit = j * bits
            for i in range(bits):
                if (indexes[j] >> i) & 1:
                    out[(bit + i) >> 3] |= <uint8_t>(1 << ((bit + i) & 7))


def unpack_bits(const uint8_t[::1] packed, int bits, uint8_t[::1] out, int num_threads=1):
    """Unpack ``out.shape[0]`` indexes of ``bits`` bits each from ``packed``."""
    cdef Py_ssize_t n = out.shape[0]
    cdef Py_ssize_t num_blocks = n // 8
    cdef Py_ssize_t b, j
    cdef uint64_t word, mask = (1 << bits) - 1
    cdef int i
    with nogil:
        for b in prange(num_blocks, num_threads=num_threads, schedule="static"):
            word = _load_word(packed, b * bits, bits)
            for i in range(8):
                out[b * 8 + i] = <uint8_t>((word >> (i * bits)) & mask)
        for j in range(num_blocks * 8, n):
            out[j] = <uint8_t>_index_at(packed, bits, j)


def decompress(const uint8_t[::1] packed, int bits, const float[::1] centroids,
               const int64_t[::1] outlier_pos, const float[::1] outlier_val,
               float[::1] out, int num_threads=1):
    """Fill ``out`` with centroids looked up by the packed indexes, then scatter outliers."""
    cdef Py_ssize_t n = out.shape[0]
    cdef Py_ssize_t num_blocks = n // 8
    cdef Py_ssize_t num_outliers = outlier_pos.shape[0]
    cdef Py_ssize_t b, j, o
    cdef uint64_t word, mask = (1 << bits) - 1
    cdef int i
    with nogil:
        for b in prange(num_blocks, num_threads=num_threads, schedule="static"):
            word = _load_word(packed, b * bits, bits)
            for i in range(8):
                out[b * 8 + i] = centroids[(word >> (i * bits)) & mask]
        for j in range(num_blocks * 8, n):
            out[j] = centroids[_index_at(packed, bits, j)]
        for o in prange(num_outliers, num_threads=num_threads, schedule="static"):
            out[outlier_pos[o]] = outlier_val[o]
