"""Batch profiles and their ARIMA forecast (E3 §3.1) on synthetic series whose next value is known."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from workbench.earlyexit.batchprofile import BatchProfile, BatchProfileEstimator, split_windows
from workbench.errors import WorkbenchError


# -- BatchProfile ----------------------------------------------------------------------------------

def test_from_exit_layers_counts_who_is_left_after_each_ramp():
    # 8 samples on a 4-layer model: 2 leave at layer 0, 1 at layer 1, none at 2, 5 run it all (layer 3)
    p = BatchProfile.from_exit_layers([0, 0, 1, 3, 3, 3, 3, 3], 4)
    assert p.remaining == (6 / 8, 5 / 8, 5 / 8, 0.0)
    assert p[1] == 5 / 8 and len(p) == 4 and list(p) == list(p.remaining)
    assert p.entering(0) == 1.0 and p.entering(3) == 5 / 8
    assert p.exit_fractions() == pytest.approx((2 / 8, 1 / 8, 0.0, 5 / 8))
    assert p.batch_sizes(16) == pytest.approx((16, 12, 10, 10))


def test_from_batch_sizes_is_the_papers_figure_1_reading():
    # input batch 16, batch size seen after each ramp
    p = BatchProfile.from_batch_sizes([16, 12, 8, 8], 16)
    assert p.remaining == (1.0, 0.75, 0.5, 0.5)


@pytest.mark.parametrize("values, match", [
    ((), "one fraction per layer"),
    ((1.2, 0.5), r"entry 0 is 1.2.*\[0, 1\]"),
    ((0.5, -0.1), r"entry 1 is -0.1"),
    ((0.5, float("nan")), "entry 1 is nan"),
    ((0.5, 0.7, 0.2), "increases at layer 1"),
    (("a",), "sequence of fractions"),
])
def test_invalid_profiles_are_refused_clearly(values, match):
    with pytest.raises(WorkbenchError, match=match):
        BatchProfile(values)


def test_bad_exit_layers_are_refused():
    with pytest.raises(WorkbenchError, match="outside the model's layers 0..3"):
        BatchProfile.from_exit_layers([0, 4], 4)
    with pytest.raises(WorkbenchError, match="no exit layers"):
        BatchProfile.from_exit_layers([], 4)
    with pytest.raises(WorkbenchError, match="num_layers"):
        BatchProfile.from_exit_layers([0], 0)


def test_nearest_projects_onto_valid_profiles():
    assert BatchProfile.nearest([1.3, 0.4, 0.6, -0.2]).remaining == pytest.approx((1.0, 0.5, 0.5, 0.0))
    assert BatchProfile.nearest([0.9, 0.5]).remaining == (0.9, 0.5)  # already valid: unchanged


def test_sampled_exits_follow_the_profile():
    p = BatchProfile((0.5, 0.25, 0.25, 0.0))
    exits = p.sample_exit_layers(20000, rng=3)
    observed = BatchProfile.from_exit_layers(exits, 4)
    assert observed.remaining == pytest.approx(p.remaining, abs=0.02)
    assert np.array_equal(exits, p.sample_exit_layers(20000, rng=3))


# -- the estimator ---------------------------------------------------------------------------------

def test_a_constant_series_forecasts_the_constant():
    est = BatchProfileEstimator(4)
    profile = BatchProfile((0.8, 0.6, 0.6, 0.1))
    for _ in range(8):
        est.update(profile)
    details = est.forecast_details()
    assert details.profile == profile
    assert set(details.methods) == {"constant"}
    assert est.error(profile).mean_abs == 0.0


def test_a_noisy_level_forecasts_near_the_level():
    rng = np.random.default_rng(0)
    est = BatchProfileEstimator(3, order=(1, 0, 0))
    for _ in range(20):
        noise = rng.normal(0, 0.01)
        est.update(BatchProfile((0.7 + noise, 0.4 + noise / 2, 0.0)))
    got = est.forecast_details()
    assert got.methods[:2] == ("arima", "arima")
    assert got.profile[0] == pytest.approx(0.7, abs=0.02) and got.profile[1] == pytest.approx(0.4, abs=0.02)


def test_a_drifting_mix_forecasts_closer_than_the_last_window():
    # the easy share falls 2 points a window (E3 §5.4's shifting mix): ARIMA(1,1,0) with drift extrapolates
    rng = np.random.default_rng(1)
    level = lambda w: np.array([0.9, 0.7, 0.5]) - 0.02 * w  # noqa: E731
    est = BatchProfileEstimator(3)
    for w in range(12):
        est.update(BatchProfile(tuple(level(w) + rng.normal(0, 0.002, 3) * [1, 1, 1])))
    truth = level(12)
    got = np.array(est.forecast().remaining)
    last = np.array(est.observations[-1].remaining)
    assert set(est.forecast_details().methods) == {"arima"}
    assert np.all(np.abs(got - truth) < np.abs(last - truth))
    assert est.error(BatchProfile(tuple(truth))).mean_abs < np.abs(last - truth).mean()


def test_too_few_windows_fall_back_to_the_last_observation_and_say_so():
    est = BatchProfileEstimator(2, order=(1, 1, 0))
    assert est.min_windows == 5
    est.update(BatchProfile((0.9, 0.1)))
    est.update(BatchProfile((0.8, 0.2)))
    details = est.forecast_details()
    assert details.profile.remaining == (0.8, 0.2)
    assert details.fell_back and details.methods[0].startswith("last: 2 of the 5 windows")


def test_update_takes_exit_layers_or_several_profiles():
    est = BatchProfileEstimator(4)
    assert est.update([0, 0, 3, 3]).remaining == (0.5, 0.5, 0.5, 0.0)
    mean = est.update([BatchProfile((1.0, 0.5, 0.5, 0.0)), BatchProfile((0.5, 0.5, 0.0, 0.0))])
    assert mean.remaining == (0.75, 0.5, 0.25, 0.0)
    assert len(est.observations) == 2


def test_the_sliding_window_keeps_the_most_recent_windows():
    est = BatchProfileEstimator(1, window=6)
    for v in np.linspace(1.0, 0.5, 10):
        est.update(BatchProfile((v,)))
    assert [p[0] for p in est.observations] == pytest.approx(np.linspace(1.0, 0.5, 10)[-6:])


@pytest.mark.parametrize("kwargs, match", [
    ({"num_layers": 0}, "num_layers"),
    ({"num_layers": 4, "window": 0}, "window"),
    ({"num_layers": 4, "order": (1, -1, 0)}, "must not be negative"),
    ({"num_layers": 4, "order": "abc"}, "three whole numbers"),
    ({"num_layers": 4, "window": 3}, "min_windows 5 exceeds"),
])
def test_bad_estimator_settings(kwargs, match):
    with pytest.raises(WorkbenchError, match=match):
        BatchProfileEstimator(**kwargs)


def test_bad_windows_are_refused():
    est = BatchProfileEstimator(4)
    with pytest.raises(WorkbenchError, match="nothing to forecast"):
        est.forecast()
    with pytest.raises(WorkbenchError, match="empty window"):
        est.update([])
    with pytest.raises(WorkbenchError, match="wrap a list of fractions"):
        est.update([0.5, 0.5, 0.2, 0.0])
    with pytest.raises(WorkbenchError, match="3 layers given to an estimator of a 4-layer model"):
        est.update(BatchProfile((1.0, 0.5, 0.0)))


def test_split_windows_cuts_a_trace_by_time():
    windows = split_windows([0.0, 50.0, 130.0, 370.0], [1, 2, 3, 0], window_s=120.0)
    assert windows == [[1, 2], [3], [], [0]]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.floats(0, 1), min_size=3, max_size=3), min_size=1, max_size=9),
       st.sampled_from([(1, 1, 0), (1, 0, 0)]))
def test_forecasts_are_always_valid_profiles(rows, order):
    """Whatever the series (jumps, spikes, a single window), the forecast lies in [0, 1] and never increases."""
    est = BatchProfileEstimator(3, order=order, window=9)
    for row in rows:
        est.update(BatchProfile.nearest(row))
    got = np.array(est.forecast().remaining)
    assert np.all((got >= 0) & (got <= 1))
    assert np.all(np.diff(got) <= 0)
