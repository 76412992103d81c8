import pytest

from workbench.devices import DISTILBERT, MINILM, get_profile
from workbench.ui import OverviewPanel


def test_controls_redraw_their_figures(prepared):
    panel = OverviewPanel("quick")
    grid_fig = lambda: panel.figures["grid"]
    times_fig = lambda: panel.figures["times"]
    first_grid = grid_fig()
    assert panel.message.value == ""
    assert grid_fig().data[0].z[5][11] == pytest.approx(prepared["sentiment"].accuracy_grid[5, 11] * 100)
    panel.task.value = "bbc"
    assert grid_fig().data[0].z[5][11] == pytest.approx(prepared["bbc"].accuracy_grid[5, 11] * 100)
    assert "BBC News" in grid_fig().layout.title.text
    panel.device.value = "jetson-nano"
    assert times_fig().data[0].y[11] == pytest.approx(get_profile("jetson-nano").layer_compute_s(12, DISTILBERT) * 1e3)
    panel.shape.value = "MiniLM layer (d=384)"
    panel.bits.value = 2
    assert times_fig().data[1].y[0] == pytest.approx(get_profile("jetson-nano").shard_read_s(2, MINILM) * 1e3)
    assert panel.children[2] is panel.figure_slot("grid") and panel.children[6] is panel.figure_slot("times")
    synced = panel.figure_slot("grid").figure                        # what the browser receives
    assert synced["layout"]["title"]["text"] == grid_fig().layout.title.text
    assert first_grid is not grid_fig()
    shown = grid_fig()
    panel.device.value = "odroid-n2"
    assert grid_fig() is shown                                              # a device change leaves the grid alone


def test_unprepared_task_shows_an_inline_message(tmp_cache):
    panel = OverviewPanel("quick")
    assert "wb-error" in panel.message.value and "workbench prepare --preset quick" in panel.message.value
    assert "Traceback" not in panel.message.value
    assert "grid" not in panel.figures


def test_a_device_change_keeps_the_task_error_and_redraws_only_the_device_figure(tmp_cache):
    panel = OverviewPanel("quick")
    panel.device.value = "jetson-nano"
    assert "workbench prepare --preset quick" in panel.message.value
    assert "Jetson Nano" in panel.figures["times"].layout.title.text and "grid" not in panel.figures
