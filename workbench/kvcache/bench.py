"""`workbench bench llms`: LLMS against its baselines on replayed context-switching traces (paper section 5).

Every trace gives each context ``--calls`` calls on average (``calls x contexts`` calls), so contexts
grow over calls as in the paper's long traces. Memory is fixed, as on the paper's devices where what
the model leaves is given to contexts: budgets are fractions of the working set at 8 bits of the
reference trace (``--reference-contexts`` contexts, the first pattern). The default ``--budget`` 0.375
is three average contexts, as the paper's Orin NX (8 GB) has about 3 GB left for 1 GiB contexts.

Tables:

- ``switching`` (Figure 9): mean switching latency per method, context count and pattern on an
  emulated device (``--device``), with every method's ratio to LLMS. The summary compares the
  latencies averaged over all cells: LLMS >= 5x below vLLM-SQ and >= 20x below LMK is the
  criterion (paper: 9.7x on average and up to 100x); the per-cell ratios are printed beside. Each
  cell starts with the next method in turn, so the first replay after a new trace (slower: cold caches)
  is not always the same method's. A cell where no method brought a chunk back (nothing read or
  recomputed: where the contexts fit) is replayed ``--fit-rounds`` times per method, methods interleaved
  and each round starting with the next: its switches take a fraction of a millisecond, where a few
  calls of one replay are noise. Its rows give the standard error of the mean switch (``switch_sem_ms``), and the summary
  names each cell where a baseline switched faster than LLMS, and whether by more than twice the
  standard error of the difference.
- ``ablation`` (Figure 13): the reference trace (8 contexts, first pattern): LLMS and LLMS without
  chunk lifecycle management, without tolerance-aware compression, without the pipeline.
- ``paper_scale``: the ablation's LLMS loads priced by a cost model at the paper's own dimensions
  (Llama2-7B chunks, the paper's recompute figures), with and without the pipeline, beside the bound
  1 + 1/R that overlapping recompute with reads can reach (:func:`paper_scale_table`).
- ``active_contexts`` (Figure 10): for each of three budgets (``--budgets``), the most contexts each
  method serves with a mean switching latency under 10 ms and under 25 ms (``most_contexts``: counts
  doubled from 2 up to ``--max-contexts``, then bisected; a count equal to the cap means at least
  that many). The search uses the random pattern by default: its contexts grow evenly, as the
  paper's all reach the model's window, where Markov's favourites would outgrow a fixed budget by
  themselves. A count whose trace holds a context the budget cannot hold alone is not served.
  Every probe is one trace, so a latency need not grow with the count; each row lists its probes.
- ``perplexity`` (Figure 6b / 12): held-out perplexity of the decoder reading its own KV cache at
  static 8/4/2 bits and with tolerance-aware levels at the 50% global ratio
  (:func:`~workbench.kvcache.perplexity.kv_perplexity`).
- ``memory``: the peak resident memory of one call on a context of 2,048 and of 8,000 tokens, each in a
  fresh process whose service holds the context on disk only (:mod:`workbench.kvcache.memory`).
- ``load``: ``--load-clients`` client processes make ``--load-calls`` calls each over the socket of a
  `workbench serve llms` process against ``--load-contexts`` contexts, under ``--load-memory-mb``;
  wall time, calls per second and call latency, then every reply checked against one process making
  the same calls in the order the service served them (:mod:`workbench.kvcache.loadtest`).
- ``http``: time to first token and decode rate through the OpenAI-compatible endpoint, for one
  conversation of ``--http-turns`` turns and for ``--http-conversations`` interleaved ones under
  ``--http-memory-mb``, with context reuse and with every turn's prompt processed whole
  (:mod:`workbench.kvcache.bench_http`).

The replay tables, perplexity and memory (about 1,750 calls, 27 windows, two long contexts) took 43
minutes on this project's 2-core host, shared; the load (1,600 calls, 1.55 a second with 8 clients, then its single-process check making
them all again) 31 minutes more (``--tables load --load-calls 50`` for a shorter one, 12 minutes).
Since those were timed, the switching table's cells where contexts fit are replayed five times per method: its
2- and 4-context cells of the three patterns took 16 minutes (``--fit-rounds 1`` for one replay each).
``--quick`` makes every table in about two minutes.
"""
from __future__ import annotations

import math
import statistics
import time

import numpy as np

from workbench.argtypes import Bound, Parser, count, memory_holds, seed
from workbench.bench import add_quick_argument, parse_with_quick
from workbench.kvcache import limits
from workbench.kvcache.artifacts import METHODS
from workbench.data import split_size
from workbench.kvcache.config import SWAP_DEVICES
from workbench.kvcache.costmodel import SWAP_PRESETS
from workbench.kvcache.memory import memory_table
from workbench.kvcache.perplexity import kv_perplexity, perplexity_windows
from workbench.kvcache.traces import PATTERNS
from workbench.presets import add_preset_argument

ABLATIONS = ("llms", "llms_without_lifecycle", "llms_without_compression", "llms_without_pipeline")
PAPER_ABLATION_S = {"llms": 0.27, "llms_without_lifecycle": 0.62, "llms_without_compression": 0.42,
                    "llms_without_pipeline": 1.62}
"""Figure 13: mean switching latency on Jetson Orin NX, Llama2-7B, 8 contexts, Markov pattern."""
THRESHOLDS_MS = (10.0, 25.0)
TABLES = ("kernel", "switching", "active_contexts", "ablation", "paper_scale", "perplexity", "memory", "load", "http")
REPLAYED = {"switching", "active_contexts", "ablation", "paper_scale"}
"""The tables replayed on ``--device``."""
REFERENCE_CONTEXTS = 8
TARGET_VS_SQ, TARGET_VS_LMK = 5.0, 20.0
"""Perplexity settings: the plain decoder, chunks kept raw, static 8/4/2 bits, tolerance-aware levels, and
tolerance-aware level counts placed at random (what ranking chunks by density is worth)."""

QUICK = {"contexts": [2, 3], "calls": 2, "max_new_tokens": 2, "prompt_words": 12, "budgets": [0.5, 0.75, 1.0],
         "reference_contexts": 3, "max_contexts": 2, "articles": 2, "prefix": 64, "target": 16, "windows": 2,
         "load_clients": 2, "load_calls": 3, "load_contexts": 3, "memory_tokens": [128], "kernel_chunks": 8,
         "http_turns": 3, "http_conversations": 3, "http_rounds": 2, "http_new_tokens": 4, "http_prompt_words": 6,
         "http_memory_mb": 2.0, "fit_rounds": 1}
"""--quick: tiny sizes so every table is made in a minute or two (the tests)."""


CHAT_TURN_TOKENS = 192
"""Tokens a memory probe's call adds to its context besides the context itself (the chat turn, the growth)."""
CALLS_PER_CONTEXT = count(1, unit="calls", at_most=Bound(limits.CONTEXT_TOKENS,
                                                         "the decoder's context; every call adds a token or more"))
SEARCHED_CONTEXTS = count(2, unit="contexts", at_most=limits.contexts.at_most)
ARTICLES = count(1, unit="articles", at_most=Bound(split_size("bbc", "test"), "the held-out BBC articles"))
PREFIX = count(16, unit="tokens", at_most=Bound(limits.CONTEXT_TOKENS - 2, "the decoder's context less a target"))
TARGET = count(2, unit="tokens", at_most=Bound(limits.CONTEXT_TOKENS - 16, "the decoder's context less a chunk"))
WINDOWS = count(1, unit="windows", at_most=memory_holds(8 * 19, "windows of 19 token ids or more"))
MEMORY_TOKENS = count(16, unit="tokens", at_most=Bound(
    limits.CONTEXT_TOKENS - CHAT_TURN_TOKENS, f"the decoder's {limits.CONTEXT_TOKENS} less the chat turn and the "
                                              f"call's growth"))


KERNEL_CHUNKS = count(1, unit="chunks", at_most=Bound(limits.CONTEXT_TOKENS // 16, "the decoder's context in "
                                                                                   "16-token chunks"))
HTTP_TURNS = count(1, unit="turns", at_most=Bound(limits.CONTEXT_TOKENS // 32, "the decoder's context in turns of "
                                                                              "32 tokens or more"))
FIT_ROUNDS = count(1, unit="rounds", at_most=Bound(20, "rounds of a cell whose contexts fit, each a replay of "
                                                     "its trace per method"))
KERNEL_TARGET = 1.5
"""The fused kernel's aim: within 1.5x of a plain copy of the bytes it writes."""


def kernel_table(opts, repeats: int = 7) -> list[dict]:
    """The switch's dequantization, per level: the fused kernel (vector and portable), the unfused path it
    replaced (unpack, then torch's multiply, add and copy), and a plain copy of the same float16 bytes into the
    same cache, each writing ``--kernel-chunks`` chunks of the decoder's shape; the median of ``repeats``
    passes after one untimed. GB/s counts the float16 bytes written."""
    import torch

    from workbench.kvcache.chunks import encode_chunk, recompress

    from workbench.models.config import shipped_decoder_config

    cfg = shipped_decoder_config()
    L, H, D, T = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 16
    n = opts.kernel_chunks
    k = np.zeros((L, H, n * T, D), np.float16)
    v = np.zeros_like(k)
    kt, vt = torch.from_numpy(k), torch.from_numpy(v)
    values = np.random.default_rng(opts.seed).normal(size=(L, 2, H, T, D)).astype(np.float32)
    plain = values.astype(np.float16)
    nbytes = n * plain.nbytes
    rows = []

    def timed(work) -> float:
        work()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            work()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def copy():
        for i in range(n):
            k[:, :, i * T:(i + 1) * T] = plain[:, 0]
            v[:, :, i * T:(i + 1) * T] = plain[:, 1]

    copy_s = timed(copy)
    for bits in (8, 4, 2, 16):
        chunk = encode_chunk(values, 16) if bits == 16 else recompress(encode_chunk(values, 8), bits)

        def fused(simd=True):
            for i in range(n):
                chunk.into_half(k, v, i * T, simd=simd)

        def unfused():
            for i in range(n):
                t = chunk.to_tensor()
                kt[:, :, i * T:(i + 1) * T].copy_(t[:, 0])
                vt[:, :, i * T:(i + 1) * T].copy_(t[:, 1])

        for name, work in (("fused", fused), ("fused, portable", lambda: fused(False)), ("unfused (before)", unfused)):
            seconds = timed(work)
            rows.append({"bits": bits, "path": name, "chunks": n, "mb_written": nbytes / 1e6,
                         "ms": 1e3 * seconds, "gb_per_s": nbytes / seconds / 1e9,
                         "copy_gb_per_s": nbytes / copy_s / 1e9, "over_copy": seconds / copy_s})
    return rows


def parser() -> Parser:
    p = Parser(prog="workbench bench llms")
    add_preset_argument(p)
    p.add_argument("--calls", type=CALLS_PER_CONTEXT, default=4, help="calls per context in a trace (on average)")
    p.add_argument("--contexts", nargs="+", type=limits.contexts, default=[2, 4, 8, 16],
                   help="active-context counts of the switching table")
    p.add_argument("--patterns", nargs="+", choices=PATTERNS, default=["markov"],
                   help="switching patterns; the first also makes the ablation and the reference trace")
    p.add_argument("--device", choices=SWAP_DEVICES, default="orin-nx",
                   help="emulated device (or the host at its own speed)")
    p.add_argument("--fit-rounds", type=FIT_ROUNDS, default=5,
                   help="replays per method of a switching cell where no method brings a chunk back (the contexts fit): "
                        "their switches take a fraction of a millisecond, so such cells are measured this many "
                        "times, the methods interleaved")
    p.add_argument("--budget", type=limits.working_set_fraction, default=0.375,
                   help="memory of the switching and ablation tables, the same for every context count: this "
                        "fraction of the reference trace's working set at 8 bits")
    p.add_argument("--budgets", nargs=3, type=limits.working_set_fraction, default=[0.25, 0.5, 0.75],
                   help="the three memory budgets of the active-contexts table, as fractions of the reference "
                        "trace's working set at 8 bits")
    p.add_argument("--search-pattern", choices=PATTERNS, default="random",
                   help="pattern of the active-contexts search (random: contexts grow evenly, as the paper's all "
                        "reach the model's window; Markov's favourites outgrow a fixed budget by themselves)")
    p.add_argument("--max-contexts", type=SEARCHED_CONTEXTS, default=16, help="largest count the active-contexts search tries")
    p.add_argument("--reference-contexts", type=SEARCHED_CONTEXTS, default=REFERENCE_CONTEXTS,
                   help="contexts of the ablation and of the trace whose working set the --budgets refer to")
    p.add_argument("--max-new-tokens", type=limits.new_tokens, default=4, help="tokens generated per call")
    p.add_argument("--prompt-words", type=limits.prompt_words, default=40, help="words per prompt, at most")
    p.add_argument("--seed", type=seed, default=0, help="trace seed")
    p.add_argument("--articles", type=ARTICLES, default=16, help="held-out BBC articles for the perplexity table")
    p.add_argument("--prefix", type=PREFIX, default=192,
                   help="perplexity: tokens prefilled into chunks per window (a multiple of 16)")
    p.add_argument("--target", type=TARGET, default=64, help="perplexity: tokens scored per window")
    p.add_argument("--windows", type=WINDOWS, default=32, help="perplexity: most windows scored")
    p.add_argument("--load-clients", type=limits.client_processes, default=8, help="load: client processes")
    p.add_argument("--load-calls", type=CALLS_PER_CONTEXT, default=200, help="load: calls per client")
    p.add_argument("--load-contexts", type=limits.contexts, default=16, help="load: contexts, shared out among the clients")
    p.add_argument("--load-memory-mb", type=limits.memory_mb, default=32.0,
                   help="load: the served service's budget for chunks, beside the working cache of a call")
    p.add_argument("--load-new-tokens", type=limits.new_tokens, default=2, help="load: tokens generated per call")
    p.add_argument("--load-prompt-words", type=limits.prompt_words, default=6, help="load: words per prompt, at most")
    p.add_argument("--memory-tokens", nargs="+", type=MEMORY_TOKENS, default=[2048, 8000],
                   help="memory: context lengths whose call's peak RSS is measured")
    p.add_argument("--kernel-chunks", type=KERNEL_CHUNKS, default=256,
                   help="kernel: chunks written into one float16 cache per timed pass")
    p.add_argument("--http-turns", type=HTTP_TURNS, default=10, help="http: turns of the one conversation")
    p.add_argument("--http-conversations", type=limits.contexts, default=8,
                   help="http: conversations taking turns under the memory budget")
    p.add_argument("--http-rounds", type=HTTP_TURNS, default=4, help="http: turns of each interleaved conversation")
    p.add_argument("--http-memory-mb", type=limits.memory_mb, default=6.0,
                   help="http: chunk budget of the interleaved conversations, beside the working cache of a call")
    p.add_argument("--http-new-tokens", type=limits.new_tokens, default=16, help="http: max_tokens of each turn")
    p.add_argument("--http-prompt-words", type=limits.prompt_words, default=12, help="http: words in each user turn")
    p.add_argument("--tables", nargs="+", choices=TABLES, default=list(TABLES), help="tables to make")
    add_quick_argument(p, QUICK, "tiny sizes (tests)")
    return p


def options(args: list[str]):
    opts = parse_with_quick(parser(), args, QUICK)
    if opts.prefix % 16:
        parser().error(f"--prefix must be a multiple of 16 (whole chunks), got {opts.prefix}")
    if opts.prefix + opts.target + 1 > limits.CONTEXT_TOKENS:
        parser().error(f"--prefix and --target: a window of {opts.prefix} + {opts.target} + 1 tokens is longer than "
                       f"the decoder's context of {limits.CONTEXT_TOKENS}")
    from workbench.kvcache.bench_http import CONTEXT_TOKENS, tokens_per_turn

    for name, turns in (("--http-turns", opts.http_turns), ("--http-rounds", opts.http_rounds)):
        need = turns * tokens_per_turn(opts.http_prompt_words, opts.http_new_tokens)
        if need > CONTEXT_TOKENS:
            parser().error(f"{name}: {turns} turns of {opts.http_prompt_words} words and {opts.http_new_tokens} new "
                           f"tokens take about {need} tokens, beyond the bench services' context of {CONTEXT_TOKENS}; "
                           f"lower {name}, --http-prompt-words or --http-new-tokens")
    if opts.load_contexts < opts.load_clients:
        parser().error(f"--load-contexts must be at least --load-clients (every client holds a context of its own), "
                       f"got {opts.load_contexts} for {opts.load_clients}")
    return opts


# ----------------------------------------------------------------------------- replays

class Replays:
    """Traces and replays of one bench run, each made once (the tables share them)."""

    def __init__(self, opts, model):
        self.opts, self.model = opts, model
        self._traces: dict = {}
        self._results: dict = {}
        self.calls_run = 0

    def trace(self, contexts: int, pattern: str):
        from workbench.kvcache.traces import synthesize_trace

        key = (contexts, pattern)
        if key not in self._traces:
            self._traces[key] = synthesize_trace(contexts, self.opts.calls * contexts, pattern, seed=self.opts.seed,
                                                 max_prompt_words=self.opts.prompt_words)
        return self._traces[key]

    def budget(self, fraction: float) -> int:
        """``fraction`` of the working set at 8 bits of the reference trace (``--reference-contexts`` contexts,
        the first pattern), in bytes."""
        from workbench.kvcache.replay import budget_for

        trace = self.trace(self.opts.reference_contexts, self.opts.patterns[0])
        return budget_for(trace, fraction, max_new_tokens=self.opts.max_new_tokens, model=self.model)

    def run(self, method: str, contexts: int, pattern: str, budget: int, fit: bool = True, round: int = 0):
        """The replay of ``method`` (``round``: a repeat of the same replay, run anew); None when ``fit`` is
        off and a context outgrows ``budget`` by itself."""
        from workbench.kvcache.lifecycle import MemoryBudgetError
        from workbench.kvcache.replay import replay

        key = (method, contexts, pattern, budget, fit, round)
        if key not in self._results:
            trace = self.trace(contexts, pattern)
            t0 = time.perf_counter()
            try:
                result = replay(trace, method, memory_budget_bytes=budget, device=self.opts.device, model=self.model,
                                max_new_tokens=self.opts.max_new_tokens, fit_budget=fit)
            except MemoryBudgetError:
                result = None
            self.calls_run += len(trace.calls)
            shown = "a context outgrows the budget" if result is None else \
                f"mean switch {1e3 * result.mean_switch_s():8.2f} ms"
            print(f"  {method:24s} {contexts:3d} contexts {pattern:8s} budget {budget / 1e6:7.2f} MB: {shown} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
            self._results[key] = result
        return self._results[key]


def _summary_of(result, rounds=()) -> dict:
    """A method's row of a cell: ``result``'s counts; its switch statistics over ``result`` and the
    replays of ``rounds`` together."""
    switches = [1e3 * c.switch_s for r in (result, *rounds) for c in _later_calls(r)]
    mean = float(np.mean(switches)) if switches else 0.0
    sem = float(np.std(switches, ddof=1) / math.sqrt(len(switches))) if len(switches) > 1 else 0.0
    later = list(_later_calls(result))
    return {"mean_switch_ms": mean, "switch_sem_ms": sem, "rounds": 1 + len(rounds),
            "p95_switch_ms": float(np.percentile(switches, 95)) if switches else 0.0,
            "calls": len(result.calls),
            "switches": sum(a.context != b.context for a, b in zip(result.calls, result.calls[1:])),
            "loads": sum(1 for c in result.calls if c.chunks_missing),
            "chunks_missing": sum(c.chunks_missing for c in result.calls),
            "chunks_recomputed": sum(c.chunks_recomputed for c in result.calls),
            "mb_read": sum(c.bytes_read for c in result.calls) / 1e6,
            "evictions": sum(len(c.evictions) for c in result.calls),
            "budget_mb": result.memory_budget_bytes / 1e6, "budget_raised": result.settings["budget_raised"]}


def _later_calls(result):
    """Calls to contexts that already existed (a context's first call brings nothing back)."""
    seen = set()
    for c in result.calls:
        if c.context in seen:
            yield c
        seen.add(c.context)


def _ratio(value: float, base: float) -> float:
    return value / base if base > 0 else math.inf


def switching_table(replays: Replays) -> list[dict]:
    from workbench.kvcache.replay import working_set_bytes

    opts, rows = replays.opts, []
    budget = replays.budget(opts.budget)
    for k, (pattern, n) in enumerate((p, n) for p in opts.patterns for n in opts.contexts):
        ws = working_set_bytes(replays.trace(n, pattern), 8, opts.max_new_tokens, replays.model)
        first = k % len(METHODS)          # each cell starts with another method: no method always runs cold
        ran = {m: replays.run(m, n, pattern, budget) for m in METHODS[first:] + METHODS[:first]}
        again: dict[str, list] = {m: [] for m in METHODS}
        if not any(c.chunks_missing for r in ran.values() for c in r.calls):
            for k_round in range(1, opts.fit_rounds):
                start = (first + k_round) % len(METHODS)
                for m in METHODS[start:] + METHODS[:start]:
                    again[m].append(replays.run(m, n, pattern, budget, round=k_round))
        summary = {m: _summary_of(ran[m], again[m]) for m in METHODS}
        for m in METHODS:
            rows.append({"pattern": pattern, "contexts": n, "device": opts.device, "method": m,
                         "working_set_mb": ws / 1e6, **summary[m],
                         "ratio_to_llms": _ratio(summary[m]["mean_switch_ms"], summary["llms"]["mean_switch_ms"])})
    return rows


def baselines_ahead(rows: list[dict]) -> list[tuple[dict, bool]]:
    """Each switching row whose baseline switched faster than LLMS in its cell, with whether by more than
    twice the standard error of the difference of the two means (beyond the measurement's noise)."""
    llms = {(r["pattern"], r["contexts"]): r for r in rows if r["method"] == "llms"}
    out = []
    for r in rows:
        ref = llms[(r["pattern"], r["contexts"])]
        if r["method"] != "llms" and r["mean_switch_ms"] < ref["mean_switch_ms"]:
            noise = 2 * math.hypot(r.get("switch_sem_ms", 0.0), ref.get("switch_sem_ms", 0.0))
            out.append((r, ref["mean_switch_ms"] - r["mean_switch_ms"] > noise))
    return out


def switching_ratios(rows: list[dict]) -> dict[str, float]:
    """Each method's switching latency averaged over every cell of the table, over LLMS's."""
    mean = {m: np.mean([r["mean_switch_ms"] for r in rows if r["method"] == m]) for m in METHODS}
    return {m: _ratio(mean[m], mean["llms"]) for m in METHODS}


def active_contexts_table(replays: Replays) -> list[dict]:
    opts, rows = replays.opts, []
    pattern = opts.search_pattern
    for fraction in opts.budgets:
        budget = replays.budget(fraction)
        found: dict[str, dict[float, int]] = {}
        for m in METHODS:
            probes: dict[int, float] = {}

            def latency_ms(n: int) -> float:
                if n not in probes:
                    result = replays.run(m, n, pattern, budget, fit=False)
                    probes[n] = math.inf if result is None else 1e3 * result.mean_switch_s()
                return probes[n]

            found[m] = {t: most_contexts(latency_ms, t, opts.max_contexts) for t in THRESHOLDS_MS}
            rows.append({"pattern": pattern, "device": opts.device, "budget_fraction": fraction,
                         "budget_mb": budget / 1e6, "method": m,
                         **{f"contexts_under_{t:g}ms": found[m][t] for t in THRESHOLDS_MS},
                         "search_cap": opts.max_contexts,
                         "probes_ms": " ".join(f"{n}:{v:.1f}" for n, v in sorted(probes.items()))})
        for row in rows[-len(METHODS):]:
            for t in THRESHOLDS_MS:
                best = max(found[m][t] for m in METHODS if m != "llms")
                row[f"llms_over_best_baseline_{t:g}ms"] = _ratio(found["llms"][t], best)
    return rows


def most_contexts(latency_ms, threshold_ms: float, cap: int) -> int:
    """The largest count n in 2..cap with ``latency_ms(n) < threshold_ms``, assuming latency grows with n:
    doubling from 2, then bisecting between the last count under and the first over (0 if 2 is over)."""
    if not latency_ms(2) < threshold_ms:
        return 0
    good, bad = 2, None
    while bad is None and good < cap:
        n = min(2 * good, cap)
        if latency_ms(n) < threshold_ms:
            good = n
        else:
            bad = n
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        if latency_ms(mid) < threshold_ms:
            good = mid
        else:
            bad = mid
    return good


def ablation_table(replays: Replays) -> list[dict]:
    opts, pattern, n = replays.opts, replays.opts.patterns[0], replays.opts.reference_contexts
    budget = replays.budget(opts.budget)
    results = {m: replays.run(m, n, pattern, budget) for m in ABLATIONS}
    base = results["llms"].mean_switch_s()
    return [{"method": m, "contexts": n, "pattern": pattern, "device": opts.device, **_summary_of(r),
             "ratio_to_llms": _ratio(r.mean_switch_s(), base), "paper_orin_s": PAPER_ABLATION_S[m],
             "paper_ratio": PAPER_ABLATION_S[m] / PAPER_ABLATION_S["llms"]} for m, r in results.items()]


def paper_scale_table(replays: Replays) -> list[dict]:
    """The ablation's LLMS replay priced at the paper's dimensions (a cost model only: Llama2-7B's 4 MB
    chunks with the paper's recompute line and each preset's read bandwidth, nothing run): every load
    of the replay, with the chunks and levels it brought back, planned by equation 4 (the pipeline) and
    read whole (without it). What the pipeline can buy there, beside its bound 1 + 1/R and the paper's
    Figure 13 (1.62 s / 0.27 s = 6x on Orin NX)."""
    from workbench.kvcache.costmodel import paper_cost_model, pipeline_bound
    from workbench.kvcache.planner import fixed_plan, plan_swap_recompute

    opts, pattern, n = replays.opts, replays.opts.patterns[0], replays.opts.reference_contexts
    result = replays.run("llms", n, pattern, replays.budget(opts.budget))
    loads = [c.missing_bits for c in _later_calls(result) if c.missing_bits]
    rows = []
    for device in SWAP_PRESETS:
        costs = paper_cost_model(device)
        missing = [[(i, bits, costs.chunk_bytes[bits]) for i, bits in enumerate(levels)] for levels in loads]
        with_pipeline = [plan_swap_recompute(costs, m) for m in missing]
        read_all = [fixed_plan(costs, (), m).predicted_s for m in missing]
        mean_with = float(np.mean([p.predicted_s for p in with_pipeline])) if loads else 0.0
        mean_without = float(np.mean(read_all)) if loads else 0.0
        rows.append({"device": device, "source": "cost model at Llama2-7B dimensions (paper figures), not measured",
                     "loads": len(loads), "chunks_per_load": float(np.mean([len(m) for m in loads])) if loads else 0.0,
                     "chunks_recomputed": sum(len(p.recompute) for p in with_pipeline),
                     "mean_switch_with_pipeline_ms": 1e3 * mean_with, "mean_switch_read_all_ms": 1e3 * mean_without,
                     "without_over_with": _ratio(mean_without, mean_with) if loads else 1.0,
                     "bound": pipeline_bound(costs),
                     "paper_ratio": PAPER_ABLATION_S["llms_without_pipeline"] / PAPER_ABLATION_S["llms"]})
    return rows


# ----------------------------------------------------------------------------- perplexity

def perplexity_table(opts, model) -> list[dict]:
    from workbench.data import heldout_text
    from workbench.models.decoder import decoder_tokenizer

    ids = decoder_tokenizer().encode(heldout_text(opts.articles))
    windows = perplexity_windows(ids, opts.prefix, opts.target, opts.windows)
    if not windows:
        raise SystemExit(f"workbench bench llms: {opts.articles} articles hold {len(ids)} tokens, fewer than one "
                         f"window of {opts.prefix + opts.target + 1}; ask for more --articles or a shorter window")
    measured = kv_perplexity(model, windows, opts.prefix)
    eight = measured[8][1]
    return [{"setting": str(s), "perplexity": ppl, "kv_bytes_per_window": nbytes, "bytes_vs_8bit": nbytes / eight,
             "windows": len(windows), "prefix": opts.prefix, "scored_tokens": len(windows) * opts.target}
            for s, (ppl, nbytes) in measured.items()]


# ----------------------------------------------------------------------------- load

def load_table(opts, model) -> list[dict]:
    """One load run against a served service and its check (module docstring)."""
    import tempfile

    from workbench.kvcache.loadtest import (budget_bytes, check_replies, plan_calls, reference_replies, run_load,
                                            served)

    plans = plan_calls(opts.load_clients, opts.load_calls, opts.load_contexts, seed=opts.seed,
                       prompt_words=opts.load_prompt_words)
    total = opts.load_clients * opts.load_calls
    print(f"load: {opts.load_clients} client processes x {opts.load_calls} calls against {opts.load_contexts} "
          f"contexts, {opts.load_new_tokens} new tokens per call, {opts.load_memory_mb:g} MB", flush=True)
    started, last = time.perf_counter(), [-1]

    def answered(done, n):
        if done // max(1, n // 20) != last[0]:                 # about every 5 % of the calls
            last[0] = done // max(1, n // 20)
            print(f"  {done}/{n} calls answered ({time.perf_counter() - started:.0f} s)", flush=True)

    with tempfile.TemporaryDirectory(prefix="llms-load-swap-") as swap:
        with served(swap, opts.load_memory_mb) as address:
            result = run_load(address, plans, max_new_tokens=opts.load_new_tokens, progress=answered)
    print(f"load: {len(result.replies)} of {total} calls answered in {result.wall_s:.1f} s "
          f"({result.calls_per_s:.2f} calls/s; latency p50 {result.latency_ms(50):.0f} ms, "
          f"p95 {result.latency_ms(95):.0f} ms); checking against one process making the same calls", flush=True)
    t0 = time.perf_counter()
    step = max(1, total // 10)

    def progress(done, n):
        if done % step == 0 or done == n:
            print(f"  reference {done}/{n} calls ({time.perf_counter() - t0:.0f} s)", flush=True)

    reference = reference_replies(plans, result, memory_budget_bytes=budget_bytes(opts.load_memory_mb),
                                  model=model, progress=progress)
    problems = check_replies(plans, result, reference)
    for line in problems[:10]:
        print(f"  {line}")
    print(f"load check: {'every reply equals the single-process run' if not problems else f'{len(problems)} problems'}"
          f" ({len(result.replies)} replies, {len(reference)} reference calls)", flush=True)
    return [{"clients": result.clients, "calls_per_client": opts.load_calls, "contexts": result.contexts,
             "new_tokens": opts.load_new_tokens, "memory_mb": opts.load_memory_mb, "answered": len(result.replies),
             "wall_s": result.wall_s, "calls_per_s": result.calls_per_s, "p50_ms": result.latency_ms(50),
             "p95_ms": result.latency_ms(95),
             "mean_queue_wait_ms": float(np.mean([r.queue_wait_s for r in result.replies]) * 1e3)
             if result.replies else 0.0,
             "mean_switch_ms": float(np.mean([r.switch_s for r in result.replies]) * 1e3) if result.replies else 0.0,
             "problems": len(problems), "reference_s": time.perf_counter() - t0}]


# ----------------------------------------------------------------------------- the run

def device_line(device, model) -> str:
    """What the replays' device is: an emulated preset follows this host's cached swap profile, which moves
    between measurements, so each run says the speeds it replayed at (compare ratios within a run)."""
    from workbench.kvcache.replay import cost_model

    costs = cost_model(device, model)
    load8 = costs.t_io(costs.chunk_bytes[8])
    line = (f"device {costs.device} ({costs.source}): an 8-bit chunk read in {1e3 * load8:.2f} ms "
            f"({costs.chunk_bytes[8] / load8 / 1e6:.1f} MB/s), recomputed in {1e3 * costs.recompute_fixed_s:.0f} ms "
            f"+ {1e3 * costs.recompute_per_chunk_s:.0f} ms per chunk")
    if costs.source == "emulated":
        line += ("; derived from this host's cached swap profile, which moves between measurements "
                 "(`workbench kvcache costs --remeasure` measures it again)")
    return line


def run(args: list[str]) -> dict[str, list[dict]]:
    from workbench.models.decoder import load_decoder

    opts = options(args)
    t0 = time.perf_counter()
    model = load_decoder()
    replays = Replays(opts, model)
    tables: dict[str, list[dict]] = {}
    print(f"LLMS bench on {opts.device}: {opts.calls} calls per context, patterns {' '.join(opts.patterns)}, "
          f"{opts.max_new_tokens} new tokens per call", flush=True)
    if REPLAYED & set(opts.tables):
        print(device_line(opts.device, model), flush=True)
    if "kernel" in opts.tables:
        tables["kernel"] = rows = kernel_table(opts)
        copy = rows[0]["copy_gb_per_s"]
        print(f"kernel: {rows[0]['chunks']} chunks into a float16 cache ({rows[0]['mb_written']:.1f} MB); a plain copy "
              f"{copy:.2f} GB/s; " + ", ".join(f"{r['bits']}-bit {r['path']} {r['gb_per_s']:.2f} GB/s "
                                              f"({r['over_copy']:.2f}x the copy)" for r in rows), flush=True)
        fused = max(r["over_copy"] for r in rows if r["path"] == "fused")
        print(f"fused kernel within {KERNEL_TARGET:g}x of the copy at every level: "
              f"{'met' if fused <= KERNEL_TARGET else 'MISSED'} (slowest {fused:.2f}x)", flush=True)
    if "switching" in opts.tables:
        print(f"switching: contexts {opts.contexts}, {replays.budget(opts.budget) / 1e6:.2f} MB ({opts.budget:g} of "
              f"the {opts.reference_contexts}-context trace's working set)")
        tables["switching"] = rows = switching_table(replays)
        ratios = switching_ratios(rows)
        llms = np.mean([r["mean_switch_ms"] for r in rows if r["method"] == "llms"])
        print(f"switching latency averaged over {len(rows) // len(METHODS)} cells: LLMS {llms:.2f} ms; "
              + ", ".join(f"{m} {ratios[m]:.1f}x" for m in METHODS[1:]))
        for m in ("vllm_sq", "lmk"):
            print(f"{m} / LLMS per cell: " + ", ".join(f"{r['pattern']} {r['contexts']}: {r['ratio_to_llms']:.1f}x"
                                                      for r in rows if r["method"] == m))
        ahead = baselines_ahead(rows)
        cell = {(r["pattern"], r["contexts"]): r for r in rows if r["method"] == "llms"}

        def shown(r):
            return f"{r['mean_switch_ms']:.3f} ± {r['switch_sem_ms']:.3f} ms"
        print("baselines faster than LLMS in a cell (mean ± standard error): " + ("; ".join(
            f"{r['pattern']} {r['contexts']}: {r['method']} {shown(r)} against "
            f"{shown(cell[(r['pattern'], r['contexts'])])} over {r['rounds']} replay{'s' if r['rounds'] > 1 else ''} "
            f"each, {'beyond' if beyond else 'within'} twice the difference's standard error"
            for r, beyond in ahead) or "none"), flush=True)
        print(f"LLMS vs vLLM-SQ {ratios['vllm_sq']:.1f}x (criterion >= {TARGET_VS_SQ:g}x: "
              f"{'met' if ratios['vllm_sq'] >= TARGET_VS_SQ else 'MISSED'}), vs LMK {ratios['lmk']:.1f}x (criterion "
              f">= {TARGET_VS_LMK:g}x: {'met' if ratios['lmk'] >= TARGET_VS_LMK else 'MISSED'}); "
              "paper: 9.7x on average and up to 100x", flush=True)
    if "ablation" in opts.tables:
        print(f"ablation: {opts.reference_contexts} contexts, {opts.patterns[0]}")
        tables["ablation"] = rows = ablation_table(replays)
        print("ablation, mean switching latency: " + ", ".join(
            f"{r['method']} {r['mean_switch_ms']:.2f} ms ({r['ratio_to_llms']:.2f}x; paper {r['paper_ratio']:.2f}x)"
            for r in rows), flush=True)
    if "paper_scale" in opts.tables:
        tables["paper_scale"] = rows = paper_scale_table(replays)
        print("at the paper's dimensions (cost model, not measured), the ablation's loads without / with the "
              "pipeline: " + ", ".join(f"{r['device']} {r['without_over_with']:.3f}x (bound {r['bound']:.3f}x)"
                                       for r in rows) + f"; paper, Orin NX: {rows[0]['paper_ratio']:.1f}x", flush=True)
    if "active_contexts" in opts.tables:
        print(f"active contexts ({opts.search_pattern}): budgets {opts.budgets} of the working set of the "
              f"{opts.reference_contexts}-context trace")
        tables["active_contexts"] = rows = active_contexts_table(replays)
        for r in rows:
            if r["method"] == "llms":
                print(f"budget {r['budget_mb']:.2f} MB: LLMS serves "
                      + ", ".join(f"{r[f'contexts_under_{t:g}ms']}"
                                  f"{' (the cap)' if r[f'contexts_under_{t:g}ms'] == opts.max_contexts else ''} "
                                  f"contexts under {t:g} ms "
                                  f"({r[f'llms_over_best_baseline_{t:g}ms']:.2f}x the best baseline)"
                                  for t in THRESHOLDS_MS), flush=True)
    if "perplexity" in opts.tables:
        tables["perplexity"] = rows = perplexity_table(opts, model)
        got = {r["setting"]: r for r in rows}
        print("held-out perplexity: " + ", ".join(f"{s} {r['perplexity']:.3f} ({r['bytes_vs_8bit']:.2f}x 8-bit bytes)"
                                                  for s, r in got.items()))
        better = got["tolerance"]["perplexity"] < got["4"]["perplexity"]
        print(f"tolerance-aware at 50% vs static 4-bit: {got['tolerance']['perplexity']:.3f} vs "
              f"{got['4']['perplexity']:.3f} at {got['tolerance']['bytes_vs_8bit']:.3f}x / "
              f"{got['4']['bytes_vs_8bit']:.3f}x the 8-bit bytes (criterion lower: {'met' if better else 'MISSED'})")
    if "memory" in opts.tables:
        tables["memory"] = memory_table(opts)
    if "load" in opts.tables:
        tables["load"] = load_table(opts, model)
    if "http" in opts.tables:
        from workbench.kvcache.bench_http import http_table, report

        print(f"http: one conversation of {opts.http_turns} turns; {opts.http_conversations} conversations of "
              f"{opts.http_rounds} turns under {opts.http_memory_mb:g} MB; {opts.http_new_tokens} new tokens a turn; "
              f"with context reuse and reprocessing every prompt", flush=True)
        tables["http"] = rows = http_table(opts, model)
        report(rows)
    replayed = f"replays of traces of {replays.calls_run} calls, " if replays.calls_run else ""
    print(f"bench llms: {replayed}{time.perf_counter() - t0:.0f} s", flush=True)
    return tables
