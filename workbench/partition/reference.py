"""The Voltage paper's reported figures (shipped in ``data/reference/voltage_figures.csv``) beside our bench.

The paper ran BERT-Large, ViT and GPT-2 on six 1-vCPU VMs at 500 Mbit/s; we run the shipped MiniLM encoder,
the SmolLM2 decoder's prefill and random layers of the paper's shapes on this host's processes, emulating
the VMs. Compare reductions, crossings and ratios, not absolute seconds.
"""
from __future__ import annotations

import pandas as pd

from workbench.resources import shipped


def paper_figures() -> pd.DataFrame:
    return pd.read_csv(shipped("reference") / "voltage_figures.csv")


def paper_value(metric: str, setting: str) -> str:
    rows = paper_figures()
    hit = rows[(rows["metric"] == metric) & (rows["setting"] == setting)]
    if hit.empty:
        raise KeyError(f"no paper figure for {metric!r} / {setting!r}")
    return str(hit.iloc[0]["value"])
