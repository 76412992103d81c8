"""A training run stopped mid-way resumes from its last save and ends bit for bit where an unbroken run ends."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from workbench.train import resume as resume_module
from workbench.train.resume import TrainingProgress, progress_path


def stop_after_saves(monkeypatch, saves: int) -> list:
    """Make the run stop (as SIGTERM's handler would) once it has saved ``saves`` times; returns the phases
    and steps saved, appended as they happen."""
    seen, original = [], TrainingProgress.save

    def save(self, phase, step, optimizer):
        original(self, phase, step, optimizer)
        seen.append((phase, step))
        if len(seen) == saves:
            raise KeyboardInterrupt
    monkeypatch.setattr(resume_module.TrainingProgress, "save", save)
    return seen


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_elastic_fine_tuning_stopped_in_its_second_phase_resumes_there(tmp_path, monkeypatch):
    from workbench.elastic.finetune import train_elastic
    from workbench.elastic.trainconfig import train_config

    cfg = replace(train_config("sentiment", "quick"), full_steps=3, elastic_steps=3, importance_batches=1,
                  max_train=64, max_dev=8)
    whole = train_elastic(cfg, progress=False)
    kept = tmp_path / "run.progress.pt"
    with monkeypatch.context() as m:
        saved = stop_after_saves(m, 5)                                  # 3 steps of "full", 2 of "elastic"
        with pytest.raises(KeyboardInterrupt):
            train_elastic(cfg, progress=False, resume_path=kept, resume_every_s=0)
    assert saved == [("full", 1), ("full", 2), ("full", 3), ("elastic", 1), ("elastic", 2)]
    with monkeypatch.context() as m:
        after = stop_after_saves(m, 0)
        resumed = train_elastic(cfg, progress=False, resume_path=kept, resume_every_s=0)
    assert after == [("elastic", 3)]                                    # one step left, nothing redone
    assert same_tensors(resumed.encoder.state_dict(), whole.encoder.state_dict())
    assert resumed.losses == whole.losses and (resumed.head_order == whole.head_order).all()
    assert (resumed.accuracy_grid == whole.accuracy_grid).all()


def test_ramp_training_stopped_in_its_first_phase_resumes_there(tmp_path, monkeypatch):
    from workbench.earlyexit.record import ramp_config
    from workbench.earlyexit.train import train_ramps

    cfg = replace(ramp_config("sentiment", "quick"), full_steps=3, ramp_steps=2, max_train=48, max_dev=8)
    model, record, info = train_ramps(cfg, progress=False)
    kept = tmp_path / "run.progress.pt"
    with monkeypatch.context() as m:
        stop_after_saves(m, 2)
        with pytest.raises(KeyboardInterrupt):
            train_ramps(cfg, progress=False, resume_path=kept, resume_every_s=0)
    with monkeypatch.context() as m:
        after = stop_after_saves(m, 0)
        model2, record2, info2 = train_ramps(cfg, progress=False, resume_path=kept, resume_every_s=0)
    assert after == [("encoder", 3), ("ramps", 1), ("ramps", 2)]
    assert same_tensors(model2.state_dict(), model.state_dict())
    assert info2["losses"] == info["losses"] and info2["ramp_losses"] == info["ramp_losses"]
    assert (record2.entropies == record.entropies).all()


def test_progress_for_other_settings_or_damaged_is_not_used(tmp_path, monkeypatch):
    from workbench.earlyexit.record import ramp_config
    from workbench.earlyexit.train import train_ramps

    cfg = replace(ramp_config("sentiment", "quick"), full_steps=2, ramp_steps=1, max_train=48, max_dev=8)
    kept = tmp_path / "run.progress.pt"
    with monkeypatch.context() as m:
        stop_after_saves(m, 1)
        with pytest.raises(KeyboardInterrupt):
            train_ramps(replace(cfg, seed=1), progress=False, resume_path=kept, resume_every_s=0)
    for damage in (None, b"not a checkpoint"):
        if damage is not None:
            kept.write_bytes(damage)
        with monkeypatch.context() as m:
            after = stop_after_saves(m, 0)
            train_ramps(cfg, progress=False, resume_path=kept, resume_every_s=0)
        assert after == [("encoder", 1), ("encoder", 2), ("ramps", 1)]      # from the start
        kept.write_bytes(b"")


def test_the_progress_file_sits_beside_the_model():
    from pathlib import Path

    assert progress_path(Path("/c/models/elastic-sst-abc")) == Path("/c/models/elastic-sst-abc.progress.pt")
