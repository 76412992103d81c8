"""Exact recompute of any set of missing chunks from their token ids and the chunks still held (LLMS 3.3).

Chunks are swapped out independently, so the ones to rebuild are interleaved with ones still in
memory. Per layer, the missing tokens' K and V are projected at their *global* positions (the
rotary encoding sees the position each token had in the context, not its rank among the missing
ones) and inserted among the present chunks' K/V of that layer; the layer then runs for the
missing tokens only, each attending to every slot whose position is <= its own (the causal mask
over the original positions). The result is the K/V a full forward pass would have produced,
given the values the present chunks hold: exact for chunks kept raw, and for quantized ones what
the service itself would compute on top of their dequantized values.

A missing token never attends to a later one, so chunks after the last missing one are not
needed. :class:`LayerRecompute` does one layer per call, so a loader can interleave it with
reading other chunks' layers; :func:`recompute_chunks` runs it over all layers.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch

from workbench.errors import WorkbenchError
from workbench.kvcache.chunks import ChunkedKV, check_bits, encode_at_level

DEFAULT_BITS = 8
"""Level of a recomputed chunk that was not in memory and whose swapped level is not given."""


def chunk_bits(kv: ChunkedKV, chunks: Iterable[int], bits: int | Mapping[int, int] | None) -> dict[int, int]:
    """The level each of ``chunks`` is stored at after recompute: ``bits`` (one int, or per chunk), else the
    level the chunk holds now, else :data:`DEFAULT_BITS`."""
    out = {}
    for i in chunks:
        if isinstance(bits, int):
            level = bits
        elif bits is not None and i in bits:
            level = bits[i]
        elif kv.chunks[i] is not None:
            level = kv.chunks[i].bits
        else:
            level = DEFAULT_BITS
        out[i] = check_bits(int(level))
    return out


class LayerRecompute:
    """Rebuilds chunks ``missing`` of ``kv`` one layer per :meth:`step`.

    ``needed`` lists the other chunks whose K/V each step must be given: those before the last
    missing chunk (later ones cannot be attended to by a missing token).
    """

    @torch.no_grad()
    def __init__(self, model, tokens, kv: ChunkedKV, missing: Iterable[int]):
        if len(tokens) != len(kv.tokens):
            raise WorkbenchError(f"the context holds {len(kv.tokens)} tokens, {len(tokens)} token ids given")
        self.model, self.kv = model, kv
        self.missing = sorted({int(i) for i in missing})
        bad = [i for i in self.missing if not 0 <= i < kv.num_chunks]
        if bad:
            raise WorkbenchError(f"chunks {bad} do not exist; the context has {kv.num_chunks} chunks")
        last = self.missing[-1] if self.missing else -1
        self.needed = [i for i in range(last) if i not in set(self.missing)]
        self.end = kv.span(last)[1] if self.missing else 0
        slots = [np.arange(*kv.span(i)) for i in self.missing]
        self.positions = torch.from_numpy(np.concatenate(slots) if slots else np.zeros(0, np.int64))   # (T,)
        ids = torch.tensor([int(tokens[p]) for p in self.positions.tolist()], dtype=torch.long)
        self.hidden = model.embed(ids)                                                          # (T, d)
        self.layer = 0

    @property
    def num_layers(self) -> int:
        return len(self.model.layers)

    @torch.no_grad()
    def step(self, context: Mapping[int, np.ndarray | torch.Tensor]) -> torch.Tensor:
        """Run the next layer; ``context[i]`` is chunk i's K/V of that layer (2, kv_heads, tokens, head_dim)
        for every chunk in ``needed``. Returns the missing tokens' K/V of the layer (2, kv_heads, T, head_dim)."""
        if self.layer >= self.num_layers:
            raise WorkbenchError(f"all {self.num_layers} layers are already recomputed")
        absent = [i for i in self.needed if i not in context]
        if absent:
            raise WorkbenchError(f"layer {self.layer} needs the K/V of chunks {absent}")
        layer, kv = self.model.layers[self.layer], self.kv
        k_new, v_new = layer.project_kv(self.hidden, self.positions)                           # (H, T, dh)
        keys = torch.empty((kv.kv_heads, self.end, kv.head_dim), dtype=k_new.dtype)          # (H, S, dh)
        values = torch.empty_like(keys)
        for i in self.needed:
            start, end = kv.span(i)
            held = torch.as_tensor(context[i])
            keys[:, start:end], values[:, start:end] = held[0], held[1]
        keys[:, self.positions], values[:, self.positions] = k_new, v_new
        self.layer += 1
        if self.layer < self.num_layers:                # the last layer's output feeds nothing we keep
            self.hidden = layer(self.hidden, self.positions, keys, values, torch.arange(self.end))
        return torch.stack([k_new, v_new])

    def chunk_arrays(self, per_layer: list[torch.Tensor]) -> dict[int, np.ndarray]:
        """Split the steps' outputs (one per layer) into each missing chunk's K/V
        (layers, 2, kv_heads, tokens, head_dim)."""
        stacked = torch.stack(per_layer).numpy()                                          # (L, 2, H, T, dh)
        out, offset = {}, 0
        for i in self.missing:
            start, end = self.kv.span(i)
            out[i] = stacked[:, :, :, offset:offset + end - start]
            offset += end - start
        return out


def held_layers(kv: ChunkedKV, chunks: Iterable[int]) -> dict[int, np.ndarray]:
    """Dequantized K/V (layers, 2, kv_heads, tokens, head_dim) of in-memory ``chunks``, to feed
    :meth:`LayerRecompute.step`."""
    absent = [i for i in chunks if kv.chunks[i] is None]
    if absent:
        raise WorkbenchError(f"chunks {absent} are neither in memory nor to be recomputed; load them first")
    return {i: kv.chunks[i].to_array() for i in chunks}


@torch.no_grad()
def recompute_chunks(model, tokens, kv: ChunkedKV, missing: Iterable[int],
                     bits: int | Mapping[int, int] | None = None) -> ChunkedKV:
    """Rebuild chunks ``missing`` of ``kv`` in place from ``tokens`` and the chunks it holds; returns ``kv``.

    Each rebuilt chunk is stored at ``bits`` (one level, or a mapping chunk -> level), by default the
    level it holds now or :data:`DEFAULT_BITS` for a chunk not in memory. Every chunk before the last
    missing one must be in memory or missing.
    """
    job = LayerRecompute(model, tokens, kv, missing)
    if not job.missing:
        return kv
    levels = chunk_bits(kv, job.missing, bits)
    held = held_layers(kv, job.needed)
    outputs = [job.step({i: a[n] for i, a in held.items()}) for n in range(job.num_layers)]
    for i, array in job.chunk_arrays(outputs).items():
        kv.chunks[i] = encode_at_level(array, levels[i])
    return kv
