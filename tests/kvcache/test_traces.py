import numpy as np
import pytest

from workbench.errors import WorkbenchError
from workbench.kvcache.traces import synthesize_trace

TEXTS = {"review": ["a fine film " * 3, "dull and long"], "headline": ["Markets rise. Then fall"],
         "summary": [("word " * 80).strip()]}


def test_poisson_times_and_prompts_from_each_contexts_source():
    trace = synthesize_trace(6, 4000, "random", mean_interval_s=300, seed=1, texts=TEXTS, max_prompt_words=10)
    gaps = np.diff([0.0] + [c.time_s for c in trace.calls])
    assert (gaps > 0).all() and gaps.mean() == pytest.approx(300, rel=0.05)
    assert gaps.std() == pytest.approx(300, rel=0.08)                 # exponential: std equals the mean
    for call in trace.calls:
        assert call.prompt in {" ".join(t.split()[:10]) for t in TEXTS[trace.sources[call.context]]}
    counts = np.bincount([c.context for c in trace.calls], minlength=6) / 4000
    assert np.allclose(counts, 1 / 6, atol=0.03)
    assert synthesize_trace(6, 50, "random", seed=1, texts=TEXTS) == synthesize_trace(6, 50, "random", seed=1,
                                                                                        texts=TEXTS)


def test_markov_prefers_the_recently_used_and_gaussian_the_middle():
    markov = synthesize_trace(8, 3000, "markov", seed=2, texts=TEXTS, decay=0.5)
    uniform = synthesize_trace(8, 3000, "random", seed=2, texts=TEXTS)
    assert markov.switches() / 2999 == pytest.approx(0.5, abs=0.04)  # stays with weight 1 of 1 + 1/2 + ...
    assert uniform.switches() / 2999 == pytest.approx(7 / 8, abs=0.03)
    gauss = synthesize_trace(9, 4000, "gaussian", seed=3, texts=TEXTS)
    counts = np.bincount([c.context for c in gauss.calls], minlength=9)
    lengths = np.array([np.mean([len(t.split()) for t in TEXTS[s]]) + i * 1e-6 for i, s in enumerate(gauss.sources)])
    by_rank = counts[np.argsort(lengths)]
    assert by_rank[4] > by_rank[0] * 3 and by_rank[4] > by_rank[8] * 3


def test_bad_settings_are_named():
    with pytest.raises(WorkbenchError, match="unknown switching pattern 'zipf'"):
        synthesize_trace(4, 10, "zipf", texts=TEXTS)
    with pytest.raises(WorkbenchError, match="contexts: must be at least 1 contexts, got 0"):
        synthesize_trace(0, 10, texts=TEXTS)


def test_shipped_texts_make_prompts():
    trace = synthesize_trace(3, 6, "markov", seed=0, max_prompt_words=12)
    assert trace.sources == ("review", "headline", "summary")
    assert all(0 < len(c.prompt.split()) <= 12 for c in trace.calls)
