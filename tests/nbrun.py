"""Running a notebook as the tests do: a real kernel (nbclient) in the notebook's own folder, answers typed in."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def type_answers(nb, answers: dict, pattern: str = "{name} = None") -> None:
    """Put each answer of ``answers`` (name -> value) in place of the notebook's one line ``pattern`` for it."""
    left = dict(answers)
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        for name in list(left):
            line = pattern.format(name=name)
            if line in cell.source:
                cell.source = cell.source.replace(line, f"{name} = {left.pop(name)!r}", 1)
    assert not left, f"the notebook has no line for {sorted(left)}"


def execute(path: Path, nb=None, answers: dict | None = None):
    """Run notebook ``path`` (or its edited copy ``nb``) top to bottom, with ``answers`` typed in; fails on
    any error output. Returns the executed notebook."""
    nb = nb if nb is not None else nbformat.read(path, as_version=4)
    if answers:
        type_answers(nb, answers)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    return nb


def check_boxes(nb) -> list[str]:
    """The HTML of every lab self-check box the notebook showed, in order."""
    return [o["data"]["text/html"] for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "wb-check" in o.get("data", {}).get("text/html", "")]


def box_status(box: str) -> str:
    """A check box's status ("right", "low", "wrong", ...)."""
    return re.search(r"wb-check-(\w+)", box).group(1)
