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


def paper_rows(figure: int) -> pd.DataFrame:
    """The paper's reported values of one figure."""
    rows = paper_figures()
    return rows[rows["figure"] == figure].drop(columns="figure").reset_index(drop=True)


def bench_results(name: str, run: str | None = None):
    """Table ``name`` of the last `workbench bench llms` run (switching, active_contexts, ablation,
    perplexity, ...) with what made it (``workbench.bench.results.Results``): the full run's when there
    is one, else a quick run's (its caption says it is not meaningful); None when neither ran on this cache."""
    from workbench.bench.results import load_results

    return load_results(f"llms-{name}", run)


def bench_table(name: str, run: str | None = None) -> pd.DataFrame | None:
    """The rows of :func:`bench_results`, or None."""
    found = bench_results(name, run)
    return None if found is None else found.frame()


def replay_ratios(replays: dict) -> pd.DataFrame:
    """Mean switching latency per method of a set of replays and each baseline's ratio to LLMS."""
    llms = replays["llms"].mean_switch_s()
    rows = [{"method": m, "mean_switch_ms": 1e3 * r.mean_switch_s(),
             "times_llms": r.mean_switch_s() / llms if llms > 0 else float("nan")} for m, r in replays.items()]
    return pd.DataFrame(rows)


def switching_runs() -> pd.DataFrame:
    """Full-preset switching runs recorded on this project's 2-core host as the switch path changed (shipped in
    ``data/reference/llms_switching_runs.csv``), one row a run and cell: LLMS's mean switch and each baseline's
    over it, then a row a run averaged over its cells as the bench averages them (each method's mean over
    the cells, over LLMS's). Recorded, not re-measured: a fresh ``workbench bench llms`` run is the current
    one."""
    rows = pd.read_csv(shipped("reference") / "llms_switching_runs.csv")
    wide = rows.pivot_table(index=["run", "change", "pattern", "contexts"], columns="method",
                            values="mean_switch_ms", sort=False).reset_index()
    wide.columns.name = None
    summary = wide.groupby(["run", "change"], sort=False)[["llms", "vllm_sq", "lmk"]].mean().reset_index()
    summary["pattern"], summary["contexts"] = "all 12 cells", "mean"
    out = pd.concat([wide, summary], ignore_index=True)
    out["vllm_sq_over_llms"] = out["vllm_sq"] / out["llms"]
    out["lmk_over_llms"] = out["lmk"] / out["llms"]
    return out[["run", "change", "pattern", "contexts", "llms", "vllm_sq_over_llms", "lmk_over_llms"]].rename(
        columns={"llms": "llms_ms"})
