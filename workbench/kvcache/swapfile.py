"""A swapped-out chunk on disk: one file, layer-major, so a loader can read one layer of it at a time.

Layout: the payload (float32 values, or the codes, bit-packed below 8 bits), then for quantized
chunks the float16 per-channel minimum, then the step. The chunk's leading axis is the layer, so
layer ``l`` of each part is one contiguous byte range (a layer holds 2 x heads x tokens x head_dim
values, a multiple of 4, so packed codes of 2 and 4 bits never straddle layers). The bit width and
shape are kept by the caller (the service's index), not in the file.

Files are written to a temporary name, flushed to disk and renamed, so a file that exists is whole.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from workbench import bitpack
from workbench.errors import CorruptArtifactError
from workbench.kvcache.chunks import FLOAT_BITS, ChunkData


def layer_part_sizes(bits: int, shape: tuple[int, ...]) -> tuple[int, int]:
    """Bytes per layer of the payload and of each float16 channel array (0 when raw)."""
    per_layer = int(np.prod(shape[1:]))
    if bits == FLOAT_BITS:
        return 4 * per_layer, 0
    payload = per_layer if bits == 8 else bitpack.packed_nbytes(per_layer, bits)
    return payload, 2 * (per_layer // shape[3])


def file_size(bits: int, shape: tuple[int, ...]) -> int:
    payload, channels = layer_part_sizes(bits, shape)
    return shape[0] * (payload + 2 * channels)


def write_chunk(path: Path, chunk: ChunkData) -> int:
    """Write ``chunk`` atomically and durably; returns its size in bytes."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    parts = [chunk.payload] if chunk.low is None else [chunk.payload, chunk.low, chunk.step]
    with open(tmp, "wb") as handle:
        for part in parts:
            handle.write(np.ascontiguousarray(part).tobytes())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return file_size(chunk.bits, chunk.shape)


def check_file_size(path: Path, data: bytes | int, bits: int, shape) -> None:
    """A swap file's size (or its bytes) must be what its level and shape make; else it is damaged."""
    size = data if isinstance(data, int) else len(data)
    if size != file_size(bits, shape):
        raise CorruptArtifactError(f"swap file {path} holds {size} bytes, expected {file_size(bits, shape)} "
                                   f"for a {bits}-bit chunk of shape {tuple(shape)}")


def read_chunk(path: Path, bits: int, shape: tuple[int, ...]) -> ChunkData:
    """The whole chunk back, as written."""
    data = Path(path).read_bytes()
    check_file_size(path, data, bits, shape)
    payload_l, channels_l = layer_part_sizes(bits, shape)
    layers = shape[0]
    if bits == FLOAT_BITS:
        return ChunkData(bits=bits, shape=tuple(shape), payload=np.frombuffer(data, np.float32).copy())
    p = layers * payload_l
    c = layers * channels_l
    cshape = (shape[0], shape[1], shape[2], 1, shape[4])
    return ChunkData(bits=bits, shape=tuple(shape), payload=np.frombuffer(data[:p], np.uint8).copy(),
                     low=np.frombuffer(data[p:p + c], np.float16).reshape(cshape).copy(),
                     step=np.frombuffer(data[p + c:p + 2 * c], np.float16).reshape(cshape).copy())


def read_layer(handle, bits: int, shape: tuple[int, ...], layer: int) -> np.ndarray:
    """Layer ``layer`` of a chunk file opened as ``handle`` (binary), as float32 (2, heads, tokens, head_dim):
    three positioned reads (one when raw), nothing else of the file."""
    payload_l, channels_l = layer_part_sizes(bits, shape)
    layers = shape[0]
    fd = handle.fileno()
    lshape = tuple(shape[1:])
    raw = os.pread(fd, payload_l, layer * payload_l)
    if len(raw) != payload_l:
        raise CorruptArtifactError(f"swap file {getattr(handle, 'name', fd)} is short at layer {layer}")
    if bits == FLOAT_BITS:
        return np.frombuffer(raw, np.float32).reshape(lshape).copy()
    base = layers * payload_l
    cshape = (shape[1], shape[2], 1, shape[4])
    low = np.frombuffer(os.pread(fd, channels_l, base + layer * channels_l), np.float16).reshape(cshape)
    step = np.frombuffer(os.pread(fd, channels_l, base + layers * channels_l + layer * channels_l),
                         np.float16).reshape(cshape)
    count = int(np.prod(lshape))
    codes = np.frombuffer(raw, np.uint8) if bits == 8 else bitpack.unpack_bits(np.frombuffer(raw, np.uint8),
                                                                             count, bits)
    return codes.reshape(lshape).astype(np.float32) * step.astype(np.float32) + low.astype(np.float32)
