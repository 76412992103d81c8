"""A swapped-out chunk on disk: one file, layer-major, so a loader can read one layer of it at a time.

Layout: the payload (float32 or float16 values, or the codes, bit-packed below 8 bits), then for quantized
chunks the float16 minimum of every group (per key feature, then per value token, of each layer and head),
then the step. The chunk's leading axis is the layer, so
layer ``l`` of each part is one contiguous byte range (a layer holds 2 x heads x tokens x head_dim
values, a multiple of 4, so packed codes of 2 and 4 bits never straddle layers). The bit width and
shape are kept by the caller (the service's index), not in the file.

Files are written to a temporary name, flushed to disk and renamed, so a file that exists is whole.
This module is the format's one reader too: positioned reads of one layer (:func:`read_layer_bytes`),
which the loader streams layer by layer (:func:`stream_layers`) and whole reads are built from.
"""
from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np

from workbench import bitpack
from workbench.errors import CorruptArtifactError
from workbench.kvcache.chunks import RAW_BITS, ChunkData, raw_dtype, scale_shape


def layer_part_sizes(bits: int, shape: tuple[int, ...]) -> tuple[int, int]:
    """Bytes per layer of the payload and of each float16 scale array (0 when raw)."""
    per_layer = int(np.prod(shape[1:]))
    if bits in RAW_BITS:
        return bits // 8 * per_layer, 0
    payload = per_layer if bits == 8 else bitpack.packed_nbytes(per_layer, bits)
    _, heads, groups = scale_shape(shape)
    return payload, 2 * heads * groups


def file_size(bits: int, shape: tuple[int, ...]) -> int:
    payload, scales = layer_part_sizes(bits, shape)
    return shape[0] * (payload + 2 * scales)


def write_chunk(path: Path, chunk: ChunkData) -> int:
    """Write ``chunk`` atomically and durably; returns its size in bytes."""
    return write_chunk_crc(path, chunk)[0]


def write_chunk_crc(path: Path, chunk: ChunkData) -> tuple[int, int]:
    """Write ``chunk`` atomically and durably; returns its size in bytes and the file's CRC-32, taken from the
    same buffers as they are written (each part goes out from its array, neither copied nor read back)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    parts = [chunk.payload] if chunk.low is None else [chunk.payload, chunk.low, chunk.step]
    crc = 0
    with open(tmp, "wb", buffering=0) as handle:
        for part in parts:
            view = memoryview(np.ascontiguousarray(part)).cast("B")
            crc = zlib.crc32(view, crc)
            while view:
                view = view[handle.write(view):]
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return file_size(chunk.bits, chunk.shape), crc


class DamagedChunkFileError(CorruptArtifactError):
    """Swap files of these chunks failed their size or CRC-32 check; ``chunks`` maps index -> what was wrong."""

    def __init__(self, chunks: dict[int, str]):
        self.chunks = dict(chunks)
        super().__init__("damaged swap files: " + "; ".join(f"chunk {i}: {why}" for i, why in sorted(self.chunks.items())))


def check_file_size(path: Path, data: bytes | int, bits: int, shape) -> None:
    """A swap file's size (or its bytes) must be what its level and shape make; else it is damaged."""
    size = data if isinstance(data, int) else len(data)
    if size != file_size(bits, shape):
        raise CorruptArtifactError(f"swap file {path} holds {size} bytes, expected {file_size(bits, shape)} "
                                   f"for a {bits}-bit chunk of shape {tuple(shape)}")


def read_chunk(path: Path, bits: int, shape: tuple[int, ...]) -> ChunkData:
    """The whole chunk back, as written."""
    return read_chunk_layers([(path, bits, tuple(shape))])[0]


def read_layer(handle, bits: int, shape: tuple[int, ...], layer: int) -> np.ndarray:
    """Layer ``layer`` of a chunk file opened as ``handle`` (binary), as float32 (2, heads, tokens, head_dim):
    three positioned reads (one when raw), nothing else of the file."""
    return stack_layers(bits, tuple(shape[1:]), [read_layer_bytes(handle, bits, shape, layer)]).to_array()[0]


LayerBytes = tuple[bytes, bytes, bytes]
"""One layer of a swap file as stored: payload, group minimum and group step (both empty when raw)."""


def read_layer_bytes(handle, bits: int, shape: tuple[int, ...], layer: int,
                     sizes: tuple[int, int] | None = None) -> LayerBytes:
    """Layer ``layer`` of the swap file of a chunk of ``shape`` opened as ``handle``: three positioned reads.
    ``sizes``: bytes per layer of the payload and of each scale array, when the caller has them."""
    payload_bytes, scale_bytes = sizes or layer_part_sizes(bits, shape)
    layers, fd = shape[0], handle.fileno()

    def read(nbytes: int, offset: int) -> bytes:
        raw = os.pread(fd, nbytes, offset)
        if len(raw) != nbytes:
            raise CorruptArtifactError(f"swap file {getattr(handle, 'name', fd)} is short at layer {layer}")
        return raw

    payload = read(payload_bytes, layer * payload_bytes)
    if bits in RAW_BITS:
        return payload, b"", b""
    base = layers * payload_bytes
    return (payload, read(scale_bytes, base + layer * scale_bytes),
            read(scale_bytes, base + (layers + layer) * scale_bytes))


def stack_layers(bits: int, layer_shape: tuple[int, ...], parts: list[LayerBytes]) -> ChunkData:
    """A chunk whose leading axis runs over ``parts``, each one layer (2, kv_heads, tokens, head_dim) as stored:
    a file's layers in order give the file's chunk; one layer of several same-shaped files gives them all at
    once, so one ``to_array`` dequantizes the lot."""
    shape = (len(parts), *layer_shape)
    payload = b"".join(p[0] for p in parts)
    if bits in RAW_BITS:
        writable = np.frombuffer(payload, raw_dtype(bits)).copy()       # torch warns on read-only arrays
        return ChunkData(bits=bits, shape=shape, payload=writable)
    scales = scale_shape(shape)
    return ChunkData(bits=bits, shape=shape, payload=np.frombuffer(payload, np.uint8),
                     low=np.frombuffer(b"".join(p[1] for p in parts), np.float16).reshape(scales),
                     step=np.frombuffer(b"".join(p[2] for p in parts), np.float16).reshape(scales))


COLD_READS = hasattr(os, "posix_fadvise")
"""Whether swap files can be dropped from the page cache before they are read (so reads come from disk)."""


def stream_layers(files, cold: bool = False):
    """Yield, layer after layer, ``(layer, parts, values)`` for swap files ``(path, bits, shape)``: each file's
    stored layer (:data:`LayerBytes`) and its float32 K/V (2, kv_heads, tokens, head_dim). Files of one level
    and shape are dequantized together. ``cold``: each file is first dropped from the page cache
    (``posix_fadvise(DONTNEED)``, where the platform has it)."""
    files = list(files)
    groups: dict[tuple, list[int]] = {}
    for n, (path, bits, shape) in enumerate(files):
        check_file_size(path, Path(path).stat().st_size, bits, shape)
        groups.setdefault((bits, tuple(shape[1:])), []).append(n)
    sizes = [layer_part_sizes(bits, shape) for _, bits, shape in files]
    handles = [open(path, "rb", buffering=0) for path, _, _ in files]
    try:
        for handle in handles if cold and COLD_READS else ():
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        for layer in range(files[0][2][0] if files else 0):
            parts = [read_layer_bytes(h, bits, shape, layer, size)
                     for h, (_, bits, shape), size in zip(handles, files, sizes)]
            values: list[np.ndarray | None] = [None] * len(files)
            for (bits, layer_shape), members in groups.items():
                with np.errstate(invalid="ignore", over="ignore"):    # a damaged file's scales: its CRC says so
                    stacked = stack_layers(bits, layer_shape, [parts[n] for n in members]).to_array()
                for row, n in enumerate(members):
                    values[n] = stacked[row]
            yield layer, parts, values
    finally:
        for h in handles:
            h.close()


def read_chunk_layers(files, cold: bool = False) -> list[ChunkData]:
    """Read whole swap files ``(path, bits, shape)`` layer by layer, as the loader's IO thread does."""
    files = list(files)
    per_file: list[list[LayerBytes]] = [[] for _ in files]
    for _, parts, _ in stream_layers(files, cold):
        for collected, part in zip(per_file, parts):
            collected.append(part)
    return [stack_layers(bits, tuple(shape[1:]), layers) for (_, bits, shape), layers in zip(files, per_file)]
