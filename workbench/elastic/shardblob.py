"""The bytes of one shard version (a *blob*): the one place that knows their layout.

A shard's weights are its :data:`~workbench.models.encoder.SHARD_KEYS` matrices
flattened and concatenated (:func:`flatten_shard`), ``count`` float32 values. Its
blob at ``bits`` = 32 is those values as raw float32. At k < 32 bits it is::

    packed indexes      ceil(count * k / 8) bytes   (workbench.bitpack layout)
    centroids           2^k float32
    outlier positions   c int32, ascending
    outlier values      c float32

so ``c`` follows from the blob's size. Everything is little-endian. The store writes
and reads blobs only through this module; its manifest records each blob's size.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.bitpack import decompress, packed_nbytes

FP32 = 32
"""The bitwidth of a shard's unquantized version (its blob is raw float32)."""


@dataclass(frozen=True)
class ShardBlob:
    """A k-bit blob's parts, as read-only views of its bytes where parsed from one."""
    bits: int
    count: int                 # weights in the shard
    packed: np.ndarray         # uint8, packed_nbytes(count, bits)
    centroids: np.ndarray      # float32, 2**bits
    outlier_pos: np.ndarray    # int32, ascending
    outlier_val: np.ndarray    # float32

    def to_bytes(self) -> bytes:
        return b"".join([np.ascontiguousarray(self.packed, np.uint8).tobytes(),
                         np.asarray(self.centroids, np.float32).tobytes(),
                         np.asarray(self.outlier_pos, np.int32).tobytes(),
                         np.asarray(self.outlier_val, np.float32).tobytes()])

    def decode(self, out: np.ndarray | None = None, num_threads: int | None = None) -> np.ndarray:
        """The shard's float32 weights, written into ``out`` if given."""
        out = np.empty(self.count, np.float32) if out is None else out
        return decompress(self.packed, self.bits, self.centroids, self.outlier_pos, self.outlier_val, out,
                          num_threads)


def flatten_shard(shard: dict) -> np.ndarray:
    """A shard's matrices (``{key: tensor}``, as ``EncoderLayer.shard`` returns) as one float32 vector."""
    from workbench.models.encoder import SHARD_KEYS

    return np.concatenate([shard[k].detach().cpu().numpy().astype(np.float32).ravel() for k in SHARD_KEYS])


def blob_nbytes(count: int, bits: int, outliers: int = 0) -> int:
    """Size of the blob of a ``count``-weight shard at ``bits`` with ``outliers`` outliers."""
    if bits == FP32:
        return 4 * count
    return packed_nbytes(count, bits) + 4 * (1 << bits) + 8 * outliers


def quantized_blob(q) -> ShardBlob:
    """The blob of a 1-D :class:`~workbench.elastic.quantize.QuantizedTensor` (one shard's slice)."""
    return ShardBlob(q.bits, q.size, q.packed(), q.centroids.astype(np.float32), q.outlier_pos.astype(np.int32),
                     q.outlier_val.astype(np.float32))


def encode_fp32(weights: np.ndarray) -> bytes:
    """The 32-bit blob of a shard's flat weights."""
    return np.ascontiguousarray(weights, dtype=np.float32).tobytes()


def parse_blob(blob: bytes, count: int, bits: int) -> ShardBlob:
    """The parts of a ``count``-weight shard's ``bits``-bit blob (views of ``blob``, no copy)."""
    if bits == FP32:
        raise ValueError("a 32-bit blob is raw float32 weights; it has no parts (use decode_blob)")
    raw = np.frombuffer(blob, dtype=np.uint8)
    head = blob_nbytes(count, bits)
    outliers, rest = divmod(raw.size - head, 8)
    if outliers < 0 or rest:
        raise ValueError(f"a {bits}-bit blob of {count} weights has {head} + 8 * outliers bytes, not {raw.size}")
    p, c = packed_nbytes(count, bits), head + 4 * outliers
    return ShardBlob(bits, count, raw[:p], raw[p:head].view(np.float32), raw[head:c].view(np.int32),
                     raw[c:].view(np.float32))


def decode_blob(blob: bytes, count: int, bits: int, out: np.ndarray | None = None,
                num_threads: int | None = None) -> np.ndarray:
    """A blob -> the shard's flat float32 weights, written into ``out`` (a working buffer) if given."""
    if bits != FP32:
        return parse_blob(blob, count, bits).decode(out, num_threads)
    weights = np.frombuffer(blob, dtype=np.float32)
    if weights.size != count:
        raise ValueError(f"a 32-bit blob of {count} weights has {4 * count} bytes, not {len(blob)}")
    if out is None:
        return weights.copy()
    out[:] = weights
    return out
