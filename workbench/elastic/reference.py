"""The WRX paper's Tables 5, 6 and 7 (shipped in ``data/reference``) beside our evaluation.

The paper ran DynaBERT (12 x 12, BERT-base) on GLUE; we run the shipped 6 x 12 MiniLM
on movie-review sentiment, the closest task to SST-2, under emulated profiles of
the same two devices. Compare shapes, rankings and ratios, not absolute numbers.
"""
from __future__ import annotations

import pandas as pd

from workbench.resources import shipped

REFERENCE_DIR = shipped("reference")
PLATFORMS = {"odroid-n2": "odroid-n2-cpu", "jetson-nano": "jetson-nano-gpu"}


def paper_table(number: int) -> pd.DataFrame:
    """Table 5 (accuracy), 6 (submodels) or 7 (importance vs random) as published."""
    names = {5: "wrx_table5_accuracy.csv", 6: "wrx_table6_submodels.csv", 7: "wrx_table7_importance.csv"}
    if number not in names:
        raise ValueError(f"the reference holds WRX tables 5, 6 and 7, not {number}")
    return pd.read_csv(REFERENCE_DIR / names[number])


def cells_frame(cells) -> pd.DataFrame:
    """Our evaluation cells (``CellResult``, or ``CellRow`` as the results file is read back) as a frame with the
    paper's method names."""
    from workbench.elastic.evaluate import PAPER_NAMES

    frame = pd.DataFrame([c.as_row() for c in cells])
    frame["paper_method"] = frame["method"].map(PAPER_NAMES)
    return frame


def accuracy_side_by_side(cells, benchmark: str = "SST-2") -> pd.DataFrame:
    """Accuracy (%) per method and target: ours beside the paper's on ``benchmark``, per platform."""
    ours = cells_frame(cells)
    ours = ours[ours["device"].isin(PLATFORMS)]
    ours = ours.assign(platform=ours["device"].map(PLATFORMS), ours_pct=100 * ours["accuracy"])
    paper = paper_table(5)
    paper = paper[paper["benchmark"] == benchmark].rename(columns={"accuracy_pct": "paper_pct", "method": "paper_method"})
    merged = ours.merge(paper, on=["paper_method", "platform", "target_ms"], how="left")
    return (merged.pivot_table(index=["platform", "paper_method"], columns="target_ms",
                               values=["ours_pct", "paper_pct"]).round(1))


def submodels_side_by_side(cells) -> pd.DataFrame:
    """Submodel (depth x width) per method and target: ours beside the paper's Table 6."""
    ours = cells_frame(cells)
    ours = ours[ours["device"].isin(PLATFORMS)]
    ours = ours.assign(platform=ours["device"].map(PLATFORMS),
                       ours=ours["n"].astype(str) + "x" + ours["m"].astype(str))
    paper = paper_table(6).rename(columns={"method": "paper_method"})
    paper["paper"] = paper["depth"].astype(str) + "x" + paper["width"].astype(str)
    merged = ours.merge(paper[["paper_method", "platform", "target_ms", "paper"]],
                        on=["paper_method", "platform", "target_ms"], how="inner")
    return merged.pivot_table(index=["platform", "paper_method"], columns="target_ms", values=["ours", "paper"],
                              aggfunc="first")
