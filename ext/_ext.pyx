# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Bit packing and shard decompression kernels (private: use workbench.bitpack).

Design
------
A k-bit index stream (1 <= k <= 8) is stored LSB-first: index j occupies bits
[j*k, (j+1)*k) of the stream, bit b living in byte b // 8 at position b % 8.
Eight consecutive indexes therefore fill exactly k bytes, so the stream splits
into independent 8-index blocks that start on byte boundaries.

Decompression is ``out[j] = centroids[index[j]]`` followed by a scatter of the
outliers, ``out[pos[o]] = value[o]``; outliers also occupy an index slot in the
stream (any value), which keeps the stream's layout independent of them. A shard's
output (~0.6 MB for MiniLM) usually fits in cache, where a plain copy runs at
20+ GB/s, so the inner loops are built to write wide and look up little:

- portable kernels (any CPU): for k in {1, 2, 4} a 256-entry byte table maps each
  packed byte to its 8, 4 or 2 floats (one copy per byte, four bytes per step);
  for k in {3, 5, 6} a pair table maps 2k bits to two floats, so a block is four
  8-byte copies; k in {7, 8} looks each index up.
- x86-64 kernels with AVX2 (chosen at run time, C below): for k in {3, 4, 5}, 32
  indexes at a time become bytes in a vector, ``pshufb`` looks up each byte of the
  centroids in 16-entry tables (one table per 16 centroids), and unpacking the four
  byte planes yields 32 floats in four 32-byte stores; for k = 6 the pair table is
  read with vector loads and written 8 floats per store.
- x86-64 kernels with AVX-512 VBMI (Ice Lake, Zen 4 and later; preferred where present):
  for k in {3, 4, 5, 6}, a byte permute and per-lane shifts turn 16 indexes into dwords
  and ``vpermt2ps`` looks their floats up in a 64-entry table held in four registers,
  one 64-byte store per 16 floats. On Zen 4 the k = 6 pair table (32 KiB, all of L1)
  ran at 0.55x a copy and AVX2 byte planes at k = 6 (16 ``pshufb`` per 32 floats) 0.4x.

Blocks are decoded in chunks of 2048 (16K floats, 64 KiB of output). One thread runs
a plain loop (no OpenMP region at all); more threads share the chunks through a
``prange`` with a dynamic schedule and the GIL released, so a Python IO thread keeps
reading while a layer decompresses. Blocks the vector kernels cannot read safely
near the stream's end, and a final partial block (n % 8 indexes), are decoded by
scalar code.

Outliers are checked before anything is written (positions in range: the one
data-dependent check, done here since it loops over the positions anyway). Ascending
positions, as the store keeps them, are written slice by slice (4096 floats) right
after their slice is decoded, while it is still in L1; other orders are written at
the end. The Python layer validates shapes and dtypes; these functions trust them.
"""
from cython.parallel cimport prange
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int32_t, int64_t
from libc.string cimport memcpy

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #if defined(__GNUC__) && defined(__x86_64__)
    #include <immintrin.h>
    #define WB_AVX2 __attribute__((target("avx2")))

    static int wb_simd_available(void) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2");
    }

    /* Byte selectors and multipliers that turn 16-byte windows of the stream into 32
       indexes, one per byte. Word w of a lane receives the two bytes that hold its
       index; multiplying by 2^(8 - s) (s = the index's bit offset in its first byte)
       and shifting right by 8 leaves the index in the low byte. The lanes take indexes
       (0-3, 8-11, 16-19, 24-27) and (4-7, 12-15, 20-23, 28-31): exactly the order in
       which unpacking four byte planes returns floats 0..31. */
    typedef struct { __m256i select_lo, select_hi, multiply, mask; } wb_extract;

    WB_AVX2 static wb_extract wb_make_extract(int bits) {
        wb_extract e;
        int8_t lo[32], hi[32];
        int16_t mul[16];
        for (int half = 0; half < 2; half++)
            for (int lane = 0; lane < 2; lane++)
                for (int w = 0; w < 8; w++) {
                    int i = (w < 4 ? w : w + 4) + 4 * lane;          /* index within this half's 16 */
                    int bit = i * bits, k = bit >> 3, s = bit & 7;
                    /* for k <= 4 both halves come from one 16-byte window */
                    int base = (half && bits <= 4) ? 2 * bits : 0;
                    int8_t *sel = half ? hi : lo;
                    sel[16 * lane + 2 * w] = (int8_t)(k + base);
                    sel[16 * lane + 2 * w + 1] = (int8_t)(s + bits > 8 ? k + 1 + base : -128);
                    if (!half) mul[8 * lane + w] = (int16_t)(1 << (8 - s));
                }
        e.select_lo = _mm256_loadu_si256((const __m256i *)lo);
        e.select_hi = _mm256_loadu_si256((const __m256i *)hi);
        e.multiply = _mm256_loadu_si256((const __m256i *)mul);
        e.mask = _mm256_set1_epi8((char)((1 << bits) - 1));
        return e;
    }

    /* Bytes a group of 32 indexes reads from its start. */
    static inline Py_ssize_t wb_group_reach(int bits) { return bits <= 4 ? 16 : 2 * bits + 16; }

    WB_AVX2 static inline __m256i wb_extract32(const uint8_t *p, int bits, const wb_extract *e) {
        __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
        __m256i b = bits <= 4 ? a : _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + 2 * bits)));
        a = _mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(a, e->select_lo), e->multiply), 8);
        b = _mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(b, e->select_hi), e->multiply), 8);
        return _mm256_and_si256(_mm256_packus_epi16(a, b), e->mask);
    }

    /* What the k in {3, 4, 5} kernel needs, prepared once per call and only read after. */
    typedef struct {
        __m256i table[2][4];          /* table[t][k]: byte k of centroids 16t..16t+15, in both lanes */
        wb_extract extract;
        int bits;
    } wb_planes;

    WB_AVX2 static void wb_planes_prepare(wb_planes *ctx, int bits, const float *centroids) {
        for (int t = 0; t < 2; t++)
            for (int k = 0; k < 4; k++) {
                uint8_t bytes[32];
                for (int j = 0; j < 16; j++) {
                    uint32_t u;
                    memcpy(&u, centroids + ((16 * t + j) & ((1 << bits) - 1)), 4);
                    bytes[j] = bytes[16 + j] = (uint8_t)(u >> (8 * k));
                }
                ctx->table[t][k] = _mm256_loadu_si256((const __m256i *)bytes);
            }
        ctx->extract = wb_make_extract(bits);
        ctx->bits = bits;
    }

    /* Decode blocks from b0 in groups of four (32 indexes) while a group's reads stay
       inside the stream; returns the first block left undone. */
    WB_AVX2 static Py_ssize_t wb_planes_blocks(const wb_planes *ctx, const uint8_t *packed, Py_ssize_t nbytes,
                                               float *out, Py_ssize_t b0, Py_ssize_t b1) {
        const int bits = ctx->bits;
        const Py_ssize_t reach = wb_group_reach(bits);
        Py_ssize_t end = nbytes < reach ? 0 : (nbytes - reach) / bits + 1;   /* blocks whose group reads fit */
        if (end > b1) end = b1;
        const __m256i high = _mm256_set1_epi8(0x70), second = _mm256_set1_epi8(0x10);
        Py_ssize_t b = b0;
        for (; b + 4 <= end; b += 4) {
            __m256i idx = wb_extract32(packed + b * bits, bits, &ctx->extract);
            __m256i p0, p1, p2, p3;
            if (bits <= 4) {
                p0 = _mm256_shuffle_epi8(ctx->table[0][0], idx);
                p1 = _mm256_shuffle_epi8(ctx->table[0][1], idx);
                p2 = _mm256_shuffle_epi8(ctx->table[0][2], idx);
                p3 = _mm256_shuffle_epi8(ctx->table[0][3], idx);
            } else {
                /* adding 0x70 sets bit 7 (pshufb writes 0) exactly where the index is not in this table */
                __m256i k0 = _mm256_add_epi8(idx, high), k1 = _mm256_add_epi8(_mm256_xor_si256(idx, second), high);
                p0 = _mm256_or_si256(_mm256_shuffle_epi8(ctx->table[0][0], k0), _mm256_shuffle_epi8(ctx->table[1][0], k1));
                p1 = _mm256_or_si256(_mm256_shuffle_epi8(ctx->table[0][1], k0), _mm256_shuffle_epi8(ctx->table[1][1], k1));
                p2 = _mm256_or_si256(_mm256_shuffle_epi8(ctx->table[0][2], k0), _mm256_shuffle_epi8(ctx->table[1][2], k1));
                p3 = _mm256_or_si256(_mm256_shuffle_epi8(ctx->table[0][3], k0), _mm256_shuffle_epi8(ctx->table[1][3], k1));
            }
            __m256i lo01 = _mm256_unpacklo_epi8(p0, p1), hi01 = _mm256_unpackhi_epi8(p0, p1);
            __m256i lo23 = _mm256_unpacklo_epi8(p2, p3), hi23 = _mm256_unpackhi_epi8(p2, p3);
            float *d = out + b * 8;
            _mm256_storeu_si256((__m256i *)d, _mm256_unpacklo_epi16(lo01, lo23));
            _mm256_storeu_si256((__m256i *)(d + 8), _mm256_unpackhi_epi16(lo01, lo23));
            _mm256_storeu_si256((__m256i *)(d + 16), _mm256_unpacklo_epi16(hi01, hi23));
            _mm256_storeu_si256((__m256i *)(d + 24), _mm256_unpackhi_epi16(hi01, hi23));
        }
        return b;
    }

    /* k = 6: four pair-table lookups per block gathered into one 32-byte store, two blocks
       a step, while the 8-byte loads stay inside the stream; returns the first block left undone. */
    WB_AVX2 static Py_ssize_t wb_pairs6_blocks(const uint8_t *packed, Py_ssize_t nbytes, const float *pairs,
                                               float *out, Py_ssize_t b0, Py_ssize_t b1) {
        const double *pd = (const double *)pairs;
        Py_ssize_t end = nbytes < 8 ? 0 : (nbytes - 8) / 6 + 1;
        if (end > b1) end = b1;
        Py_ssize_t b = b0;
        for (; b + 2 <= end; b += 2) {
            uint64_t w, x;
            memcpy(&w, packed + b * 6, 8);
            memcpy(&x, packed + b * 6 + 6, 8);
            __m256d v = _mm256_setr_pd(pd[w & 4095], pd[(w >> 12) & 4095], pd[(w >> 24) & 4095], pd[(w >> 36) & 4095]);
            __m256d u = _mm256_setr_pd(pd[x & 4095], pd[(x >> 12) & 4095], pd[(x >> 24) & 4095], pd[(x >> 36) & 4095]);
            _mm256_storeu_pd((double *)(out + b * 8), v);
            _mm256_storeu_pd((double *)(out + b * 8 + 8), u);
        }
        return b;
    }

    #define WB_AVX512 __attribute__((target("avx512f,avx512vbmi")))

    static int wb_avx512_available(void) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vbmi");
    }

    /* k in {3, 4, 5, 6} with AVX-512 VBMI, 16 indexes (two blocks) a step: vpermb moves the
       two stream bytes that hold index i into dword i, a per-dword shift brings the index to
       bit 0, and vpermt2ps looks up its float among 32 by the low five bits; for k = 6 a
       second lookup covers centroids 32..63 and bit 5 picks between the two. Bits above k
       are never masked off: table entry j holds centroid j mod 2^k. */
    typedef struct {
        __m512 table[4];              /* 64 floats: table[t] holds entries 16t..16t+15 */
        __m512i select, shift;
        int bits;
    } wb_perm;

    WB_AVX512 static void wb_perm_prepare(wb_perm *ctx, int bits, const float *centroids) {
        uint32_t entries[64], shifts[16];
        uint8_t select[64];
        for (int j = 0; j < 64; j++)
            memcpy(entries + j, centroids + (j & ((1 << bits) - 1)), 4);
        for (int i = 0; i < 16; i++) {
            int bit = i * bits;
            select[4 * i] = (uint8_t)(bit >> 3);
            select[4 * i + 1] = (uint8_t)((bit >> 3) + 1);
            select[4 * i + 2] = select[4 * i + 3] = 0;
            shifts[i] = (uint32_t)(bit & 7);
        }
        for (int t = 0; t < 4; t++)
            ctx->table[t] = _mm512_castsi512_ps(_mm512_loadu_si512((const void *)(entries + 16 * t)));
        ctx->select = _mm512_loadu_si512((const void *)select);
        ctx->shift = _mm512_loadu_si512((const void *)shifts);
        ctx->bits = bits;
    }

    WB_AVX512 static inline __attribute__((always_inline)) Py_ssize_t
    wb_perm_run(const wb_perm *ctx, const uint8_t *packed, float *out, Py_ssize_t b, Py_ssize_t end, const int bits) {
        const __m512 t0 = ctx->table[0], t1 = ctx->table[1], t2 = ctx->table[2], t3 = ctx->table[3];
        const __m512i select = ctx->select, shift = ctx->shift, bit5 = _mm512_set1_epi32(32);
        for (; b + 2 <= end; b += 2) {
            __m512i bytes = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)(packed + b * bits)));
            __m512i idx = _mm512_srlv_epi32(_mm512_permutexvar_epi8(select, bytes), shift);
            __m512 v = _mm512_permutex2var_ps(t0, idx, t1);
            if (bits == 6)
                v = _mm512_mask_blend_ps(_mm512_test_epi32_mask(idx, bit5), v, _mm512_permutex2var_ps(t2, idx, t3));
            _mm512_storeu_ps(out + b * 8, v);
        }
        return b;
    }

    /* Decode blocks from b0 two at a time while the 16-byte loads stay inside the stream;
       returns the first block left undone. */
    WB_AVX512 static Py_ssize_t wb_perm_blocks(const wb_perm *ctx, const uint8_t *packed, Py_ssize_t nbytes,
                                               float *out, Py_ssize_t b0, Py_ssize_t b1) {
        const int bits = ctx->bits;
        Py_ssize_t end = nbytes < 16 ? 0 : (nbytes - 16) / bits + 1;
        if (end > b1) end = b1;
        switch (bits) {
            case 3: return wb_perm_run(ctx, packed, out, b0, end, 3);
            case 4: return wb_perm_run(ctx, packed, out, b0, end, 4);
            case 5: return wb_perm_run(ctx, packed, out, b0, end, 5);
            default: return wb_perm_run(ctx, packed, out, b0, end, 6);
        }
    }
    #else
    typedef struct { int bits; } wb_planes;
    typedef struct { int bits; } wb_perm;
    static int wb_simd_available(void) { return 0; }
    static int wb_avx512_available(void) { return 0; }
    static void wb_perm_prepare(wb_perm *ctx, int bits, const float *centroids) { ctx->bits = bits; }
    static Py_ssize_t wb_perm_blocks(const wb_perm *ctx, const uint8_t *packed, Py_ssize_t nbytes,
                                     float *out, Py_ssize_t b0, Py_ssize_t b1) { return b0; }
    static void wb_planes_prepare(wb_planes *ctx, int bits, const float *centroids) { ctx->bits = bits; }
    static Py_ssize_t wb_planes_blocks(const wb_planes *ctx, const uint8_t *packed, Py_ssize_t nbytes,
                                       float *out, Py_ssize_t b0, Py_ssize_t b1) { return b0; }
    static Py_ssize_t wb_pairs6_blocks(const uint8_t *packed, Py_ssize_t nbytes, const float *pairs,
                                       float *out, Py_ssize_t b0, Py_ssize_t b1) { return b0; }
    #endif
    """
    ctypedef struct wb_planes:
        pass
    ctypedef struct wb_perm:
        pass
    int wb_simd_available() noexcept nogil
    int wb_avx512_available() noexcept nogil
    void wb_perm_prepare(wb_perm* ctx, int bits, const float* centroids) noexcept nogil
    Py_ssize_t wb_perm_blocks(const wb_perm* ctx, const uint8_t* packed, Py_ssize_t nbytes,
                              float* out, Py_ssize_t b0, Py_ssize_t b1) noexcept nogil
    void wb_planes_prepare(wb_planes* ctx, int bits, const float* centroids) noexcept nogil
    Py_ssize_t wb_planes_blocks(const wb_planes* ctx, const uint8_t* packed, Py_ssize_t nbytes,
                                float* out, Py_ssize_t b0, Py_ssize_t b1) noexcept nogil
    Py_ssize_t wb_pairs6_blocks(const uint8_t* packed, Py_ssize_t nbytes, const float* pairs,
                                float* out, Py_ssize_t b0, Py_ssize_t b1) noexcept nogil


cdef bint _HAVE_SIMD = wb_simd_available()
cdef bint _HAVE_AVX512 = _HAVE_SIMD and wb_avx512_available()
SIMD_AVAILABLE = bool(_HAVE_SIMD)
"""Whether this CPU runs the AVX2 kernels (decided once, at import)."""
KERNELS = ("portable", "avx2", "avx512vbmi")[:1 + _HAVE_SIMD + _HAVE_AVX512]
"""The kernel families this CPU runs, slowest first; ``decompress``'s ``simd`` is an index into it."""

ctypedef fused position_t:
    int32_t
    int64_t


cdef enum:
    _CHUNK_BLOCKS = 2048


cdef inline int _index_at(const uint8_t* packed, int bits, Py_ssize_t j) noexcept nogil:
    """Index j of the stream, read bit by bit (for the final partial block)."""
    cdef Py_ssize_t bit = j * bits
    cdef int i, v = 0
    for i in range(bits):
        v |= ((packed[(bit + i) >> 3] >> ((bit + i) & 7)) & 1) << i
    return v


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


# ----------------------------------------------------------------------------- packing


cdef void _pack_blocks(const uint8_t[::1] indexes, int bits, uint8_t[::1] out, Py_ssize_t b) noexcept nogil:
    cdef uint64_t word = 0
    cdef int i
    for i in range(8):
        word = word | ((<uint64_t>indexes[b * 8 + i]) << (i * bits))
    for i in range(bits):
        out[b * bits + i] = <uint8_t>((word >> (8 * i)) & 0xFF)


def pack_bits(const uint8_t[::1] indexes, int bits, uint8_t[::1] out, int num_threads=1):
    """Pack ``indexes`` (each < 2**bits) into ``out`` (ceil(n*bits/8) bytes, zeroed tail)."""
    cdef Py_ssize_t n = indexes.shape[0]
    cdef Py_ssize_t num_blocks = n // 8
    cdef Py_ssize_t b, j, bit
    cdef int i
    with nogil:
        if num_threads == 1:
            for b in range(num_blocks):
                _pack_blocks(indexes, bits, out, b)
        else:
            for b in prange(num_blocks, num_threads=num_threads, schedule="static"):
                _pack_blocks(indexes, bits, out, b)
        for j in range(num_blocks * bits, out.shape[0]):
            out[j] = 0
        for j in range(num_blocks * 8, n):
            bit = j * bits
            for i in range(bits):
                if (indexes[j] >> i) & 1:
                    out[(bit + i) >> 3] |= <uint8_t>(1 << ((bit + i) & 7))


cdef void _unpack_block(const uint8_t* packed, Py_ssize_t nbytes, int bits, uint8_t[::1] out, Py_ssize_t b) noexcept nogil:
    cdef uint64_t word = _block_word(packed, nbytes, b * bits, bits)
    cdef uint64_t mask = (<uint64_t>1 << bits) - 1
    cdef int i
    for i in range(8):
        out[b * 8 + i] = <uint8_t>((word >> (i * bits)) & mask)


def unpack_bits(const uint8_t[::1] packed, int bits, uint8_t[::1] out, int num_threads=1):
    """Unpack ``out.shape[0]`` indexes of ``bits`` bits each from ``packed``."""
    cdef Py_ssize_t n = out.shape[0]
    cdef Py_ssize_t num_blocks = n // 8
    cdef Py_ssize_t nbytes = packed.shape[0]
    cdef const uint8_t* p = &packed[0] if nbytes else NULL
    cdef Py_ssize_t b, j
    with nogil:
        if num_threads == 1:
            for b in range(num_blocks):
                _unpack_block(p, nbytes, bits, out, b)
        else:
            for b in prange(num_blocks, num_threads=num_threads, schedule="static"):
                _unpack_block(p, nbytes, bits, out, b)
        for j in range(num_blocks * 8, n):
            out[j] = <uint8_t>_index_at(p, bits, j)


# ----------------------------------------------------------------------------- portable decoding


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
    """Decode blocks [b0, b1) for k in {1, 2, 4}: each packed byte becomes ``per_byte`` floats in one copy."""
    cdef Py_ssize_t j = b0 * bits, end = b1 * bits
    cdef size_t width = per_byte * sizeof(float)
    cdef uint32_t word
    cdef float* o
    while j + 4 <= end:
        memcpy(&word, packed + j, 4)
        o = out + j * per_byte
        memcpy(o, table + (word & 0xFF) * per_byte, width)
        memcpy(o + per_byte, table + ((word >> 8) & 0xFF) * per_byte, width)
        memcpy(o + 2 * per_byte, table + ((word >> 16) & 0xFF) * per_byte, width)
        memcpy(o + 3 * per_byte, table + (word >> 24) * per_byte, width)
        j += 4
    while j < end:
        memcpy(out + j * per_byte, table + packed[j] * per_byte, width)
        j += 1


cdef inline void _pair_blocks(const uint8_t* packed, Py_ssize_t nbytes_total, int bits, const float* pairs,
                              float* out, Py_ssize_t b0, Py_ssize_t b1) noexcept nogil:
    """Decode blocks [b0, b1) for k in {3, 5, 6}: the pair table maps 2k bits to two floats."""
    cdef uint64_t word, mask = (<uint64_t>1 << (2 * bits)) - 1
    cdef Py_ssize_t b
    cdef float* o
    for b in range(b0, b1):
        word = _block_word(packed, nbytes_total, b * bits, bits)
        o = out + b * 8
        memcpy(o, pairs + 2 * (word & mask), 8)
        memcpy(o + 2, pairs + 2 * ((word >> (2 * bits)) & mask), 8)
        memcpy(o + 4, pairs + 2 * ((word >> (4 * bits)) & mask), 8)
        memcpy(o + 6, pairs + 2 * ((word >> (6 * bits)) & mask), 8)


cdef struct _Decoder:
    const uint8_t* packed
    Py_ssize_t nbytes                # of the packed stream: loads past it are never made
    int bits
    const float* centroids
    const float* table               # byte or pair table (see _fill_table), or NULL
    const wb_planes* planes          # the AVX2 k in {3, 4, 5} kernel's tables, or NULL
    const wb_perm* perm              # the AVX-512 k in {3, 4, 5, 6} kernel's tables, or NULL
    bint simd                        # AVX2 kernels allowed


cdef void _decode_range(const _Decoder* d, float* out, Py_ssize_t b0, Py_ssize_t b1) noexcept nogil:
    # Literal bit widths let the C compiler specialise (unroll, fold shifts) each case.
    cdef int bits = d.bits
    if d.perm != NULL:
        b0 = wb_perm_blocks(d.perm, d.packed, d.nbytes, out, b0, b1)
        _lookup_blocks(d.packed, d.nbytes, bits, d.centroids, out, b0, b1)      # the last few blocks
        return
    if d.planes != NULL:
        b0 = wb_planes_blocks(d.planes, d.packed, d.nbytes, out, b0, b1)
        _lookup_blocks(d.packed, d.nbytes, bits, d.centroids, out, b0, b1)      # the last few blocks
        return
    if bits == 6 and d.simd:
        b0 = wb_pairs6_blocks(d.packed, d.nbytes, d.table, out, b0, b1)
    if bits == 1:
        _byte_table_blocks(d.packed, 8, d.table, out, b0, b1, 1)
    elif bits == 2:
        _byte_table_blocks(d.packed, 4, d.table, out, b0, b1, 2)
    elif bits == 3:
        _pair_blocks(d.packed, d.nbytes, 3, d.table, out, b0, b1)
    elif bits == 4:
        _byte_table_blocks(d.packed, 2, d.table, out, b0, b1, 4)
    elif bits == 5:
        _pair_blocks(d.packed, d.nbytes, 5, d.table, out, b0, b1)
    elif bits == 6:
        _pair_blocks(d.packed, d.nbytes, 6, d.table, out, b0, b1)
    elif bits == 7:
        _lookup_blocks(d.packed, d.nbytes, 7, d.centroids, out, b0, b1)
    else:
        _lookup_blocks(d.packed, d.nbytes, 8, d.centroids, out, b0, b1)


cdef void _fill_table(int bits, const float* cen, float* table) noexcept nogil:
    """The byte table (k in {1, 2, 4}: byte -> 8/k floats) or pair table (k in {3, 5, 6}: 2k bits -> 2 floats)."""
    cdef int v, i, per_byte, high, low, size = 1 << bits, mask = (1 << bits) - 1
    cdef float c
    cdef float* row
    if bits == 1 or bits == 2 or bits == 4:
        per_byte = 8 // bits
        for v in range(256):
            for i in range(per_byte):
                table[v * per_byte + i] = cen[(v >> (i * bits)) & mask]
    else:
        for high in range(size):          # pair (high << bits | low) -> (cen[low], cen[high])
            c = cen[high]
            row = table + 2 * (high << bits)
            for low in range(size):
                row[2 * low] = cen[low]
                row[2 * low + 1] = c


cdef inline Py_ssize_t _scatter(const position_t* pos, const float* val, Py_ssize_t o, Py_ssize_t num_outliers,
                                Py_ssize_t limit, float* out) noexcept nogil:
    """Write outliers o, o+1, ... while their position is below ``limit``; returns the next one."""
    while o < num_outliers and pos[o] < limit:
        out[pos[o]] = val[o]
        o += 1
    return o


cdef enum:
    _SCATTER_BLOCKS = 512        # 4096 floats (16 KiB): decoded, then their outliers written while in L1


def decompress(const uint8_t[::1] packed, int bits, const float[::1] centroids,
               const position_t[::1] outlier_pos, const float[::1] outlier_val,
               float[::1] out, int num_threads=1, int simd=2):
    """Fill ``out`` with centroids looked up by the packed indexes, then scatter outliers.

    Returns -1, or the index of the first outlier position outside ``out`` (nothing is
    written then). ``simd`` caps the kernel family (an index into :data:`KERNELS`; 0 is
    portable): the tests compare every family this CPU runs.
    """
    cdef Py_ssize_t n = out.shape[0]
    cdef Py_ssize_t num_blocks = n // 8
    cdef Py_ssize_t num_chunks = (num_blocks + _CHUNK_BLOCKS - 1) // _CHUNK_BLOCKS
    cdef Py_ssize_t num_outliers = outlier_pos.shape[0]
    cdef Py_ssize_t c, j, o, start, end, written, bad = -1
    cdef const position_t* pos = &outlier_pos[0] if num_outliers else NULL
    cdef const float* val = &outlier_val[0] if num_outliers else NULL
    cdef float* dst = &out[0] if n else NULL
    cdef position_t lowest, highest
    cdef bint ascending = True
    cdef float table[8192]
    cdef wb_planes planes
    cdef wb_perm perm
    cdef _Decoder d
    d.packed = &packed[0] if packed.shape[0] else NULL
    d.nbytes = packed.shape[0]
    d.bits = bits
    d.centroids = &centroids[0]
    d.table = NULL
    d.planes = NULL
    d.perm = NULL
    d.simd = simd >= 1 and _HAVE_SIMD
    with nogil:
        if num_outliers:
            for o in range(1, num_outliers):          # branch-free reductions the compiler vectorises
                ascending &= pos[o - 1] < pos[o]
            lowest, highest = pos[0], pos[num_outliers - 1]
            if not ascending:
                for o in range(num_outliers):
                    lowest = min(lowest, pos[o])
                    highest = max(highest, pos[o])
            if lowest < 0 or highest >= n:
                for o in range(num_outliers):
                    if pos[o] < 0 or pos[o] >= n:
                        bad = o
                        break
    if bad >= 0:
        return bad
    with nogil:
        if simd >= 2 and _HAVE_AVX512 and 3 <= bits <= 6:
            wb_perm_prepare(&perm, bits, d.centroids)
            d.perm = &perm
        elif d.simd and (bits == 3 or bits == 4 or bits == 5):
            wb_planes_prepare(&planes, bits, d.centroids)
            d.planes = &planes
        elif bits <= 6:
            _fill_table(bits, d.centroids, table)
            d.table = table
        written = 0
        if num_threads == 1 or num_chunks < 2:
            start = 0
            while start < num_blocks:
                end = min(start + _SCATTER_BLOCKS, num_blocks)
                _decode_range(&d, dst, start, end)
                if ascending:
                    written = _scatter(pos, val, written, num_outliers, end * 8, dst)
                start = end
        else:
            for c in prange(num_chunks, num_threads=num_threads, schedule="dynamic"):
                _decode_range(&d, dst, c * _CHUNK_BLOCKS, min((c + 1) * _CHUNK_BLOCKS, num_blocks))
        for j in range(num_blocks * 8, n):
            dst[j] = d.centroids[_index_at(d.packed, bits, j)]
        for o in range(written, num_outliers):
            dst[pos[o]] = val[o]
    return -1


# ----------------------------------------------------------------------------- KV chunks into a float16 cache

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>

    /* float16 bits -> float (exact: every half is a float) */
    static inline float wb_h2f(uint16_t h) {
        uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
        if (exp == 0) {
            if (man == 0) {
                bits = sign;
            } else {
                uint32_t shift = 0;
                while (!(man & 0x400u)) { man <<= 1; shift++; }
                bits = sign | ((113u - shift) << 23) | ((man & 0x3ffu) << 13);
            }
        } else if (exp == 31) {
            bits = sign | 0x7f800000u | (man << 13);
        } else {
            bits = sign | ((exp + 112u) << 23) | (man << 13);
        }
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }

    /* float -> float16 bits, rounded to nearest even (as NumPy's astype and torch's copy_ round), without a
       branch, so a compiler can vectorize a loop of it: a normal half from the rebiased bits, rounding by
       adding 0xfff and the kept lowest bit; a subnormal one from the hardware's own rounding of |f| + 0.5,
       whose unit in the last place is the smallest subnormal half, 2^-24; then overflow and NaN. Equal to
       the branching conversion for every one of the 2^32 floats (checked exhaustively when written). */
    static inline uint16_t wb_f2h(float f) {
        uint32_t x;
        memcpy(&x, &f, 4);
        uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
        uint32_t normal = (ax - 0x38000000u + 0xfffu + ((ax >> 13) & 1u)) >> 13;
        float a, t;
        uint32_t tb;
        memcpy(&a, &ax, 4);
        t = a + 0.5f;
        memcpy(&tb, &t, 4);
        uint32_t r = ax < 0x38800000u ? tb - 0x3f000000u : normal;
        r = ax >= 0x477ff000u ? 0x7c00u : r;
        r = ax > 0x7f800000u ? 0x7e00u : r;
        return (uint16_t)(sign | r);
    }

    /* one row of a chunk: n codes from code ``first`` of the stream (D per position) -> float16, value =
       code * step + low in float32, the scales per feature (step[d], a key row) or, with ``per_position``,
       per position (step[t], a value row) */
    #define WB_ROW_FLOATS 512
    static void wb_row_scalar(const uint8_t *codes, int64_t first, int bits, const uint16_t *low,
                              const uint16_t *step, int64_t n, int64_t D, int per_position, uint16_t *out) {
        float s[WB_ROW_FLOATS], o[WB_ROW_FLOATS];
        const uint32_t mask = (1u << bits) - 1u;
        int held = !per_position && D <= WB_ROW_FLOATS;
        for (int64_t d = 0; held && d < D; d++) { s[d] = wb_h2f(step[d]); o[d] = wb_h2f(low[d]); }
        uint8_t unpacked[WB_ROW_FLOATS];
        const int64_t per_byte = 8 / bits;
        for (int64_t j = 0, t = 0; j < n; j += D, t++) {
            float st = per_position ? wb_h2f(step[t]) : 0.0f, of = per_position ? wb_h2f(low[t]) : 0.0f;
            const uint8_t *c = NULL;
            uint16_t *row = out + j;
            if (bits == 8) {
                c = codes + first + j;
            } else if (D <= WB_ROW_FLOATS && D % per_byte == 0 && (first + j) % per_byte == 0) {
                const uint8_t *p = codes + (first + j) / per_byte;       /* the row's codes, one per byte */
                if (bits == 4) {
                    for (int64_t i = 0; i < D / 2; i++) {
                        unpacked[2 * i] = p[i] & 15u;
                        unpacked[2 * i + 1] = p[i] >> 4;
                    }
                } else {
                    for (int64_t i = 0; i < D / per_byte; i++)
                        for (int k = 0; k < per_byte; k++)
                            unpacked[i * per_byte + k] = (uint8_t)((p[i] >> (k * bits)) & mask);
                }
                c = unpacked;
            }
            if (c && per_position) {                 /* the common rows as loops a compiler vectorizes */
                for (int64_t d = 0; d < D; d++) { float v = (float)c[d] * st; v = v + of; row[d] = wb_f2h(v); }
            } else if (c && held) {
                for (int64_t d = 0; d < D; d++) { float v = (float)c[d] * s[d]; v = v + o[d]; row[d] = wb_f2h(v); }
            } else {
                for (int64_t d = 0; d < D; d++) {
                    int64_t bit = (first + j + d) * bits;
                    float v = (float)((uint32_t)(codes[bit >> 3] >> (bit & 7)) & mask)
                              * (per_position ? st : held ? s[d] : wb_h2f(step[d]));
                    v = v + (per_position ? of : held ? o[d] : wb_h2f(low[d]));
                    row[d] = wb_f2h(v);
                }
            }
        }
    }

    #if defined(__GNUC__) && defined(__x86_64__)
    #include <immintrin.h>
    #define WB_F16C __attribute__((target("avx2,f16c,fma")))
    static int wb_f16c_available(void) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
    }
    /* eight codes from code j (a multiple of 8) as eight int32, in stream order: 8 bits widened from their
       bytes; 4 and 2 bits from one word broadcast to every lane and shifted right by each lane's offset */
    WB_F16C static inline __attribute__((always_inline)) __m256i wb_codes8(const uint8_t *codes, const int bits,
                                                                          int64_t j) {
        if (bits == 8)
            return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + j)));
        if (bits == 4) {
            int32_t word;
            memcpy(&word, codes + (j >> 1), 4);
            return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word),
                                                      _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                    _mm256_set1_epi32(15));
        }
        int16_t half;
        memcpy(&half, codes + (j >> 2), 2);
        return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi16(half),
                                                  _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                _mm256_set1_epi32(3));
    }
    /* eight int32 codes scaled and offset, rounded to float16 and stored. A fused multiply-add gives the
       product-then-sum of the scalar kernel and NumPy bit for bit: a code (8 bits at most) times a float16
       step (11 significant bits) is exact in float32, so only the sum rounds, in both. */
    WB_F16C static inline __attribute__((always_inline)) void wb_store8(__m256i codes, const float *s, const float *o,
                                                                        uint16_t *out) {
        const __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(codes), _mm256_loadu_ps(s), _mm256_loadu_ps(o));
        _mm_storeu_si128((__m128i *)out, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    /* the row sixteen values at a time (D a multiple of 16, at most WB_ROW_FLOATS): the channels' scales
       and offsets widened to float once per row, then per position unpack in order, scale, offset, round,
       store; every level runs the same arithmetic, only the unpacking differs */
    WB_F16C static inline __attribute__((always_inline)) void wb_row_bits(const uint8_t *codes, const int bits, const uint16_t *low,
                                    const uint16_t *step, int64_t n, int64_t D, uint16_t *out) {
        float s[WB_ROW_FLOATS], o[WB_ROW_FLOATS];
        for (int64_t d = 0; d < D; d += 8) {
            _mm256_storeu_ps(s + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(step + d))));
            _mm256_storeu_ps(o + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(low + d))));
        }
        for (int64_t t = 0; t < n; t += D) {
            for (int64_t d = 0; d < D; d += 16) {
                wb_store8(wb_codes8(codes, bits, t + d), s + d, o + d, out + t + d);
                wb_store8(wb_codes8(codes, bits, t + d + 8), s + d + 8, o + d + 8, out + t + d + 8);
            }
        }
    }
    /* a value row: one scale and offset per position, broadcast over its D features (D a multiple of 8) */
    WB_F16C static inline __attribute__((always_inline)) void wb_row_pos_bits(const uint8_t *codes, const int bits,
                                    const uint16_t *low, const uint16_t *step, int64_t n, int64_t D, uint16_t *out) {
        float s[8], o[8];
        for (int64_t t = 0, p = 0; t < n; t += D, p++) {
            _mm256_storeu_ps(s, _mm256_set1_ps(wb_h2f(step[p])));
            _mm256_storeu_ps(o, _mm256_set1_ps(wb_h2f(low[p])));
            for (int64_t d = 0; d < D; d += 8)
                wb_store8(wb_codes8(codes, bits, t + d), s, o, out + t + d);
        }
    }
    /* one copy of the loop per level and scale axis, so each inlines its own unpacking */
    WB_F16C static void wb_row_f16c(const uint8_t *codes, int bits, const uint16_t *low, const uint16_t *step,
                                    int64_t n, int64_t D, int per_position, uint16_t *out) {
        if (per_position) {
            if (bits == 8) wb_row_pos_bits(codes, 8, low, step, n, D, out);
            else if (bits == 4) wb_row_pos_bits(codes, 4, low, step, n, D, out);
            else wb_row_pos_bits(codes, 2, low, step, n, D, out);
        } else if (D == 64) {            /* the common head width, a constant the compiler unrolls */
            if (bits == 8) wb_row_bits(codes, 8, low, step, n, 64, out);
            else if (bits == 4) wb_row_bits(codes, 4, low, step, n, 64, out);
            else wb_row_bits(codes, 2, low, step, n, 64, out);
        } else if (bits == 8) wb_row_bits(codes, 8, low, step, n, D, out);
        else if (bits == 4) wb_row_bits(codes, 4, low, step, n, D, out);
        else wb_row_bits(codes, 2, low, step, n, D, out);
    }
    #else
    static int wb_f16c_available(void) { return 0; }
    static void wb_row_f16c(const uint8_t *codes, int bits, const uint16_t *low, const uint16_t *step,
                            int64_t n, int64_t D, int per_position, uint16_t *out) {
        wb_row_scalar(codes, 0, bits, low, step, n, D, per_position, out);
    }
    #endif
    """
    bint wb_f16c_available() noexcept nogil
    float wb_h2f(uint16_t h) noexcept nogil
    uint16_t wb_f2h(float f) noexcept nogil
    void wb_row_scalar(const uint8_t* codes, int64_t first, int bits, const uint16_t* low, const uint16_t* step,
                       int64_t n, int64_t D, int per_position, uint16_t* out) noexcept nogil
    void wb_row_f16c(const uint8_t* codes, int bits, const uint16_t* low, const uint16_t* step,
                     int64_t n, int64_t D, int per_position, uint16_t* out) noexcept nogil


cdef bint _HAVE_F16C = wb_f16c_available()


def f16c_available() -> bool:
    return bool(_HAVE_F16C)


cdef void _chunk_row(const uint8_t* payload, int bits, const uint16_t* low, const uint16_t* step,
                     uint16_t* k_out, uint16_t* v_out, Py_ssize_t row, Py_ssize_t H, Py_ssize_t T, Py_ssize_t D,
                     Py_ssize_t capacity, Py_ssize_t start, bint vector) noexcept nogil:
    """Row ``row`` of a chunk (layer l, K or V, head h: T x D values) into its cache rows from ``start``. The
    scales of (l, h) are D per-feature ones for K, then T per-position ones for V."""
    cdef Py_ssize_t l = row // (2 * H), kv = (row // H) % 2, h = row % H
    cdef uint16_t* dst = (k_out if kv == 0 else v_out) + ((l * H + h) * capacity + start) * D
    cdef Py_ssize_t n = T * D
    cdef Py_ssize_t scales = (l * H + h) * (D + T) + (D if kv else 0)
    if bits == 16:
        memcpy(dst, payload + row * n * 2, n * 2)
    elif vector:
        wb_row_f16c(payload + row * n * bits // 8, bits, low + scales, step + scales, n, D, kv, dst)
    else:
        wb_row_scalar(payload, row * n, bits, low + scales, step + scales, n, D, kv, dst)


def chunk_to_half(const uint8_t[::1] payload, int bits, const uint16_t[::1] low, const uint16_t[::1] step,
                  uint16_t[:, :, :, ::1] k_out, uint16_t[:, :, :, ::1] v_out, Py_ssize_t start, Py_ssize_t T,
                  int num_threads=1, bint simd=True):
    """One chunk (layers, 2, heads, T, D) stored at ``bits`` (8, 4 or 2: codes with float16 ``low`` and
    ``step``, (layers, heads, D + T): per key feature, then per value position; 16: float16 values) straight into the float16 cache
    ``k_out``/``v_out`` (layers, heads, capacity, D) at positions ``start`` to ``start + T``: unpack, scale,
    offset and round in one pass, no temporary. Rows (layer, K/V, head) are shared by ``num_threads``. The
    Python layer checks the shapes; this trusts them."""
    cdef Py_ssize_t L = k_out.shape[0], H = k_out.shape[1], capacity = k_out.shape[2], D = k_out.shape[3]
    cdef Py_ssize_t rows = L * 2 * H, r
    cdef const uint16_t* lo = &low[0] if low.shape[0] else NULL
    cdef const uint16_t* st = &step[0] if step.shape[0] else NULL
    cdef bint vector = simd and _HAVE_F16C and D % 16 == 0 and D <= 512
    with nogil:
        if num_threads == 1:
            for r in range(rows):
                _chunk_row(&payload[0], bits, lo, st, &k_out[0, 0, 0, 0], &v_out[0, 0, 0, 0], r, H, T, D,
                           capacity, start, vector)
        else:
            for r in prange(rows, num_threads=num_threads, schedule="static"):
                _chunk_row(&payload[0], bits, lo, st, &k_out[0, 0, 0, 0], &v_out[0, 0, 0, 0], r, H, T, D,
                           capacity, start, vector)
