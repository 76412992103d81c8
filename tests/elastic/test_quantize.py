import numpy as np
import pytest

from workbench.elastic.quantize import gobo_quantize, outlier_mask, relative_error


@pytest.fixture(scope="module")
def weights():
    rng = np.random.default_rng(0)
    w = rng.normal(0.0, 0.05, 20_000).astype(np.float32)
    w[[5, 500, 5000]] = [1.5, -2.0, 0.9]          # clear outliers
    return w


def test_outliers_are_kept_exactly_and_follow_the_likelihood_rule(weights):
    q = gobo_quantize(weights, 3)
    assert {5, 500, 5000} <= set(q.outlier_pos.tolist())
    np.testing.assert_array_equal(q.dequantize()[q.outlier_pos], weights[q.outlier_pos])
    np.testing.assert_array_equal(np.flatnonzero(outlier_mask(weights)), q.outlier_pos)
    assert q.outlier_fraction < 0.01


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6])
def test_clusters_have_equal_population_and_mean_centroids(weights, bits):
    q = gobo_quantize(weights, bits)
    inliers = np.setdiff1d(np.arange(weights.size), q.outlier_pos)
    counts = np.bincount(q.indexes[inliers], minlength=1 << bits)
    assert counts.max() - counts.min() <= 1
    for j in (0, (1 << bits) - 1):
        members = inliers[q.indexes[inliers] == j]
        assert q.centroids[j] == pytest.approx(weights[members].mean(), rel=1e-5)
    assert np.all(np.diff(q.centroids) > 0)


def test_error_falls_with_bits(weights):
    errors = [relative_error(weights, gobo_quantize(weights, b).dequantize()) for b in (2, 3, 4, 5, 6)]
    assert errors == sorted(errors, reverse=True) and errors[-1] < 0.1   # equal-population tails are wide


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="bits must be an integer in 1..8"):
        gobo_quantize(np.ones(10), 0)
    with pytest.raises(ValueError, match="finite"):
        gobo_quantize(np.array([1.0, np.nan]), 2)
