"""The trained exit ramps: their dev record is what real inference gives, and workloads of a mix follow it."""
import numpy as np
import pytest
import torch

from workbench.data import load_task, task_spec
from workbench.earlyexit import artifacts
from workbench.earlyexit.record import DEFAULT_THRESHOLD, RampRecord, thresholds
from workbench.earlyexit.train import _stage2_loss
from workbench.errors import WorkbenchError

PRESET = "quick"


@pytest.fixture(scope="module")
def prepared():
    return artifacts.prepare_model("sentiment", PRESET, progress=False)


def test_the_record_is_what_the_model_computes_on_the_dev_set(prepared):
    """The exits the record predicts for a threshold equal the exits of the model run on the dev texts."""
    from workbench.models.tokenizer import encoder_tokenizer

    rec = prepared.record
    dev = load_task("sentiment").dev
    rows = [dev.ids.index(i) for i in rec.dev_ids]
    tok = encoder_tokenizer(task_spec("sentiment").max_length)
    ids, mask = tok([dev.texts[r] for r in rows])
    t = float(np.quantile(rec.entropies[:-1], 0.4))
    out = prepared.model.configure(threshold=t).forward(ids, mask)
    assert np.array_equal(out.exit_layers, rec.exits(t))
    assert np.array_equal(out.labels, rec.predictions[rec.exits(t), np.arange(len(rows))])
    assert np.array_equal(rec.labels, dev.labels[rows])
    prepared.model.configure(threshold=DEFAULT_THRESHOLD)


def test_the_checkpoint_loads_back_to_the_same_model_and_record(prepared):
    again = artifacts.load_model("sentiment", PRESET)
    for (name, a), (_, b) in zip(prepared.model.state_dict().items(), again.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert np.array_equal(again.record.entropies, prepared.record.entropies)
    assert artifacts.load_record("sentiment", PRESET).classes == 2


def test_accuracy_per_threshold_runs_from_the_stock_model_to_the_first_ramp(prepared):
    rec = prepared.record
    table = rec.table()
    assert [row["threshold"] for row in table] == list(thresholds(2))
    assert table[0]["loss"] == 0 and table[0]["mean_layers"] == rec.num_layers
    assert table[-1]["mean_layers"] == 1.0      # ln 2 is the largest binary entropy
    assert table[-1]["accuracy"] == rec.ramp_accuracy()[0]
    assert table[0]["accuracy"] == rec.ramp_accuracy()[-1] == prepared.stock_accuracy


def test_stage_two_trains_the_ramps_only():
    from workbench.earlyexit.model import untrained_model

    m = untrained_model(2)
    m.requires_grad_(True)
    ids = torch.randint(1000, 5000, (4, 12))
    _stage2_loss(m, (ids, torch.ones_like(ids), torch.tensor([0, 1, 0, 1])))
    assert all(p.grad is None for p in m.encoder.parameters())
    assert all(p.grad is None for p in m.ramps[-1].parameters())
    assert all(p.grad is not None for r in m.ramps[:-1] for p in r.parameters())


def _toy_record():
    ent = np.array([[0.1, 0.1, 0.9, 0.9, 0.9, 0.9],
                    [0.1, 0.1, 0.1, 0.9, 0.9, 0.9],
                    [0.1, 0.1, 0.1, 0.1, 0.1, 0.1]])
    conf = np.array([0.99, 0.98, 0.9, 0.7, 0.6, 0.55])
    return RampRecord(ent, np.zeros((3, 6), dtype=np.int64), np.zeros(6, dtype=np.int64), conf, classes=2)


def test_the_easy_bin_is_the_more_confident_half_and_a_mix_draws_its_share():
    rec = _toy_record()
    easy, hard = rec.easy_hard()
    assert easy.tolist() == [0, 1, 2] and hard.tolist() == [3, 4, 5]
    rows = artifacts.mix_rows(rec, 0.8, 5000, seed=1)
    assert abs(np.isin(rows, easy).mean() - 0.8) < 0.02
    prof = artifacts.mix_profile(rec, 1.0, 0.5, n=100)
    # easy rows 0, 1 leave at ramp 0 and row 2 at ramp 1: a third of the batch is left after ramp 0
    assert prof.remaining[-1] == 0 and 0.2 < prof.remaining[0] < 0.5 and prof.remaining[1] == 0


@pytest.mark.parametrize("easy, said", [(-0.1, "must be at least 0, got -0.1"),
                                        (1.5, r"must be at most 1 \(all inputs easy; 80:20 is 0.8\), got 1.5"),
                                        (float("nan"), "expected a finite number, got nan")])
def test_a_mix_outside_zero_to_one_is_refused(easy, said):
    with pytest.raises(WorkbenchError, match=f"the easy share of a mix: {said}"):
        artifacts.mix_rows(_toy_record(), easy, 10)


@pytest.mark.parametrize("n, said", [(0, "must be at least 1 requests, got 0"),
                                     (10**9, r"must be at most 1000000 requests \(the requests of one workload")])
def test_a_workload_size_out_of_range_is_refused(n, said):
    with pytest.raises(WorkbenchError, match=f"a workload's requests: {said}"):
        artifacts.mix_rows(_toy_record(), 0.5, n)


def test_measured_mix_profile_equals_the_one_from_the_record(prepared):
    t = float(np.quantile(prepared.record.entropies[:-1], 0.5))
    measured, layers = artifacts.measure_mix(prepared, 0.5, t, n=48, seed=2)
    from_record = prepared.record.exits(t)[artifacts.mix_rows(prepared.record, 0.5, 48, seed=2)]
    assert np.array_equal(layers, from_record)
    assert measured == artifacts.mix_profile(prepared.record, 0.5, t, n=48, seed=2)
    prepared.model.configure(threshold=DEFAULT_THRESHOLD)


def test_the_forecast_comes_before_each_window_and_uses_arima_once_it_has_enough():
    rec = _toy_record()
    series = artifacts.profile_series(rec, 0.5, 0.5, windows=9, window_size=64)
    assert series.forecast[0] is None and series.mean_abs_error[0] is None
    assert all(e is not None and 0 <= e <= 1 for e in series.mean_abs_error[1:])
    assert "arima" in series.methods[5:]
    assert max(series.easy) > 0.6 and min(series.easy) < 0.4


def test_an_unprepared_task_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    with pytest.raises(WorkbenchError, match="no trained exit ramps.*workbench prepare"):
        artifacts.load_record("bbc", PRESET)
