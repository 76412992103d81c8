"""E3's batch profiles and their online ARIMA forecast (E3 §3.1).

A *batch profile* says how a batch shrinks as it runs through an early-exit model: after each layer's
exit ramp, the fraction of the input batch still present. E3's optimizer splits the model where the
profile says the batch has shrunk, so it needs the profile of the *next* stretch of the workload, not
the last one: E3 cuts the workload into windows (2 minutes in the paper), observes each window's
profile, and forecasts the next window's profile per ramp with ARIMA over the series of past windows.

Conventions used throughout the early-exit package:

- Layers are numbered from 0; every layer may carry a ramp. A sample's *exit layer* ``e`` is the layer
  whose ramp it leaves at: it runs layers ``0..e`` and no further. A sample that never exits early runs
  the whole model: its exit layer is the last layer, ``num_layers - 1``.
- ``profile[k]`` (``BatchProfile.remaining[k]``) is the fraction of the batch present *after* layer
  ``k``'s ramp, i.e. the fraction with exit layer ``> k``; the fraction that *runs* layer ``k`` is
  ``1`` for ``k == 0`` and ``profile[k - 1]`` after. Built from exit layers, the last entry is 0 (no
  one is left after the model's end); given by hand it may be anything not above the one before.

Why ARIMA on each ramp separately: the paper forecasts "the batch size at each of the exit ramps" as its
own series. The forecasts of neighbouring ramps can then disagree with the ordering a profile must have,
so the forecast is projected back onto valid profiles (clipped to [0, 1], then the closest
non-increasing sequence in least squares, by pool-adjacent-violators).

statsmodels is imported on the first fit, so importing this module stays cheap.
"""
from __future__ import annotations

import math
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from workbench.errors import WorkbenchError

WINDOW_S = 120.0
"""The paper's window: the workload is cut into 2-minute chunks."""


@dataclass(frozen=True)
class BatchProfile:
    """Fraction of a batch present after each layer's exit ramp: ``remaining[k]`` in [0, 1], non-increasing.

    Indexing (``profile[k]``), ``len`` and iteration follow ``remaining``, so a profile can be passed
    wherever a plain sequence of fractions is expected (e.g. the split optimizer's ``batch_profile``)."""
    remaining: tuple[float, ...]

    def __post_init__(self):
        try:
            values = tuple(float(v) for v in self.remaining)
        except (TypeError, ValueError) as e:
            raise WorkbenchError(f"a batch profile is a sequence of fractions, one per layer: {e}") from None
        if not values:
            raise WorkbenchError("a batch profile needs one fraction per layer; got none")
        for k, v in enumerate(values):
            if not (0.0 <= v <= 1.0):  # also refuses NaN
                raise WorkbenchError(
                    f"batch profile entry {k} is {v}: the fraction of a batch left after a ramp lies in [0, 1]")
        for k in range(1, len(values)):
            if values[k] > values[k - 1]:
                raise WorkbenchError(
                    f"batch profile increases at layer {k} ({values[k - 1]} -> {values[k]}): samples only "
                    f"leave a batch, so the fraction left after each ramp must be non-increasing "
                    f"(BatchProfile.nearest(values) gives the closest valid profile)")
        object.__setattr__(self, "remaining", values)

    # -- sequence protocol -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.remaining)

    def __getitem__(self, k):
        return self.remaining[k]

    def __iter__(self):
        return iter(self.remaining)

    @property
    def num_layers(self) -> int:
        return len(self.remaining)

    # -- derived views -----------------------------------------------------------------------------
    def entering(self, layer: int) -> float:
        """Fraction of the batch that runs ``layer`` (1 for layer 0, else the fraction left after the ramp before)."""
        if not 0 <= layer < self.num_layers:
            raise WorkbenchError(f"layer {layer} is not one of the profile's {self.num_layers} layers")
        return 1.0 if layer == 0 else self.remaining[layer - 1]

    def exit_fractions(self) -> tuple[float, ...]:
        """Fraction of the batch whose exit layer is each layer (sums to 1). What is still left after the
        last ramp leaves at the end of the model, so it counts towards the last layer."""
        out = [self.entering(k) - self.remaining[k] for k in range(self.num_layers)]
        out[-1] = self.entering(self.num_layers - 1)
        return tuple(out)

    def batch_sizes(self, batch: float) -> tuple[float, ...]:
        """Expected number of samples running each layer when ``batch`` samples enter the model."""
        return tuple(batch * self.entering(k) for k in range(self.num_layers))

    def sample_exit_layers(self, n: int, rng: np.random.Generator | int | None = None) -> np.ndarray:
        """``n`` exit layers drawn independently from the profile (seeded by ``rng``)."""
        if n < 0:
            raise WorkbenchError(f"cannot draw {n} exit layers: the count must be >= 0")
        rng = np.random.default_rng(rng)
        p = np.clip(np.asarray(self.exit_fractions(), dtype=float), 0.0, None)
        return rng.choice(self.num_layers, size=int(n), p=p / p.sum()).astype(int)

    # -- constructors ------------------------------------------------------------------------------
    @classmethod
    def from_exit_layers(cls, exit_layers: Iterable[int], num_layers: int) -> BatchProfile:
        """The profile of a set of samples given each one's exit layer (0-based; ``num_layers - 1`` = ran it all)."""
        num_layers = _positive_int(num_layers, "num_layers")
        exits = np.asarray(list(exit_layers))
        if exits.size == 0:
            raise WorkbenchError("no exit layers given: a profile needs at least one sample")
        if exits.ndim != 1 or not (np.issubdtype(exits.dtype, np.integer)
                                   or (np.issubdtype(exits.dtype, np.floating) and np.all(exits == np.round(exits)))):
            raise WorkbenchError("exit layers are whole layer numbers, one per sample")
        exits = exits.astype(int)
        bad = exits[(exits < 0) | (exits >= num_layers)]
        if bad.size:
            raise WorkbenchError(f"exit layer {int(bad[0])} is outside the model's layers 0..{num_layers - 1}")
        counts = np.bincount(exits, minlength=num_layers)
        left = exits.size - np.cumsum(counts)
        return cls(tuple(float(v) for v in left / exits.size))

    @classmethod
    def from_batch_sizes(cls, sizes: Sequence[float], batch: float) -> BatchProfile:
        """The profile from the batch size seen after each ramp when ``batch`` samples entered (E3 fig. 1)."""
        if not batch > 0:
            raise WorkbenchError(f"input batch size {batch} must be > 0")
        return cls(tuple(float(s) / float(batch) for s in sizes))

    @classmethod
    def mean(cls, profiles: Sequence[BatchProfile]) -> BatchProfile:
        """The element-wise mean of profiles of one model (itself a valid profile)."""
        profiles = list(profiles)
        if not profiles:
            raise WorkbenchError("no profiles to average")
        lengths = {p.num_layers for p in profiles}
        if len(lengths) > 1:
            raise WorkbenchError(f"profiles of different lengths cannot be averaged: {sorted(lengths)}")
        return cls(tuple(np.mean([p.remaining for p in profiles], axis=0)))

    @classmethod
    def nearest(cls, values: Sequence[float]) -> BatchProfile:
        """The valid profile closest to ``values`` (NaN read as 0): clipped to [0, 1], then the least-squares
        non-increasing fit (pool-adjacent-violators)."""
        v = np.nan_to_num(np.asarray(values, dtype=float), nan=0.0, posinf=1.0, neginf=0.0)
        fitted = _non_increasing(np.clip(v, 0.0, 1.0))
        # Guard against float noise in the block means: exactly non-increasing and within [0, 1].
        return cls(tuple(np.clip(np.minimum.accumulate(fitted), 0.0, 1.0)))


def _non_increasing(y: np.ndarray) -> np.ndarray:
    """Least-squares non-increasing fit of ``y`` (pool adjacent violators, equal weights)."""
    blocks: list[list[float]] = []  # [mean, count]
    for value in y:
        blocks.append([float(value), 1.0])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            m2, c2 = blocks.pop()
            m1, c1 = blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return np.concatenate([np.full(int(c), m) for m, c in blocks]) if blocks else np.zeros(0)


@dataclass(frozen=True)
class ProfileForecast:
    """One forecast and how it was made, for a dashboard to explain.

    ``raw`` holds the per-ramp forecasts before projection onto valid profiles; ``methods[k]`` says how
    ramp ``k``'s came about: ``"arima"``, ``"constant"`` (the series never changed, so it is its own
    forecast), or ``"last: ..."`` (the last observation, with the reason: too few windows, or the fit failed)."""
    profile: BatchProfile
    raw: tuple[float, ...]
    methods: tuple[str, ...]
    windows: int                 # how many past windows the forecast looked at
    order: tuple[int, int, int]

    @property
    def fell_back(self) -> bool:
        """Whether any ramp's forecast is the last observation rather than a model's."""
        return any(m.startswith("last") for m in self.methods)


@dataclass(frozen=True)
class ForecastError:
    """How far a forecast was from the profile that then happened: absolute error per ramp, and summaries."""
    per_ramp: tuple[float, ...]
    mean_abs: float
    max_abs: float


class BatchProfileEstimator:
    """Online forecast of the next window's batch profile (E3 §3.1).

    ``update(window)`` adds one window's observation; ``forecast()`` fits ``ARIMA(order)`` (statsmodels)
    to each ramp's series over the last ``window`` observations and returns the next window's profile.
    Until ``min_windows`` windows have been seen (default ``p + d + q + 3``, the fewest on which the fit
    is more than noise) every ramp's forecast is the last observation, and ``forecast_details()`` says so.

    ``trend`` is passed to statsmodels; by default a constant for ``d == 0`` and a drift (``"t"``) for
    ``d == 1``, so a steadily drifting exit mix is extrapolated rather than lagged; none for ``d >= 2``.
    """

    def __init__(self, num_layers: int, window: int = 30, order: tuple[int, int, int] = (1, 1, 0),
                 trend: str | None = None, min_windows: int | None = None):
        self.num_layers = _positive_int(num_layers, "num_layers")
        self.window = _positive_int(window, "window (how many past windows the forecast fits)")
        try:
            p, d, q = (int(x) for x in order)
        except (TypeError, ValueError):
            raise WorkbenchError(f"ARIMA order {order!r} must be three whole numbers (p, d, q)") from None
        if min(p, d, q) < 0:
            raise WorkbenchError(f"ARIMA order {order!r} must not be negative")
        self.order = (p, d, q)
        self.trend = trend if trend is not None else ("c" if d == 0 else "t" if d == 1 else "n")
        self.min_windows = (p + d + q + 3) if min_windows is None else _positive_int(min_windows, "min_windows")
        if self.min_windows > self.window:
            raise WorkbenchError(f"min_windows {self.min_windows} exceeds the sliding window of {self.window} "
                                 f"windows: the forecast would never use the model; raise window")
        self._history: deque[BatchProfile] = deque(maxlen=self.window)
        self._cached: ProfileForecast | None = None

    @property
    def observations(self) -> tuple[BatchProfile, ...]:
        """The observed profiles the next forecast looks at, oldest first."""
        return tuple(self._history)

    def observe(self, window) -> BatchProfile:
        """One window's observed profile, from a :class:`BatchProfile`, several (their mean: e.g. one per
        batch served in the window), or the window's per-sample exit layers (whole numbers)."""
        if isinstance(window, BatchProfile):
            profile = window
        else:
            items = list(window) if isinstance(window, Iterable) else None
            if not items:
                raise WorkbenchError("an empty window: give a BatchProfile, a list of them, or exit layers")
            if all(isinstance(x, BatchProfile) for x in items):
                profile = BatchProfile.mean(items)
            elif all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in items):
                profile = BatchProfile.from_exit_layers(items, self.num_layers)
            else:
                raise WorkbenchError("a window is a BatchProfile, a list of BatchProfiles, or a list of whole-number "
                                     "exit layers; wrap a list of fractions in BatchProfile(...)")
        if profile.num_layers != self.num_layers:
            raise WorkbenchError(f"a profile of {profile.num_layers} layers given to an estimator of a "
                                 f"{self.num_layers}-layer model")
        return profile

    def update(self, window) -> BatchProfile:
        """Add one window (see :meth:`observe` for what it may be); returns its observed profile."""
        profile = self.observe(window)
        self._history.append(profile)
        self._cached = None
        return profile

    def forecast(self) -> BatchProfile:
        """The next window's profile: per-ramp ARIMA, clipped to [0, 1] and made non-increasing."""
        return self.forecast_details().profile

    def forecast_details(self) -> ProfileForecast:
        """:meth:`forecast` with the raw per-ramp values and how each was made."""
        if self._cached is not None:
            return self._cached
        if not self._history:
            raise WorkbenchError("nothing to forecast from: call update(window) with at least one window first")
        series = np.array([p.remaining for p in self._history])  # windows x layers
        n = series.shape[0]
        raw, methods = [], []
        fitted: dict[bytes, tuple[float, str]] = {}
        for k in range(self.num_layers):
            y = series[:, k]
            if np.ptp(y) <= 1e-12:
                value, method = float(y[-1]), "constant"
            elif n < self.min_windows:
                value, method = float(y[-1]), f"last: {n} of the {self.min_windows} windows ARIMA{self.order} needs"
            else:
                key = y.tobytes()  # ramps with no exits repeat the series before them: fit once
                if key not in fitted:
                    fitted[key] = self._fit_one(y)
                value, method = fitted[key]
            raw.append(value)
            methods.append(method)
        self._cached = ProfileForecast(BatchProfile.nearest(raw), tuple(raw), tuple(methods), n, self.order)
        return self._cached

    def _fit_one(self, y: np.ndarray) -> tuple[float, str]:
        from statsmodels.tsa.arima.model import ARIMA

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # convergence chatter on short series; the result is checked below
                # only the point forecast is used: skip the parameters' covariance (a numerical Hessian)
                value = float(ARIMA(y, order=self.order, trend=self.trend).fit(cov_type="none").forecast(1)[0])
        except Exception as e:  # noqa: BLE001 - any failure of the fit falls back, and says why
            return float(y[-1]), f"last: the ARIMA fit failed ({type(e).__name__}: {e})"
        if not math.isfinite(value):
            return float(y[-1]), "last: the ARIMA forecast was not finite"
        return value, "arima"

    def error(self, actual) -> ForecastError:
        """Error of the current forecast against what the next window turned out to be (anything
        :meth:`update` takes). Call it before ``update(actual)``: afterwards the forecast is for the window after."""
        got = np.asarray(self.observe(actual).remaining)
        diff = np.abs(np.asarray(self.forecast().remaining) - got)
        return ForecastError(tuple(float(x) for x in diff), float(diff.mean()), float(diff.max()))


def split_windows(arrival_s: Sequence[float], exit_layers: Sequence[int],
                  window_s: float = WINDOW_S) -> list[list[int]]:
    """Cut a trace into consecutive windows of ``window_s`` seconds: each window's exit layers, in order
    (empty windows included, so the series keeps its clock). Feed the non-empty ones to ``update``."""
    if not window_s > 0:
        raise WorkbenchError(f"window length {window_s} s must be > 0")
    t = np.asarray(arrival_s, dtype=float)
    e = np.asarray(exit_layers)
    if t.shape != e.shape:
        raise WorkbenchError(f"{t.size} arrival times but {e.size} exit layers: give one of each per request")
    if t.size == 0:
        return []
    if np.any(t < 0) or not np.all(np.isfinite(t)):
        raise WorkbenchError("arrival times are seconds >= 0")
    index = np.floor(t / window_s).astype(int)
    return [[int(x) for x in e[index == w]] for w in range(int(index.max()) + 1)]


def _positive_int(value, what: str) -> int:
    try:
        ok = not isinstance(value, bool) and int(value) == value and int(value) >= 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise WorkbenchError(f"{what} must be a whole number >= 1, got {value!r}")
    return int(value)
