"""Folders the package ships beside its code: recorded splits, the papers' tables, the Voila pages.

The files live in the repository's top-level folders (``data/splits``, ``data/reference``,
``dashboards``); ``workbench/_shipped`` holds one relative link to each. An editable install reads
through the links, and a wheel holds copies of the linked files as package data (the
``_shipped/**/*`` pattern in ``pyproject.toml``), so both read from one place:
``workbench/_shipped/<name>``. Another top-level folder to ship is one more link there; files kept
inside the package itself need only a package-data pattern.
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def shipped(name: str) -> Path:
    """The shipped folder ``name`` (``splits``, ``reference``, ``dashboards``) as a real directory."""
    folder = files("workbench") / "_shipped" / name
    if not isinstance(folder, Path):
        raise RuntimeError(f"workbench reads its {name} folder from installed files and cannot run from an archive")
    return folder.resolve()
