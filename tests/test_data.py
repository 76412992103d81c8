import json

import numpy as np
import pytest

from workbench import data
from workbench.errors import UnknownNameError, WorkbenchError


@pytest.mark.parametrize("name, sizes, classes", [("sentiment", (8058, 1008, 1006), 2), ("bbc", (1558, 334, 333), 5)])
def test_recorded_splits_are_disjoint_and_complete(name, sizes, classes):
    task = data.load_task(name)
    assert (len(task.train), len(task.dev), len(task.test)) == sizes
    ids = [set(task.split(s).ids) for s in data.SPLIT_NAMES]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    assert set(np.unique(task.train.labels)) == set(range(classes))
    assert all(isinstance(t, str) and t for t in task.dev.texts)


def test_sentiment_keeps_only_clear_ratings():
    rows = data._read_sentiment()
    assert 9500 < len(rows) < 10605
    positives = sum(label for _, label in rows.values())
    assert 0.4 < positives / len(rows) < 0.6


def test_split_is_deterministic_and_stratified():
    rows = {f"r{i}": (f"text {i}", i % 3) for i in range(300)}
    a, b = data.make_split(rows, (0.8, 0.1, 0.1)), data.make_split(rows, (0.8, 0.1, 0.1))
    assert a == b
    assert [sum(1 for r in a["dev"] if rows[r][1] == lab) for lab in range(3)] == [10, 10, 10]
    assert data.make_split(rows, (0.8, 0.1, 0.1), seed=1) != a


def test_recorded_split_matches_a_fresh_recording(tmp_path):
    path = data.record_split("bbc", tmp_path / "bbc.json")
    assert json.loads(path.read_text()) == json.loads((data.SPLITS_DIR / "bbc.json").read_text())


def test_changed_source_data_is_refused(monkeypatch):
    rows = data._read_bbc()
    rows.pop(next(iter(rows)))
    monkeypatch.setitem(data._READERS, "bbc", lambda: rows)
    data.load_task.cache_clear()
    try:
        with pytest.raises(WorkbenchError, match="differs from the one .* was recorded on"):
            data.load_task("bbc")
    finally:
        data.load_task.cache_clear()


def test_unknown_task_names_the_known_ones():
    with pytest.raises(UnknownNameError, match="unknown task 'sst3'; known tasks: bbc, sentiment"):
        data.load_task("sst3")


def test_heldout_text_comes_from_the_bbc_test_split():
    text = data.heldout_text(2)
    test = data.load_task("bbc").test
    assert text.startswith(test.texts[0]) and test.texts[1] in text
