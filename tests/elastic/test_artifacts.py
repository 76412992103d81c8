"""The elastic slice's cache wiring: where artifacts live, damaged ones rebuilt, missing ones named."""
import shutil

import numpy as np
import pytest

from tests.conftest import PRESET
from workbench.elastic import artifacts, finetune
from workbench.errors import UnknownNameError, WorkbenchError

TINY = dict(batch_size=4, full_steps=2, importance_batches=1, elastic_steps=2, max_train=16, max_dev=8)


def test_damaged_cached_model_is_detected_and_rebuilt(prepared, tmp_path, monkeypatch, capsys):
    from workbench.assets import movie_reviews_path

    source = artifacts.model_dir("sentiment", PRESET)
    reviews = movie_reviews_path()                   # the task's sentences, taken once with pip: not again here
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    movie_reviews_path().parent.mkdir(parents=True)
    shutil.copy(reviews, movie_reviews_path())
    monkeypatch.setitem(finetune.PRESET_CONFIGS, "quick", {**finetune.PRESET_CONFIGS["quick"], "sentiment": TINY})
    target = artifacts.model_dir("sentiment", "quick")
    assert target != source                          # the training settings are part of the key
    target.parent.mkdir(parents=True)
    shutil.copytree(source, target)
    (target / "model.safetensors").write_bytes((target / "model.safetensors").read_bytes()[:1000])
    assert artifacts.model_ready("sentiment", "quick")            # present, though damaged: load finds out
    em = artifacts.prepare_model("sentiment", "quick", progress=False)
    out = capsys.readouterr().out
    assert "cached elastic model for 'sentiment' is damaged" in out and "(truncated?)" in out
    assert em.config == finetune.ElasticTrainConfig(task="sentiment", **TINY)
    assert artifacts.load_model("sentiment", "quick").accuracy_grid.tolist() == em.accuracy_grid.tolist()


def test_unprepared_artifacts_name_the_command_that_builds_them(tmp_cache):
    assert not artifacts.model_ready("sentiment", "quick") and not artifacts.importance_ready("sentiment", "quick")
    for load in (artifacts.load_model, artifacts.load_store, artifacts.model_summary):
        with pytest.raises(WorkbenchError, match=r"\(preset 'quick'\); run `workbench prepare --preset quick` first"):
            load("sentiment", "quick")
    with pytest.raises(WorkbenchError, match="run `workbench prepare` first"):
        artifacts.load_store("bbc", "full")
    with pytest.raises(UnknownNameError, match="unknown task 'qqp'"):
        finetune.train_config("qqp")
    with pytest.raises(UnknownNameError, match="unknown preset 'huge'; known presets: full, quick"):
        finetune.train_config("bbc", "huge")


def test_prepared_quick_artifacts_are_ready_and_load_as_one_context(prepared):
    for task in ("sentiment", "bbc"):
        assert artifacts.model_ready(task, PRESET) and artifacts.store_ready(task, PRESET)
        assert artifacts.importance_ready(task, PRESET)
    ctx = artifacts.load_context("bbc", "jetson-nano", PRESET)
    assert ctx.task.name == "bbc" and ctx.cost_model.device == "jetson-nano" and ctx.cost_model.seq_len == 128
    assert ctx.importance.accuracy.shape == (ctx.store.cfg.num_layers, ctx.store.cfg.num_heads)
    assert ctx.importance.dev_examples == artifacts.IMPORTANCE_DEV_SIZES["quick"]
    summary = artifacts.model_summary("bbc", PRESET)
    np.testing.assert_array_equal(summary["accuracy_grid"], prepared["bbc"].accuracy_grid)


def test_importance_is_not_ready_until_every_layer_is_measured(prepared, tmp_path, monkeypatch):
    import json

    store = artifacts.load_store("sentiment", PRESET)
    dev = artifacts.load_task("sentiment").dev.sample(artifacts.IMPORTANCE_DEV_SIZES["quick"], 0)
    path = artifacts._importance_path(store, dev.ids, "sentiment", 0)
    saved = path.read_bytes()
    try:
        partial = json.loads(saved)
        partial.pop(str(store.cfg.num_layers - 1))
        path.write_text(json.dumps(partial))          # as an interrupted run leaves it
        assert not artifacts.importance_ready("sentiment", PRESET)
    finally:
        path.write_bytes(saved)
    assert artifacts.importance_ready("sentiment", PRESET)
