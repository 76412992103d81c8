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
        assert set(d.requires) <= step_names and set(d.later) <= step_names - set(d.requires), (d.requires, d.later)
        assert d.probe_control and d.probe_figure
    for m in registry.mechanisms():
        for nb in m.notebooks:
            assert (REPO / "notebooks" / nb.path).exists(), nb.path
        for name, module in m.benchmarks.items():
            assert callable(importlib.import_module(module).run), name


@pytest.mark.integration
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


@pytest.fixture
def toy(monkeypatch):
    """tests/toy_mechanism.py registered beside the real mechanisms, as its one line in REGISTERED would."""
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.setattr(registry, "REGISTERED", (*registry.REGISTERED, "tests.toy_mechanism"))
    registry.mechanisms.cache_clear()
    module = importlib.import_module("tests.toy_mechanism")
    module.RAN.clear()
    monkeypatch.setitem(module.READY, module.STEP, True)
    yield module
    registry.mechanisms.cache_clear()


@pytest.mark.integration
def test_a_mechanism_declared_in_the_tests_reaches_every_shared_page_and_command(toy, tmp_cache, capsys):
    """Only the toy is prepared (an empty cache): every shared page and command shows it, and says what the
    others wait for."""
    from workbench import cli, prepare
    from workbench.bench import run_benchmark
    from workbench.bench import ui as bench_ui
    from workbench.info import info_dict, print_info
    from workbench.ui import OverviewPanel, ToyPanel
    from workbench.ui.gallery import Gallery

    assert ToyPanel is toy.ToyPanel
    assert "toy step" in [s.name for s in prepare.steps("quick")]
    assert cli.main(["toy", "go", "--x", "7"]) == 0 and toy.RAN == [7]
    cards = Gallery("quick").cards.value
    assert "<a href='toy.ipynb'><b>Toy page</b></a> &middot; <span class='wb-ready'>ready</span>" in cards
    assert "<b>Elastic pipelining (WRX)</b></a> &middot; <span class='wb-not-ready'>waiting for" in cards
    overview = OverviewPanel("quick")
    assert isinstance(overview.section("toy"), toy.ToyOverview) and "the quick preset" in overview.section("toy").value
    assert overview.section("elastic") is None and "wb-section-missing" in overview.sections["elastic"].children[1].value
    assert overview.message.value == "" and "times" in overview.figures
    info = info_dict("quick")["mechanisms"]["toy"]
    assert info["prepared"] == {"toy_preset": "quick"} and info["summary"] == ["toy made for quick"]
    assert (info["commands"], info["benchmarks"], info["dashboard"]) == (["go"], ["toy"], "toy.ipynb")
    print_info("quick")
    out = capsys.readouterr().out
    assert "mechanism  toy       Toy mechanism: `workbench toy {go}`, bench toy, page toy.ipynb" in out
    assert "toy        toy made for quick" in out and "elastic    sentiment not fine-tuned" in out
    assert [r["row"] for r in run_benchmark("toy", ["--rows", "3"])[""]] == [0, 1, 2]
    before = toy.ToyPanel.redraws
    rows = bench_ui.run(["--preset", "quick", "--pages", "toy.ipynb"])
    assert [(r["page"], r["control"], r["changes"]) for r in rows] == [("toy.ipynb", "Toy knob", 18)]
    assert toy.ToyPanel.redraws - before == 1 + 18


def test_a_mechanism_section_waits_for_its_steps_and_says_which(toy, monkeypatch):
    from workbench.ui import OverviewPanel

    monkeypatch.setitem(toy.READY, toy.STEP, False)
    box = OverviewPanel("quick").sections["toy"]
    assert "missing toy step" in box.children[1].value and "workbench prepare --preset quick" in box.children[1].value
    monkeypatch.setitem(toy.READY, toy.STEP, True)
    box.children[2].refresh()                          # the page's poll: the section is built in place
    assert isinstance(box.children[1], toy.ToyOverview)


def test_each_mechanism_declares_what_the_tests_need_prepared(toy, prepared):
    conftest = importlib.import_module("tests.conftest")
    made = conftest.prepared_artifacts("quick")
    assert made["toy"] == "toy artifact (quick)"
    assert set(made) == set(prepared) | {"toy"} and {"sentiment", "bbc", "replays"} <= set(prepared)


def test_two_mechanisms_with_one_name_are_refused():
    with pytest.raises(RuntimeError, match=r"two mechanisms share a name: \['elastic', 'elastic'\]"):
        registry.load_registered(("workbench.elastic.mechanism", __name__))


MECHANISM = _fake("elastic")[1]          # a second "elastic", for the test above
