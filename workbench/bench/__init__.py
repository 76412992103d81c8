"""Benchmarks behind `workbench bench NAME`: they print measured figures and write CSV results.

Each benchmark is a module exposing ``parser()`` (a ``workbench.argtypes.Parser`` of its
options, so `workbench bench NAME --help` and bad values behave like every other command)
and ``run(args: list[str])`` that returns rows
(``list[dict]``) or named tables of rows (``dict[str, list[dict]]``); each table is
printed and saved to ``<cache>/results/<run>/<name>.csv`` (``<name>-<table>.csv`` for named ones) with a
label of what made it (:mod:`workbench.bench.results`).
"""
from __future__ import annotations

import importlib

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


def run_benchmark(name: str, args: list[str] | None = None) -> dict[str, list[dict]]:
    """Run benchmark ``name``, print its tables and save them labelled with what made them
    (:mod:`workbench.bench.results`: the full run's results and a quick one's are kept apart)."""
    from workbench.bench import results

    known = benchmarks()
    if name not in known:
        raise UnknownNameError("benchmark", name, known)
    from workbench.prepare import print_preset_notice

    args = list(args or [])
    opts = bench_parser(name).parse_args(args)
    preset = getattr(opts, "preset", None) or "full"
    print_preset_notice(preset)
    made_by = results.label(preset, bool(getattr(opts, "quick", False)), ["workbench", "bench", name, *args])
    result = importlib.import_module(known[name]).run(args)
    tables = result if isinstance(result, dict) else {"": result}
    for table, rows in tables.items():
        if table:
            print(f"\n== {table}")
        print_table(rows)
        if rows:
            path = results.save_rows(f"{name}-{table}" if table else name, rows, made_by)
            print(f"results written to {path} ({made_by['run']} run)")
    return tables


def add_quick_argument(parser, quick: dict, what: str = "test sizes") -> None:
    """``--quick``: the benchmark's tiny sizes, listed in its help (applied by :func:`parse_with_quick`)."""
    parser.add_argument("--quick", action="store_true", help=f"{what}: " + ", ".join(
        f"{key.replace('_', '-')} {value}" for key, value in quick.items()))


def parse_with_quick(parser, args: list[str], quick: dict):
    """``parser``'s options for ``args``, with ``quick``'s sizes over them when ``--quick`` is given."""
    opts = parser.parse_args(args)
    if opts.quick:
        for key, value in quick.items():
            setattr(opts, key, value)
    return opts
