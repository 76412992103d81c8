"""`workbench bench llms`: LLMS against its baselines on replayed context-switching traces (paper section 5).

Every trace gives each context ``--calls`` calls on average (``calls x contexts`` calls), so contexts
grow over calls as in the paper's long traces. Memory is fixed, as on the paper's devices where what
the model leaves is given to contexts: budgets are fractions of the working set at 8 bits of the
reference trace (``--reference-contexts`` contexts, the first pattern). The default ``--budget`` 0.375
is three average contexts, as the paper's Orin NX (8 GB) has about 3 GB left for 1 GiB contexts.

Tables (the replayed ones, switching to paper_scale, are made in :mod:`workbench.kvcache.bench_replays`):

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

import statistics
import time

import numpy as np

from workbench.argtypes import Bound, Parser, count, memory_holds, seed
from workbench.bench import add_quick_argument, parse_with_quick
from workbench.kvcache import limits
from workbench.data import split_size
from workbench.kvcache.bench_replays import Replays, device_line, replayed_table
from workbench.kvcache.config import SWAP_DEVICES
from workbench.kvcache.memory import memory_table
from workbench.kvcache.perplexity import kv_perplexity, perplexity_windows
from workbench.kvcache.traces import PATTERNS
from workbench.presets import add_preset_argument

TABLES = ("kernel", "switching", "active_contexts", "ablation", "paper_scale", "perplexity", "memory", "load", "http")
REPLAYED = {"switching", "active_contexts", "ablation", "paper_scale"}
"""The tables replayed on ``--device``."""
REFERENCE_CONTEXTS = 8

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
    for name in ("switching", "ablation", "paper_scale", "active_contexts"):
        if name in opts.tables:
            tables[name] = replayed_table(name, replays)
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
