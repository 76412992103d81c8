"""Measured against predicted: when a real run misses its prediction, say so and say what the engine can tell.

Every mechanism predicts a :class:`~workbench.timeline.Timeline` and measures one in the
same schema, so the comparison is shared: the latencies, the busy time of each kind of
work in both timelines (which part went slow), whether this was the first run in the
process (imports, torch kernels and thread pools warm up), and how busy the host is
(its one-minute load average against its cores).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from workbench.timeline import Timeline

TOLERANCE = 0.20
"""A run misses its prediction when it is more than 20 % above or below it."""

WORK_KINDS = {"compute": ("compute", "decompress", "recompute"), "IO": ("io", "swap_in", "swap_out"),
              "communication": ("comm",), "stalls": ("stall",)}
"""How span kinds are grouped when the two timelines are compared (a prediction's compute
includes decompression, which a measurement times apart)."""


@dataclass(frozen=True, kw_only=True)
class HostLoad:
    load_1min: float
    cores: int

    @property
    def busy(self) -> bool:
        return self.load_1min > 0.75 * self.cores


def host_load() -> HostLoad:
    """This machine's one-minute load average and the cores this process may use."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return HostLoad(load_1min=float(load), cores=len(os.sched_getaffinity(0)))


@dataclass(frozen=True, kw_only=True)
class PredictionCheck:
    measured_s: float
    predicted_s: float
    causes: tuple[str, ...] = ()
    label: str = "measured"         # "replayed" for a run padded to its prediction: never called measured

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s if self.predicted_s > 0 else float("inf")

    @property
    def missed(self) -> bool:
        return abs(self.ratio - 1.0) > TOLERANCE

    def note(self) -> str:
        """'' when within the tolerance; else one sentence: how far off, and the likely causes."""
        if not self.missed:
            return ""
        way = "above" if self.ratio > 1 else "below"
        text = (f"{self.label} {1e3 * self.measured_s:.0f} ms is {abs(self.ratio - 1) * 100:.0f} % {way} the predicted "
                f"{1e3 * self.predicted_s:.0f} ms")
        return text + (f"; likely: {'; '.join(self.causes)}" if self.causes else "")


def compare_kinds(measured: Timeline, predicted: Timeline) -> list[tuple[str, float, float]]:
    """(group, measured seconds, predicted seconds) for each group of work either timeline has."""
    rows = []
    for group, kinds in WORK_KINDS.items():
        got = sum(measured.busy(k) for k in kinds)
        want = sum(predicted.busy(k) for k in kinds)
        if got > 0 or want > 0:
            rows.append((group, got, want))
    return rows


def check_prediction(measured: Timeline, predicted: Timeline, measured_s: float, predicted_s: float, *,
                     first_run: bool = False, emulated: str = "", load: HostLoad | None = None,
                     label: str = "measured") -> PredictionCheck:
    """Compare one measured run with its prediction; ``emulated`` names the device a preset run pads to."""
    causes = []
    if first_run:
        causes.append("first run in this process (imports, torch kernels and thread pools warm up; "
                      "run again to compare)")
    load = load or host_load()
    if load.busy and measured_s > predicted_s:         # load slows a run down; it never explains a faster one
        causes.append(f"busy host (load average {load.load_1min:.1f} on {load.cores} cores)")
    for group, got, want in compare_kinds(measured, predicted):
        if group == "stalls" or abs(got - want) <= TOLERANCE * want + 1e-3:
            continue
        text = f"{group} took {1e3 * got:.0f} ms against {1e3 * want:.0f} ms predicted"
        if emulated and group == "compute" and got > want:
            text += (f" (this host is slower than the emulated {emulated}; emulation can slow a run down "
                     f"to a device's speed, never speed it up)")
        elif group == "compute" and got < want:
            text += " (this host computes faster than the device the prediction assumes)"
        causes.append(text)
    return PredictionCheck(measured_s=measured_s, predicted_s=predicted_s, causes=tuple(causes), label=label)
