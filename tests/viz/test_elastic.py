import numpy as np
import pytest

from workbench.elastic.evaluate import CellResult
from workbench.elastic.planner import plan_elastic, plan_io
from workbench.elastic.costmodel import CostModel
from workbench.timeline import Span, Timeline
from workbench.viz import (accuracy_memory_figure, aib_figure, candidates_figure, gantt_figure,
                           importance_plan_figure)


def figure6():
    prof = CostModel(device="fig6", seq_len=64, num_layers=2, num_shards=3, io_s={2: 0.2, 3: 0.3, 4: 0.4, 32: 1.6},
                     comp_s=[1.0, 1.0, 1.0], shard_bytes={2: 2, 3: 3, 4: 4, 32: 32})
    imp = np.array([[0.1, 0.1, 0.1], [0.5, 0.9, 0.7]])
    return prof, imp


def test_aib_figure_shows_each_step_and_marks_the_binding_layer():
    prof, imp = figure6()
    io = plan_io(prof, 2.0, 2, 3, imp, preload=[(0, 0, 2), (0, 1, 2), (0, 2, 2)])
    first = aib_figure(io, step=0)
    bars = first.data[0]
    assert list(bars.y) == pytest.approx([600.0, 1600.0])                 # ms, paper Figure 6
    assert bars.marker.color[0] == "#E45756"                              # layer 0 binds
    assert "step 0/" in first.layout.title.text and "start" in first.layout.title.text
    last = aib_figure(io)
    assert list(last.data[0].y) == pytest.approx([0.0, 0.0])
    assert [t.name for t in last.data[1:]] == ["layer 0", "layer 1"] and len(last.data[1].x) == len(io.steps)
    assert "shard (1, 1) 3 -> 4 bits" in last.layout.title.text
    assert last.layout.shapes[0].x0 == len(io.steps) - 1


def test_importance_figure_writes_bits_and_outlines_preloaded_shards():
    prof, imp = figure6()
    plan = plan_elastic(prof, 2.0, imp, 0, cached=[(0, 0, 2), (0, 1, 2), (0, 2, 2)], min_width=3)
    fig = importance_plan_figure(imp, plan)
    heat, marks = fig.data
    assert np.allclose(np.asarray(heat.z), imp * 100)
    assert [list(row) for row in heat.text] == [["2", "2", "2"], ["3", "4", "3"]]
    assert sorted(zip(marks.y, marks.x)) == [(0, 0), (0, 1), (0, 2)]
    assert fig.layout.shapes[0].x1 == 2.5 and fig.layout.shapes[0].y1 == 1.5


def test_gantt_overlays_measured_on_predicted():
    pred = Timeline((Span("io", "io", 0, 0.01, "layer 0"), Span("compute", "stall", 0, 0.01, "wait"),
                     Span("compute", "compute", 0.01, 0.03, "layer 0")), "predicted")
    meas = Timeline((Span("io", "io", 0, 0.012, "layer 0"), Span("compute", "compute", 0.012, 0.033, "layer 0")),
                    "measured")
    fig = gantt_figure(pred, meas)
    names = [t.name for t in fig.data]
    assert names == ["io (predicted)", "compute (predicted)", "stall (predicted)", "io (measured)",
                     "compute (measured)"]
    compute = fig.data[1]
    assert list(compute.base) == pytest.approx([10.0]) and list(compute.x) == pytest.approx([20.0])
    assert fig.data[-1].marker.pattern.shape == "/" and fig.layout.xaxis.range[1] == pytest.approx(33 * 1.02)


def test_accuracy_memory_figure_uses_a_log_axis_and_one_cell():
    def cell(device, method, n, m, bits, acc, mem):
        return CellResult(device=device, target_ms=200.0, method=method, n=n, m=m, mean_bits=bits, accuracy=acc,
                          preload_mb=mem, resident_mb=40.0, memory_mb=mem + 40.0, predicted_ms=190.0,
                          measured_ms=195.0, measured_max_ms=196.0, runs=5, valid=True, plan_ms=1.0)

    cells = [cell("odroid-n2", m, 3, 4, 6.0, acc, mem) for m, acc, mem in (("Ours", 0.85, 1.0),
                                                                          ("PreloadModel-32", 0.86, 42.0))]
    cells.append(cell("jetson-nano", "Ours", 3, 12, 6.0, 0.5, 1.0))
    cells.append(cell("odroid-n2", "Load&Exec", 3, 3, 32.0, 0.7, 0.0))
    fig = accuracy_memory_figure(cells, 200, "odroid-n2", gold=0.87)
    assert fig.layout.xaxis.type == "log"
    assert [(t.name, t.x[0], t.y[0]) for t in fig.data] == [("Ours", 1.0, 85.0), ("PreloadModel-32", 42.0, 86.0),
                                                                ("Load&Exec", 0.01, 70.0)]
    assert fig.data[0].marker.symbol == "star"
    assert fig.data[2].name == "Load&Exec" and fig.data[2].x[0] == 0.01          # no shards: at the floor


def test_candidates_figure_marks_the_choice():
    prof = CostModel(device="cpu", seq_len=64, num_layers=4, num_shards=4, io_s={2: 0.001},
                     comp_s=[0.01, 0.02, 0.03, 0.04], shard_bytes={2: 1})
    plan = plan_elastic(prof, 0.09, np.ones((4, 4)), 0, min_width=1)
    fig = candidates_figure(plan.compute)
    heat = fig.data[0]
    row, col = list(heat.y).index(plan.n), list(heat.x).index(plan.m)
    assert heat.text[row][col] == "★"
    assert heat.z[0][0] == pytest.approx(10.0)                            # 1 x 1: 10 ms
