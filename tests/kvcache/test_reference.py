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
