import numpy as np
import pytest

from workbench.devices import DISTILBERT, MINILM, get_profile
from workbench.viz import layer_times_figure
from workbench.viz.elastic import accuracy_grid_figure


def test_accuracy_grid_figure_shows_every_submodel():
    grid = np.arange(72).reshape(6, 12) / 100
    fig = accuracy_grid_figure(grid, "t")
    heat = fig.data[0]
    assert heat.type == "heatmap" and list(heat.x) == list(range(1, 13)) and list(heat.y) == list(range(1, 7))
    assert heat.z[5][11] == pytest.approx(71.0) and heat.text[0][1] == "1.0"
    assert fig.layout.xaxis.title.text == "width m (shards per layer)"
    assert fig.layout.yaxis.title.text == "depth n (layers)"


def test_layer_times_figure_values_come_from_the_profile():
    p = get_profile("odroid-n2")
    fig = layer_times_figure(p, DISTILBERT, bits=4)
    compute, io = fig.data
    assert compute.name == "compute" and io.name == "IO (4-bit shards)"
    assert compute.y[11] == pytest.approx(95.0)
    assert io.y[11] == pytest.approx(12 * p.shard_read_s(4, DISTILBERT) * 1e3)
    assert fig.layout.yaxis.title.text == "time per layer (ms)"
    assert layer_times_figure(p, MINILM, 4).data[0].y[0] < compute.y[0]
