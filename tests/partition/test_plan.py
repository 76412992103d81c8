"""Plans: shares, positions, schedules, predictions and the errors bad input gets before any work."""
from __future__ import annotations

from dataclasses import replace

import pytest
from pytest import approx

from workbench.devices import PRESETS
from workbench.errors import WorkbenchError
from workbench.partition.cost import SHAPES, Traffic
from workbench.partition.plan import (DeviceRow, devices_from_table, devices_like, largest_remainder, plan_partition,
                                      position_bounds, proportional_shares)

ENC = SHAPES["encoder"]


def test_even_shares_cover_every_position_once():
    plan = plan_partition("voltage", ENC, 130, devices_like(4))
    assert plan.bounds[0] == (0, 32, 65, 98, 130)                # round(130 * i / 4)
    assert len(set(plan.bounds)) == 1 and len(plan.bounds) == ENC.num_layers


def test_uneven_and_per_layer_shares():
    per_layer = [[0.1, 0.2, 0.7]] * 3 + [[0.5, 0.5, 0.0]] * 3
    plan = plan_partition("voltage", ENC, 100, devices_like(3), shares=per_layer)
    assert plan.bounds[0] == (0, 10, 30, 100) and plan.bounds[5] == (0, 50, 100, 100)
    sent = [t.sent for t in plan.traffic()[4]]
    assert sent == [2 * 50 * 384 * 4, 2 * 50 * 384 * 4, 0]     # the idle device sends nothing
    last = plan.traffic()[5]                                     # the last layer: parts to the terminal only
    assert [t.sent for t in last] == [0, 50 * 384 * 4, 0] and last[0].received == 50 * 384 * 4
    assert plan.orders[5][2] == "none"


def test_algorithm_2_broadcasts_the_input_and_gathers_the_last_layer_at_the_terminal():
    """K = 4, N = 128, F = 384, even: the terminal sends the 128 x 384 input to 3 others; five All-Gathers in
    which each device sends its 32 rows to 3 others; the last layer's 32 rows from 3 devices to the terminal.
    The broadcast and the gather take the terminal's link: its 3 x 196,608 bytes and its 3 x 49,152."""
    plan = plan_partition("voltage", ENC, 128, devices_like(4, bandwidth_mbit=500, latency_ms=0.5))
    kinds = [s.kind for s in plan.steps if s.kind != "compute"]
    assert kinds == ["broadcast"] + ["all_gather"] * 5 + ["gather"]
    x, part = 128 * 384 * 4, 32 * 384 * 4
    first, last = plan.steps[0], plan.steps[-1]
    assert first.layer is None and first.traffic == (Traffic(3 * x, 0),) + (Traffic(0, x),) * 3
    assert last.traffic == (Traffic(0, 3 * part),) + (Traffic(part, 0),) * 3
    assert first.seconds[0] == approx(0.5e-3 + 3 * x / (500e6 / 8))
    assert last.seconds[0] == approx(0.5e-3 + 3 * part / (500e6 / 8))
    totals = plan.total_traffic()
    assert totals[0] == Traffic(3 * x + 5 * 3 * part, 5 * 3 * part + 3 * part)
    assert totals[1] == Traffic(5 * 3 * part + part, x + 5 * 3 * part)
    assert plan.predicted_s == approx(sum(max(s.seconds) for s in plan.steps))
    one = plan_partition("voltage", ENC, 128, devices_like(1))
    assert [s.kind for s in one.steps] == ["compute"] * 6                  # one device: nothing to send


def test_proportional_shares_follow_speed():
    fast = replace(PRESETS["edge-vm"], name="fast", flops_per_s=30e9)
    slow = replace(PRESETS["edge-vm"], name="slow", flops_per_s=10e9)
    assert proportional_shares([fast, slow]) == (0.75, 0.25)
    plan = plan_partition("voltage", ENC, 128, [fast, slow], shares="proportional")
    assert plan.bounds[0] == (0, 96, 128)


def test_the_prediction_follows_the_schedule():
    plan = plan_partition("voltage", ENC, 128, devices_like(4))
    assert [s.kind for s in plan.steps[:3]] == ["broadcast", "compute", "all_gather"]
    layer = max(plan.steps[1].seconds) + plan.steps[2].seconds[0]
    broadcast, gather = plan.steps[0].seconds[0], plan.steps[-1].seconds[0]
    assert plan.predicted_s == pytest.approx(broadcast + (ENC.num_layers - 1) * layer + max(plan.steps[-2].seconds)
                                             + gather)
    comm = [s for s in plan.timeline.spans if s.kind == "comm" and s.rank == 0]
    assert len(comm) == ENC.num_layers + 1 and comm[1].nbytes == 2 * 3 * 32 * 384 * 4
    assert comm[0].nbytes == 3 * 128 * 384 * 4 and comm[-1].nbytes == 3 * 32 * 384 * 4


def test_tensor_parallel_has_two_all_reduces_per_layer_and_four_times_the_bytes():
    devices = devices_like(4)
    tp = plan_partition("tensor_parallel", ENC, 128, devices)
    voltage = plan_partition("voltage", ENC, 128, devices)
    assert sum(s.kind == "all_reduce" for s in tp.steps) == 2 * ENC.num_layers
    assert [t.sent for t in tp.traffic()[0]] == [4 * t.sent for t in voltage.traffic()[0]]


def test_pipeline_splits_layers_by_memory():
    big = replace(PRESETS["edge-vm"], name="big", memory_bytes=3e9)
    small = replace(PRESETS["edge-vm"], name="small", memory_bytes=1e9)
    plan = plan_partition("pipeline", ENC, 64, [big, small])
    assert plan.layers == (5, 1) or plan.layers == (4, 2)
    assert plan.layers == tuple(largest_remainder(6, [3e9, 1e9]))
    sends = [s for s in plan.steps if s.kind == "send"]
    assert [(s.src, s.dst) for s in sends] == [(0, 1), (1, 0)]
    assert sends[0].traffic[0] == Traffic(64 * 384 * 4, 0)


def test_one_device_matches_for_every_scheme():
    """K = 1: every scheme computes the whole model on one device, so every prediction is the same."""
    times = {s: plan_partition(s, ENC, 128, devices_like(1)).predicted_s
             for s in ("voltage", "tensor_parallel", "torch_tp", "pipeline", "single")}
    assert max(times.values()) == pytest.approx(min(times.values()))


@pytest.mark.parametrize("call,message", [
    (lambda: plan_partition("voltage", ENC, 128, devices_like(2), shares=[0.6, 0.6]), "must sum to 1, got 1.2"),
    (lambda: plan_partition("voltage", ENC, 128, devices_like(2), shares=[1.5, -0.5]), "between 0 and 1"),
    (lambda: plan_partition("voltage", ENC, 128, devices_like(3), shares=[0.5, 0.5]), "2 shares for 3 devices"),
    (lambda: plan_partition("voltage", ENC, 3, devices_like(4)), "3 positions is shorter than the 4 devices"),
    (lambda: plan_partition("voltage", ENC, 600, devices_like(4)), "1 to 512 positions"),
    (lambda: plan_partition("tensor_parallel", ENC, 128, devices_like(13)), "at most 12 devices"),
    (lambda: plan_partition("torch_tp", ENC, 128, devices_like(5)), "divide by the device count"),
    (lambda: plan_partition("tensor_parallel", SHAPES["decoder"], 128, devices_like(3)), "use voltage"),
    (lambda: plan_partition("voltage", ENC, 128, devices_like(65)), "at most 64 devices"),
    (lambda: plan_partition("voltage", ENC, 128, devices_like(64) + devices_like(1)), "1 to 64 devices"),
    (lambda: plan_partition("voltage", ENC, 128, [replace(d, net_bytes_per_s=0) for d in devices_like(2)]),
     "bandwidth of 0 Mbit/s"),
    (lambda: plan_partition("sideways", ENC, 128, devices_like(2)), "scheme must be one of"),
    (lambda: devices_like(2, bandwidth_mbit=0), "link bandwidth: must be more than 0 Mbit/s"),
    (lambda: devices_like(2, bandwidth_mbit=float("inf")), "finite"),
    (lambda: devices_from_table([DeviceRow(10, 4, 500), DeviceRow(-1, 4, 500)]), "device 1's speed"),
    (lambda: devices_from_table([DeviceRow(10, 4, 1e9)]), "at most 100000 Mbit/s"),
])
def test_bad_input_is_refused_with_its_range(call, message):
    with pytest.raises(WorkbenchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_position_bounds_never_go_backwards():
    assert position_bounds(10, [0.0, 1.0, 0.0]) == (0, 0, 10, 10)
    assert position_bounds(7, [1 / 3] * 3) == (0, 2, 5, 7)


def test_a_table_of_devices_keeps_its_units():
    devices = devices_from_table([DeviceRow(10, 4, 500), DeviceRow(20, 8, 1000, name="laptop")], latency_ms=1)
    assert devices[0].flops_per_s == 10e9 and devices[1].memory_bytes == 8e9
    assert devices[1].net_bytes_per_s == 125e6 and devices[1].name == "laptop" and devices[0].net_latency_s == 1e-3
