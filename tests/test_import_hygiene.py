"""Imports go one way: engine -> viz -> ui; no mechanism imports another; the first figures need no torch."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "workbench"
UI_LIBRARIES = ("plotly", "ipywidgets", "anywidget", "voila")


def engine_modules() -> list[str]:
    """Every module under workbench/ outside viz/ and ui/, found by walking the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[1] in ("viz", "ui") or parts[-1] == "__main__":
            continue
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def mechanism_packages() -> list[str]:
    from workbench.mechanisms import REGISTERED

    return [path.rsplit(".", 2)[1] for path in REGISTERED]


def imported_modules(path: Path) -> set[str]:
    """Absolute module names ``path`` imports, at the top or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


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
