"""Hepti on real processes: each mode equals the model in one process and counts the bytes its schedule
says; a falling memory report switches the mode mid-run; a killed device's work moves to the others."""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

from workbench.devices import PRESETS
from workbench.hepti.plan import hepti_partition
from workbench.errors import WorkbenchError
from workbench.hepti.run import PrimaryLost, memory_bytes, predicted_steps, run_hepti, shape_of
from workbench.models.shapes import SHAPES
from workbench.models.split import PartitionModel

pytestmark = pytest.mark.alone         # times work under CPU limits: run with no other test beside it

N = 32
ENC = SHAPES["encoder"]


def devices(count=4, speed=3e9):
    """Boards slow enough that this host keeps up with their emulated speed, so decisions stay put."""
    return [replace(PRESETS["rpi4"], name=f"d{i}", flops_per_s=speed * (2 if i == 1 else 1), net_bytes_per_s=125e6)
            for i in range(count)]


@pytest.fixture(scope="module")
def reference():
    model = PartitionModel("encoder")
    hidden, logits = model.reference(model.inputs(model.token_ids(N, 0)))
    return hidden.numpy(), logits.numpy()


def counted(run, kinds=("all_gather", "all_reduce")):
    """Per layer, per rank: bytes sent in the layers' collectives, as the ranks counted them."""
    table = {}
    for rank, counts in enumerate(run.counts[-1]):
        for c in counts:
            if c["kind"] in kinds:
                table[(c["layer"], rank)] = table.get((c["layer"], rank), 0) + c["sent"]
    return table


def scheduled(run):
    table = {}
    steps = predicted_steps(run.partition, shape_of(ENC, N), ENC.num_layers)
    for step in steps:
        for rank, t in enumerate(step.traffic):
            if t.sent:
                table[(step.layer, rank)] = table.get((step.layer, rank), 0) + t.sent
    return table


@pytest.mark.parametrize("mode", ["ws", "1d", "2d"])
@pytest.mark.integration
def test_each_mode_equals_the_model_and_counts_its_schedules_bytes(mode, reference):
    run = run_hepti(devices(), seq_len=N, mode=mode, adapt=False)
    np.testing.assert_allclose(run.hidden, reference[0], atol=2e-4, rtol=0)
    np.testing.assert_allclose(run.logits, reference[1], atol=2e-4, rtol=0)
    assert [d.mode for d in run.decisions] == [mode] and run.partition.mode == mode
    assert counted(run) == scheduled(run)
    if mode == "2d":
        assert run.partition.grid == (2, 2)


@pytest.mark.integration
def test_a_falling_memory_report_switches_the_mode_and_the_output_stays(reference):
    boards = devices()
    ws_needs = memory_bytes("ws", shape_of(ENC, N), 0.0, ENC.num_layers)
    run = run_hepti(boards, seq_len=N, memory_falls={"d2": (3, ws_needs / 2)}, adapt=False)
    np.testing.assert_allclose(run.hidden, reference[0], atol=2e-4, rtol=0)
    modes = [(d.layer, d.mode) for d in run.decisions]
    assert modes == [(0, "ws"), (3, "1d")]
    assert "d2's free memory fell to" in run.decisions[1].changed
    marks = [s.label for s in run.timeline.spans if s.event == "decision"]
    assert any("1d" in m for m in marks)


@pytest.mark.integration
def test_a_killed_device_is_named_and_its_work_moves_to_the_rest(reference):
    started = time.monotonic()
    run = run_hepti(devices(), seq_len=N, kill_at=("d2", 3), adapt=False)
    assert time.monotonic() - started < 120
    np.testing.assert_allclose(run.hidden, reference[0], atol=2e-4, rtol=0)
    assert len(run.faults) == 1 and "rank 2 (d2) died (was killed by SIGKILL)" in run.faults[0]
    assert "resumed at layer 3 over the 3 devices left" in run.faults[0]
    assert run.decisions[-1].layer == 3 and len(run.decisions[-1].shares) == 3


@pytest.mark.integration
def test_the_primary_holds_the_request_and_its_death_fails_it():
    """Killing the primary ends the request with one clear error (a run that resumed from a copy the parent
    kept would pass here); no worker process is left."""
    started = time.monotonic()
    with pytest.raises(PrimaryLost, match=r"the primary d0 died at layer 2: it holds the request .* nothing is resumed"):
        run_hepti(devices(), seq_len=N, kill_at=("d0", 2), adapt=False)
    assert time.monotonic() - started < 120


def test_the_primary_checkpoint_is_one_file_of_the_latest_layer(tmp_path):
    from workbench.hepti.run import checkpoint_layer, load_checkpoint, save_checkpoint

    assert checkpoint_layer(str(tmp_path)) is None
    x = np.arange(24, dtype=np.float32).reshape(1, 4, 6)
    save_checkpoint(str(tmp_path), 1, x)
    save_checkpoint(str(tmp_path), 2, x + 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layer-0002.npy"]
    layer, got = load_checkpoint(str(tmp_path))
    assert layer == 2 and np.array_equal(got, x + 1)


@pytest.mark.parametrize("kill, falls, message", [
    (("d9", 1), None, "the kill names 'd9', which is none of the devices"),
    (("d2", 99), None, "the kill on d2 is at layer 99; the model's layers are 0 to 5"),
    (None, {"d2": (6, 1e6)}, "the memory fall on d2 is at layer 6"),
    (("d3", 1), None, "the kill names 'd3', which takes no part in the plan"),
])
def test_faults_outside_the_plan_or_the_model_are_refused_before_any_process(kill, falls, message):
    boards = devices()
    boards[3] = replace(boards[3], net_bytes_per_s=1e4)                  # 80 kbit/s: never worth its link
    with pytest.raises(WorkbenchError, match=message):
        run_hepti(boards, seq_len=N, kill_at=kill, memory_falls=falls, adapt=False)


def test_the_speed_estimate_ignores_one_slow_layer_and_follows_two():
    from workbench.hepti.run import SpeedEstimate

    est = SpeedEstimate(6e9)
    assert est.flops_per_s == 6e9
    est.add(6e8, 1.0)                               # one layer at a tenth of the speed
    assert est.flops_per_s == 6e9
    est.add(6e9, 1.0)
    est.add(6e9, 1.0)
    est.add(6e8, 1.0)                               # another lone stall, two layers later
    assert est.flops_per_s == 6e9
    est.add(1.2e9, 1.0)                             # two slow layers of the last three: the estimate follows
    assert est.flops_per_s == pytest.approx(1.2e9)
    est.add(0.0, 0.0)                               # a layer the rank sat out says nothing
    assert est.flops_per_s == pytest.approx(1.2e9)


@pytest.mark.parametrize("stalled, repartitions", [((1,), False), ((1, 2), True)])
@pytest.mark.integration
def test_one_stalled_layer_keeps_the_split_and_a_sustained_slowdown_repartitions(stalled, repartitions, reference):
    """d1 (the fastest) loses 0.15 s inside its compute at the stalled layers (many times its layer): one stall
    is smoothed away, two in a row re-partition at the next layer, away from d1; the output never changes.
    A rank that reported its last layer's speed alone would re-partition on the single stall."""
    run = run_hepti(devices(), seq_len=N, stalls={"d1": {layer: 0.15 for layer in stalled}})
    np.testing.assert_allclose(run.hidden, reference[0], atol=2e-4, rtol=0)
    assert any(s.label == f"stall {stalled[-1]} (injected)" for s in run.timeline.spans)
    if not repartitions:
        assert [d.changed for d in run.decisions] == ["first"]
        return
    assert [d.layer for d in run.decisions] == [0, stalled[-1] + 1]
    assert "d1's measured speed (median of its last 3 layers) moved from" in run.decisions[1].changed
    assert run.decisions[1].shares[1] < run.decisions[0].shares[1] / 2


@pytest.mark.integration
def test_a_run_that_misses_its_prediction_says_by_how_much_and_why(reference):
    """A 0.4 s stall on the primary (smoothed away: no re-partition) puts the run far above Eq. 7: the check
    says how far and names the stall, the compute it landed in and the report gathers Eq. 7 leaves out;
    a replay is never called measured."""
    run = run_hepti(devices(), seq_len=N, stalls={"d0": {2: 0.4}})
    check = run.check()
    assert run.label == "replayed" and check.label == "replayed" and check.missed
    note = check.note()
    percent = round(100 * (run.latency_s / run.partition.predicted_latency_s - 1))
    assert note.startswith(f"replayed {1e3 * run.latency_s:.0f} ms is {percent} % above the predicted "
                           f"{1e3 * run.partition.predicted_latency_s:.0f} ms; likely: ")
    assert "1 injected stall(s), 4" in note and "compute took" in note and "report gathers" in note


@pytest.mark.integration
def test_a_measured_run_computes_under_cpu_limits_and_is_labelled_so(reference):
    """measured=True: every rank under its device's CPU limit on a shaped link (or, where this host cannot,
    at its speed with the reason); the outputs still equal the model."""
    from workbench.distributed.cpulimit import limits_problem

    run = run_hepti(devices(2), seq_len=N, measured=True, adapt=False)
    np.testing.assert_allclose(run.hidden, reference[0], atol=2e-4, rtol=0)
    problem = limits_problem()
    if problem:
        assert run.label == "unlimited" and problem in run.note
    else:
        assert run.label == "measured" and run.limited and not run.emulated and run.note == ""
        assert run.check().label == "measured"


def _slice_floats(split, rank, shape) -> int:
    """What rank holds of one layer in 1D-tiled WS, counted from the split: its heads' rows of Q, K, V with their
    biases, W_O's columns for those heads, its FFN columns of W_1 (with bias) and rows of W_2, the biases of W_O and
    W_2 and both LayerNorms whole."""
    d, dh = shape.hidden, shape.hidden // shape.heads
    h, f = split.heads[rank], split.ffn[rank]
    return 3 * (h * dh * d + h * dh) + d * h * dh + d + 4 * d + (f * d + f) + d * f + d


@pytest.mark.integration
def test_each_rank_holds_only_its_slice_and_its_resident_memory_says_so(reference):
    """1D-tiled over four boards with 20 MB free each (the whole model's layers are 42 MB): every rank's weights
    are its slice, to the float, and the operating system's count of its anonymous memory grows by about that
    much, within its device's bound. A rank that loaded the whole model, or cut its slice per call from a
    full copy, would be above the bound."""
    from workbench.hepti.run import split_of

    shape = shape_of(ENC, N)
    boards = [replace(b, memory_bytes=20e6) for b in devices()]
    run = run_hepti(boards, seq_len=N, mode="1d", adapt=False)
    np.testing.assert_allclose(run.hidden, reference[0], atol=2e-4, rtol=0)
    split = split_of(run.partition, list(range(4)), shape)
    whole = ENC.num_layers * (4 * shape.hidden ** 2 + 2 * shape.hidden * shape.ffn) * 4
    for rank, entries in enumerate(run.memory):
        (entry,) = entries
        assert entry["layer"] == 0 and entry["held"] == ENC.num_layers * _slice_floats(split, rank, shape) * 4
        assert 0.9 * entry["held"] <= entry["resident"] <= entry["held"] + 4e6, (rank, entry)
        assert entry["resident"] <= boards[rank].memory_bytes and entry["held"] < 0.5 * whole


@pytest.mark.integration
def test_a_device_that_cannot_hold_its_slice_is_named(reference):
    """Fixed shares keep d1's 0.4 after its free memory falls to 5 MB at layer 2: the run fails naming d1, what
    its share needs and what it has."""
    from workbench.distributed.ranks import RunFailed

    boards = [replace(b, memory_bytes=20e6) for b in devices()]
    with pytest.raises(RunFailed, match=r"d1 cannot hold its share 0\.400 in 1D-tiled WS mode: it needs 18\.6 MB, "
                                        r"has 5\.0 MB"):
        run_hepti(boards, seq_len=N, mode="1d", adapt=False, shares=[0.2, 0.4, 0.2, 0.2],
                  memory_falls={"d1": (2, 5e6)})


def test_the_first_decision_is_the_partitioners():
    boards = devices()
    run_first = hepti_partition(boards, shape_of(ENC, N), num_layers=ENC.num_layers)
    assert run_first.mode == "ws" and run_first.shares[1] > run_first.shares[0]
