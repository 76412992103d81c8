"""`bench ui --at-ends`: the ends each page declares are its own controls, and the probe walks to new values."""
import ipywidgets as widgets
import pytest

from workbench.bench.ui import control, end_steps, end_value, set_ends
from workbench.mechanisms import Dashboard, dashboards, load


def test_a_slider_at_its_top_walks_down_to_values_not_seen_before():
    slider = widgets.IntSlider(value=512, min=1, max=512, step=1)
    assert end_steps(slider, 4) == [511, 510, 509, 508]
    slider.value = 1
    assert end_steps(slider, 3) == [2, 3, 4]
    stepped = widgets.FloatSlider(value=50.0, min=50, max=1000, step=10)
    assert end_steps(stepped, 3) == [60.0, 70.0, 80.0]
    assert end_steps(widgets.IntSlider(value=9, min=0, max=10), 5) == [8, 7, 6, 5, 4]     # away from the nearer end


def test_a_selection_walks_its_options_and_stops_at_the_far_end():
    bits = widgets.SelectionSlider(options=(2, 3, 4, 5, 6, 32), value=32)
    assert end_steps(bits) == [6, 5, 4, 3, 2]
    assert (end_value(bits, "max"), end_value(bits, "min")) == (32, 2)


def test_an_end_is_a_sliders_end_an_options_label_or_the_value_itself():
    slider = widgets.IntSlider(value=3, min=1, max=64)
    menu = widgets.Dropdown(options=[("weight-stationary", "ws"), ("tiled", "1d")], value="ws")
    assert (end_value(slider, "max"), end_value(slider, "min"), end_value(slider, 7)) == (64, 1, 7)
    assert end_value(menu, "tiled") == "1d"


def test_an_end_naming_no_control_of_the_page_is_refused_with_its_name():
    panel = widgets.VBox([widgets.IntSlider(description="Devices")])
    board = Dashboard(page="toy.ipynb", title="t", summary="s", ends=(("Devices", "max"), ("Deadline (ms)", "min")))
    with pytest.raises(LookupError, match="toy.ipynb declares an end for 'Deadline \\(ms\\)' but has no such control"):
        set_ends(panel, board)
    assert control(panel, "Devices").value == 100


@pytest.mark.parametrize("board", [d for d in dashboards() if d.panel], ids=lambda d: d.page)
def test_every_pages_ends_are_its_own_controls_and_values_they_take(board, prepared):
    """Each declared end names a control of the page's panel, and the value is one the control offers: a slider's
    end, an option's label, a number in range, a checkbox's state."""
    assert board.ends, f"{board.page} declares no ends for `bench ui --at-ends` and `bench browser --at-ends`"
    panel = load(board.panel)("quick")
    for label, value in board.ends:
        widget = control(panel, label)
        assert widget is not None, f"{board.page}: no control labelled {label!r}"
        if value in ("max", "min"):
            assert hasattr(widget, "max") or getattr(widget, "_options_values", None) is not None
        elif isinstance(value, bool):
            assert isinstance(widget, widgets.Checkbox)
        elif getattr(widget, "_options_labels", None) is not None:
            assert value in widget._options_labels
        else:
            low, high = getattr(widget, "min", None), getattr(widget, "max", None)
            assert low is None or low <= value <= high, f"{board.page}: {label} = {value} is outside {low}..{high}"
