"""A context's KV cache in chunks: ``chunk_size`` tokens each, spanning every layer.

A chunk is the unit the service compresses, swaps and recomputes. Its data is the K and V of
its tokens in all layers, an array (layers, 2, kv_heads, tokens, head_dim), held either raw
(float32, ``bits == 32``) or by linear quantization at 8, 4 or 2 bits with a float16 minimum and
step per group: keys per channel (each layer, head and feature over the chunk's tokens), values per
token (each layer, head and token over its features). Keys carry a few large outlier channels, so one
range per channel keeps the others fine; values have none, and a range per token follows how their
error reaches the output (each token's value row is weighted by one attention score). Against scales
per channel for values too, this split holds 37.5 % fewer scale bytes and, on the shipped decoder, cut
the perplexity that 2-bit chunks add about five-fold (``workbench bench llms --tables perplexity``).
Codes below 8 bits are bit-packed by the Cython extension (``workbench.bitpack``). Lower levels are
made from the 8-bit chunk ("further" compression, as in LLMS), never from the float original, which
the service no longer holds.

The token ids of every chunk stay in memory with the context (the paper's memory-resident
fragment), so a chunk that is not in memory can be recomputed from its text.
"""
from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from workbench import _ext, bitpack
from workbench.errors import WorkbenchError

FLOAT_BITS = 32
HALF_BITS = 16
RAW_BITS: tuple[int, ...] = (FLOAT_BITS, HALF_BITS)
"""Raw chunks: float32 (exact; tests and the perplexity reference) or float16 (what the paper's FP16
baselines keep, and what the service's uncompressed configurations hold)."""
LEVELS: tuple[int, ...] = (8, 4, 2)
"""Compression levels (bits per value): the 8-bit base and the two further ones."""
CHUNK_SIZE = 16
_HALF = np.dtype(np.float16)
_NO_HALVES = np.zeros(0, np.uint16)


def check_bits(bits: int) -> int:
    if bits not in (*RAW_BITS, *LEVELS):
        raise WorkbenchError(f"a chunk is held at 32 or 16 (raw float), 8, 4 or 2 bits, got {bits}")
    return bits


def raw_dtype(bits: int):
    """The NumPy dtype of a raw chunk's values at ``bits`` (32 or 16)."""
    return np.float32 if bits == FLOAT_BITS else np.float16


@dataclass(frozen=True, eq=False)
class ChunkData:
    """K and V of one chunk, raw or quantized; ``shape`` is (layers, 2, kv_heads, tokens, head_dim)."""
    bits: int
    shape: tuple[int, ...]
    payload: np.ndarray                     # float32/float16 values (raw) or uint8 codes, bit-packed below 8 bits
    low: np.ndarray | None = None           # (layers, kv_heads, head_dim + tokens) float16 minimum: per key
                                            # feature, then per value token (:func:`scale_shape`)
    step: np.ndarray | None = None          # same shape, float16 step

    @property
    def num_tokens(self) -> int:
        """Tokens the chunk holds (``ChunkedKV.tokens`` is a context's token ids)."""
        return self.shape[3]

    @property
    def nbytes(self) -> int:
        """Bytes the chunk occupies: its payload plus, when quantized, every group's minimum and step."""
        extra = 0 if self.low is None else self.low.nbytes + self.step.nbytes
        return int(self.payload.nbytes + extra)

    def to_array(self) -> np.ndarray:
        """The chunk's K and V as float32 (layers, 2, kv_heads, tokens, head_dim)."""
        if self.bits in RAW_BITS:
            return self.payload.reshape(self.shape).astype(np.float32, copy=False)
        count = int(math.prod(self.shape))
        codes = self.payload if self.bits == 8 else bitpack.unpack_bits(self.payload, count, self.bits)
        low, step = self.scales()
        return codes.reshape(self.shape).astype(np.float32) * step + low

    def scales(self) -> tuple[np.ndarray, np.ndarray]:
        """The minimum and step of every value of a quantized chunk, float32 arrays of its shape."""
        return _spread(self.low, self.shape), _spread(self.step, self.shape)

    def to_tensor(self):
        """:meth:`to_array` as a float32 torch tensor, computed by torch's vectorized kernels (the
        dequantization on the switch's critical path: several times faster than NumPy's passes)."""
        import torch

        def tensor(array):                   # read as is (a loaded chunk's buffer is read-only), never written
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                return torch.from_numpy(array)

        if self.bits in RAW_BITS:
            return tensor(self.payload).view(self.shape).float()
        count = int(math.prod(self.shape))
        codes = self.payload if self.bits == 8 else bitpack.unpack_bits(self.payload, count, self.bits)
        D = self.shape[4]
        low, step = tensor(self.low).float(), tensor(self.step).float()
        values = tensor(codes).view(self.shape).float()
        values[:, 0].mul_(step[:, :, None, :D]).add_(low[:, :, None, :D])
        values[:, 1].mul_(step[:, :, D:, None]).add_(low[:, :, D:, None])
        return values

    def into_half(self, k: np.ndarray, v: np.ndarray, start: int, num_threads: int = 1, simd: bool = True) -> None:
        """Write this chunk into a float16 cache, ``k`` and ``v`` (layers, kv_heads, capacity, head_dim), at
        positions ``start`` to ``start + tokens``, in one pass of the extension's fused kernel from the stored
        form (unpack, scale, offset, round; no temporary array): bit for bit :meth:`to_half_reference`.
        ``simd=False`` forces the portable kernel. A 32-bit chunk goes to a float32 cache instead."""
        L, _, H, T, D = self.shape
        if self.bits == FLOAT_BITS:
            raise WorkbenchError("a 32-bit chunk is exact in float32: write it to a float32 cache, not float16")
        for name, out in (("k", k), ("v", v)):
            if out.dtype != _HALF or out.ndim != 4 or not out.flags.c_contiguous or not out.flags.writeable:
                raise WorkbenchError(f"{name} must be a writable C-contiguous float16 array (layers, heads, "
                                     f"capacity, head_dim), got {out.dtype} {out.shape}")
            if (out.shape[0], out.shape[1], out.shape[3]) != (L, H, D) or not 0 <= start <= out.shape[2] - T:
                raise WorkbenchError(f"a chunk of shape {self.shape} at position {start} does not fit the cache "
                                     f"{name} of shape {out.shape}")
        raw = self.bits == HALF_BITS
        low = _NO_HALVES if raw else self.low.reshape(-1).view(np.uint16)
        step = _NO_HALVES if raw else self.step.reshape(-1).view(np.uint16)
        _ext.chunk_to_half(self.payload.reshape(-1).view(np.uint8), self.bits, low, step, k.view(np.uint16),
                           v.view(np.uint16), start, T, num_threads, simd)

    def to_half_reference(self) -> np.ndarray:
        """The fused kernel's NumPy twin: the chunk as float16 (layers, 2, kv_heads, tokens, head_dim), each value
        ``code * step + low`` in float32 (a product, then a sum), rounded to nearest even."""
        if self.bits in RAW_BITS:
            return self.payload.reshape(self.shape).astype(np.float16)
        count = int(math.prod(self.shape))
        codes = self.payload if self.bits == 8 else bitpack.unpack_bits(self.payload, count, self.bits)
        low, step = self.scales()
        return (codes.reshape(self.shape).astype(np.float32) * step + low).astype(np.float16)

    def to_bytes(self) -> bytes:
        """A self-describing serialization (NumPy's .npz, no pickle) for the swap store."""
        buffer = io.BytesIO()
        arrays = {"meta": np.array([self.bits, *self.shape], dtype=np.int64), "payload": self.payload}
        if self.low is not None:
            arrays.update(low=self.low, step=self.step)
        np.savez(buffer, **arrays)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> ChunkData:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            meta = z["meta"].tolist()
            return cls(bits=int(meta[0]), shape=tuple(int(v) for v in meta[1:]), payload=z["payload"].copy(),
                       low=z["low"].copy() if "low" in z.files else None,
                       step=z["step"].copy() if "step" in z.files else None)


def scale_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """Shape of a quantized chunk's minimum and step arrays: (layers, kv_heads, head_dim + tokens), the key's
    per-feature groups then the value's per-token ones of each layer and head."""
    L, _, H, T, D = shape
    return L, H, D + T


def _spread(scale: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A (layers, kv_heads, head_dim + tokens) scale array as float32 over every value of ``shape``."""
    D = shape[4]
    full = np.empty(shape, np.float32)
    scale = scale.astype(np.float32)
    full[:, 0] = scale[:, :, None, :D]
    full[:, 1] = scale[:, :, D:, None]
    return full


def _quantize_groups(values: np.ndarray, axis: int, top: int):
    """Float16 minimum and step of ``values`` along ``axis`` (kept as length 1), and the codes."""
    low = values.min(axis=axis, keepdims=True).astype(np.float16)
    span = values.max(axis=axis, keepdims=True) - low.astype(np.float32)
    step = np.where(span > 0, span / top, 1.0).astype(np.float16)
    step = np.where(step.astype(np.float32) > 0, step, np.float16(1.0))             # an underflowed step
    codes = np.clip(np.rint((values - low.astype(np.float32)) / step.astype(np.float32)), 0, top)
    return low, step, codes


def encode_chunk(kv: np.ndarray, bits: int) -> ChunkData:
    """Hold ``kv`` (layers, 2, kv_heads, tokens, head_dim) raw (32 or 16) or quantized (8/4/2 bits: keys per
    channel, values per token, module docstring)."""
    check_bits(bits)
    kv = np.ascontiguousarray(kv, dtype=np.float32)
    if kv.ndim != 5:
        raise WorkbenchError(f"a chunk is (layers, 2, kv_heads, tokens, head_dim), got shape {kv.shape}")
    if bits in RAW_BITS:
        return ChunkData(bits=bits, shape=kv.shape, payload=kv.reshape(-1).astype(raw_dtype(bits)))
    top = (1 << bits) - 1
    k_low, k_step, k_codes = _quantize_groups(kv[:, 0], 2, top)        # (L, H, 1, D): over the tokens
    v_low, v_step, v_codes = _quantize_groups(kv[:, 1], 3, top)        # (L, H, T, 1): over the features
    codes = np.stack([k_codes, v_codes], axis=1).astype(np.uint8).reshape(-1)
    payload = codes if bits == 8 else bitpack.pack_bits(codes, bits)
    low = np.concatenate([k_low[:, :, 0, :], v_low[:, :, :, 0]], axis=2)
    step = np.concatenate([k_step[:, :, 0, :], v_step[:, :, :, 0]], axis=2)
    return ChunkData(bits=bits, shape=kv.shape, payload=payload, low=low, step=step)


def recompress(chunk: ChunkData, bits: int) -> ChunkData:
    """The chunk at another level, from the values it holds now (8 -> 4 or 2; equal bits: itself)."""
    return chunk if bits == chunk.bits else encode_chunk(chunk.to_array(), bits)


def encode_at_level(kv: np.ndarray, bits: int) -> ChunkData:
    """``kv`` held at ``bits`` the way every route makes that level: raw levels directly, lower ones from
    the 8-bit encoding (``recompress(encode_chunk(kv, 8), bits)``), so a chunk recomputed from its
    tokens gets the codes a chunk compressed after its call and read back from its file has."""
    if check_bits(bits) in RAW_BITS:
        return encode_chunk(kv, bits)
    return recompress(encode_chunk(kv, LEVELS[0]), bits)


def working_nbytes(cfg, tokens: int, new_bits: int = LEVELS[0]) -> int:
    """Bytes of the decoder cache (decoder config ``cfg``) a call works in for ``tokens`` tokens (K and V of
    every layer), in the dtype :meth:`ChunkedKV.working_dtype` picks: float32 for raw 32-bit chunks, float16
    otherwise."""
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * int(tokens) * (4 if new_bits == FLOAT_BITS else 2)


def chunk_nbytes(shape: tuple[int, ...], bits: int) -> int:
    """Bytes of a chunk of ``shape`` at ``bits`` without building it (memory accounting, planning)."""
    count = int(math.prod(shape))
    if check_bits(bits) in RAW_BITS:
        return bits // 8 * count
    payload = count if bits == 8 else bitpack.packed_nbytes(count, bits)
    return int(payload + 2 * 2 * math.prod(scale_shape(shape)))


@dataclass(eq=False)
class ChunkedKV:
    """One context: its token ids (always in memory), its chunks' data (``None`` where not in memory)
    and the attention its tokens received, for information density.

    Chunk ``i`` holds tokens ``i * chunk_size`` up to ``(i + 1) * chunk_size``; the last one may be shorter.
    """
    layers: int
    kv_heads: int
    head_dim: int
    chunk_size: int = CHUNK_SIZE
    tokens: list[int] = field(default_factory=list)
    chunks: list[ChunkData | None] = field(default_factory=list)
    attn_sum: np.ndarray = field(default_factory=lambda: np.zeros(0))     # per token: attention received
    attn_rows: np.ndarray = field(default_factory=lambda: np.zeros(0))    # per token: rows that could attend
    pending: list[int] = field(default_factory=list)                      # generated, not yet fed back (no K/V)

    @classmethod
    def for_decoder(cls, cfg, chunk_size: int = CHUNK_SIZE) -> ChunkedKV:
        if chunk_size < 1:
            raise WorkbenchError(f"a chunk holds at least one token, got chunk size {chunk_size}")
        return cls(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, chunk_size)

    @property
    def num_chunks(self) -> int:
        return len(self.chunks)

    def span(self, i: int) -> tuple[int, int]:
        """Token range [start, end) of chunk ``i``."""
        start = i * self.chunk_size
        return start, min(start + self.chunk_size, len(self.tokens))

    def chunk_tokens(self, i: int) -> list[int]:
        start, end = self.span(i)
        return self.tokens[start:end]

    def missing(self) -> list[int]:
        return [i for i, c in enumerate(self.chunks) if c is None]

    def levels(self) -> list[int | None]:
        return [None if c is None else c.bits for c in self.chunks]

    def nbytes(self) -> int:
        """Bytes of the chunks in memory."""
        return sum(c.nbytes for c in self.chunks if c is not None)

    def to_array(self) -> np.ndarray:
        """Every chunk's K and V, float32 (layers, 2, kv_heads, tokens, head_dim); all must be in memory."""
        if self.missing():
            raise WorkbenchError(f"chunks {self.missing()} are not in memory; load or recompute them first")
        if not self.chunks:
            return np.zeros((self.layers, 2, self.kv_heads, 0, self.head_dim), np.float32)
        return np.concatenate([c.to_array() for c in self.chunks], axis=3)

    def working_dtype(self, new_bits: int = LEVELS[0]):
        """The decoder cache's dtype for this context and a call writing chunks at ``new_bits``: float32
        when a chunk is (or will be) held raw at 32 bits, else float16, which holds every lower level's
        values and halves the cache."""
        import torch

        raw32 = new_bits == FLOAT_BITS or any(c is not None and c.bits == FLOAT_BITS for c in self.chunks)
        return torch.float32 if raw32 else torch.float16

    def to_cache(self, cfg, extra: int = 0, new_bits: int = LEVELS[0], into=None, written=None):
        """A decoder ``KVCache`` holding this context, with room for ``extra`` more tokens written at
        ``new_bits``, in :meth:`working_dtype`; built one chunk at a time, so the context is never held
        twice in float. ``into``: a cache to write in place of a new one (its dtype must be
        :meth:`working_dtype` and its capacity at least the context and ``extra``; slots past the context are
        left as they are). ``written``: chunk -> the ChunkData already written into ``into`` at its place;
        a chunk that still holds that very object is not written again."""
        import torch

        from workbench.models.decoder import KVCache

        n = len(self.tokens)
        if self.missing():
            raise WorkbenchError(f"chunks {self.missing()} are not in memory; load or recompute them first")
        dtype = self.working_dtype(new_bits)
        if into is None:
            cache = KVCache.empty(cfg, n + extra, dtype=dtype)
        elif into.k.dtype != dtype or into.capacity < n + extra:
            raise WorkbenchError(f"the cache given holds {into.capacity} {into.k.dtype} slots; this call needs "
                                 f"{n + extra} of {dtype}")
        else:
            cache = into
        written = written if into is not None and written else {}
        self.write_chunks(cache, [i for i, c in enumerate(self.chunks) if written.get(i) is not c])
        cache.positions[:n] = torch.arange(n)
        cache.length = n
        return cache

    def write_chunks(self, cache, indices) -> None:
        """Write chunks ``indices`` into ``cache`` at their positions, each straight from its stored form
        (:meth:`ChunkData.into_half` for a float16 cache)."""
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)          # small copies: a second OpenMP thread on a busy core stalled them 10x
        try:
            half = cache.k.dtype == torch.float16
            k, v = (cache.k.numpy(), cache.v.numpy()) if half else (None, None)
            for i in indices:
                chunk = self.chunks[i]
                start, end = self.span(i)
                if half:
                    chunk.into_half(k, v, start)
                    continue
                values = chunk.to_tensor()
                cache.k[:, :, start:end].copy_(values[:, 0])
                cache.v[:, :, start:end].copy_(values[:, 1])
        finally:
            torch.set_num_threads(threads)

    def absorb(self, cache, new_tokens: list[int], attn_columns=None, bits: int = 8) -> list[int]:
        """Take the tokens a call added (``new_tokens``, already in ``cache`` after this context's own)
        into chunks at ``bits``; returns the indices of the chunks that changed (the open tail and new ones).

        ``attn_columns`` (the cache length,): attention the call's new tokens paid to every slot.
        """
        import torch

        old = len(self.tokens)
        if cache.length != old + len(new_tokens):
            raise WorkbenchError(f"the cache holds {cache.length} tokens, expected {old} + {len(new_tokens)}")
        self.tokens.extend(int(t) for t in new_tokens)
        n = len(self.tokens)
        self.attn_sum = np.concatenate([self.attn_sum, np.zeros(n - old)])
        self.attn_rows = np.concatenate([self.attn_rows, np.zeros(n - old)])
        if attn_columns is not None:
            self.attn_sum += np.asarray(attn_columns, dtype=np.float64)[:n]
            self.attn_rows += n - np.maximum(np.arange(n), old)          # new rows at or after each token
        first = old // self.chunk_size
        changed = list(range(first, -(-n // self.chunk_size)))
        for i in changed:
            start, end = self.span(i)
            values = torch.stack([cache.k[:, :, start:end], cache.v[:, :, start:end]], dim=1).float().numpy()
            data = encode_chunk(values, bits)
            if i < len(self.chunks):
                self.chunks[i] = data
            else:
                self.chunks.append(data)
        return changed

    def full_chunks(self) -> list[int]:
        """Chunks holding ``chunk_size`` tokens (every one but an open last one)."""
        return [i for i in range(self.num_chunks) if self.span(i)[1] - self.span(i)[0] == self.chunk_size]

    def relevel(self, targets, base_of) -> tuple[set[int], dict[int, ChunkData]]:
        """Put each chunk ``i`` of ``targets`` (index -> bits) at its level, made from its 8-bit base
        (``base_of(i)``, or the chunk itself while at 8 bits); a chunk without a base only goes down, from
        what it holds. Returns the chunks changed and, for those raised, what they held before."""
        changed, raised = set(), {}
        for i, bits in targets.items():
            held, bits = self.chunks[i], int(bits)
            if bits == held.bits:
                continue
            base = held if held.bits == LEVELS[0] else base_of(i)
            if base is None:
                if bits > held.bits:
                    continue
                base = held
            self.chunks[i] = recompress(base, bits)
            changed.add(i)
            if bits > held.bits:
                raised[i] = held
        return changed, raised

    def token_density(self, heads_times_layers: int) -> np.ndarray:
        """Per token: the mean attention it received (equation 1 before the chunk average)."""
        rows = np.maximum(self.attn_rows, 1)
        return self.attn_sum / rows / heads_times_layers

    def chunk_density(self, heads_times_layers: int) -> np.ndarray:
        """Per chunk: the mean of its tokens' density (LLMS equation 1)."""
        per_token = self.token_density(heads_times_layers)
        return np.array([per_token[slice(*self.span(i))].mean() if self.span(i)[1] > self.span(i)[0] else 0.0
                         for i in range(self.num_chunks)])
