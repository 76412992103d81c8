"""Gaussian outlier-aware dictionary quantization (GOBO), as WRX applies it per layer.

All weights of a layer are fitted with a one-component Gaussian (scikit-learn's
``GaussianMixture``); weights whose log-likelihood falls below ``threshold`` are
*outliers* and kept exactly as (position, fp32 value). The others are sorted and
cut into 2^k clusters of equal population, each represented by its mean (the
*centroid*), so a weight becomes a k-bit index. Outliers also hold an index slot
(0), which keeps the index stream's layout independent of them.

:func:`decompress_reference` is the NumPy twin of the Cython kernel
``workbench._ext.decompress``; the tests require them to agree bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.bitpack import decompress_reference, pack_bits  # noqa: F401  (decompress_reference: public here)

BITWIDTHS = (2, 3, 4, 5, 6)
"""The compressed versions WRX stores beside the fp32 one (k = 32)."""


@dataclass(frozen=True)
class QuantizedTensor:
    """A weight array as k-bit indexes into ``centroids`` plus exact outliers."""
    shape: tuple[int, ...]
    bits: int
    centroids: np.ndarray      # (2**bits,) float32, ascending
    indexes: np.ndarray        # (size,) uint8, one per weight in C order (outliers: 0)
    outlier_pos: np.ndarray    # (c,) int64 flat positions
    outlier_val: np.ndarray    # (c,) float32 original values

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def outlier_fraction(self) -> float:
        return self.outlier_pos.size / max(1, self.size)

    def dequantize(self) -> np.ndarray:
        """The float32 array this tensor stands for (same shape as the original)."""
        out = self.centroids[self.indexes]
        out[self.outlier_pos] = self.outlier_val
        return out.reshape(self.shape)

    def packed(self) -> np.ndarray:
        return pack_bits(self.indexes, self.bits)

    def select(self, start: int, stop: int) -> "QuantizedTensor":
        """The flat slice [start, stop) as its own tensor, sharing this tensor's centroids."""
        keep = (self.outlier_pos >= start) & (self.outlier_pos < stop)
        return QuantizedTensor((stop - start,), self.bits, self.centroids, self.indexes[start:stop],
                               self.outlier_pos[keep] - start, self.outlier_val[keep])


def outlier_mask(weights: np.ndarray, threshold: float = -4.0) -> np.ndarray:
    """True where a weight's log-likelihood under a 1-component Gaussian fit is below ``threshold``."""
    from sklearn.mixture import GaussianMixture

    flat = np.asarray(weights, dtype=np.float64).reshape(-1, 1)
    gmm = GaussianMixture(n_components=1, covariance_type="full", random_state=0).fit(flat)
    return gmm.score_samples(flat) < threshold


def inlier_order(weights: np.ndarray, outliers: np.ndarray) -> np.ndarray:
    """Flat positions of the non-outlier weights in ascending order of value (stable)."""
    flat = np.asarray(weights, dtype=np.float32).reshape(-1)
    inliers = np.flatnonzero(~np.asarray(outliers, dtype=bool).reshape(-1))
    return inliers[np.argsort(flat[inliers], kind="stable")]


def gobo_quantize(weights: np.ndarray, bits: int, threshold: float = -4.0,
                  outliers: np.ndarray | None = None, order: np.ndarray | None = None) -> QuantizedTensor:
    """Quantize ``weights`` (any shape) to ``bits``-bit indexes with GOBO's outlier rule.

    ``outliers`` may pass a precomputed :func:`outlier_mask` and ``order`` the matching
    :func:`inlier_order`; neither depends on ``bits``, so a caller quantizing one layer
    at k = 2..6 fits the Gaussian and sorts once.
    """
    if not isinstance(bits, (int, np.integer)) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an integer in 1..8, got {bits!r}")
    w = np.asarray(weights, dtype=np.float32)
    if w.size == 0 or not np.isfinite(w).all():
        raise ValueError("weights must be a non-empty array of finite numbers")
    flat = w.reshape(-1)
    mask = outlier_mask(flat, threshold) if outliers is None else np.asarray(outliers, dtype=bool).reshape(-1)
    if mask.shape != flat.shape:
        raise ValueError(f"outlier mask has {mask.size} entries for {flat.size} weights")
    order = inlier_order(flat, mask) if order is None else np.asarray(order)
    clusters = 1 << bits
    if order.size < clusters:
        raise ValueError(f"{order.size} non-outlier weights cannot fill {clusters} clusters")
    # equal population: cluster j takes sorted positions [bounds[j], bounds[j+1])
    bounds = (np.arange(clusters + 1) * order.size) // clusters
    indexes = np.zeros(flat.size, dtype=np.uint8)
    centroids = np.empty(clusters, dtype=np.float32)
    for j in range(clusters):
        members = order[bounds[j]:bounds[j + 1]]
        indexes[members] = j
        centroids[j] = flat[members].astype(np.float64).mean()
    pos = np.flatnonzero(mask).astype(np.int64)
    return QuantizedTensor(w.shape, int(bits), centroids, indexes, pos, flat[pos].copy())


def relative_error(original: np.ndarray, approx: np.ndarray) -> float:
    """Relative Frobenius error ||a - o|| / ||o||."""
    original = np.asarray(original, dtype=np.float64)
    return float(np.linalg.norm(np.asarray(approx, dtype=np.float64) - original) / np.linalg.norm(original))
