"""Shared figure styling."""
from workbench.viz.style import log_axis


def test_log_axes_label_powers_of_ten_only_when_the_range_holds_one():
    wide = log_axis(0.005, 40.0, "MB")
    assert wide["type"] == "log" and wide["dtick"] == 1 and wide["title"] == "MB"
    assert wide["range"][0] < -2 < 1 < wide["range"][1]
    narrow = log_axis(2.0, 9.0, "ms")
    assert narrow["dtick"] == "D2"                       # no power of ten inside: 2 and 5 label it
