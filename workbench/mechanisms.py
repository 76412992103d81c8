"""How a mechanism plugs into the workbench: one declaration per package, one line here.

Each mechanism package (``workbench.elastic``, ``workbench.kvcache``, ...) has a
module ``mechanism.py`` whose ``MECHANISM`` says what it brings: prepare steps, CLI
commands (``workbench <name> ...``), services (``workbench serve <name>``), benchmarks
(``workbench bench NAME``), its dashboard (a gallery card and the Voila page), its notebooks
and its section of ``workbench info``. ``workbench prepare``, the CLI,
``workbench bench`` and the gallery are built from :func:`mechanisms`, so adding a
mechanism adds its package and one line to :data:`REGISTERED`.

Declarations stay cheap to import (no torch, no plotly): everything heavy is imported
inside the functions they point to.

The roles a mechanism package's modules play (the names differ where the papers' words do; a
package has the roles it needs):

- declaration: ``mechanism.py`` (its ``MECHANISM``); commands: ``commands.py`` (argument parsing and
  printing only; arguments checked in the user's units by ``workbench.argtypes`` and the package's limits);
- limits: ``limits.py`` or the engine's own checks: the allowed range of every number, said with the range;
- artifacts: ``artifacts.py``, what ``workbench prepare`` builds for it and how it is read back;
- cost model: ``costmodel.py`` / ``cost.py`` / ``profiles.py``; planner: ``planner.py`` / ``plan.py`` /
  ``optimizer.py``; runtime: ``pipeline.py`` / ``service.py`` / ``runtime.py`` / ``run.py`` / ``serve.py``
  (with its worker processes in ``worker.py``; what a run takes and gives back, when it is wanted without
  the runtime's heavy imports, beside it: E3's ``served.py``);
- baselines: ``baselines.py`` (the paper's baselines on the same engine);
- evaluation: ``evaluate.py`` / ``evaluation.py``, beside ``reference.py`` (the paper's published figures from
  ``data/reference``) and, where a simulator or a model is checked against real runs, ``validation.py``;
  what the tables deploy and measure, when it is a job of its own, beside them (E3's ``pools.py``);
  bench: ``bench.py`` (``workbench bench NAME``, tables written as results files; a measurement with a job of
  its own, such as LLMS's ``perplexity.py``, lives in its own module and the bench keeps its table; a group of
  tables sharing their runs goes in ``bench_<group>.py``, as LLMS's ``bench_replays.py`` and ``bench_http.py``
  and Hepti's and Voltage's ``bench_runs.py``);
  a table the pages read back has a row dataclass (``Results.rows_as``);
- lab: ``lab.py`` (the teaching lab's expected answers and their checks);
- views, outside the package: ``workbench.ui.<name>`` (the page's panel: controls wired to engine calls) and
  ``workbench.viz.<name>`` (pure figure builders). No mechanism imports another, and no shared module imports
  a mechanism or its views (``tests/test_import_hygiene.py``).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import import_module
from typing import Callable, Literal

REGISTERED: tuple[str, ...] = (
    "workbench.elastic.mechanism",
    "workbench.kvcache.mechanism",
    "workbench.partition.mechanism",
    "workbench.hepti.mechanism",
    "workbench.earlyexit.mechanism",
)
"""Modules that define a ``MECHANISM``; the one line a new mechanism adds."""


@dataclass(frozen=True, kw_only=True)
class PrepareStep:
    """One resumable piece of `workbench prepare`, skipped when its artifact is already intact."""
    name: str                                   # shown in progress and the gallery, e.g. "elastic fine-tuning: bbc"
    run: Callable[[str, bool, bool], str | None]   # run(preset, progress, force) -> a one-line summary; cached
    ready: Callable[[str], bool]                # ready(preset): is the artifact there and whole, without building it?
    task: str | None = None                     # the task it serves (``prepare --tasks`` filters on it)
    estimate_s: dict[str, float] = field(default_factory=dict)   # preset -> seconds on 2 cores (measured)


@dataclass(frozen=True, kw_only=True)
class Command:
    """``workbench <mechanism> <name> ...``; ``configure`` adds arguments and ``set_defaults(func=...)``."""
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    top_level_alias: bool = False               # also ``workbench <name>`` (commands from before mechanisms had groups)
    group: str = ""                             # "": the mechanism's own group; else where an alias from before lives


@dataclass(frozen=True, kw_only=True)
class Dashboard:
    """A gallery card and the Voila page it opens (a notebook in ``dashboards/``)."""
    page: str                                   # e.g. "elastic.ipynb"
    title: str
    summary: str                                # one line on the card
    requires: tuple[str, ...] = ()              # names of the prepare steps whose artifacts the page reads
    later: tuple[str, ...] = ()                 # steps of further choices (another task): the page opens without
                                                # them, offers what is ready and says what is still being prepared
    probe_control: str = ""                     # label of a slider `workbench bench browser` moves ...
    probe_figure: str = ""                      # ... and the figure slot whose redraw it times
    panel: str = ""                             # "module:Class" of the page's Panel (`bench ui`, `workbench.ui`)
    first: bool = False                         # the flagship: its steps are prepared before any other page's
    ends: tuple[tuple[str, object], ...] = ()   # (control label, value) that put the page at its controls' ends
    """What `bench ui --at-ends` and `bench browser --at-ends` set before timing the probe: a number, an option's
    label, or "max" / "min" for a slider's end. The probe itself may be among them (it then steps back from its end)."""


OVERVIEW = Dashboard(
    page="overview.ipynb", title="Overview",
    summary="the shipped models, device profiles with per-layer IO and compute times, and each mechanism's "
            "part built from its prepared artifacts (or what it still waits for)",
    probe_control="Shard bits", probe_figure="times",
    ends=(("Layer", "DistilBERT layer (d=768)"), ("Shard bits", "max")), panel="workbench.ui.overview:OverviewPanel")
"""The shared page every gallery lists first (not a mechanism of its own); it needs nothing prepared."""


@dataclass(frozen=True, kw_only=True)
class OverviewSection:
    """A mechanism's part of the overview page, built from its own prepared artifacts."""
    title: str
    panel: str                                  # "module:Class", made as Class(preset): a widget
    requires: tuple[str, ...] = ()              # prepare steps it reads; until they are ready the page says so


@dataclass(frozen=True, kw_only=True)
class Notebook:
    path: str                                   # relative to the repository's notebooks/
    title: str
    kind: Literal["tutorial", "lab", "evaluation"]


@dataclass(frozen=True, kw_only=True)
class InfoSection:
    """A mechanism's part of `workbench info`: what its prepared artifacts say, as data and as terminal lines."""
    data: dict[str, object]                     # JSON-ready: the mechanism's "prepared" in `workbench info --json`
    lines: tuple[str, ...] = ()                 # the same for a terminal, one line each (its "summary" in JSON)


@dataclass(frozen=True, kw_only=True)
class Mechanism:
    name: str                                   # CLI group and package name, e.g. "elastic"
    title: str                                  # e.g. "Elastic pipelining (WRX)"
    paper: str                                  # the paper it implements, in a few words
    prepare_steps: Callable[[str], list[PrepareStep]] = lambda preset: []
    commands: tuple[Command, ...] = ()
    benchmarks: dict[str, str] = field(default_factory=dict)      # bench name -> module with run(args)
    servers: tuple[Command, ...] = ()           # ``workbench serve <name>``: long-running services it offers
    dashboard: Dashboard | None = None
    notebooks: tuple[Notebook, ...] = ()
    info: Callable[[str], InfoSection] | None = None   # info(preset): reads what is prepared, never builds it
    overview: OverviewSection | None = None
    test_artifacts: Callable[[str], dict[str, object]] | None = None
    """test_artifacts(preset): prepares (cached) what the test suite needs and returns it by name; the tests'
    ``prepared`` fixture merges every mechanism's."""


def load_registered(paths: tuple[str, ...]) -> tuple[Mechanism, ...]:
    """The ``MECHANISM`` of each module in ``paths``; two with one name are refused."""
    found = tuple(import_module(path).MECHANISM for path in paths)
    names = [m.name for m in found]
    if len(set(names)) != len(names):
        raise RuntimeError(f"two mechanisms share a name: {names}")
    return found


@lru_cache(maxsize=None)
def mechanisms() -> tuple[Mechanism, ...]:
    """Every registered mechanism, in registration order."""
    return load_registered(REGISTERED)


def load(ref: str) -> object:
    """What a ``"module:name"`` reference names, imported now."""
    module, _, name = ref.partition(":")
    return getattr(import_module(module), name)


def dashboards() -> tuple[Dashboard, ...]:
    """The overview and every registered mechanism's page, in gallery order."""
    return (OVERVIEW, *(m.dashboard for m in mechanisms() if m.dashboard is not None))
