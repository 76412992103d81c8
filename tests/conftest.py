"""Shared fixtures. The suite runs on the quick-prepared models (WORKBENCH_PRESET=quick)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("WORKBENCH_PRESET", "quick")
PRESET = os.environ["WORKBENCH_PRESET"]
REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.fspath)).relative_to(REPO / "tests").parts
        if parts[0] == "browser":
            item.add_marker(pytest.mark.browser)
        elif parts[0] == "notebooks" or item.fspath.basename == "test_notebooks.py":
            item.add_marker(pytest.mark.notebooks)
        else:
            item.add_marker(pytest.mark.unit)


@pytest.fixture(scope="session")
def prepared():
    """The quick-prepared elastic models of both tasks (trained once, then cached)."""
    from workbench.elastic.artifacts import prepare_model

    return {t: prepare_model(t, PRESET, progress=False) for t in ("sentiment", "bbc")}


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty cache directory for tests that damage or rebuild cached files."""
    root = tmp_path / "cache"
    monkeypatch.setenv("WORKBENCH_CACHE", str(root))
    return root
