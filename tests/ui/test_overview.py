import pytest

from workbench.devices import DISTILBERT, MINILM, get_profile
from workbench.ui import OverviewPanel


def test_controls_redraw_figures_in_place(prepared):
    panel = OverviewPanel("quick")
    grid_fig, times_fig = panel.figures["grid"], panel.figures["times"]
    assert panel.message.value == ""
    assert grid_fig.data[0].z[5][11] == pytest.approx(prepared["sentiment"].accuracy_grid[5, 11] * 100)
    panel.task.value = "bbc"
    assert grid_fig.data[0].z[5][11] == pytest.approx(prepared["bbc"].accuracy_grid[5, 11] * 100)
    assert "BBC News" in grid_fig.layout.title.text
    panel.device.value = "jetson-nano"
    assert times_fig.data[0].y[11] == pytest.approx(get_profile("jetson-nano").layer_compute_s(12, DISTILBERT) * 1e3)
    panel.shape.value = "MiniLM layer (d=384)"
    panel.bits.value = 2
    assert times_fig.data[1].y[0] == pytest.approx(get_profile("jetson-nano").shard_read_s(2, MINILM) * 1e3)
    assert panel.figures == {"grid": grid_fig, "times": times_fig}
    assert panel.children[2].children == (grid_fig,)


def test_unprepared_task_shows_an_inline_message(tmp_cache):
    panel = OverviewPanel("quick")
    assert "wb-error" in panel.message.value and "workbench prepare --profile quick" in panel.message.value
    assert "Traceback" not in panel.message.value
    assert "grid" not in panel.figures
