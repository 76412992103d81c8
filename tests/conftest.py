"""Shared fixtures. The suite runs on the quick-prepared models (WORKBENCH_PRESET=quick)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("WORKBENCH_PRESET", "quick")
PRESET = os.environ["WORKBENCH_PRESET"]
REPO = Path(__file__).resolve().parent.parent


TIERS = ("unit", "integration", "browser", "notebooks")


def _hypothesis_profile() -> None:
    """Under ``CI=true`` the property tests draw the same examples on every run, so a red CI is the change's and
    not the draw's; elsewhere they draw anew each run, which is how they find new cases (a failing draw prints
    its example: make it a test of its own)."""
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True)
    if os.environ.get("CI", "").lower() == "true":
        settings.load_profile("ci")


_hypothesis_profile()


def pytest_collection_modifyitems(config, items):
    """Each test's tier by what it starts: ``browser`` (tests/browser), ``notebooks`` (nbclient kernels),
    ``integration`` where marked so (processes, servers, Ray, gloo), ``unit`` otherwise: one process and no
    server, which :func:`_unit_starts_nothing` holds it to (``tests/tiers.py``). Browser tests share one
    worker under ``--dist loadgroup`` (one Voila server and one chromium at a time)."""
    for item in items:
        parts = Path(str(item.fspath)).relative_to(REPO / "tests").parts
        if parts[0] == "browser":
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.xdist_group("browser"))    # on parallel workers: one server, one browser
        elif parts[0] == "notebooks" or item.fspath.basename == "test_notebooks.py":
            item.add_marker(pytest.mark.notebooks)
        elif not any(item.get_closest_marker(tier) for tier in TIERS[1:]):
            item.add_marker(pytest.mark.unit)
    if getattr(config.option, "loadgroup", False):
        _group_node_ids(items)


def _group_node_ids(items) -> None:
    """On an xdist worker under ``--dist loadgroup``: end each grouped test's node id with ``@group``, which is
    what the scheduler groups by. pytest-xdist 3.8 writes that suffix to ``item._nodeid``, which pytest 9 no
    longer reads (a node id is built from ``item._id``), so without this every ``xdist_group`` is ignored."""
    from _pytest.nodeid import NodeId

    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names and "@" not in item.nodeid.rpartition("]")[2]:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")


_SLOT = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """On parallel workers (``make test`` runs pytest-xdist), a test marked ``alone`` runs, fixtures included,
    with no other test running (``tests.tiers.RunSlot``); in one process this changes nothing."""
    global _SLOT
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is None:
        yield
        return
    if _SLOT is None:
        from tests.tiers import RunSlot

        worker_base = item.config._tmp_path_factory.getbasetemp()       # <run's base>/popen-gwN: the run's is shared
        _SLOT = RunSlot(str(worker_base.parent / f"slots-{workerinput['testrunuid']}"))
    alone = item.get_closest_marker("alone") is not None
    _SLOT.enter(alone)
    _share_cores(alone)
    try:
        yield
    finally:
        _SLOT.leave()


_OMP_THREADS = os.environ.get("OMP_NUM_THREADS")
_TORCH_THREADS: int | None = None


def _share_cores(alone: bool) -> None:
    """Beside another worker, a test computes on one thread, as do the processes it starts (two workers each
    spinning two OpenMP threads on two cores took twice the CPU); a test running alone has every core."""
    import torch

    global _TORCH_THREADS
    if _TORCH_THREADS is None:
        _TORCH_THREADS = torch.get_num_threads()
    torch.set_num_threads(_TORCH_THREADS if alone else 1)
    if not alone:
        os.environ["OMP_NUM_THREADS"] = "1"
    elif _OMP_THREADS is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = _OMP_THREADS


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """A module's or class's fixture set up for a ``unit`` test is held to the unit tier as the test is (a
    server a whole module shares makes its tests integration tests)."""
    item = getattr(request, "_pyfuncitem", None)
    if fixturedef.scope not in ("module", "class") or item is None or item.get_closest_marker("unit") is None:
        yield
        return
    from tests.tiers import refuse_processes

    patch = pytest.MonkeyPatch()
    refuse_processes(patch, f"{item.nodeid} (its fixture {fixturedef.argname})")
    try:
        yield
    finally:
        patch.undo()


@pytest.fixture(autouse=True)
def _unit_starts_nothing(request, monkeypatch):
    """Holds ``unit`` tests to their tier (``tests.tiers.refuse_processes``); session fixtures, set up before it,
    may start what they need."""
    if request.node.get_closest_marker("unit") is not None:
        from tests.tiers import refuse_processes, refuse_server_fixtures

        refuse_server_fixtures(request.node.nodeid, request.fixturenames)
        refuse_processes(monkeypatch, request.node.nodeid)
    yield


def prepared_artifacts(preset: str) -> dict[str, object]:
    """What every registered mechanism declares its tests need (``Mechanism.test_artifacts``), prepared, by name."""
    from workbench.mechanisms import mechanisms

    found: dict[str, object] = {}
    for mechanism in mechanisms():
        made = mechanism.test_artifacts(preset) if mechanism.test_artifacts else {}
        if set(made) & set(found):
            raise RuntimeError(f"{mechanism.name} declares test artifacts named like another's: {set(made) & set(found)}")
        found.update(made)
    return found


@pytest.fixture(scope="session")
def prepared():
    """Every registered mechanism's test artifacts for the suite's preset (e.g. ``prepared["bbc"]``, elastic's
    model of that task); prepared once, then cached."""
    return prepared_artifacts(PRESET)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty cache directory for tests that damage or rebuild cached files."""
    root = tmp_path / "cache"
    monkeypatch.setenv("WORKBENCH_CACHE", str(root))
    return root


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray with 2 CPUs for the whole pytest run (started on first use, shut down at the end);
    yields the :class:`workbench.earlyexit.serve.RaySession`. A Ray this process already runs is reused."""
    from workbench.earlyexit.serve import ray_session

    session = ray_session(num_cpus=2)
    yield session
    session.close()
