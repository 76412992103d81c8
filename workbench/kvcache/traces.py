"""Context-switching traces as LLMS section 4 synthesizes them: calls at Poisson times, each to one of
N active contexts chosen by a switching pattern, with prompts drawn from shipped text datasets.

Patterns:
- ``random``: every context equally likely.
- ``markov``: first-order Markov over the recency order: the context used ``r`` switches ago is
  chosen with weight ``decay ** r`` (the one just used included), so recently used contexts are
  preferred, as the paper describes.
- ``gaussian``: contexts ranked by how much each call adds to them (their "delta length"); the
  probability follows a Gaussian over that rank centred on the middle, so contexts with a
  moderate workload are called most.

Each context draws its prompts from one source, as the paper derives several contexts from each
dataset: short movie-review sentences (sentiment, an SST-2 analogue), BBC headlines with their
first sentence (news classification, an AG News analogue) and longer BBC openings (summary).
Prompts are cut to ``max_prompt_words`` words, since a 2-core host decodes about 13 tokens a second.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.errors import WorkbenchError

PATTERNS = ("random", "markov", "gaussian")
SOURCES = ("review", "headline", "summary")


@dataclass(frozen=True, kw_only=True)
class TraceCall:
    time_s: float          # seconds from the trace start
    context: int           # which active context is called (0 .. contexts - 1)
    prompt: str


@dataclass(frozen=True, kw_only=True)
class Trace:
    calls: tuple[TraceCall, ...]
    contexts: int
    pattern: str
    mean_interval_s: float
    seed: int
    sources: tuple[str, ...]           # per context: where its prompts come from

    def switches(self) -> int:
        """Calls whose context differs from the previous call's."""
        return sum(a.context != b.context for a, b in zip(self.calls, self.calls[1:]))


def _texts(source: str) -> list[str]:
    from workbench.data import load_task

    if source == "review":
        return list(load_task("sentiment").train.texts)
    articles = load_task("bbc").train.texts
    if source == "headline":
        return [". ".join(a.split(". ")[:1]) for a in articles]
    return [". ".join(a.split(". ")[:3]) for a in articles]


def _cut(text: str, words: int) -> str:
    parts = text.split()
    return " ".join(parts[:words])


def synthesize_trace(contexts: int, calls: int, pattern: str = "random", mean_interval_s: float = 300.0,
                     seed: int = 0, decay: float = 0.5, max_prompt_words: int = 40,
                     texts: dict[str, list[str]] | None = None) -> Trace:
    """A trace of ``calls`` calls over ``contexts`` contexts; ``texts`` (source -> texts) replaces the shipped
    datasets (tests)."""
    from workbench.argtypes import seed as seeds
    from workbench.kvcache import limits

    limits.contexts.check("contexts", contexts)
    limits.trace_calls.check("calls", calls)
    limits.mean_interval_s.check("mean_interval_s", mean_interval_s)
    seeds.check("seed", seed)
    limits.prompt_words.check("max_prompt_words", max_prompt_words)
    if pattern not in PATTERNS:
        raise WorkbenchError(f"unknown switching pattern {pattern!r}; known: {', '.join(PATTERNS)}")
    if not 0 < decay < 1:
        raise WorkbenchError(f"decay: in (0, 1), got {decay}")
    limits.check_trace_time(contexts, calls, pattern)
    rng = np.random.default_rng(seed)
    sources = tuple(SOURCES[i % len(SOURCES)] for i in range(contexts))
    pools = {s: (texts or {}).get(s) or _texts(s) for s in set(sources)}
    times = np.cumsum(rng.exponential(mean_interval_s, calls))
    chosen = _pattern(pattern, contexts, calls, rng, decay, sources, pools)
    out = []
    for t, c in zip(times, chosen):
        pool = pools[sources[c]]
        out.append(TraceCall(time_s=float(t), context=int(c), prompt=_cut(pool[int(rng.integers(len(pool)))],
                                                                          max_prompt_words)))
    return Trace(calls=tuple(out), contexts=contexts, pattern=pattern, mean_interval_s=mean_interval_s, seed=seed,
                 sources=sources)


def _pattern(pattern, contexts, calls, rng, decay, sources, pools) -> list[int]:
    if pattern == "random":
        return rng.integers(contexts, size=calls).tolist()
    if pattern == "gaussian":
        delta = np.array([np.mean([len(t.split()) for t in pools[s][:200]]) for s in sources])
        delta += np.arange(contexts) * 1e-6                      # contexts of one source: a stable order
        rank = np.argsort(np.argsort(delta))
        centre, width = (contexts - 1) / 2, max(contexts / 4, 0.5)
        weights = np.exp(-0.5 * ((rank - centre) / width) ** 2)
        return rng.choice(contexts, size=calls, p=weights / weights.sum()).tolist()
    recency = list(rng.permutation(contexts))
    chosen = []
    for _ in range(calls):
        weights = decay ** np.arange(contexts)
        pick = recency[int(rng.choice(contexts, p=weights / weights.sum()))]
        recency.remove(pick)
        recency.insert(0, pick)
        chosen.append(int(pick))
    return chosen
