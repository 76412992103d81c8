"""The replayed tables of `workbench bench llms` (switching, active contexts, ablation, paper scale): the
traces and replays one run shares (:class:`Replays`), each table from them, and what the run prints of the
switching and active-contexts tables. What each table measures is in :mod:`workbench.kvcache.bench`."""
from __future__ import annotations

import math
import time

import numpy as np

from workbench.kvcache.artifacts import METHODS
from workbench.kvcache.costmodel import SWAP_PRESETS

ABLATIONS = ("llms", "llms_without_lifecycle", "llms_without_compression", "llms_without_pipeline")
PAPER_ABLATION_S = {"llms": 0.27, "llms_without_lifecycle": 0.62, "llms_without_compression": 0.42,
                    "llms_without_pipeline": 1.62}
"""Figure 13: mean switching latency on Jetson Orin NX, Llama2-7B, 8 contexts, Markov pattern."""
THRESHOLDS_MS = (10.0, 25.0)
TARGET_VS_SQ, TARGET_VS_LMK = 5.0, 20.0
"""The switching table's criterion: LLMS's latency averaged over the cells at least 5x below vLLM-SQ's and 20x
below LMK's (the paper: 9.7x on average and up to 100x)."""


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


def _methods_from(k: int) -> tuple[str, ...]:
    """The methods in their order, starting with the ``k``-th (modulo their count)."""
    k %= len(METHODS)
    return tuple(METHODS[k:]) + tuple(METHODS[:k])


def switching_table(replays: Replays) -> list[dict]:
    from workbench.kvcache.replay import working_set_bytes

    opts, rows = replays.opts, []
    budget = replays.budget(opts.budget)
    for k, (pattern, n) in enumerate((p, n) for p in opts.patterns for n in opts.contexts):
        ws = working_set_bytes(replays.trace(n, pattern), 8, opts.max_new_tokens, replays.model)
        ran = {m: replays.run(m, n, pattern, budget) for m in _methods_from(k)}   # no method always runs cold
        again: dict[str, list] = {m: [] for m in METHODS}
        if not any(c.chunks_missing for r in ran.values() for c in r.calls):
            for k_round in range(1, opts.fit_rounds):
                for m in _methods_from(k + k_round):
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


def replayed_table(name: str, replays: Replays) -> list[dict]:
    """Replayed table ``name`` (``switching``, ``ablation``, ``paper_scale`` or ``active_contexts``), its
    summary printed as it is made."""
    opts = replays.opts
    if name == "switching":
        print(f"switching: contexts {opts.contexts}, {replays.budget(opts.budget) / 1e6:.2f} MB ({opts.budget:g} of "
              f"the {opts.reference_contexts}-context trace's working set)")
        rows = switching_table(replays)
        report_switching(rows)
    elif name == "ablation":
        print(f"ablation: {opts.reference_contexts} contexts, {opts.patterns[0]}")
        rows = ablation_table(replays)
        print("ablation, mean switching latency: " + ", ".join(
            f"{r['method']} {r['mean_switch_ms']:.2f} ms ({r['ratio_to_llms']:.2f}x; paper {r['paper_ratio']:.2f}x)"
            for r in rows), flush=True)
    elif name == "paper_scale":
        rows = paper_scale_table(replays)
        print("at the paper's dimensions (cost model, not measured), the ablation's loads without / with the "
              "pipeline: " + ", ".join(f"{r['device']} {r['without_over_with']:.3f}x (bound {r['bound']:.3f}x)"
                                       for r in rows) + f"; paper, Orin NX: {rows[0]['paper_ratio']:.1f}x", flush=True)
    elif name == "active_contexts":
        print(f"active contexts ({opts.search_pattern}): budgets {opts.budgets} of the working set of the "
              f"{opts.reference_contexts}-context trace")
        rows = active_contexts_table(replays)
        for r in rows:
            if r["method"] == "llms":
                print(f"budget {r['budget_mb']:.2f} MB: LLMS serves "
                      + ", ".join(f"{r[f'contexts_under_{t:g}ms']}"
                                  f"{' (the cap)' if r[f'contexts_under_{t:g}ms'] == opts.max_contexts else ''} "
                                  f"contexts under {t:g} ms "
                                  f"({r[f'llms_over_best_baseline_{t:g}ms']:.2f}x the best baseline)"
                                  for t in THRESHOLDS_MS), flush=True)
    else:
        raise ValueError(f"no replayed table {name!r}")
    return rows


def report_switching(rows: list[dict]) -> None:
    """The switching table's summary: the averages and the criterion, each baseline's ratio per cell, and every
    cell where a baseline switched faster than LLMS, with whether beyond the measurement's noise."""
    ratios = switching_ratios(rows)
    llms = np.mean([r["mean_switch_ms"] for r in rows if r["method"] == "llms"])
    print(f"switching latency averaged over {len(rows) // len(METHODS)} cells: LLMS {llms:.2f} ms; "
          + ", ".join(f"{m} {ratios[m]:.1f}x" for m in METHODS[1:]))
    for m in ("vllm_sq", "lmk"):
        print(f"{m} / LLMS per cell: " + ", ".join(f"{r['pattern']} {r['contexts']}: {r['ratio_to_llms']:.1f}x"
                                                  for r in rows if r["method"] == m))
    cell = {(r["pattern"], r["contexts"]): r for r in rows if r["method"] == "llms"}

    def shown(r):
        return f"{r['mean_switch_ms']:.3f} ± {r['switch_sem_ms']:.3f} ms"
    print("baselines faster than LLMS in a cell (mean ± standard error): " + ("; ".join(
        f"{r['pattern']} {r['contexts']}: {r['method']} {shown(r)} against "
        f"{shown(cell[(r['pattern'], r['contexts'])])} over {r['rounds']} replay{'s' if r['rounds'] > 1 else ''} "
        f"each, {'beyond' if beyond else 'within'} twice the difference's standard error"
        for r, beyond in baselines_ahead(rows)) or "none"), flush=True)
    print(f"LLMS vs vLLM-SQ {ratios['vllm_sq']:.1f}x (criterion >= {TARGET_VS_SQ:g}x: "
          f"{'met' if ratios['vllm_sq'] >= TARGET_VS_SQ else 'MISSED'}), vs LMK {ratios['lmk']:.1f}x (criterion "
          f">= {TARGET_VS_LMK:g}x: {'met' if ratios['lmk'] >= TARGET_VS_LMK else 'MISSED'}); "
          "paper: 9.7x on average and up to 100x", flush=True)
