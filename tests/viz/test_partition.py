"""Figures of position-wise partitioning read back against the engine's own numbers (cost model only, no torch).

Each test says the wrong code it catches."""
import math

import pytest

from workbench.partition.cost import SHAPES, attention_order
from workbench.partition.plan import SCHEMES, DeviceRow, devices_from_table, devices_like, plan_partition
from workbench.timeline import Span, Timeline
from workbench.viz.partition import (ORDER_PATTERNS, decision_figure, order_boundary, orders_figure,
                                     scheme_label, schemes_figure, timeline_figure)
from workbench.viz.timeline import gantt_figure

ENCODER = SHAPES["encoder"]


def unequal(*speeds, bandwidth=500.0):
    return devices_from_table([DeviceRow(s, 4.0 + i, bandwidth) for i, s in enumerate(speeds)])


def all_plans(shape, N, devices, shares="even"):
    out = {}
    for scheme in SCHEMES:
        try:
            out[scheme] = plan_partition(scheme, shape, N, devices, shares=shares)
        except Exception as exc:              # noqa: BLE001 - the figure draws the reason
            out[scheme] = str(exc)
    return out


def test_voltage_decision_bars_are_the_plans_position_bounds_and_orders():
    """Catches: bars drawn from the shares instead of the rounded bounds, a device's start and end swapped or
    shifted by one device, the layers in another order, the hatching of Eq. (8) on the wrong device."""
    devices = unequal(1.0, 40.0, 10.0)            # proportional: a short partition (Eq. 8) beside long ones
    plan = plan_partition("voltage", ENCODER, 500, devices, shares="proportional")
    fig = decision_figure(plan)
    assert len(fig.data) == plan.K
    orders = {o for layer in plan.orders for o in layer}
    assert orders == {"x_first", "qk_first"}      # the case below tells the two patterns apart
    for i, trace in enumerate(fig.data):
        assert list(trace.y) == list(range(ENCODER.num_layers))
        assert list(trace.base) == [b[i] for b in plan.bounds]
        assert [s + w for s, w in zip(trace.base, trace.x)] == [b[i + 1] for b in plan.bounds]
        assert list(trace.marker.pattern.shape) == [ORDER_PATTERNS[o[i]] for o in plan.orders]
        assert trace.name.startswith(f"device {i} ({devices[i].name}): {plan.shares[0][i]:.1%}")
    assert plan.bounds[0] == (0, round(500 / 51), round(500 * 41 / 51), 500)    # 1 : 40 : 10 of 500, rounded
    assert fig.layout.xaxis.title.text == "positions (of N = 500)" and fig.layout.yaxis.title.text == "layer"
    assert tuple(fig.layout.xaxis.range) == (0, 500)

    per_layer = [(0.1 * (1 + k), 0.5, 0.4 - 0.1 * k) for k in range(4)] + [(0.2, 0.2, 0.6)] * 2
    plan = plan_partition("voltage", ENCODER, 500, devices, shares=per_layer)     # shares change per layer
    fig = decision_figure(plan)
    assert len(set(plan.bounds)) == 5
    for i, trace in enumerate(fig.data):
        assert list(trace.base) == [b[i] for b in plan.bounds]
        assert list(trace.x) == [b[i + 1] - b[i] for b in plan.bounds]
        assert [c[0] for c in trace.customdata] == [s[i] for s in plan.shares]


def test_tensor_parallel_and_pipeline_decisions_draw_heads_and_layers():
    """Catches: heads drawn from a device's index instead of the plan's split, the pipeline's layers given to the
    wrong device (they follow memory, not speed), a device without layers drawn as an empty trace."""
    devices = unequal(10.0, 10.0, 10.0, 10.0, 10.0)
    tp = plan_partition("tensor_parallel", ENCODER, 64, devices)
    fig = decision_figure(tp)
    starts = [sum(tp.heads[:i]) for i in range(tp.K)]
    assert [t.base[0] for t in fig.data] == starts and [t.x[0] for t in fig.data] == list(tp.heads)
    assert tp.heads == (3, 3, 2, 2, 2) and fig.layout.xaxis.title.text == "attention heads (of H = 12)"

    pipe = plan_partition("pipeline", ENCODER, 64, devices_from_table(
        [DeviceRow(10, 1, 500), DeviceRow(10, 2, 500), DeviceRow(10, 3, 500)]))
    fig = decision_figure(pipe)
    assert [len(t.y) for t in fig.data] == list(pipe.layers) == [1, 2, 3]
    assert [list(t.y) for t in fig.data] == [[0], [1, 2], [3, 4, 5]]
    assert all(list(t.x) == [64] * len(t.y) for t in fig.data)
    single = decision_figure(plan_partition("single", ENCODER, 64, devices))
    assert len(single.data) == 1 and list(single.data[0].y) == list(range(6))


def test_scheme_bars_stack_the_plans_compute_and_communication():
    """Catches: compute read from one device's compute_s (the stack would not reach the predicted latency on
    unequal devices), communication in seconds instead of ms, bars put under the wrong scheme, the one-device
    line drawn at another scheme's latency, an impossible scheme silently dropped."""
    devices = unequal(10.0, 20.0, 10.0, 5.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0)   # 13 > 12 heads
    plans = all_plans(ENCODER, 128, devices)
    assert isinstance(plans["tensor_parallel"], str) and isinstance(plans["torch_tp"], str)
    fig = schemes_figure(plans, plans["single"].predicted_s, selected="voltage")
    compute, comm = fig.data
    assert list(compute.x) == list(comm.x) == [scheme_label(s) for s in SCHEMES]
    for k, scheme in enumerate(SCHEMES):
        plan = plans[scheme]
        if isinstance(plan, str):
            assert compute.y[k] is None and comm.y[k] is None
            note = next(a for a in fig.layout.annotations if a.x == scheme_label(scheme))
            assert note.text == "not possible" and note.hovertext == plan
            continue
        on_path = sum(max(s.seconds) for s in plan.steps if s.kind == "compute")
        assert compute.y[k] == pytest.approx(1e3 * on_path)
        assert compute.y[k] == pytest.approx(1e3 * (plan.predicted_s - plan.comm_s()))
        assert compute.customdata[k] == pytest.approx(1e3 * max(plan.compute_s()))
        assert comm.y[k] == pytest.approx(1e3 * plan.comm_s())
        assert compute.y[k] + comm.y[k] == pytest.approx(1e3 * plan.predicted_s)
    voltage = plans["voltage"]
    assert max(voltage.compute_s()) < voltage.predicted_s - voltage.comm_s() + 1e-12
    line = fig.layout.shapes[0]
    assert line.y0 == line.y1 == pytest.approx(1e3 * plans["single"].predicted_s)
    widths = list(compute.marker.line.width)
    assert widths[list(SCHEMES).index("voltage")] == 2.5 and sorted(widths)[:4] == [0.5] * 4
    assert fig.layout.yaxis.title.text == "predicted latency (ms)"
    assert "13 devices, 500 Mbit/s links" in fig.layout.title.text


def test_lower_bandwidth_grows_the_communication_bar_by_the_cost_models_seconds():
    """Catches: a figure that caches its bars across bandwidths, or scales them by anything but the plan."""
    fast = all_plans(ENCODER, 128, devices_like(4, bandwidth_mbit=1000))
    slow = all_plans(ENCODER, 128, devices_like(4, bandwidth_mbit=250))
    a = schemes_figure(fast).data[1].y
    b = schemes_figure(slow).data[1].y
    tp = list(SCHEMES).index("tensor_parallel")
    grown = 1e3 * (slow["tensor_parallel"].comm_s() - fast["tensor_parallel"].comm_s())
    assert b[tp] - a[tp] == pytest.approx(grown)
    # 2 All-Reduces per layer, each a device's largest of sent or received bytes over its link: 3/4 of the
    # ring's 2NF floats moved at 1/250 - 1/1000 of a Mbit/s more per bit
    nbytes = 2 * 128 * 384 * 4 * 3 / 4
    assert grown == pytest.approx(1e3 * 6 * 2 * nbytes * 8 * (1 / 250e6 - 1 / 1000e6))


def test_the_timeline_is_the_shared_gantt_of_the_plan_and_names_both_latencies():
    """Catches: another Gantt than the shared one, a measured run drawn without the prediction beneath it, the
    title's two latencies swapped."""
    plan = plan_partition("voltage", ENCODER, 64, devices_like(2))
    fig = timeline_figure(plan)
    same = gantt_figure(plan.timeline, title=fig.layout.title.text)
    assert fig.to_plotly_json()["data"] == same.to_plotly_json()["data"]
    assert fig.layout.title.text.endswith(f"predicted {1e3 * plan.predicted_s:.1f} ms")
    measured = Timeline(tuple(Span(s.lane, s.kind, s.start * 1.5, s.end * 1.5, s.label, device=s.device,
                                   rank=s.rank, layer=s.layer) for s in plan.timeline.spans), "measured")
    fig = timeline_figure(plan, measured, 1.5 * plan.predicted_s, note="50 % above the prediction")
    names = {t.name for t in fig.data}
    assert {"compute (predicted)", "comm (predicted)", "compute (measured)", "comm (measured)"} <= names
    assert (f"measured {1.5e3 * plan.predicted_s:.1f} ms vs predicted {1e3 * plan.predicted_s:.1f} ms"
            in fig.layout.title.text)
    assert "<sub>50 % above the prediction</sub>" in fig.layout.title.text
    assert fig.layout.xaxis.title.text == "time (ms)"


@pytest.mark.parametrize("model", ["encoder", "bert-large"])
def test_the_order_map_is_theorem_2_at_every_point_and_marks_the_page(model):
    """Catches: the map drawn with N and P swapped, Eq. (8) coloured where Eq. (3) wins, points with P > N
    coloured, the page's point at N/K drawn at another K, a boundary line that is not the theorem's."""
    shape = SHAPES[model]
    F, F_H = shape.hidden, shape.head_dim
    fig = orders_figure(shape, 300, 6)
    heat = fig.data[0]
    xs, ys = list(heat.x), list(heat.y)
    assert xs == ys and xs[0] == 1 and xs[-1] == shape.max_positions
    seen = set()
    for r, P in enumerate(ys):
        for c, N in enumerate(xs):
            z = heat.z[r][c]
            if P > N:
                assert z is None
                continue
            assert z == (attention_order(N, P, F, F_H) == "x_first"), (N, P)
            if P < N:                              # the boundary line separates the two colours
                assert z == (P < order_boundary(N, F, F_H)), (N, P)
            seen.add(z)
    assert seen == {0, 1}
    point = fig.data[-1]
    assert list(point.x) == [300] and list(point.y) == [50.0]
    assert "at N = 300, P = N/K = 50" in fig.layout.title.text
    assert fig.layout.xaxis.title.text == "sequence length N"
    assert fig.layout.yaxis.title.text.startswith("partition length P")
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "log"
    assert math.isclose(order_boundary(N := 512, F, F_H), N * F * F_H / (F * F_H + N * (F - F_H)))


def test_the_order_map_says_a_rotary_model_keeps_eq_3():
    fig = orders_figure(SHAPES["decoder"], 1024, 4)
    assert "rotary keys: this model keeps Eq. 3" in fig.layout.title.text
    assert fig.layout.xaxis.range[1] == pytest.approx(math.log10(8192))
