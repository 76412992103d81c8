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
from libc.string cimport memcpy


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


cdef inline uint64_t _block_word(const uint8_t* packed, Py_ssize_t nbytes_total, Py_ssize_t start, int bits) noexcept nogil:
    """The ``bits`` bytes of one 8-index block as a little-endian word (8-byte load when in bounds)."""
    cdef uint64_t word = 0
    cdef int i
    if start + 8 <= nbytes_total:
        memcpy(&word, packed + start, 8)
        if bits < 8:
            word &= (<uint64_t>1 << (8 * bits)) - 1
        return word
    for i in range(bits):
        word |= (<uint64_t>packed[start + i]) << (8 * i)
    return word


cdef inline void _lookup_blocks(const uint8_t* packed, Py_ssize_t nbytes_total, int bits, const float* cen,
                                float* out, Py_ssize_t b0, Py_ssize_t b1) noexcept nogil:
    """Decode blocks [b0, b1): shift eight indexes out of each block's word, look each up."""
    cdef uint64_t word, mask = (<uint64_t>1 << bits) - 1
    cdef Py_ssize_t b
    cdef float* o
    for b in range(b0, b1):
        word = _block_word(packed, nbytes_total, b * bits, bits)
        o = out + b * 8
        o[0] = cen[word & mask]
        o[1] = cen[(word >> bits) & mask]
        o[2] = cen[(word >> (2 * bits)) & mask]
        o[3] = cen[(word >> (3 * bits)) & mask]
        o[4] = cen[(word >> (4 * bits)) & mask]
        o[5] = cen[(word >> (5 * bits)) & mask]
        o[6] = cen[(word >> (6 * bits)) & mask]
        o[7] = cen[(word >> (7 * bits)) & mask]


cdef inline void _byte_table_blocks(const uint8_t* packed, int per_byte, const float* table,
                                    float* out, Py_ssize_t b0, Py_ssize_t b1, int bits) noexcept nogil:
    """Decode blocks [b0, b1) for k in {1, 2, 4}: each packed byte maps to ``per_byte`` floats at once."""
    cdef Py_ssize_t j
    cdef size_t width = per_byte * sizeof(float)
    for j in range(b0 * bits, b1 * bits):
        memcpy(out + j * per_byte, table + packed[j] * per_byte, width)


cdef void _decode_range(const uint8_t* packed, Py_ssize_t nbytes_total, int bits, const float* cen,
                        const float* table, float* out, Py_ssize_t b0, Py_ssize_t b1) noexcept nogil:
    # Literal bit widths let the C compiler specialise (unroll, fold shifts) each case.
    if bits == 1:
        _byte_table_blocks(packed, 8, table, out, b0, b1, 1)
    elif bits == 2:
        _byte_table_blocks(packed, 4, table, out, b0, b1, 2)
    elif bits == 3:
        _lookup_blocks(packed, nbytes_total, 3, cen, out, b0, b1)
    elif bits == 4:
        _byte_table_blocks(packed, 2, table, out, b0, b1, 4)
    elif bits == 5:
        _lookup_blocks(packed, nbytes_total, 5, cen, out, b0, b1)
    elif bits == 6:
        _lookup_blocks(packed, nbytes_total, 6, cen, out, b0, b1)
    elif bits == 7:
        _lookup_blocks(packed, nbytes_total, 7, cen, out, b0, b1)
    else:
        _lookup_blocks(packed, nbytes_total, 8, cen, out, b0, b1)


cdef enum:
    _CHUNK_BLOCKS = 2048


def decompress(const uint8_t[::1] packed, int bits, const float[::1] centroids,
               const int64_t[::1] outlier_pos, const float[::1] outlier_val,
               float[::1] out, int num_threads=1):
    """Fill ``out`` with centroids looked up by the packed indexes, then scatter outliers.

    Blocks are decoded in chunks of 2048 (16K floats, 64 KiB of output) spread over
    the threads. For 1-, 2- and 4-bit indexes a 256-entry byte table maps each packed
    byte to its 8, 4 or 2 floats with one copy; other widths load a block's bytes as
    one 64-bit word (an unaligned 8-byte load where the stream allows) and shift the
    eight indexes out.
    """
    cdef Py_ssize_t n = out.shape[0]
    cdef Py_ssize_t num_blocks = n // 8
    cdef Py_ssize_t num_chunks = (num_blocks + _CHUNK_BLOCKS - 1) // _CHUNK_BLOCKS
    cdef Py_ssize_t num_outliers = outlier_pos.shape[0]
    cdef Py_ssize_t nbytes_total = packed.shape[0]
    cdef Py_ssize_t c, j, o, b1
    cdef int i, v, per_byte
    cdef float table[2048]
    cdef const uint8_t* p = &packed[0] if nbytes_total else NULL
    cdef const float* cen = &centroids[0]
    cdef float* dst = &out[0] if n else NULL
    if bits == 1 or bits == 2 or bits == 4:
        per_byte = 8 // bits
        for v in range(256):
            for i in range(per_byte):
                table[v * per_byte + i] = cen[(v >> (i * bits)) & ((1 << bits) - 1)]
    with nogil:
        for c in prange(num_chunks, num_threads=num_threads, schedule="static"):
            b1 = (c + 1) * _CHUNK_BLOCKS
            if b1 > num_blocks:
                b1 = num_blocks
            _decode_range(p, nbytes_total, bits, cen, table, dst, c * _CHUNK_BLOCKS, b1)
        for j in range(num_blocks * 8, n):
            dst[j] = cen[_index_at(packed, bits, j)]
        for o in prange(num_outliers, num_threads=num_threads, schedule="static"):
            dst[outlier_pos[o]] = outlier_val[o]
