"""Tolerance-aware compression of a served context after its call (LLMS 3.2).

Every full chunk's level is assigned anew over the whole context from its information density
(``density.assign_levels`` at the configured global ratio), up or down, and made from the chunk's 8-bit
base: in memory while the chunk is held at 8 bits, else read from its base file. The open last chunk stays
at the base level until it is full. Raising a level needs memory, which the caller grants or refuses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from workbench.kvcache.chunks import ChunkData, ChunkedKV
from workbench.kvcache.config import ServiceConfig
from workbench.kvcache.density import assign_levels
from workbench.kvcache.store import ChunkRow


@dataclass
class Releveled:
    """What :func:`relevel_context` did to a context."""
    density: np.ndarray                                      # per chunk, equation 1
    changed: set[int] = field(default_factory=set)           # chunks whose level changed
    raised: dict[int, ChunkData] = field(default_factory=dict)   # chunk -> what it held before it was raised
    bases: dict[int, ChunkData] = field(default_factory=dict)    # chunk -> its 8-bit base, to write once


def relevel_context(kv: ChunkedKV, rows: Mapping[int, ChunkRow], config: ServiceConfig, heads_times_layers: int,
                    read_base: Callable[[ChunkRow], ChunkData | None]) -> Releveled:
    """Assign the levels of ``kv``'s full chunks anew (changing ``kv.chunks`` in place) under ``config``.

    ``rows``: the index's rows of the chunks it already holds (a chunk without a row is new in this call);
    ``read_base(row)`` reads a chunk's base file (None when it is missing or damaged: that chunk can then
    only go down, from what it holds). Bases are returned for full chunks held at the base level that have
    no base file yet. Baselines that do not compress by tolerance keep every level."""
    density = kv.chunk_density(heads_times_layers)
    if config.compression != "tolerance":
        return Releveled(density)
    full = kv.full_chunks()
    if not full:
        return Releveled(density)
    bases = {i: kv.chunks[i] for i in full
             if kv.chunks[i].bits == config.base_bits and (i not in rows or rows[i].base_crc32 is None)}
    targets = dict(zip(full, assign_levels(density[full], config.levels, config.global_ratio)))
    changed, raised = kv.relevel(targets, lambda i: read_base(rows[i]) if i in rows else None)
    return Releveled(density, changed, dict(raised), bases)
