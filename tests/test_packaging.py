"""The wheel installs into an environment of its own and works from outside the repository.

The wheel is built from a copy of the sources (so the repository's ``build/`` stays untouched),
without build isolation or dependencies, and installed with ``--no-deps`` into a fresh virtual
environment that sees the project's installed dependencies through a ``.pth`` line (a plain path,
so the editable install's finder in that folder is not loaded and cannot shadow the wheel).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("packaging")]     # one worker builds the wheel, once

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "workbench", "ext", "data", "dashboards")
SHIPPED = {"splits": "data/splits", "reference": "data/reference", "dashboards": "dashboards"}
PLAN = ("elastic", "plan", "--task", "sentiment", "--device", "jetson-nano", "--target-ms", "200")


def run(*cmd, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"WORKBENCH_PRESET": "quick"}
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{cmd}:\n{out.stdout}\n{out.stderr}"
    return out


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    """(wheel, venv bin folder, a working folder outside the repository)."""
    root = tmp_path_factory.mktemp("packaging")
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "build"))
        else:
            shutil.copy2(REPO / name, src / name)
    run(sys.executable, "-m", "pip", "wheel", src, "--no-deps", "--no-index", "--no-build-isolation", "-q",
        "-w", root / "dist", cwd=root)
    (wheel,) = (root / "dist").glob("workbench-*.whl")

    venv = root / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=root)
    site = Path(sysconfig.get_path("purelib", vars={"base": venv, "platbase": venv}))
    (site / "_project_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    bin_dir = venv / "bin"
    run(bin_dir / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed", wheel,
        cwd=root)
    return wheel, bin_dir, root


@pytest.mark.integration
def test_wheel_holds_every_file_of_the_package_and_the_extension(wheel_env):
    wheel, _, root = wheel_env
    names = set(zipfile.ZipFile(wheel).namelist())
    for name, folder in SHIPPED.items():
        files = {p.name for p in (REPO / folder).iterdir() if p.is_file() and not p.name.startswith(".")}
        assert files and {f"workbench/_shipped/{name}/{f}" for f in files} <= names, name
    package = set()
    for folder, dirs, files in os.walk(root / "src" / "workbench", followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
        package |= {(Path(folder) / f).relative_to(root / "src").as_posix() for f in files if not f.startswith(".")}
    assert "workbench/_shipped/dashboards/index.ipynb" in package and package <= names, package - names
    assert any(n.startswith("workbench/_ext.") and n.endswith(".so") for n in names)


@pytest.mark.integration
def test_installed_package_reads_its_own_files(wheel_env):
    _, bin_dir, cwd = wheel_env
    out = run(bin_dir / "python", "-c",
              "import workbench; from workbench.serving import DASHBOARDS_DIR; from workbench.data import SPLITS_DIR;"
              "from workbench.elastic.reference import paper_table;"
              "print(workbench.__file__, DASHBOARDS_DIR, SPLITS_DIR, len(paper_table(6)), sep='\\n')", cwd=cwd)
    package_file, dashboards, splits, table6_rows = out.stdout.splitlines()
    site = Path(package_file).parent.parent
    assert site.is_relative_to(bin_dir.parent) and not site.is_relative_to(REPO)
    assert Path(dashboards) == site / "workbench" / "_shipped" / "dashboards"
    assert (Path(dashboards) / "index.ipynb").is_file()
    assert sorted(p.name for p in Path(splits).iterdir()) == ["bbc.json", "sentiment.json"]
    assert int(table6_rows) > 0


@pytest.mark.integration
def test_installed_commands_run_outside_the_repository(wheel_env, prepared):
    _, bin_dir, cwd = wheel_env
    info = run(bin_dir / "workbench", "info", cwd=cwd).stdout
    assert "task       sentiment" in info and "task       bbc" in info and "mechanism  elastic" in info
    plan = run(bin_dir / "workbench", *PLAN, cwd=cwd).stdout
    assert re.match(r"Ours: \d+x\d+ submodel, predicted [\d.]+ ms \(target 200 ms\)", plan), plan
    assert plan == run(sys.executable, "-m", "workbench.cli", *PLAN, cwd=REPO).stdout
