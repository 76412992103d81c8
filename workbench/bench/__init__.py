"""Benchmarks behind `workbench bench NAME`: they print measured figures and write CSV results.

Each benchmark is a module exposing ``run(args: list[str]) -> list[dict]``; the rows
are printed as a table and saved to ``<cache>/results/<name>.csv``.
"""
from __future__ import annotations

import csv
import importlib

from workbench.cache import cache_dir
from workbench.errors import UnknownNameError

BENCHMARKS = {
    "host": "workbench.bench.host",
}


def print_table(rows: list[dict]) -> None:
    if not rows:
        print("(no rows)")
        return
    cols = list(rows[0])
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    widths = {c: max(len(c), *(len(fmt(r[c])) for r in rows)) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(fmt(r[c]).ljust(widths[c]) for c in cols))


def save_rows(name: str, rows: list[dict]):
    path = cache_dir() / "results" / f"{name}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def run_benchmark(name: str, args: list[str] | None = None) -> list[dict]:
    if name not in BENCHMARKS:
        raise UnknownNameError("benchmark", name, BENCHMARKS)
    rows = importlib.import_module(BENCHMARKS[name]).run(list(args or []))
    print_table(rows)
    if rows:
        print(f"results written to {save_rows(name, rows)}")
    return rows
