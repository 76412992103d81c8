"""Imports go one way: engine -> viz -> ui; no mechanism imports another, not even through a shared module;
shared modules import no mechanism, directly or through other modules; no two modules import each other; the
first figures need no torch. The lists (mechanism packages, their own views, the pages) come from the registry."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "workbench"
UI_LIBRARIES = ("plotly", "ipywidgets", "anywidget", "voila")
IMPORTERS = ("import_module", "__import__")


def engine_modules() -> list[str]:
    """Every module under workbench/ outside viz/ and ui/, found by walking the package."""
    return [m for m in module_paths()
            if not _in("workbench.viz", m) and not _in("workbench.ui", m) and not m.endswith(".__main__")]


def mechanism_packages() -> list[str]:
    """The registered mechanisms' package names (``elastic``, ``kvcache``), read from the registry."""
    from workbench.mechanisms import REGISTERED

    return [path.rsplit(".", 2)[1] for path in REGISTERED]


VIEW_PACKAGES = ("workbench.ui", "workbench.viz", "workbench.bench")


def declared_views(mechanism: str) -> set[str]:
    """One mechanism's own modules in ui/, viz/ and bench/: named after it, or named by its declaration (its
    page's panel, its overview section, its benchmarks)."""
    from workbench.mechanisms import mechanisms

    (m,) = [m for m in mechanisms() if m.name == mechanism]
    refs = [m.dashboard.panel if m.dashboard else "", m.overview.panel if m.overview else "", *m.benchmarks.values()]
    found = {f"{package}.{mechanism}" for package in VIEW_PACKAGES} | {ref.partition(":")[0] for ref in refs if ref}
    return {v for v in found if any(_in(package, v) for package in VIEW_PACKAGES)}


def own_views() -> set[str]:
    """Every mechanism's own views (:func:`declared_views`)."""
    return set().union(*(declared_views(name) for name in mechanism_packages()))


def shared_modules(modules, mechanisms: list[str], views: set[str]) -> list[str]:
    """Every module outside the mechanism packages and their own views. A view is one module its mechanism
    declares (or names after itself); a module beside it, even inside a view package of the same name, is
    shared, so it must learn about mechanisms from the registry too."""
    return [m for m in modules if m not in views
            and not any(_in(f"workbench.{p}", m) for p in mechanisms)]


def _in(package: str, module: str) -> bool:
    return module == package or module.startswith(package + ".")


def module_paths() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name, not ``__init__``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_modules(path: Path, modules: dict[str, Path] | None = None) -> set[str]:
    """Absolute module names ``path`` imports, at the top or inside functions; with ``modules``, relative
    imports are resolved and ``from a import b`` names ``a.b`` where that is a module."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in IMPORTERS
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and modules is None:
            if node.module and node.level == 0:
                names.add(node.module)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = path.relative_to(PACKAGE.parent).parts[:-1]
                anchor = package[:len(package) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return names


_GRAPHS: dict[Path, dict[str, set[str]]] = {}


def import_graph() -> dict[str, set[str]]:
    """Module -> the workbench modules it imports (lazily or not), from the sources (parsed once per package
    folder; each caller gets its own copy)."""
    if PACKAGE not in _GRAPHS:
        modules = module_paths()
        _GRAPHS[PACKAGE] = {name: {m for m in imported_modules(path, modules) if m in modules and m != name}
                            for name, path in modules.items()}
    return {name: set(edges) for name, edges in _GRAPHS[PACKAGE].items()}


def loading_graph() -> dict[str, set[str]]:
    """:func:`import_graph` with what Python runs besides: importing ``a.b.c`` runs ``a`` and ``a.b`` first."""
    graph = import_graph()
    return {name: edges | {p for m in edges | {name} for p in parents(m) if p in graph and p != name}
            for name, edges in graph.items()}


def parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts))]


def chain_to(graph: dict[str, set[str]], start: str, bad) -> list[str] | None:
    """The shortest chain of imports from ``start`` to a module for which ``bad`` holds (None: there is none)."""
    came, todo = {start: None}, [start]
    while todo:
        module = todo.pop(0)
        if bad(module):
            chain = [module]
            while came[chain[-1]] is not None:
                chain.append(came[chain[-1]])
            return chain[::-1]
        for m in sorted(graph.get(module, ())):
            if m not in came:
                came[m] = module
                todo.append(m)
    return None


def mechanism_reached(graph, shared: list[str], mechanisms: list[str]) -> dict[str, list[str]]:
    """Each shared module that may load a mechanism package, with the chain of imports that does it."""
    found = {}
    for module in shared:
        for start in (*parents(module), module):
            chain = chain_to(graph, start, lambda m: any(_in(f"workbench.{p}", m) for p in mechanisms))
            if chain:
                found[module] = chain
                break
    return found


def reachable(graph: dict[str, set[str]], start: set[str]) -> set[str]:
    """Every module that importing ``start`` may load, following imports through any module."""
    seen, todo = set(start), list(start)
    while todo:
        for m in graph.get(todo.pop(), ()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def import_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The groups of modules that import each other (directly or round a circle), one set per circle."""
    cycles, done = [], set()
    for name in graph:
        if name in done:
            continue
        group = {m for m in reachable(graph, {name}) if name in reachable(graph, {m})}
        done |= group
        if len(group) > 1:
            cycles.append(group)
    return cycles


def test_engine_modules_are_found_by_walking_the_package():
    modules = engine_modules()
    assert {"workbench.elastic.planner", "workbench.train.loop", "workbench.mechanisms", "workbench.cli"} <= set(modules)
    assert not any(m.startswith(("workbench.ui", "workbench.viz")) for m in modules)


@pytest.mark.integration
def test_engine_imports_load_no_ui_library():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in engine_modules()) +
            f"bad = sorted(m for m in {UI_LIBRARIES!r} if m in sys.modules)\nprint(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_no_engine_source_names_a_ui_library():
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[0] in ("viz", "ui"):
            continue
        bad = {m for m in imported_modules(path) if m.split(".")[0] in UI_LIBRARIES}
        assert not bad, f"{path} imports {bad}"


def test_no_mechanism_package_imports_another():
    mechanisms = mechanism_packages()
    assert "elastic" in mechanisms
    for name in mechanisms:
        others = {f"workbench.{o}" for o in mechanisms if o != name}
        for path in (PACKAGE / name).rglob("*.py"):
            bad = {m for m in imported_modules(path) if any(m == o or m.startswith(o + ".") for o in others)}
            assert not bad, f"{path} imports another mechanism: {bad}"


def test_no_mechanism_reaches_another_through_shared_modules():
    graph, mechanisms = import_graph(), mechanism_packages()
    for name in mechanisms:
        own = {m for m in graph if _in(f"workbench.{name}", m)}
        loaded = reachable(graph, own)
        bad = sorted(m for m in loaded for o in mechanisms if o != name and _in(f"workbench.{o}", m))
        assert not bad, f"importing workbench.{name} may load {bad}"


@pytest.mark.parametrize("name", mechanism_packages())
@pytest.mark.integration
def test_importing_a_mechanism_loads_no_other(name):
    own = sorted(m for m in module_paths() if _in(f"workbench.{name}", m))
    others = [f"workbench.{o}" for o in mechanism_packages() if o != name]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in own) +
            f"print(sorted(m for m in sys.modules if any(m == o or m.startswith(o + '.') for o in {others!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_lists_come_from_the_registry():
    from workbench.mechanisms import mechanisms

    assert mechanism_packages() == [m.name for m in mechanisms()] and "elastic" in mechanism_packages()
    assert {"workbench.ui.elastic", "workbench.viz.elastic", "workbench.ui.kvcache"} <= own_views()
    assert {"ElasticPanel", "OverviewPanel", "KVCachePanel"} <= set(PANELS)


def test_a_module_beside_a_declared_view_is_shared():
    """Only the modules a mechanism declares (or names after itself) are its views: a helper inside a view
    package of the same name is shared, and may not import the mechanism."""
    modules = ["workbench.ui.mech", "workbench.ui.mech.live", "workbench.mech", "workbench.mech.core", "workbench.cli"]
    assert shared_modules(modules, ["mech"], {"workbench.ui.mech"}) == ["workbench.ui.mech.live", "workbench.cli"]


def test_no_shared_module_reaches_a_mechanism():
    """Shared modules (all but the mechanism packages and their own ui/, viz/ and bench/ files: ui/overview.py,
    the benchmark plumbing, the CLI, ...) learn about mechanisms only from the registry: none may load a
    mechanism package, at its top or inside a function, directly or through any other module."""
    mechanisms, graph = mechanism_packages(), loading_graph()
    shared = shared_modules(graph, mechanisms, own_views())
    assert {"workbench.labs", "workbench.info", "workbench.prepare", "workbench.cli", "workbench.bench",
            "workbench.bench.ui", "workbench.ui", "workbench.ui.overview", "workbench.ui.gallery"} <= set(shared)
    bad = mechanism_reached(graph, shared, mechanisms)
    assert not bad, "\n".join(f"{m}: {' -> '.join(chain)}" for m, chain in bad.items())


@pytest.mark.integration
def test_importing_every_shared_module_loads_no_mechanism():
    mechanisms = mechanism_packages()
    shared = shared_modules(module_paths(), mechanisms, own_views())
    code = ("import sys\n" + "".join(f"import {m}\n" for m in shared if not m.endswith(".__main__")) +
            f"print(sorted(m for m in sys.modules if any(m == 'workbench.' + p or m.startswith('workbench.' + p + '.')"
            f" for p in {mechanisms!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_check_follows_imports_through_shared_modules_packages_and_import_module(tmp_path, monkeypatch):
    files = {
        "__init__.py": "", "mech/__init__.py": "", "mech/core.py": "", "ui/__init__.py": "",
        "ui/mech.py": "def f():\n    from workbench.mech import core\n",           # the mechanism's own page
        "ui/page.py": "from workbench.ui import mech\n",                            # shared, via its own page
        "direct.py": "def f():\n    import workbench.mech.core\n",
        "through.py": "from workbench import helper\n", "helper.py": "from workbench.mech.core import x\n",
        "dynamic.py": "from importlib import import_module\nimport_module('workbench.mech.core')\n",
        "sub/__init__.py": "from workbench import direct\n", "sub/leaf.py": "x = 1\n",
        "via_page.py": "from workbench.ui import page as p\n", "alone.py": "def f(name):\n    import_module(name)\n",
        "errors.py": "", "uses_errors.py": "from workbench import errors\n",
    }
    for name, text in files.items():
        (tmp_path / "workbench" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "workbench" / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "workbench")
    graph = loading_graph()
    shared = shared_modules(graph, ["mech"], {"workbench.ui.mech"})
    assert "workbench.ui.mech" not in shared and "workbench.mech.core" not in shared
    bad = mechanism_reached(graph, shared, ["mech"])
    assert all(chain[-1] in ("workbench.mech", "workbench.mech.core") for chain in bad.values())
    assert bad["workbench.direct"][:-1] == ["workbench.direct"]
    assert bad["workbench.through"][:-1] == ["workbench.through", "workbench.helper"]
    assert bad["workbench.dynamic"][:-1] == ["workbench.dynamic"]
    assert bad["workbench.sub.leaf"][:-1] == ["workbench.sub", "workbench.direct"]
    assert bad["workbench.ui.page"][:-1] == ["workbench.ui.page", "workbench.ui.mech"]
    assert bad["workbench.via_page"][:-1] == ["workbench.via_page", "workbench.ui.page", "workbench.ui.mech"]
    assert set(bad) == {"workbench.direct", "workbench.through", "workbench.helper", "workbench.dynamic",
                        "workbench.sub", "workbench.sub.leaf", "workbench.ui.page", "workbench.via_page"}


def views_of(mechanism: str, views: set[str]) -> set[str]:
    """Those of ``views`` that are one mechanism's: declared by it (or named after it)."""
    return views & declared_views(mechanism)


def view_reached(graph, starts: list[str], bad) -> dict[str, list[str]]:
    """Each of ``starts`` that may load a module for which ``bad`` holds (running its parent packages first),
    with the chain of imports that does it."""
    found = {}
    for module in starts:
        for start in (*parents(module), module):
            chain = chain_to(graph, start, bad)
            if chain:
                found[module] = chain
                break
    return found


def test_no_shared_module_reaches_a_mechanisms_view():
    """The view packages' faces (``workbench.viz``, ``workbench.ui``) and every other shared module re-export
    shared things only: importing ``workbench.viz.timeline`` must not load the elastic view."""
    mechanisms, graph, views = mechanism_packages(), loading_graph(), own_views()
    shared = shared_modules(graph, mechanisms, views)
    bad = view_reached(graph, shared, lambda m: m in views)
    assert not bad, "\n".join(f"{m}: {' -> '.join(chain)}" for m, chain in bad.items())


@pytest.mark.parametrize("name", mechanism_packages())
def test_no_mechanisms_view_reaches_another_mechanism_or_its_views(name):
    mechanisms, graph, views = mechanism_packages(), loading_graph(), own_views()
    mine = views_of(name, views)
    others = set().union(*(views_of(o, views) for o in mechanisms if o != name)) - mine
    assert mine and not mine & others
    bad = view_reached(graph, sorted(mine), lambda m: m in others or any(
        _in(f"workbench.{o}", m) for o in mechanisms if o != name))
    assert not bad, "\n".join(f"{m}: {' -> '.join(chain)}" for m, chain in bad.items())


def test_the_view_check_follows_package_faces(tmp_path, monkeypatch):
    """A shared view module inside a package whose face imports a mechanism's view is caught through the face."""
    files = {"__init__.py": "", "viz/__init__.py": "from workbench.viz.mech import fig\n", "viz/mech.py": "fig = 1\n",
             "viz/timeline.py": "x = 1\n", "viz/other.py": "from workbench.viz import mech\n"}
    for name, text in files.items():
        (tmp_path / "workbench" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "workbench" / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "workbench")
    graph = loading_graph()
    bad = view_reached(graph, ["workbench.viz.timeline", "workbench.viz"], lambda m: m == "workbench.viz.mech")
    assert bad == {"workbench.viz.timeline": ["workbench.viz", "workbench.viz.mech"],
                   "workbench.viz": ["workbench.viz", "workbench.viz.mech"]}


def test_no_two_modules_import_each_other():
    assert import_cycles(import_graph()) == []


def test_the_graph_resolves_relative_imports_and_finds_circles(tmp_path, monkeypatch):
    root = tmp_path / "workbench"
    (root / "pkg").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "a.py").write_text("def f():\n    from . import b\n")
    (root / "pkg" / "b.py").write_text("from workbench.pkg.c import x\n")
    (root / "pkg" / "c.py").write_text("from ..pkg import a\nx = 1\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", root)
    graph = import_graph()
    assert graph["workbench.pkg.a"] == {"workbench.pkg.b"} and graph["workbench.pkg.c"] == {"workbench.pkg.a"}
    assert import_cycles(graph) == [{"workbench.pkg.a", "workbench.pkg.b", "workbench.pkg.c"}]
    assert reachable(graph, {"workbench.pkg.b"}) == {"workbench.pkg.a", "workbench.pkg.b", "workbench.pkg.c"}


def test_the_check_catches_a_mechanism_importing_another(tmp_path):
    fake = tmp_path / "mod.py"
    fake.write_text("def f():\n    from workbench.kvcache.chunks import Chunk\n")
    assert "workbench.kvcache.chunks" in imported_modules(fake)


def _panels() -> list[str]:
    from workbench.mechanisms import dashboards

    return [d.panel.partition(":")[2] for d in dashboards() if d.panel] + ["Gallery"]


PANELS = _panels()


@pytest.mark.parametrize("panel", PANELS)
@pytest.mark.integration
def test_dashboards_draw_their_first_figures_without_torch(prepared, panel):
    code = (f"import sys\nfrom workbench.ui import {panel}\np = {panel}('quick')\n"
            "message = getattr(p, 'message', None)\n"
            "assert message is None or 'wb-error' not in message.value, message.value\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
