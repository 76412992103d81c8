"""Hepti's cost model and LP partitioner: shares, modes, reasons, and bad input."""
from __future__ import annotations

import math
from dataclasses import replace
from itertools import product

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.devices import MINILM, PRESETS, LayerShape
from workbench.errors import WorkbenchError
from workbench.hepti.plan import (FLOAT_BYTES, DeadlineMissed, hepti_partition, largest_remainder, layer_latency,
                                  memory_bytes, mode_blocks, ws_fixed_bytes)

BOARD = PRESETS["rpi4"]
FAST_LINKS = 1e12


def boards(*speeds_gflops, memory=4e9, bandwidth=FAST_LINKS):
    return [replace(BOARD, name=f"d{i}", flops_per_s=s * 1e9, memory_bytes=memory, net_bytes_per_s=bandwidth)
            for i, s in enumerate(speeds_gflops)]


@settings(max_examples=200, deadline=None)
@given(total=st.integers(0, 5000), shares=st.lists(st.floats(0, 1), min_size=1, max_size=20))
def test_rounding_keeps_the_sum_and_non_negativity(total, shares):
    if sum(shares) <= 0:
        shares = shares[:-1] + [1.0]
    sizes = largest_remainder(total, shares)
    assert sum(sizes) == total and min(sizes) >= 0
    exact = [total * s / sum(shares) for s in shares]
    assert all(abs(a - e) < 1 for a, e in zip(sizes, exact))
    assert all(a == 0 for a, s in zip(sizes, shares) if s == 0)


def test_equal_devices_get_equal_shares():
    part = hepti_partition(boards(12, 12, 12, 12), MINILM)
    np.testing.assert_allclose(part.shares, [0.25] * 4, atol=1e-9)
    assert part.sizes == (32, 32, 32, 32) and part.mode == "ws"


def test_speeds_one_two_one_get_shares_one_two_one_when_links_are_fast():
    part = hepti_partition(boards(10, 20, 10), MINILM)
    np.testing.assert_allclose(part.shares, [0.25, 0.5, 0.25], atol=1e-9)
    assert part.sizes == (32, 64, 32)


def test_a_device_with_no_free_memory_is_dropped():
    devices = boards(10, 10, 10)
    devices[1] = replace(devices[1], memory_bytes=0)
    part = hepti_partition(devices, MINILM)
    assert part.shares[1] == 0 and part.sizes[1] == 0 and part.participants == [0, 2]
    assert any("d1 dropped: no free memory" in r for r in part.reasons)


def test_modes_follow_the_device_count_and_memory():
    assert hepti_partition(boards(10), MINILM).mode == "serial"
    assert hepti_partition(boards(10, 10, 10), MINILM, num_layers=6).mode == "ws"
    short = ws_fixed_bytes(MINILM, 6) / 2                   # can hold half of what WS needs
    few = [boards(10, memory=4e9)[0]] + boards(10, 10, 10, memory=short)[1:]
    part = hepti_partition(few, MINILM, num_layers=6)
    assert part.mode == "1d" and "cannot hold what WS needs" in part.reasons[0]
    many = [boards(10, memory=4e9)[0]] + boards(*[10] * 16, memory=short)[1:]
    part = hepti_partition(many, MINILM, num_layers=6)
    assert part.mode == "2d" and part.grid == (4, 4) and math.isclose(sum(part.shares), 1.0)
    mu, nu = part.axis_shares
    np.testing.assert_allclose(part.shares, [m * n for m, n in product(mu, nu)])
    slow = [replace(d, net_bytes_per_s=125e6) for d in many]        # 1 Gbit/s: only a few are worth their link
    part = hepti_partition(slow, MINILM, num_layers=6)
    assert part.mode == "1d" and len(part.participants) < 16
    assert any("1D-tiled after all: the mixed-integer optimum takes" in r for r in part.reasons)
    assert part.predicted_latency_s < hepti_partition(slow, MINILM, num_layers=6, mode="2d").predicted_latency_s


def test_memory_bounds_the_shares_and_binds():
    """The tiled mode keeps each device's share of the weights within its memory."""
    total = memory_bytes("1d", MINILM, 1.0, 6)
    devices = boards(10, 10, 10, memory=total)
    devices[1] = replace(devices[1], memory_bytes=0.1 * total)
    devices[2] = replace(devices[2], memory_bytes=0.2 * total)
    part = hepti_partition(devices, MINILM, num_layers=6, mode="1d")
    assert part.shares[1] <= 0.1 + 1e-9 and part.shares[2] <= 0.2 + 1e-9
    assert "memory of d1" in part.binding


def test_the_latency_is_equation_7():
    """One layer, two equal devices in WS: per block the slowest device's compute (2 r / FLOP/s, Eq. 5) plus
    the bytes each device receives over its bandwidth summed over devices (Eq. 6)."""
    devices = boards(10, 10, bandwidth=100e6)
    T, d, f = MINILM.seq_len, MINILM.hidden, MINILM.ffn
    compute = 2 * (3 * d * T * d + 2 * T * T * d + d * d * T + 2 * d * f * T) * 0.5 / 10e9
    comm = 2 * (2 * 0.5 * T * d * FLOAT_BYTES / 100e6)     # two All-Gathers, each device receiving half
    latency, _ = layer_latency("ws", MINILM, [0.5, 0.5], devices)
    assert latency == pytest.approx(compute + comm)
    assert hepti_partition(devices, MINILM).predicted_latency_s == pytest.approx(compute + comm)


def test_a_deadline_no_partition_meets_names_the_best_latency():
    best = hepti_partition(boards(10, 10), MINILM).predicted_latency_s
    with pytest.raises(WorkbenchError, match=rf"best reachable is {1e3 * best:.1f} ms"):
        hepti_partition(boards(10, 10), MINILM, deadline_s=best / 2)


def _unequal(K: int) -> list:
    """K devices of four kinds on unequal links (the page's table at many devices): a mixed-integer program that
    leaves most of them out."""
    kinds = [replace(d, net_bytes_per_s=b) for d, b in zip(boards(12, 8, 12, 4), (125e6, 125e6, 125e6, 37.5e6))]
    return [replace(kinds[i % 4], name=f"b{i}") for i in range(K)]


def test_a_missed_deadline_unquoted_is_proven_without_the_full_solve_and_quoted_after_it(monkeypatch):
    """``quote_best=False``: the mixed-integer program given the deadline proves it missed (DeadlineMissed,
    naming the deadline) without the solve the quote needs; quoted, the same inputs name the best reachable,
    and the optimum is remembered, so the quote asked again solves nothing. Just above the best reachable
    the deadline is met, by the same partition quoted or not; just below it is missed. A feasibility check
    that compared one layer's time with the whole deadline (or the other way round) fails at one of them."""
    from workbench.hepti import plan

    devices, L = _unequal(24), 6
    calls = []
    solve = plan.solve_sizes
    monkeypatch.setattr(plan, "solve_sizes", lambda mode, shape, devs, *a, **k:
                        calls.append((len(devs), k.get("feasible_only", False))) or solve(mode, shape, devs, *a, **k))
    forget = lambda: monkeypatch.setattr(plan, "OPTIMA", plan.Optima())
    forget()
    with pytest.raises(plan.DeadlineMissed) as missed:
        hepti_partition(devices, MINILM, deadline_s=0.004, num_layers=L, quote_best=False)
    assert str(missed.value).startswith("no partition meets the deadline of 4.0 ms (weight-stationary (WS)")
    assert missed.value.best_s is None and calls == [(24, True)]        # the feasibility check only
    best = hepti_partition(devices, MINILM, num_layers=L)
    assert calls[1:] == [(24, False)]
    with pytest.raises(WorkbenchError, match=rf"^no partition meets the deadline of 4.0 ms: the best reachable is "
                                             rf"{1e3 * best.predicted_latency_s:.1f} ms") as quoted:
        hepti_partition(devices, MINILM, deadline_s=0.004, num_layers=L)
    assert len(calls) == 2                                             # remembered: nothing solved again
    forget()
    above = hepti_partition(devices, MINILM, deadline_s=best.predicted_latency_s * (1 + 1e-6), num_layers=L,
                            quote_best=False)
    assert above == best and above.sizes == best.sizes
    forget()
    with pytest.raises(plan.DeadlineMissed):
        hepti_partition(devices, MINILM, deadline_s=best.predicted_latency_s * (1 - 1e-4), num_layers=L,
                        quote_best=False)


def test_a_missed_deadline_is_quoted_at_once_when_the_last_optimums_devices_still_give_the_best(monkeypatch):
    """After an optimum at another sequence length, a missed deadline is quoted exactly as the full solve quotes
    it, from the program over the devices that took part then and a proof over all of them (both a few ms),
    with no full solve; where those devices no longer give the best, the proof fails and nothing is quoted.
    A quote taken from the restricted program without the proof fails the second case."""
    from workbench.hepti import plan

    devices, L = _unequal(24), 6
    forget = lambda: monkeypatch.setattr(plan, "OPTIMA", plan.Optima())
    forget()
    hepti_partition(devices, replace(MINILM, seq_len=100), num_layers=L)
    taking = next(iter(plan.OPTIMA.taking.values()))
    calls = []
    solve = plan.solve_sizes
    monkeypatch.setattr(plan, "solve_sizes", lambda mode, shape, devs, *a, **k:
                        calls.append((len(devs), k.get("feasible_only", False))) or solve(mode, shape, devs, *a, **k))
    with pytest.raises(plan.DeadlineMissed) as missed:
        hepti_partition(devices, MINILM, deadline_s=0.004, num_layers=L, quote_best=False)
    assert calls == [(24, True), (len(taking), False), (24, True)]
    with pytest.raises(WorkbenchError) as full:
        hepti_partition(devices, MINILM, deadline_s=0.004, num_layers=L)
    assert str(missed.value) == str(full.value) and "the best reachable is" in str(full.value)
    assert missed.value.best_s == pytest.approx(hepti_partition(devices, MINILM, num_layers=L).predicted_latency_s)

    forget()                                     # a set that cannot give the best: its two slowest-linked boards
    slow = tuple(sorted(range(1, 24), key=lambda i: devices[i].net_bytes_per_s)[:2])
    plan.OPTIMA.taking[("ws", tuple(devices), L, "shared")] = (0, *slow)
    with pytest.raises(plan.DeadlineMissed) as missed:
        hepti_partition(devices, MINILM, deadline_s=0.004, num_layers=L, quote_best=False)
    assert missed.value.best_s is None and "best reachable" not in str(missed.value)


def test_weights_that_fit_nowhere_are_said_so_quoted_or_not():
    devices = [replace(d, memory_bytes=1e5) for d in boards(10, 10)]
    for quote in (True, False):
        with pytest.raises(WorkbenchError, match="fit nowhere") as refused:
            hepti_partition(devices, MINILM, deadline_s=0.001, num_layers=6, mode="ws", quote_best=quote)
        assert not isinstance(refused.value, DeadlineMissed)


@pytest.mark.parametrize("devices,message", [
    (lambda: [], "at least one device"),
    (lambda: boards(-1.0, 10), "flops_per_s must be > 0"),
    (lambda: boards(10, 10, bandwidth=-5), "net_bytes_per_s must be >= 0"),
    (lambda: boards(10, 10, bandwidth=0), "bandwidth must be above 0 Mbit/s"),
    (lambda: [replace(BOARD, name="p", memory_bytes=1e3)], "less than the"),
])
def test_bad_input_gets_a_clear_error(devices, message):
    with pytest.raises(WorkbenchError, match=message):
        hepti_partition(devices(), MINILM, num_layers=6)


def test_weights_that_fit_nowhere():
    devices = boards(10, 10, 10, memory=1e6)
    with pytest.raises(WorkbenchError, match="fit nowhere"):
        hepti_partition(devices, MINILM, num_layers=6)


def test_a_slow_device_behind_a_slow_link_is_dropped_and_the_rest_solved_again():
    devices = boards(20, 20, 0.01, bandwidth=125e6)
    part = hepti_partition(devices, MINILM)
    assert part.shares[2] == 0 and any("d2 dropped" in r for r in part.reasons)


def test_mode_blocks_count_their_collectives():
    assert [b.collective for b in mode_blocks("ws", MINILM, 4)].count("all_gather") == 2
    assert [b.collective for b in mode_blocks("1d", MINILM, 4)].count("all_reduce") == 2
    two_d = [b.collective for b in mode_blocks("2d", MINILM, 4, (2, 2))]
    assert two_d.count("all_gather") == 3 and two_d.count("all_reduce") == 3
    shape = LayerShape(64, 4, 128, 10)
    activations = (0.5 * (4 * 10 * 10 + 3 * 10 * 64 + 10 * 128) + 3 * 10 * 64) * 4      # scores of its heads, ...
    whatever = (4 * 64 * 64 / 4 + 9 * 64 + 128) * 4          # a head beyond its share, biases and norms, per layer
    assert memory_bytes("1d", shape, 0.5) == 0.5 * (4 * 64 * 64 + 2 * 64 * 128) * 4 + whatever + activations
    assert memory_bytes("1d", shape, 0.5, 3) == 3 * (0.5 * (4 * 64 * 64 + 2 * 64 * 128) * 4 + whatever) + activations
    longer = LayerShape(64, 4, 128, 20)                     # the scores grow with T squared, the weights not at all
    assert memory_bytes("1d", longer, 0.5) - memory_bytes("1d", shape, 0.5) == \
        4 * (0.5 * (4 * 300 + 3 * 10 * 64 + 10 * 128) + 3 * 10 * 64)
    assert memory_bytes("serial", shape, 0.0) == 0.0


def test_the_primary_always_takes_part():
    """A primary behind a slow link would get share 0 from the LP alone; it holds the output, so it keeps at
    least one unit of the split."""
    devices = boards(1, 20, 20, bandwidth=125e6)
    devices[0] = replace(devices[0], net_bytes_per_s=1.25e6)
    part = hepti_partition(devices, MINILM)
    assert part.shares[0] > 0 and part.sizes[0] >= 1


def test_a_device_whose_link_costs_more_than_its_compute_saves_is_left_out():
    devices = boards(10, 10, 10, bandwidth=125e6)
    devices[2] = replace(devices[2], net_bytes_per_s=1.25e6)          # 10 Mbit/s
    part = hepti_partition(devices, MINILM, solver="lp")
    assert part.shares[2] == 0 and any(r.startswith("d2 dropped: receiving its part of each layer over its 10 "
                                                    "Mbit/s link") for r in part.reasons)
    both = hepti_partition(devices[:2], MINILM)
    assert part.predicted_latency_s == pytest.approx(both.predicted_latency_s)
    exact = hepti_partition(devices, MINILM, solver="milp")
    assert exact.shares[2] == 0 and any(r.startswith("d2 dropped: receiving its part") for r in exact.reasons)
    assert exact.predicted_latency_s <= part.predicted_latency_s * (1 + 1e-9)
    with pytest.raises(WorkbenchError, match="solver must be one of milp, lp"):
        hepti_partition(devices, MINILM, solver="greedy")


def test_each_dropped_device_is_explained_by_its_own_link_and_speed():
    """Two devices left out for their slow links quote different numbers: each its own link's receive time and
    the compute its own speed would save, computed here from the layer's sizes by hand."""
    devices = boards(10, 10, 10, 10, bandwidth=125e6)
    devices[2] = replace(devices[2], net_bytes_per_s=1.25e6)                          # 10 Mbit/s, 10 GFLOP/s
    devices[3] = replace(devices[3], net_bytes_per_s=2.5e6, flops_per_s=5e9)          # 20 Mbit/s, 5 GFLOP/s
    exact = hepti_partition(devices, MINILM, solver="milp")
    assert exact.mode == "ws" and exact.shares[2] == exact.shares[3] == 0
    T, d, f = MINILM.seq_len, MINILM.hidden, MINILM.ffn
    work = 2 * (3 * d * T * d + 2 * T * T * d + d * d * T + 2 * d * f * T)           # WS: Q K V, attention, L, MLP
    received = 2 * T * d * FLOAT_BYTES                                                # two All-Gathers of T x d
    for name, link, speed in (("d2", 1.25e6, 10e9), ("d3", 2.5e6, 5e9)):
        receive_ms, saves_ms = 1e3 * received / link, 1e3 * (work / 20e9 - work / (20e9 + speed))
        said = f"takes about {receive_ms:.3g} ms, more than the {saves_ms:.3g} ms its {speed / 1e9:.3g} GFLOP/s"
        assert [r for r in exact.reasons if r.startswith(f"{name} dropped:")] == [
            f"{name} dropped: receiving its part of each layer over its {8 * link / 1e6:.3g} Mbit/s link {said} "
            "would take off the layer's compute"]


def test_ws_needs_room_for_a_head_beside_the_fixed_part():
    exact = ws_fixed_bytes(MINILM, 6)
    devices = [boards(10, memory=4e9)[0]] + boards(10, 10, memory=exact)[1:]
    assert hepti_partition(devices, MINILM, num_layers=6).mode == "1d"


# -- P2 as a mixed-integer program

def _brute_force(mode, shape, devices, num_layers, deadline_s=math.inf, network="shared"):
    """The best Eq. 7 over every integer split of the mode's units that fits each device's memory."""
    from workbench.hepti.plan import split_units

    U, best = split_units(mode, shape), (math.inf, None)
    for head in product(range(U + 1), repeat=len(devices) - 1):
        units = (U - sum(head), *head)
        if units[0] < 1:
            continue
        if any(a and memory_bytes(mode, shape, a / U, num_layers) > d.memory_bytes * (1 + 1e-12)
               for a, d in zip(units, devices)):
            continue
        latency = layer_latency(mode, shape, [a / U for a in units], devices, network=network)[0] * num_layers
        if latency <= deadline_s and latency < best[0]:
            best = (latency, units)
    return best


TINY = LayerShape(hidden=16, heads=2, ffn=10, seq_len=9)


@pytest.mark.parametrize("network", ["shared", "switch"])
@pytest.mark.parametrize("mode", ["ws", "1d"])
@pytest.mark.parametrize("case", ["mixed", "slow link", "memory", "deadline"])
def test_the_mixed_integer_program_equals_brute_force(mode, case, network):
    """Over every integer split of a tiny layer (9 rows, 10 FFN columns) on three or four unequal devices, the
    MILP finds Eq. 7's minimum, and its units give that latency: with a device whose link costs more than its
    compute saves (left out), one whose memory caps its units, and a deadline the LP relaxation's shares would
    round past. A participation decided by the LP (the old heuristic) or an All-Reduce charged for devices not
    taking part fails one of them."""
    from workbench.hepti.plan import solve_sizes

    devices = [replace(d, net_bytes_per_s=b) for d, b in zip(boards(3, 5, 2, 4), (2e6, 8e6, 4e6, 6e6))]
    deadline = math.inf
    if case == "slow link":
        devices[2] = replace(devices[2], net_bytes_per_s=2e4)
    if case == "memory":
        cap = memory_bytes(mode, TINY, 2 / 9 if mode == "ws" else 2 / 10, 2)
        devices[1] = replace(devices[1], memory_bytes=cap)
    if case == "deadline":
        deadline = 1.02 * _brute_force(mode, TINY, devices[:3], 2, network=network)[0]
        devices = devices[:3]
    best, units = _brute_force(mode, TINY, devices, 2, deadline, network)
    solved = solve_sizes(mode, TINY, devices, 2, deadline, network=network)
    assert solved is not None
    got_units, got_latency, binding = solved
    U = 9 if mode == "ws" else 10
    assert sum(got_units) == U and got_units[0] >= 1
    assert got_latency == pytest.approx(best, rel=1e-6)
    assert layer_latency(mode, TINY, [a / U for a in got_units], devices, network=network)[0] * 2 == \
        pytest.approx(best, rel=1e-6)
    if case == "slow link":
        assert got_units[2] == 0
    if case == "memory":
        assert got_units[1] <= 2
    assert "sets the time" in binding


def test_sixty_four_devices_never_predict_worse_than_the_best_subset_of_them():
    """64 copies of four boards: the MILP's latency is at most that of the best 1, 2, ... of each kind (which it
    can pick itself), where the LP relaxation over all 64 is many times worse (every device pays Eq. 6)."""
    from workbench.hepti.plan import solve_shares, solve_sizes

    kinds = [replace(d, net_bytes_per_s=b) for d, b in zip(boards(12, 8, 12, 4), (125e6, 125e6, 125e6, 37.5e6))]
    devices = [replace(kinds[i % 4], name=f"b{i}") for i in range(64)]
    units, latency, _ = solve_sizes("ws", MINILM, devices, 6)
    assert sum(units) == MINILM.seq_len
    for n in range(1, 9):
        subset = devices[:n]
        sub = solve_sizes("ws", MINILM, subset, 6)
        assert latency <= sub[1] * (1 + 1e-9)
    relaxed = solve_shares("ws", MINILM, devices, 6)
    assert relaxed[1] > 3 * latency
    part = hepti_partition(devices, MINILM, num_layers=6, solver="milp", mode="ws")
    assert part.sizes == tuple(units) and part.predicted_latency_s == pytest.approx(latency)


# -- one network model with Voltage

@pytest.mark.parametrize("network", ["switch", "shared"])
def test_hepti_1d_and_voltages_tensor_parallel_plan_predict_the_same_schedule(network):
    """Hepti's 1D-tiled WS with even shares is the tensor-parallel split of Voltage's plans: on one cluster's
    network the two predict the same seconds for every compute step and every All-Reduce (the devices
    without per-layer overhead or small-row slowdown, which Eq. 5 does not have). A Hepti that priced its
    collectives with a model of its own (Eq. 6 summed where the cluster is a switch, or one latency per ring
    All-Reduce) fails."""
    from workbench.models.shapes import get_shape
    from workbench.hepti.run import predicted_steps, shape_of
    from workbench.partition.plan import plan_partition

    model = get_shape("encoder")
    devices = [replace(d, layer_overhead_s=0.0, half_peak_tokens=0.0, net_latency_s=2e-4)
               for d in boards(12, 6, 12, 6, bandwidth=30e6)]
    shape = shape_of(model, 32)
    part = hepti_partition(devices, shape, num_layers=model.num_layers, mode="1d", fixed_shares=[0.25] * 4,
                           network=network)
    hepti = [(s.kind, pytest.approx(max(s.seconds), rel=1e-12)) for s in predicted_steps(part, shape, model.num_layers)]
    plan = plan_partition("tensor_parallel", model, 32, devices, network=network)
    voltage = [(s.kind, max(s.seconds)) for s in plan.steps]
    assert voltage == hepti
    assert sum(s for _, s in voltage) == pytest.approx(plan.predicted_s)


def test_the_cluster_chooses_the_network_and_eq6_sums_where_a_switch_takes_the_busiest():
    from workbench.devices import get_cluster
    from workbench.network import Traffic, collective_s

    assert get_cluster("hepti").network == "shared" and get_cluster("voltage").network == "switch"
    traffic = [Traffic(300, 100), Traffic(100, 200), Traffic(0, 0)]
    assert collective_s(traffic, [100.0, 100.0, 50.0], 0.5, 2, "shared") == pytest.approx(1.0 + 1.0 + 2.0)
    assert collective_s(traffic, [100.0, 100.0, 50.0], 0.5, 2, "switch") == pytest.approx(1.0 + 3.0)
    with pytest.raises(WorkbenchError, match="a network is one of switch, shared, got 'bus'"):
        collective_s(traffic, [1.0] * 3, 0.0, network="bus")
    devices = boards(12, 6, 12, bandwidth=30e6)
    shared = hepti_partition(devices, MINILM, num_layers=6, mode="1d", fixed_shares=[1 / 3] * 3)
    switch = hepti_partition(devices, MINILM, num_layers=6, mode="1d", fixed_shares=[1 / 3] * 3, network="switch")
    assert shared.predicted_latency_s > switch.predicted_latency_s
    assert hepti_partition(devices, MINILM, num_layers=6, network="switch").predicted_latency_s <= \
        switch.predicted_latency_s * (1 + 1e-9)
