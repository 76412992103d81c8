"""Benchmark results on disk, each labelled with what made it, and read back with that label.

``<cache>/results/<run>/<table>.csv`` holds the rows and ``<table>.json`` beside it says how they were made:
the preset, whether the sizes were cut for tests, the command line, the commit, the date and this host (its
CPU, cores, memory and, when measured, its device profile). ``run`` is ``full`` for the full preset at full
sizes and ``quick`` for anything less, so a quick run never replaces the full results a notebook or page
presents beside a paper's figures; what reads results says which run and date they come from, and that
quick results are not meaningful.
"""
from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

RUNS = ("full", "quick")
"""Results kept apart: the full preset at full sizes, and every smaller run."""


def results_root() -> Path:
    from workbench.cache import cache_dir

    return cache_dir() / "results"


def run_label(preset: str | None, quick_sizes: bool = False) -> str:
    """``full`` only for the full preset at full sizes; else ``quick``."""
    return "full" if preset in (None, "full") and not quick_sizes else "quick"


def _commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def host_facts() -> dict:
    """This machine as a result should name it; the measured device profile only when it is cached."""
    from workbench.argtypes import machine_cores, machine_memory_bytes
    from workbench.hostprofile import host_profile_path

    cpu = next((line.split(":", 1)[1].strip() for line in _read_lines("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor() or platform.machine())
    facts = {"cpu": cpu, "cores": machine_cores(), "memory_bytes": machine_memory_bytes(),
             "python": platform.python_version(),
             "system": platform.platform()}
    path = host_profile_path()
    if path.exists():
        try:
            facts["profile"] = json.loads(path.read_text())
        except ValueError:
            pass
    return facts


def _read_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def label(preset: str | None, quick_sizes: bool, command: list[str] | None = None) -> dict:
    """What made a set of results, for the JSON beside them."""
    return {"run": run_label(preset, quick_sizes), "preset": preset or "full", "quick_sizes": bool(quick_sizes),
            "command": " ".join(command if command is not None else ["workbench", *sys.argv[1:]]),
            "commit": _commit(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "host": host_facts()}


_READ_AS = {"int": int, "float": float, "str": str, "bool": lambda text: text == "True"}
"""How a CSV cell becomes a row field of each annotated type."""


def save_rows(table: str, rows: list[dict], made_by: dict) -> Path:
    """Write ``rows`` to ``<run>/<table>.csv`` and ``made_by`` (:func:`label`) beside them; the JSON goes last,
    so a reader never pairs new rows with an old label (a missing or older label reads as unlabelled)."""
    folder = results_root() / made_by["run"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{table}.csv"
    meta = folder / f"{table}.json"
    meta.unlink(missing_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)
    meta.write_text(json.dumps({**made_by, "rows": len(rows)}, indent=1))
    return path


@dataclass(frozen=True)
class Results:
    """A table of results and what made it."""
    table: str
    path: Path
    made_by: dict

    @property
    def run(self) -> str:
        return self.made_by.get("run", "quick")

    @property
    def meaningful(self) -> bool:
        return self.run == "full"

    def rows(self) -> list[dict]:
        with open(self.path, newline="") as handle:
            return list(csv.DictReader(handle))

    def rows_as(self, schema: type) -> list:
        """The rows as ``schema`` (a dataclass of int, float, str and bool fields: the table's row type), each
        cell read as its field's type; columns the schema does not name are left out. A table missing one of
        its fields (written before the field was added) raises ``WorkbenchError`` naming them."""
        from workbench.errors import WorkbenchError

        rows = self.rows()
        wanted = {f.name: _READ_AS[str(f.type)] for f in fields(schema)}
        missing = sorted(set(wanted) - set(rows[0])) if rows else []
        if missing:
            raise WorkbenchError(f"{self.path} has no column {', '.join(missing)} of a {schema.__name__} row: it "
                                 f"was written by an older version; run `{self.made_by.get('command', 'workbench bench')}` "
                                 "again")
        return [schema(**{name: read(row[name]) for name, read in wanted.items()}) for row in rows]

    def frame(self):
        import pandas as pd

        return pd.read_csv(self.path)

    def caption(self) -> str:
        """One line for a notebook or page: which run, when, from which commit, on what; quick ones flagged."""
        m = self.made_by
        host = m.get("host", {})
        where = f"{host.get('cores', '?')} cores of {host.get('cpu', 'an unknown CPU')}"
        made = (f"`{m.get('command', 'workbench bench')}` ({m.get('preset', '?')} preset"
                f"{', test sizes' if m.get('quick_sizes') else ''}) on {str(m.get('date', '?'))[:10]}, commit "
                f"{m.get('commit') or 'unknown'}, {where}")
        if not self.meaningful:
            return f"{made}. Quick results: not meaningful, they only show the pipeline runs."
        return made + "."


def load_results(table: str, run: str | None = None) -> Results | None:
    """Results of ``table`` from ``run`` (``full`` or ``quick``), or when None the full ones if they exist, else
    the quick ones; None when neither exists. Rows without a label are not read."""
    if run is not None and run not in RUNS:
        from workbench.errors import UnknownNameError

        raise UnknownNameError("results run", run, RUNS)
    for name in ((run,) if run else RUNS):
        path = results_root() / name / f"{table}.csv"
        meta = path.with_suffix(".json")
        if path.exists() and meta.exists():
            try:
                made_by = json.loads(meta.read_text())
            except ValueError:
                continue
            return Results(table, path, made_by)
    return None
