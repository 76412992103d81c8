"""Every notebook and dashboard runs top to bottom (nbclient, a real kernel, the quick-prepared models)."""
import json
from pathlib import Path

import nbformat
import pytest

from tests.conftest import PRESET
from tests.nbrun import execute
from workbench.prepare import preset_notice

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p for d in ("notebooks", "dashboards") for p in (REPO / d).rglob("*.ipynb")
                   if ".ipynb_checkpoints" not in p.parts)


def test_every_notebook_is_collected():
    assert {p.relative_to(REPO).as_posix() for p in NOTEBOOKS} >= {
        "dashboards/index.ipynb", "dashboards/overview.ipynb", "notebooks/overview.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_notebook_executes(path, prepared):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert all("id" in c for c in json.loads(path.read_text())["cells"]), "every cell needs an id (nbformat 4.5)"
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "store notebooks without outputs"
    execute(path, nb)
    assert not any("wb-error" in str(o) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    if path.parent.name != "dashboards" and preset_notice(PRESET):     # pages: the browser tests look for it
        first = next(c for c in nb.cells if c.cell_type == "code")
        assert "wb-preset-notice" in str(first.outputs), "the quick-preset line is missing from the first cell"
