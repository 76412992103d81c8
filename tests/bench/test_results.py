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


def test_a_table_reads_back_as_its_row_type_and_an_older_one_names_its_missing_columns(monkeypatch, tmp_path):
    """The elastic cells written by `bench elastic` read back as ``CellRow`` with every field its own type (no
    casts in the page); a table written before a field existed is refused naming it, not read with a guess.
    Catches: numbers left as text, booleans read as the non-empty string "False", extra columns passed on."""
    from dataclasses import asdict

    from workbench.bench.results import save_rows
    from workbench.elastic.evaluate import CellRow
    from workbench.errors import WorkbenchError

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    cell = CellRow(device="odroid-n2", target_ms=200.0, method="Ours", n=3, m=4, mean_bits=5.5, accuracy=0.875,
                   preload_mb=1.25, resident_mb=40.0, memory_mb=41.25, predicted_ms=190.5, measured_ms=195.25,
                   measured_max_ms=196.0, runs=5, valid=False, plan_ms=1.5, task="sst2", preset="quick",
                   dev_examples=16, gold=0.9)
    made_by = {"run": "quick", "preset": "quick", "command": "workbench bench elastic"}
    save_rows("elastic-cells", [{**asdict(cell), "extra": "x"}], made_by)
    (back,) = load_results("elastic-cells", "quick").rows_as(CellRow)
    assert back == cell and back.valid is False and isinstance(back.n, int)
    older = {k: v for k, v in asdict(cell).items() if k not in ("preset", "gold")}
    save_rows("elastic-cells", [{**older, "profile": "quick"}], made_by)
    with pytest.raises(WorkbenchError, match="has no column gold, preset of a CellRow row: it was written by an "
                                             "older version; run `workbench bench elastic` again"):
        load_results("elastic-cells", "quick").rows_as(CellRow)
