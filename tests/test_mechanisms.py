"""The registry contract: what a mechanism declares exists, and prepare, CLI, bench and gallery are built from it."""
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import mechanisms as registry
from workbench.mechanisms import Command, Dashboard, Mechanism, PrepareStep

REPO = Path(__file__).resolve().parent.parent


def test_every_declared_page_notebook_benchmark_and_required_step_exists():
    from workbench.prepare import steps

    step_names = {s.name for s in steps("quick")}
    assert len(step_names) == len(steps("quick"))
    for d in registry.dashboards():
        assert (REPO / "dashboards" / d.page).exists(), d.page
        assert set(d.requires) <= step_names, d.requires
        assert d.probe_control and d.probe_figure
    for m in registry.mechanisms():
        for nb in m.notebooks:
            assert (REPO / "notebooks" / nb.path).exists(), nb.path
        for name, module in m.benchmarks.items():
            assert callable(importlib.import_module(module).run), name


def test_declarations_are_cheap_to_import():
    code = ("import sys, workbench.mechanisms as r\nr.mechanisms()\n"
            "print(','.join(sorted(m for m in ('torch', 'plotly', 'ipywidgets', 'sklearn') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def _fake(name="fake"):
    ran = []

    def configure(parser):
        parser.add_argument("--x", type=int, default=1)
        parser.set_defaults(func=lambda args: ran.append(args.x) or 0)

    step = PrepareStep(name=f"{name} step", run=lambda preset, progress, force: ran.append(preset) or "made",
                       ready=lambda preset: False)
    return ran, Mechanism(name=name, title=f"{name.title()} mechanism", paper="a test",
                          prepare_steps=lambda preset: [step],
                          commands=(Command(name="go", help="go somewhere", configure=configure),),
                          servers=(Command(name=f"{name}-svc", help="serve something", configure=configure),),
                          benchmarks={f"{name}-bench": "workbench.bench.host"},
                          dashboard=Dashboard(page="fake.ipynb", title="Fake page", summary="one line",
                                              requires=(f"{name} step",), probe_control="x", probe_figure="f"))


def test_a_registered_mechanism_reaches_prepare_cli_bench_and_gallery(monkeypatch, tmp_cache):
    from workbench import cli, prepare
    from workbench.bench import benchmarks
    from workbench.ui.gallery import Gallery

    ran, fake = _fake()
    monkeypatch.setattr(registry, "mechanisms", lambda: (*registry.load_registered(registry.REGISTERED), fake))
    assert "fake step" in [s.name for s in prepare.steps("quick")]
    assert cli.main(["fake", "go", "--x", "7"]) == 0 and ran == [7]
    assert cli.main(["serve", "fake-svc", "--x", "3"]) == 0 and ran == [7, 3]
    assert benchmarks()["fake-bench"] == "workbench.bench.host"
    cards = Gallery("quick").cards.value
    assert "<a href='fake.ipynb'><b>Fake page</b></a>" in cards and "waiting for fake step" in cards


def test_a_planned_mechanism_is_listed_as_coming_until_one_registers_its_name(monkeypatch):
    from workbench.ui.gallery import Gallery

    cards = Gallery("quick").cards.value
    registered = {m.name for m in registry.mechanisms()}
    for p in registry.PLANNED:
        assert (f"<b>{p.title}</b> &middot; coming" in cards) == (p.name not in registered), p.title
    _, fake = _fake("earlyexit")
    monkeypatch.setattr(registry, "mechanisms", lambda: (*registry.load_registered(registry.REGISTERED), fake))
    assert "Early-exit serving (E3)" not in Gallery("quick").cards.value


def test_two_mechanisms_with_one_name_are_refused():
    with pytest.raises(RuntimeError, match=r"two mechanisms share a name: \['elastic', 'elastic'\]"):
        registry.load_registered(("workbench.elastic.mechanism", __name__))


MECHANISM = _fake("elastic")[1]          # a second "elastic", for the test above
