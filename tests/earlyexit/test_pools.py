"""Deployments as pools of replicas: analytic capacity with and without exits, and disabled ramps."""
from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.earlyexit.batchprofile import BatchProfile
from workbench.earlyexit.pools import Pool, pool_capacity

approx = pytest.approx


def test_pools_capacity_exits_and_disabled_ramps():
    layer_s = lambda k, b, g: 1e-3 * b + 1e-3                      # noqa: E731
    pool = Pool(((0, 2),), (3,), (4,), ("x",), ramps=False)
    profile = BatchProfile((0.5, 0.0))
    assert pool_capacity(pool, profile, layer_s) == approx(3 * 4 / (2 * 5e-3))   # nobody leaves: full batches
    assert list(pool.exit_layers(np.array([0, 1]))) == [1, 1]
    # with exits, half the batch runs layer 1: the expected time over Binomial(4, 1/2) survivors
    shrinking = Pool(((0, 2),), (1,), (4,), ("x",))
    expected = 5e-3 + sum(math.comb(4, n) / 16 * (1e-3 * n + 1e-3) for n in range(1, 5))
    assert pool_capacity(shrinking, profile, layer_s) == approx(4 / expected)
    split = Pool(((0, 2), (2, 4)), (1, 1), (2, 2), ("x", "x"), ramps=frozenset({0, 1}))
    assert list(split.exit_layers(np.arange(4))) == [0, 1, 3, 3]      # ramp 2 off: its samples leave at 3
