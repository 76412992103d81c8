"""Benchmark results are saved labelled with what made them, and a quick run never replaces a full one."""
import json
import sys
import types

import pytest

from workbench import bench
from workbench.argtypes import Parser
from workbench.bench.results import load_results, run_label


@pytest.fixture
def toy_benchmark(monkeypatch, tmp_path):
    """A benchmark ``toy`` whose rows say how it was run; results go to a fresh cache."""
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    module = types.ModuleType("toy_benchmark")

    def parser():
        p = Parser(prog="workbench bench toy")
        p.add_argument("--preset", choices=("full", "quick"), default="full", help="artifacts")
        p.add_argument("--quick", action="store_true", help="test sizes")
        return p

    def run(args):
        opts = parser().parse_args(args)
        return {"speed": [{"preset": opts.preset, "quick": opts.quick, "ms": 1.5}]}

    module.parser, module.run = parser, run
    monkeypatch.setitem(sys.modules, "toy_benchmark", module)
    monkeypatch.setattr(bench, "benchmarks", lambda: {"toy": "toy_benchmark"})
    return tmp_path


@pytest.mark.integration
def test_a_quick_run_is_kept_apart_from_the_full_one_and_says_it_is_not_meaningful(toy_benchmark, capsys):
    bench.run_benchmark("toy", [])
    bench.run_benchmark("toy", ["--quick"])
    bench.run_benchmark("toy", ["--preset", "quick"])
    assert "(quick run)" in capsys.readouterr().out
    full, quick = load_results("toy-speed", "full"), load_results("toy-speed", "quick")
    assert full.rows() == [{"preset": "full", "quick": "False", "ms": "1.5"}]        # not replaced by either
    assert quick.rows() == [{"preset": "quick", "quick": "False", "ms": "1.5"}]     # the latest quick run
    assert load_results("toy-speed").path == full.path                             # the full one first
    assert full.meaningful and not quick.meaningful
    assert "not meaningful" in quick.caption() and "not meaningful" not in full.caption()
    made = json.loads(full.path.with_suffix(".json").read_text())
    assert made["command"] == "workbench bench toy" and made["preset"] == "full" and made["rows"] == 1
    assert len(made["date"]) == 25 and made["date"].endswith("+00:00")
    assert made["host"]["cores"] >= 1 and made["host"]["cpu"] and made["commit"]
    assert f"commit {made['commit']}" in full.caption() and "`workbench bench toy` (full preset)" in full.caption()


@pytest.mark.integration
def test_results_without_their_label_are_not_read(toy_benchmark):
    bench.run_benchmark("toy", [])
    found = load_results("toy-speed")
    found.path.with_suffix(".json").unlink()                # rows whose label was never written
    assert load_results("toy-speed") is None


def test_only_the_full_preset_at_full_sizes_is_a_full_run():
    assert run_label("full") == "full" and run_label(None) == "full"
    assert run_label("full", quick_sizes=True) == run_label("quick") == "quick"
