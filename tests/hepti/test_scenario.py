"""A Hepti study's settings turned into the engine's answers without a page: every layer's decision follows the
memory reports as ``decide`` makes them, the executed steps are each layer's own partition's, the comparison
holds Hepti's MILP, both baselines and each mode forced, and a remembering solver is asked, not bypassed."""
import math
from dataclasses import replace

import pytest

from workbench.devices import get_cluster
from workbench.distributed.shares import proportional_shares
from workbench.errors import WorkbenchError
from workbench.hepti.plan import MODE_TITLES, hepti_partition
from workbench.hepti.run import decide, layer_steps, shape_of, split_of
from workbench.hepti.scenario import COMPARE, FORCED, Scenario, compare, run_mode, scenario_steps, schedule, solve
from workbench.models.shapes import SHAPES

CLUSTER = tuple(get_cluster("hepti").devices)
SHAPE = shape_of(SHAPES["encoder"], 128)


def study(**changes) -> Scenario:
    return replace(Scenario(CLUSTER, "encoder", 128, math.inf, None, "hepti"), **changes)


def test_a_memory_fall_switches_the_mode_at_its_layer_and_only_there():
    s = study(falls=(("rpi4-b", 2, 20e6),))
    layers = schedule(s)
    ws = hepti_partition(CLUSTER, SHAPE, num_layers=6)
    fallen = tuple(replace(d, memory_bytes=20e6) if d.name == "rpi4-b" else d for d in CLUSTER)
    _split, why, tiled = decide(split_of(ws, range(4), SHAPE), None, fallen, SHAPE, 6, 2, math.inf, range(4))
    assert [ld.partition.mode for ld in layers] == ["ws", "ws", tiled.mode, tiled.mode, tiled.mode, tiled.mode]
    assert [ld.changed for ld in layers] == ["first", "", why, "", "", ""]
    assert layers[0].partition.shares == ws.shares and layers[2].partition.shares == tiled.shares


def test_the_steps_are_each_layers_own_partitions():
    s = study(falls=(("rpi4-b", 2, 20e6),))
    layers = schedule(s)
    steps = scenario_steps(s, layers)
    expected = [st for n, ld in enumerate(layers)
                for st in layer_steps(split_of(ld.partition, range(4), SHAPE), n, SHAPE, CLUSTER)]
    assert steps == expected and {st.layer for st in steps} == set(range(6))


def test_baseline_shares_run_in_heptis_mode_and_a_forced_mode_wins():
    assert run_mode(study()) is None                                   # Hepti decides as it runs
    assert run_mode(study(shares="even")) == hepti_partition(CLUSTER, SHAPE, num_layers=6).mode
    assert run_mode(study(shares="even", mode="2d")) == "2d"
    even = schedule(study(shares="even"))
    assert all(ld.partition.shares == pytest.approx((0.25,) * 4) for ld in even)
    prop = schedule(study(shares="proportional"))[0].partition
    assert prop.shares == pytest.approx(proportional_shares(CLUSTER))


def test_the_comparison_holds_every_choice_and_keeps_a_refusal_as_its_reason():
    out = compare(study())
    assert list(out) == [COMPARE["hepti"], COMPARE["even"], COMPARE["proportional"], *(FORCED[m] for m in MODE_TITLES)]
    for mode in MODE_TITLES:
        assert out[FORCED[mode]].predicted_latency_s == pytest.approx(
            hepti_partition(CLUSTER, SHAPE, num_layers=6, mode=mode).predicted_latency_s)
    tiny = tuple(replace(d, memory_bytes=1e3) for d in CLUSTER)        # nobody holds a slice of anything
    refused = compare(study(devices=tiny))
    assert all(isinstance(v, str) and v for v in refused.values())


def test_a_remembering_solver_is_the_one_asked():
    asked = []

    def remembering(*args):
        asked.append(args)
        return solve(*args)

    schedule(study(shares="even"), partition=remembering)
    compare(study(), partition=remembering)
    # the run's mode; then Hepti's, each baseline's mode and shares, and the four modes forced
    assert len(asked) == 1 + 1 + 2 * 2 + 4
    assert {a[4] for a in asked[-4:]} == set(MODE_TITLES) and asked[3][5] == (0.25,) * 4
