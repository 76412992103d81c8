"""Imports go one way: engine -> viz -> ui; no mechanism imports another, not even through a shared module;
shared modules import no mechanism; no two modules import each other; the first figures need no torch."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "workbench"
UI_LIBRARIES = ("plotly", "ipywidgets", "anywidget", "voila")


def engine_modules() -> list[str]:
    """Every module under workbench/ outside viz/ and ui/, found by walking the package."""
    return [m for m in module_paths()
            if not _in("workbench.viz", m) and not _in("workbench.ui", m) and not m.endswith(".__main__")]


def mechanism_packages() -> list[str]:
    """The registered mechanisms' package names (``elastic``, ``kvcache``), read from the registry."""
    from workbench.mechanisms import REGISTERED

    return [path.rsplit(".", 2)[1] for path in REGISTERED]


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
        if isinstance(node, ast.Import):
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


def import_graph() -> dict[str, set[str]]:
    """Module -> the workbench modules it imports (lazily or not), from the sources."""
    modules = module_paths()
    return {name: {m for m in imported_modules(path, modules) if m in modules and m != name}
            for name, path in modules.items()}


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
def test_importing_a_mechanism_loads_no_other(name):
    own = sorted(m for m in module_paths() if _in(f"workbench.{name}", m))
    others = [f"workbench.{o}" for o in mechanism_packages() if o != name]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in own) +
            f"print(sorted(m for m in sys.modules if any(m == o or m.startswith(o + '.') for o in {others!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_shared_engine_modules_import_no_mechanism():
    """Views (ui/, viz/) may be a mechanism's own; every other module outside the mechanism packages, the
    shared benchmark plumbing in bench/ included (each mechanism's benchmarks live in its package), is
    shared and learns about mechanisms only from the registry."""
    graph, mechanisms = import_graph(), mechanism_packages()
    shared = [m for m in graph if not any(_in(f"workbench.{p}", m) for p in (*mechanisms, "ui", "viz"))]
    assert {"workbench.labs", "workbench.info", "workbench.prepare", "workbench.cli", "workbench.bench"} <= set(shared)
    for module in shared:
        bad = {m for m in graph[module] if any(_in(f"workbench.{o}", m) for o in mechanisms)}
        assert not bad, f"{module} imports {bad}"


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


@pytest.mark.parametrize("panel", ["ElasticPanel", "OverviewPanel", "Gallery"])
def test_dashboards_draw_their_first_figures_without_torch(prepared, panel):
    code = (f"import sys\nfrom workbench.ui import {panel}\np = {panel}('quick')\n"
            "message = getattr(p, 'message', None)\n"
            "assert message is None or 'wb-error' not in message.value, message.value\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
