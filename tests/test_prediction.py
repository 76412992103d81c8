import numpy as np

from workbench.prediction import HostLoad, check_prediction, compare_kinds
from workbench.timeline import Span, Timeline

QUIET = HostLoad(load_1min=0.1, cores=2)


def timeline(source, compute_s, io_s, stall_s=0.0):
    spans = [Span("io", "io", 0.0, io_s), Span("compute", "compute", io_s, io_s + compute_s)]
    if stall_s:
        spans.append(Span("compute", "stall", 0.0, stall_s))
    return Timeline(tuple(spans), source)


def test_within_twenty_percent_is_silent():
    predicted = timeline("predicted", 0.100, 0.050)
    measured = timeline("measured", 0.110, 0.055)
    check = check_prediction(measured, predicted, 0.165, 0.150, load=QUIET)
    assert not check.missed and check.note() == "" and check.ratio == 0.165 / 0.150


def test_a_miss_names_how_far_and_which_work_went_slow():
    predicted = timeline("predicted", 0.100, 0.050)
    measured = timeline("measured", 0.400, 0.052, stall_s=0.2)
    check = check_prediction(measured, predicted, 0.452, 0.150, emulated="jetson-nano", load=QUIET)
    assert check.missed
    assert check.note() == (
        "measured 452 ms is 201 % above the predicted 150 ms; likely: compute took 400 ms against 100 ms predicted "
        "(this host is slower than the emulated jetson-nano; emulation can slow a run down to a device's speed, "
        "never speed it up)")
    rows = compare_kinds(measured, predicted)
    assert [r[0] for r in rows] == ["compute", "IO", "stalls"]
    assert np.allclose([r[1:] for r in rows], [(0.4, 0.1), (0.052, 0.05), (0.2, 0.0)])


def test_first_run_and_busy_host_are_named():
    same = timeline("predicted", 0.1, 0.05)
    check = check_prediction(same, same, 0.5, 0.15, first_run=True, load=HostLoad(load_1min=3.4, cores=2))
    assert check.causes == ("first run in this process (imports, torch kernels and thread pools warm up; run again "
                            "to compare)", "busy host (load average 3.4 on 2 cores)")
    assert not HostLoad(load_1min=1.4, cores=2).busy and HostLoad(load_1min=1.6, cores=2).busy


def test_faster_than_predicted_is_a_miss_too():
    predicted = timeline("predicted", 0.100, 0.100)
    measured = timeline("measured", 0.100, 0.010)
    check = check_prediction(measured, predicted, 0.110, 0.200, load=QUIET)
    assert check.note() == ("measured 110 ms is 45 % below the predicted 200 ms; likely: IO took 10 ms against "
                            "100 ms predicted")


def test_a_faster_run_is_never_blamed_on_load():
    """A run below its prediction on a busy host: the load is not named (it slows runs down), the faster compute
    is, as the host outrunning the modelled device."""
    predicted = timeline("predicted", 0.200, 0.010)
    measured = timeline("measured", 0.050, 0.010)
    check = check_prediction(measured, predicted, 0.060, 0.210, load=HostLoad(load_1min=3.4, cores=2))
    assert check.missed and not any("busy" in c for c in check.causes)
    assert check.causes == ("compute took 50 ms against 200 ms predicted (this host computes faster than the "
                            "device the prediction assumes)",)


def test_a_replayed_run_is_never_called_measured():
    same = timeline("predicted", 0.1, 0.05)
    check = check_prediction(same, same, 0.5, 0.15, load=QUIET, label="replayed")
    assert check.note().startswith("replayed 500 ms is 233 % above the predicted 150 ms")
