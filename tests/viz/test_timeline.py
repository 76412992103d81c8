"""The one Gantt chart: every kind in its colour, a row per (device, lane), flows as arrows."""
import pytest

import workbench.timeline
from tests.viz.test_elastic import unexplained
from workbench.timeline import SPAN_KINDS, Span, Timeline
from workbench.viz.timeline import FALLBACK_COLOR, KIND_COLORS, gantt_figure

LANE = {"io": "io", "swap_in": "io", "swap_out": "io", "comm": "link", "queue": "link"}


def every_kind_on_two_devices(source="predicted", stretch=1.0):
    spans = [Span(LANE.get(kind, "compute"), kind, i * 0.01 * stretch, (i + 1) * 0.01 * stretch, f"{kind} {device}",
                  device=device) for device in ("edge-a", "edge-b") for i, kind in enumerate(SPAN_KINDS)]
    return Timeline(spans, source)


def bars(fig, tag="predicted"):
    return {t.name.removesuffix(f" ({tag})"): t for t in fig.data if t.type == "bar" and t.name.endswith(f"({tag})")}


def test_every_kind_is_drawn_in_its_colour_in_a_row_per_device_and_lane():
    fig = gantt_figure(every_kind_on_two_devices())
    drawn = bars(fig)
    assert set(drawn) == set(SPAN_KINDS)
    for kind, trace in drawn.items():
        assert trace.marker.color == KIND_COLORS[kind] and len(trace.x) == 2
        assert sorted(trace.y) == sorted(f"{d} · {LANE.get(kind, 'compute')}" for d in ("edge-a", "edge-b"))
    rows = {y for t in fig.data for y in t.y}
    assert rows == {f"{d} · {lane}" for d in ("edge-a", "edge-b") for lane in ("io", "compute", "link")}
    assert list(fig.layout.yaxis.categoryarray) == ["edge-b · link", "edge-b · compute", "edge-b · io",
                                                    "edge-a · link", "edge-a · compute", "edge-a · io"]
    assert unexplained(fig) == []


def test_each_kind_has_a_colour_of_its_own_and_an_unknown_kind_is_still_drawn(monkeypatch):
    assert set(KIND_COLORS) == set(SPAN_KINDS) and FALLBACK_COLOR not in KIND_COLORS.values()
    monkeypatch.setattr(workbench.timeline, "SPAN_KINDS", (*SPAN_KINDS, "prefetch"))
    fig = gantt_figure(Timeline([Span("io", "prefetch", 0, 0.01, "ahead"), Span("io", "io", 0.01, 0.02)]))
    assert [(t.name, t.marker.color) for t in fig.data] == [("io (predicted)", KIND_COLORS["io"]),
                                                            ("prefetch (predicted)", FALLBACK_COLOR)]


def test_measured_is_overlaid_hatched_in_the_rows_of_the_prediction():
    fig = gantt_figure(every_kind_on_two_devices(), every_kind_on_two_devices("measured", stretch=1.2))
    predicted, measured = bars(fig), bars(fig, "measured")
    assert set(predicted) == set(measured) == set(SPAN_KINDS)
    for kind in SPAN_KINDS:
        assert list(measured[kind].y) == list(predicted[kind].y)
        assert measured[kind].marker.pattern.shape == "/" and not predicted[kind].marker.pattern.shape
        assert (predicted[kind].offset, measured[kind].offset) == (0, -predicted[kind].width)
    assert len(fig.layout.yaxis.categoryarray) == 6
    assert fig.layout.xaxis.range[1] == pytest.approx(len(SPAN_KINDS) * 12 * 1.02)


def test_a_flow_is_an_arrow_from_the_send_end_to_the_receive_start():
    sender = Timeline([Span("link", "comm", 0.010, 0.012, "send", device="edge-a", flow="x", nbytes=64)], "measured")
    receiver = Timeline([Span("link", "comm", 0.001, 0.002, "recv", device="edge-b", flow="x")], "measured")
    merged = Timeline.merge([sender, receiver], [0.0, 0.015])
    fig = gantt_figure(None, merged)
    arrows = [t for t in fig.data if t.type == "scatter"]
    assert [t.name for t in arrows] == ["send -> receive (measured)"]
    assert list(arrows[0].x) == pytest.approx([12.0, 16.0, None])
    assert list(arrows[0].y) == ["edge-a · link", "edge-b · link", None]
    assert "64 bytes" in arrows[0].hovertext[0] and unexplained(fig) == []


def test_a_single_device_keeps_rows_named_by_lane():
    fig = gantt_figure(Timeline([Span("io", "io", 0, 1, device="odroid-n2"),
                                 Span("compute", "compute", 1, 2, device="odroid-n2")]))
    assert list(fig.layout.yaxis.categoryarray) == ["compute", "io"]
