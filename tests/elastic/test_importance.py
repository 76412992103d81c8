import json
from dataclasses import replace
import shutil
import zlib

import numpy as np
import pytest

from workbench.data import load_task
from workbench.elastic import importance as imp
from workbench.elastic import artifacts
from workbench.elastic.artifacts import prepare_store
from workbench.elastic.shardblob import parse_blob
from workbench.elastic.store import ShardStore
from workbench.errors import WorkbenchError
from tests.conftest import PRESET

DAMAGED = (2, 7)
MAX_LEN = 32          # short inputs keep each profile to a few seconds


@pytest.fixture(scope="module")
def bbc_store():
    return prepare_store("bbc", PRESET, progress=False)


@pytest.fixture(scope="module")
def dev():
    return load_task("bbc").dev.sample(16, seed=3)


def _damaged_copy(store: ShardStore, root, layer: int, shard: int) -> ShardStore:
    """A copy of ``store`` whose lowest-bitwidth version of one shard has wildly wrong centroids."""
    shutil.copytree(store.root, root)
    manifest_path = root / store.version / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    low = min(store.bitwidths)
    entry = next(e for e in manifest["layers"][layer]["shards"][shard] if e["bits"] == low)
    path = root / store.version / manifest["layers"][layer]["file"]
    data = bytearray(path.read_bytes())
    start, end = entry["offset"], entry["offset"] + entry["nbytes"]
    parts = parse_blob(bytes(data[start:end]), store.shard_params, low)
    damaged = replace(parts, centroids=parts.centroids * -40.0).to_bytes()
    assert len(damaged) == entry["nbytes"]
    data[start:end] = damaged
    entry["crc32"] = zlib.crc32(damaged)
    path.write_bytes(bytes(data))
    manifest_path.write_text(json.dumps(manifest))
    return ShardStore.open(root)


@pytest.fixture(scope="module")
def damaged(bbc_store, dev, tmp_path_factory):
    """A damaged copy of the store and its profile, measured once for the tests below."""
    store = _damaged_copy(bbc_store, tmp_path_factory.mktemp("importance") / "store", *DAMAGED)
    return store, imp.measure_importance(store, dev, MAX_LEN, progress=False)


def test_damaged_shard_ranks_first_and_profile_is_deterministic(damaged, dev):
    store, a = damaged
    n, m = store.cfg.num_layers, store.cfg.num_heads
    assert a.accuracy.shape == a.loss.shape == (n, m) and a.dev_examples == 16
    assert a.order()[0] == DAMAGED
    assert a.accuracy[DAMAGED] > a.baseline_accuracy
    assert sorted(a.order()) == [(i, j) for i in range(n) for j in range(m)]
    again = imp.profile_importance(store, dev, MAX_LEN, progress=False)     # no resume file: computed again
    assert again.shape == (n, m) and np.array_equal(a.accuracy, again)


def test_interrupted_run_resumes_to_the_same_result(damaged, dev, tmp_path, monkeypatch):
    store, reference = damaged
    saved = tmp_path / "resume.json"
    original = imp._Runner.parts

    def interrupt_in_layer_2(self, n, raised=None):
        if n == 2 and raised is not None:
            raise KeyboardInterrupt
        return original(self, n, raised)

    monkeypatch.setattr(imp._Runner, "parts", interrupt_in_layer_2)
    with pytest.raises(KeyboardInterrupt):
        imp.measure_importance(store, dev, MAX_LEN, progress=False, resume_path=saved)
    assert sorted(json.loads(saved.read_text())) == ["0", "1", "baseline"]
    monkeypatch.setattr(imp._Runner, "parts", original)
    resumed = imp.measure_importance(store, dev, MAX_LEN, progress=False, resume_path=saved)
    assert np.array_equal(resumed.accuracy, reference.accuracy) and np.array_equal(resumed.loss, reference.loss)


def test_ranking_agreement_of_identical_and_reversed_profiles():
    acc = np.arange(12, dtype=float).reshape(3, 4) / 12
    p = imp.ShardImportance(acc, -acc, 0.1, 2, 32, 10)
    q = imp.ShardImportance(acc[::-1, ::-1].copy(), -acc[::-1, ::-1], 0.1, 2, 32, 10)
    same = imp.ranking_agreement(p, p)
    assert same["spearman_accuracy"] == pytest.approx(1.0) and same["top_overlap"] == 1.0
    assert imp.ranking_agreement(p, q)["spearman_accuracy"] == pytest.approx(-1.0)
    assert imp.ranking_agreement(p, q)["top_overlap"] == 0.0


def test_importance_order_breaks_ties_by_the_secondary_key_then_by_position():
    importance = np.array([[0.5, 0.9, 0.5], [0.5, 0.1, 0.9]])
    assert imp.importance_order(importance, 2, 3) == [(0, 1), (1, 2), (0, 0), (0, 2), (1, 0), (1, 1)]
    loss = np.array([[0.3, 0.0, 0.1], [0.2, 0.0, 0.4]])
    assert imp.importance_order(importance, 2, 3, tie_break=loss) == [(0, 1), (1, 2), (0, 2), (1, 0), (0, 0),
                                                                      (1, 1)]
    assert imp.importance_order(importance, 1, 2) == [(0, 1), (0, 0)]       # the top-left submodel only
    profile = imp.ShardImportance(importance, loss, 0.1, 2, 32, 10)
    assert profile.order() == imp.importance_order(importance, 2, 3, tie_break=loss)
    with pytest.raises(ValueError, match="at least 3 rows and 3 columns, got shape"):
        imp.importance_order(importance, 3, 3)
    with pytest.raises(ValueError, match="tie_break holds non-finite values"):
        imp.importance_order(importance, 2, 3, tie_break=np.full((2, 3), np.nan))


def test_prepared_profile_and_bad_dev_size(prepared):
    prof = artifacts.load_importance("sentiment", PRESET)
    assert prof.accuracy.shape == (6, 12) and prof.dev_examples == artifacts.IMPORTANCE_DEV_SIZES["quick"]
    with pytest.raises(WorkbenchError, match="at least 1 example, got dev_size=0"):
        artifacts.prepare_importance("sentiment", PRESET, dev_size=0, progress=False)
