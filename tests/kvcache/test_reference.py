import pytest

from workbench.kvcache.reference import paper_figures, paper_value


def test_the_papers_figures_are_shipped_as_the_text_states_them():
    assert paper_value("switching latency reduction vs vllm_sq", "average") == "9.7"
    assert [paper_value("ablation switching latency", s) for s in
            ("llms", "without lifecycle management", "without tolerance-aware compression",
             "without swapping-recompute pipeline")] == ["0.27", "0.62", "0.42", "1.62"]
    assert [paper_value("active contexts under 25 ms", f"{g} GB") for g in (1, 2, 3)] == ["9.28", "19.34", "27.38"]
    assert set(paper_figures()["figure"]) == {9, 10, 12, 13}


def test_replay_ratios_divide_by_llms():
    from workbench.kvcache.reference import replay_ratios

    class Replay:
        def __init__(self, s):
            self.s = s

        def mean_switch_s(self):
            return self.s

    frame = replay_ratios({"llms": Replay(0.01), "lmk": Replay(0.5)})
    assert frame["times_llms"].tolist() == [1.0, 50.0] and frame["mean_switch_ms"].tolist() == [10.0, 500.0]


def test_the_recorded_switching_runs_average_as_the_bench_does():
    """The summary row of each recorded run is the bench's own average of its cells (each method's mean over
    the cells, over LLMS's: not a mean of per-cell ratios), and every run holds the 12 cells of five methods."""
    import pandas as pd

    from workbench.kvcache.artifacts import METHODS
    from workbench.kvcache.bench_replays import switching_ratios
    from workbench.kvcache.reference import switching_runs
    from workbench.resources import shipped

    recorded = pd.read_csv(shipped("reference") / "llms_switching_runs.csv")
    table = switching_runs()
    for run, rows in recorded.groupby("run"):
        assert len(rows) == 12 * len(METHODS) and set(rows["method"]) == set(METHODS)
        ratios = switching_ratios(rows.to_dict("records"))
        (summary,) = table[(table["run"] == run) & (table["contexts"] == "mean")].to_dict("records")
        assert summary["vllm_sq_over_llms"] == pytest.approx(ratios["vllm_sq"])
        assert summary["lmk_over_llms"] == pytest.approx(ratios["lmk"])
