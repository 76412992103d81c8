"""The E3 paper's published figures (shipped in ``data/reference/e3_figures.csv``) for setting ours beside them.

Each row names the paper's figure (or ``text``) and section, what was measured, under which setting, and the
value as the paper states it: a number (``1.44``), a range (``4-8``) or words (``closely matches``). The paper
ran BERT-BASE/-LARGE, ResNet-50 and LLMs on up to 46 real GPUs; ours simulates the same GPU types from
published BERT batch curves and trains exit ramps on the shipped 6-layer encoder. Compare gains and orderings, not
samples per second.
"""
from __future__ import annotations

import pandas as pd

from workbench.resources import shipped

COLUMNS = ("figure", "section", "metric", "setting", "value", "unit", "note")


def paper_figures() -> pd.DataFrame:
    """Every published figure, one row each, as text (``figure`` is a number or ``text``)."""
    return pd.read_csv(shipped("reference") / "e3_figures.csv", dtype=str, keep_default_na=False)


def paper_value(metric: str, setting: str) -> str:
    """The value the paper gives for ``metric`` under ``setting``, as printed."""
    rows = paper_figures()
    hit = rows[(rows["metric"] == metric) & (rows["setting"] == setting)]
    if hit.empty:
        raise KeyError(f"no E3 figure for {metric!r} / {setting!r}")
    return str(hit.iloc[0]["value"])


def paper_range(metric: str, setting: str) -> tuple[float, float]:
    """A numeric figure as (low, high): ``"4-8"`` gives (4, 8), ``"1.44"`` gives (1.44, 1.44)."""
    text = paper_value(metric, setting).removeprefix("about ").strip()
    low, sep, high = text.partition("-") if not text.startswith("-") else ("", "", "")
    try:
        return (float(low), float(high)) if sep else (float(text), float(text))
    except ValueError:
        raise ValueError(f"the paper states {metric!r} / {setting!r} in words: {text!r}") from None


def optimizer_times() -> pd.DataFrame:
    """Figure 20: the optimizer's run time (s) per model and cluster kind."""
    rows = paper_figures()
    rows = rows[rows["metric"] == "optimizer run time"]
    split = rows["setting"].str.rsplit(" ", n=1, expand=True)
    return pd.DataFrame({"model": split[0].str.lower(), "cluster": split[1],
                         "paper_s": rows["value"].astype(float)}).reset_index(drop=True)


def gains() -> pd.DataFrame:
    """The goodput gains given as a factor ("x"), with the figure they come from."""
    rows = paper_figures()
    rows = rows[(rows["unit"] == "x") & rows["metric"].str.startswith("goodput gain")]
    return rows.assign(value=rows["value"].astype(float))[["figure", "section", "metric", "setting", "value",
                                                           "note"]].reset_index(drop=True)
