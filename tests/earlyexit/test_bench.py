"""`workbench bench e3` in quick mode without Ray: every table's invariants, whatever this host's speed."""
from __future__ import annotations


import pytest

from workbench.earlyexit import bench as eb


def test_quick_replaces_the_sizes():
    opts = eb.options(["--quick"])
    assert opts.batches == eb.QUICK["batches"] and opts.mixes == ["80:20"] and opts.requests == 600
    assert eb.options(["--batches", "2", "16"]).batches == [2, 16]
    with pytest.raises(SystemExit):
        eb.options(["--batches", "65"])


def test_quick_bench_without_serving(capsys):
    tables = eb.run(["--quick", "--no-serve", "--batches", "1", "4", "--clusters", "homogeneous",
                     "--mix-source", "parametric"])
    out = capsys.readouterr().out
    assert set(tables) == set(eb.TABLES)
    assert tables["validation"] == [] and "validation: skipped (--no-serve given)" in out

    opt = tables["optimizer"]
    assert {(r["model"], r["gpus"]) for r in opt} == {("bert-base", 16), ("bert-base", 46), ("bert-large", 16),
                                                     ("bert-large", 46)}
    assert all(r["median_s"] > 0 and r["goodput"] > 0 and r["types"] in (1, 4) for r in opt)

    good = {(r["batch"], r["system"]): r for r in tables["goodput"]}
    assert set(good) == {(b, s) for b in (1, 4) for s in ("e3", "as_is", "stock")}
    assert all(r["attainment"] >= 0.99 for r in good.values())
    # the ratios printed are the table's, with their band
    e3 = good[(4, "e3")]
    lo, hi = e3["e3_over_as_is_band"]
    assert f"b=4 {e3['e3_over_as_is']:.2f}x [{lo:.2f}-{hi:.2f}]" in out and e3["deploys"] in out

    cost = tables["cost"]
    assert {(r["batch"], r["system"]) for r in cost} == set(good) and all(r["target"] == 6000 for r in cost)
    assert all(r["alpha"] == 1.0 for r in cost if r["system"] == "e3")
    assert all(r["windows"] == 6 for r in tables["misprediction"])
    assert all(r["ramps_disabled"] == len(r["disabled"].split()) for r in tables["ramps"])
    assert "optimizer median time" in out and "mixes:" in out and "ARIMA on a drifting 80:20 mix" in out
