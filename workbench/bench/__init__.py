"""Benchmarks behind `workbench bench NAME`: they print measured figures and write CSV results.

Each benchmark is a module exposing ``run(args: list[str])`` that returns rows
(``list[dict]``) or named tables of rows (``dict[str, list[dict]]``); each table is
printed and saved to ``<cache>/results/<name>.csv`` (``<name>-<table>.csv`` for named ones).
"""
from __future__ import annotations

import csv
import importlib

from workbench.cache import cache_dir
from workbench.errors import UnknownNameError

BENCHMARKS = {
    "host": "workbench.bench.host",
    "sharding": "workbench.bench.sharding",
    "elastic": "workbench.bench.elastic",
    "ui": "workbench.bench.ui",
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


def run_benchmark(name: str, args: list[str] | None = None) -> dict[str, list[dict]]:
    if name not in BENCHMARKS:
        raise UnknownNameError("benchmark", name, BENCHMARKS)
    result = importlib.import_module(BENCHMARKS[name]).run(list(args or []))
    tables = result if isinstance(result, dict) else {"": result}
    for table, rows in tables.items():
        if table:
            print(f"\n== {table}")
        print_table(rows)
        if rows:
            print(f"results written to {save_rows(f'{name}-{table}' if table else name, rows)}")
    return tables
