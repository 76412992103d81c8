"""Benchmarks behind `workbench bench NAME`: they print measured figures and write CSV results.

Each benchmark is a module exposing ``parser()`` (a ``workbench.argtypes.Parser`` of its
options, so `workbench bench NAME --help` and bad values behave like every other command)
and ``run(args: list[str])`` that returns rows
(``list[dict]``) or named tables of rows (``dict[str, list[dict]]``); each table is
printed and saved to ``<cache>/results/<name>.csv`` (``<name>-<table>.csv`` for named ones).
"""
from __future__ import annotations

import csv
import importlib

from workbench.cache import cache_dir
from workbench.errors import UnknownNameError

SHARED = {
    "host": "workbench.bench.host",
    "ui": "workbench.bench.ui",
    "browser": "workbench.bench.browser",
}
"""Benchmarks of the shared layers; each mechanism declares its own (``Mechanism.benchmarks``)."""


def benchmarks() -> dict[str, str]:
    """Every benchmark name -> its module: the shared ones and each registered mechanism's."""
    from workbench.mechanisms import mechanisms

    found = dict(SHARED)
    for mechanism in mechanisms():
        for name, module in mechanism.benchmarks.items():
            if name in found:
                raise RuntimeError(f"benchmark {name!r} is declared twice")
            found[name] = module
    return found


def bench_parser(name: str):
    """The option parser of benchmark ``name``."""
    known = benchmarks()
    if name not in known:
        raise UnknownNameError("benchmark", name, known)
    return importlib.import_module(known[name]).parser()


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
    known = benchmarks()
    if name not in known:
        raise UnknownNameError("benchmark", name, known)
    from workbench.prepare import print_preset_notice

    print_preset_notice(getattr(bench_parser(name).parse_args(list(args or [])), "preset", "full"))
    result = importlib.import_module(known[name]).run(list(args or []))
    tables = result if isinstance(result, dict) else {"": result}
    for table, rows in tables.items():
        if table:
            print(f"\n== {table}")
        print_table(rows)
        if rows:
            print(f"results written to {save_rows(f'{name}-{table}' if table else name, rows)}")
    return tables
