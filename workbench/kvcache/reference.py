"""The LLMS paper's reported figures (shipped in ``data/reference/llms_figures.csv``) beside our bench.

The paper ran Llama2-7B and OPT-6.7B with 4K contexts on a Jetson Orin NX, a Jetson TX2 and a Xiaomi 14,
over 72-hour traces. We run SmolLM2-135M with contexts of a few hundred tokens on this host, emulating the
devices' recompute-to-load cost ratio; compare ratios and orderings, not absolute seconds.
"""
from __future__ import annotations

import pandas as pd

from workbench.resources import shipped


def paper_figures() -> pd.DataFrame:
    return pd.read_csv(shipped("reference") / "llms_figures.csv")


def paper_value(metric: str, setting: str) -> str:
    rows = paper_figures()
    hit = rows[(rows["metric"] == metric) & (rows["setting"] == setting)]
    if hit.empty:
        raise KeyError(f"no paper figure for {metric!r} / {setting!r}")
    return str(hit.iloc[0]["value"])
