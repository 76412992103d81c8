import numpy as np
import pytest

from workbench.devices import DISTILBERT, get_profile
from workbench.elastic.evaluate import CellResult
from workbench.elastic.planner import plan_elastic, plan_io
from workbench.elastic.costmodel import CostModel
from workbench.timeline import Span, Timeline
from workbench.viz import gantt_figure, layer_times_figure
from workbench.viz.elastic import (accuracy_grid_figure, accuracy_memory_figure, aib_figure, candidates_figure,
                                   importance_plan_figure)


def figure6():
    prof = CostModel(device="fig6", seq_len=64, num_layers=2, num_shards=3, io_s={2: 0.2, 3: 0.3, 4: 0.4, 32: 1.6},
                     comp_s=[1.0, 1.0, 1.0], shard_bytes={2: 2, 3: 3, 4: 4, 32: 32})
    imp = np.array([[0.1, 0.1, 0.1], [0.5, 0.9, 0.7]])
    return prof, imp


def figure6_plan():
    prof, imp = figure6()
    return plan_elastic(prof, 2.0, imp, 0, cached=[(0, 0, 2), (0, 1, 2), (0, 2, 2)], min_width=3), imp


def four_by_four(target_s=0.09):
    prof = CostModel(device="cpu", seq_len=64, num_layers=4, num_shards=4, io_s={2: 0.001},
                     comp_s=[0.01, 0.02, 0.03, 0.04], shard_bytes={2: 1})
    return plan_elastic(prof, target_s, np.ones((4, 4)), 0, min_width=1)


def two_runs():
    pred = Timeline((Span("io", "io", 0, 0.01, "layer 0"), Span("compute", "stall", 0, 0.01, "wait"),
                     Span("compute", "compute", 0.01, 0.03, "layer 0")), "predicted")
    meas = Timeline((Span("io", "io", 0, 0.012, "layer 0"), Span("compute", "compute", 0.012, 0.033, "layer 0")),
                    "measured")
    return pred, meas


def cell(device, method, n, m, bits, acc, mem):
    return CellResult(device=device, target_ms=200.0, method=method, n=n, m=m, mean_bits=bits, accuracy=acc,
                      preload_mb=mem, resident_mb=40.0, memory_mb=mem + 40.0, predicted_ms=190.0,
                      measured_ms=195.0, measured_max_ms=196.0, runs=5, valid=True, plan_ms=1.0)


def evaluation_cells():
    cells = [cell("odroid-n2", m, 3, 4, 6.0, acc, mem) for m, acc, mem in (("Ours", 0.85, 1.0),
                                                                          ("PreloadModel-32", 0.86, 42.0))]
    cells.append(cell("jetson-nano", "Ours", 3, 12, 6.0, 0.5, 1.0))
    cells.append(cell("odroid-n2", "Load&Exec", 3, 3, 32.0, 0.7, 0.0))
    return cells


def test_aib_figure_shows_each_step_and_marks_the_binding_layer():
    prof, imp = figure6()
    io = plan_io(prof, 2.0, 2, 3, imp, preload=[(0, 0, 2), (0, 1, 2), (0, 2, 2)])
    first = aib_figure(io, step=0)
    others, binding = first.data[:2]
    assert list(others.x) == [1] and list(others.y) == pytest.approx([1600.0])      # ms, paper Figure 6
    assert list(binding.x) == [0] and list(binding.y) == pytest.approx([600.0])     # layer 0 binds
    assert binding.name == "binding layer (smallest AIB)" and binding.marker.color != others.marker.color
    assert "step 0/" in first.layout.title.text and "start" in first.layout.title.text
    last = aib_figure(io)
    assert [t.name for t in last.data[2:]] == ["layer 0", "layer 1"] and len(last.data[2].x) == len(io.steps)
    assert "shard (1, 1) 3 -> 4 bits" in last.layout.title.text
    assert last.layout.shapes[0].x0 == len(io.steps) - 1


def test_importance_figure_writes_bits_and_outlines_preloaded_shards():
    plan, imp = figure6_plan()
    fig = importance_plan_figure(imp, plan)
    heat, submodel, preloaded = fig.data
    assert np.allclose(np.asarray(heat.z), imp * 100)
    assert [list(row) for row in heat.text] == [["2", "2", "2"], ["3", "4", "3"]]
    assert submodel.name == "planned submodel 2 x 3" and max(submodel.x[:4]) == 2.5 and max(submodel.y[:4]) == 1.5
    boxes = sorted((round(y + 0.4), round(x + 0.4)) for x, y in zip(preloaded.x[::6], preloaded.y[::6]))
    assert preloaded.name.startswith("preloaded") and boxes == [(0, 0), (0, 1), (0, 2)]


def test_importance_axes_start_at_the_first_shard_and_layer():
    plan, imp = figure6_plan()
    for fig in (importance_plan_figure(imp, plan), importance_plan_figure(imp)):
        assert tuple(fig.layout.xaxis.range) == (-0.5, 2.5) and list(fig.layout.xaxis.tickvals) == [0, 1, 2]
        assert tuple(fig.layout.yaxis.range) == (1.5, -0.5) and list(fig.layout.yaxis.tickvals) == [0, 1]


def test_gantt_overlays_measured_on_predicted():
    fig = gantt_figure(*two_runs())
    names = [t.name for t in fig.data]
    assert names == ["io (predicted)", "compute (predicted)", "stall (predicted)", "io (measured)",
                     "compute (measured)"]
    compute = fig.data[1]
    assert list(compute.base) == pytest.approx([10.0]) and list(compute.x) == pytest.approx([20.0])
    assert fig.data[-1].marker.pattern.shape == "/" and fig.layout.xaxis.range[1] == pytest.approx(33 * 1.02)


def luminance(color: str) -> float:
    """Relative luminance (0 black .. 1 white) of a #rrggbb colour or a colour name Plotly knows here."""
    color = {"white": "#ffffff", "black": "#000000"}.get(color, color)
    r, g, b = (int(color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_labels_on_hatched_bars_are_dark():
    fig = gantt_figure(*two_runs())
    hatched = [t for t in fig.data if t.marker.pattern.shape]
    assert hatched and all(t.textfont.color is not None and luminance(t.textfont.color) < 0.4 for t in hatched)


def test_accuracy_memory_figure_uses_a_log_axis_and_one_cell():
    fig = accuracy_memory_figure(evaluation_cells(), 200, "odroid-n2", gold=0.87)
    assert fig.layout.xaxis.type == "log"
    assert [(t.name, t.x[0], t.y[0]) for t in fig.data] == [("Ours", 1.0, 85.0), ("PreloadModel-32", 42.0, 86.0),
                                                                ("Load&Exec", 0.01, 70.0)]
    assert fig.data[0].marker.symbol == "star"
    assert fig.data[2].name == "Load&Exec" and fig.data[2].x[0] == 0.01          # no shards: at the floor
    assert fig.layout.shapes[0].y0 == pytest.approx(87.0) and "gold" in fig.layout.shapes[0].name


def test_accuracy_memory_figure_without_cells_says_what_to_run():
    for cells, device in (([], "odroid-n2"), (evaluation_cells(), "host")):
        fig = accuracy_memory_figure(cells, 200, device)
        assert not fig.data and fig.layout.xaxis.visible is False
        assert "workbench bench elastic" in fig.layout.annotations[0].text


def test_candidates_figure_marks_the_choice():
    plan = four_by_four()
    fig = candidates_figure(plan.compute)
    heat = fig.data[0]
    assert heat.z[0][0] == pytest.approx(10.0)                            # 1 x 1: 10 ms
    chosen = [t for t in fig.data if t.name == f"chosen {plan.n} x {plan.m}"][0]
    assert (chosen.x[0], chosen.y[0]) == (plan.m, plan.n)
    row, col = list(heat.y).index(plan.n), list(heat.x).index(plan.m)
    assert heat.text[row][col] == "chosen"


def test_candidates_limit_runs_along_cell_edges_right_of_the_widest_fitting_width():
    plan = four_by_four(0.09)                       # n x m fits when n * 10 * m <= 90 ms
    limit = [t for t in candidates_figure(plan.compute).data if "limit of the 90 ms target" in (t.name or "")][0]
    points = [(x, y) for x, y in zip(limit.x, limit.y) if x is not None]
    assert all(x % 1 == 0.5 and y % 1 == 0.5 for x, y in points)              # on edges, never through cells
    verticals = {(limit.x[i], limit.y[i] + 0.5) for i in range(len(limit.x) - 1)
                 if limit.x[i] is not None and limit.x[i] == limit.x[i + 1]}
    widest = {n: max(m for m in range(1, 5) if n * m <= 9) for n in range(1, 5)}
    assert verticals == {(widest[n] + 0.5, n) for n in range(1, 5) if widest[n] < 4}


def legend_shown(fig) -> bool:
    """Whether Plotly draws the legend: layout, then template, then its default (two or more entries)."""
    for value in (fig.layout.showlegend, fig.layout.template.layout.showlegend):
        if value is not None:
            return value
    entries = [t for t in fig.data if t.showlegend is not False and t.type in ("scatter", "bar")]
    return len(entries) + len([s for s in fig.layout.shapes if s.showlegend]) >= 2


def unexplained(fig) -> list[str]:
    """The marks of ``fig`` that neither the legend, a colour bar nor their own text labels explain.

    A trace is explained by a named legend entry (shown, in a figure whose legend is drawn), by a titled
    colour bar when its colours come from a scale (heatmap, contour) and it draws no line of its own, or by
    text labels written on it. One trace in several colours must take them from a titled colour bar, so a
    mark in a colour of its own has its own legend entry. A shape must be in the legend or carry a label.
    Hover alone explains nothing: it is where the exact values are, not what a colour means."""
    problems = []
    shown = legend_shown(fig)
    for trace in fig.data:
        what = f"{trace.type} {trace.name!r}"
        scaled = trace.type in ("heatmap", "contour")
        colorbar = scaled and trace.showscale is not False and bool(trace.colorbar.title.text)
        lines = trace.type == "contour" and trace.contours.coloring in ("none", "lines")
        in_legend = (bool(trace.name) and shown and
                     (trace.showlegend is True or (trace.showlegend is None and trace.type in ("scatter", "bar"))))
        labelled = "text" in (getattr(trace, "mode", None) or "") and trace.text is not None
        if not (in_legend or labelled or (colorbar and not lines)):
            problems.append(f"{what}: not in the legend, not labelled, no colour bar")
        colors = getattr(getattr(trace, "marker", None), "color", None)
        if isinstance(colors, (list, tuple)) and len(set(colors)) > 1 and not (
                trace.marker.showscale and trace.marker.colorbar.title.text):
            problems.append(f"{what}: {len(set(colors))} colours in one trace, no colour bar says what they mean")
    for shape in fig.layout.shapes:
        if not ((shape.showlegend and shape.name and shown) or (shape.label and shape.label.text)):
            problems.append(f"{shape.type} shape: neither in the legend nor labelled")
    return problems


def every_figure() -> dict:
    """Each builder of workbench.viz on engine results, in the states the pages show."""
    from tests.viz.test_kvcache import kvcache_figures

    plan, imp = figure6_plan()
    prof, _ = figure6()
    io = plan_io(prof, 2.0, 2, 3, imp, preload=[(0, 0, 2), (0, 1, 2), (0, 2, 2)])
    narrow = four_by_four(0.09)
    return {
        "importance_plan_figure": [importance_plan_figure(imp, plan), importance_plan_figure(np.ones((4, 4)), narrow),
                                   importance_plan_figure(imp)],
        "candidates_figure": [candidates_figure(narrow.compute), candidates_figure(four_by_four(1.0).compute)],
        "aib_figure": [aib_figure(io, 0), aib_figure(io)],
        "gantt_figure": [gantt_figure(*two_runs()), gantt_figure(plan.timeline)],
        "accuracy_memory_figure": [accuracy_memory_figure(evaluation_cells(), 200, "odroid-n2", gold=0.87),
                                   accuracy_memory_figure([], 200, "odroid-n2")],
        "accuracy_grid_figure": [accuracy_grid_figure(np.arange(72).reshape(6, 12) / 100)],
        "layer_times_figure": [layer_times_figure(get_profile("odroid-n2"), DISTILBERT, 4)],
        **kvcache_figures(),
    }


def test_every_mark_of_every_figure_is_explained():
    import workbench.viz.elastic
    import workbench.viz.kvcache

    figures = every_figure()
    own = {name for module in (workbench.viz.elastic, workbench.viz.kvcache) for name, f in vars(module).items()
           if name.endswith("_figure") and callable(f) and f.__module__ == module.__name__}
    assert set(figures) == set(workbench.viz.__all__) | own
    problems = [f"{name}: {p}" for name, figs in figures.items() for fig in figs for p in unexplained(fig)]
    assert problems == []


def test_accuracy_memory_figure_names_the_users_target_and_stays_short_without_cells():
    fig = accuracy_memory_figure(evaluation_cells(), 200, "odroid-n2", gold=0.87, asked_ms=230)
    assert fig.layout.title.text.endswith("at 200 ms on odroid-n2 (the evaluated target nearest to your 230 ms)")
    assert "nearest" not in accuracy_memory_figure(evaluation_cells(), 200, "odroid-n2", asked_ms=200).layout.title.text
    empty = accuracy_memory_figure([], 230, "odroid-n2")
    assert "230 ms" in empty.layout.title.text and empty.layout.height <= 200
