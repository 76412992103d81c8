"""Tolerance-aware compression: how much a chunk can be compressed, and which level each chunk gets.

Information density (LLMS equation 1): a token that the tokens after it attend to strongly carries
information. Its density is the mean of its column of the causal attention matrix over the rows
that can attend to it (itself and every later token), averaged over heads and layers; a chunk's
density is the mean over its tokens.

Level assignment (equation 3, read for its stated intent): denser chunks keep more bits, and the
context's mean compression ratio (bits / 8) meets the global ratio as exactly as the chunk count
allows without exceeding it. Among the level counts that do, the one that disturbs attention least
wins. A chunk quantized at b bits adds noise of power proportional to (2^b - 1)^-2 (the squared
step of a group's range); a query reads the chunk's values weighted by the attention it pays
them, so to first order the chunk adds noise of power density^2 x (2^b - 1)^-2 to what attention
returns. :func:`assign_levels` minimises the sum over chunks (:func:`context_noise`).

The equation as printed weights density by 1 / ratio, which would reward compressing dense chunks
hardest; read with the weight ratio instead, the objective is linear in the level counts and always
picks the extremes (8 and 2 bits, no 4), which measured worse than static 4-bit at equal bytes on
the shipped decoder (held-out perplexity 30.17 against 29.28). The noise objective keeps most
chunks at 4 bits, spends 8 bits on the few chunks attention leans on (the first, where attention
sinks, and the most recent) and 2 bits on the sparsest: 29.07 (``workbench bench llms``).
"""
from __future__ import annotations

import numpy as np

from workbench.errors import WorkbenchError

BASE_BITS = 8


def information_density(attn: np.ndarray, chunk_size: int) -> np.ndarray:
    """Per-chunk density from causal attention probabilities ``attn`` (..., R, C) with R == C tokens;
    the leading axes (layers, heads) are averaged."""
    attn = np.asarray(attn, dtype=np.float64)
    if attn.ndim < 2 or attn.shape[-1] != attn.shape[-2]:
        raise WorkbenchError(f"attention must end in (tokens, tokens), got shape {attn.shape}")
    if chunk_size < 1:
        raise WorkbenchError(f"a chunk holds at least one token, got chunk size {chunk_size}")
    n = attn.shape[-1]
    per_column = attn.reshape(-1, n, n).mean(0).sum(0) / (n - np.arange(n))       # rows col..n-1 can attend
    return np.array([per_column[s:s + chunk_size].mean() for s in range(0, n, chunk_size)])


def _ratios(levels) -> np.ndarray:
    return np.asarray(levels, dtype=np.float64) / BASE_BITS


def level_noise(bits) -> np.ndarray:
    """Relative noise power of linear quantization at ``bits``: the squared step, (2^b - 1)^-2."""
    return (2.0 ** np.asarray(bits, dtype=np.float64) - 1.0) ** -2


def assign_levels(density, levels=(8, 4, 2), global_ratio: float = 0.5) -> np.ndarray:
    """Bits per chunk: the mean ratio as close to ``global_ratio`` as the chunk count allows (never above
    it), then the least attention noise (:func:`context_noise`); denser chunks never get fewer bits.

    Ties in density keep chunk order (earlier chunks first)."""
    density = np.asarray(density, dtype=np.float64)
    levels = sorted({int(b) for b in levels}, reverse=True)
    if not levels or any(b < 1 or b > BASE_BITS for b in levels):
        raise WorkbenchError(f"levels are bit widths from 1 to {BASE_BITS}, got {levels}")
    ratios = _ratios(levels)
    if not ratios[-1] - 1e-12 <= global_ratio <= ratios[0] + 1e-12:
        raise WorkbenchError(f"a global ratio of {global_ratio:g} is outside what levels {levels} can reach "
                             f"({ratios[-1]:g} to {ratios[0]:g})")
    if not np.all(np.isfinite(density)) or np.any(density < 0):
        raise WorkbenchError("information densities are finite and not negative")
    n = len(density)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(-density, kind="stable")
    prefix = np.concatenate([[0.0], np.cumsum(density[order] ** 2)])   # weight of a run of the sorted chunks
    counts = _compositions(n, len(levels))                             # (options, levels)
    total = counts @ ratios
    feasible = total <= global_ratio * n + 1e-9
    counts, total = counts[feasible], total[feasible]
    ends = np.cumsum(counts, axis=1)
    noise = ((prefix[ends] - prefix[ends - counts]) * level_noise(levels)).sum(axis=1)
    gap = np.round(global_ratio * n - total, 9)
    best = np.lexsort((noise, gap))[0]                 # smallest gap to the target, then the least noise
    bits = np.empty(n, dtype=np.int64)
    bits[order] = np.repeat(levels, counts[best])
    return bits


def _compositions(n: int, parts: int) -> np.ndarray:
    """Every way to write n as an ordered sum of ``parts`` non-negative counts, one per row."""
    if parts == 1:
        return np.array([[n]], dtype=np.int64)
    heads = np.stack(np.meshgrid(*[np.arange(n + 1)] * (parts - 1), indexing="ij"), -1).reshape(-1, parts - 1)
    heads = heads[heads.sum(1) <= n]
    return np.column_stack([heads, n - heads.sum(1)])


def context_noise(density, bits) -> float:
    """Attention noise of a context whose chunks have ``density`` and sit at ``bits``: sum of density^2 x
    :func:`level_noise` (lower keeps more; the objective :func:`assign_levels` minimises)."""
    density = np.asarray(density, dtype=np.float64)
    return float(np.dot(density ** 2, level_noise(bits)))
