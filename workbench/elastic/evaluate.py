"""Evaluation of WRX against its baselines (our analogues of the paper's Tables 5, 6 and 7).

For every device profile, target latency and method, the plan is made on the
profile, its accuracy is measured on the dev split with exactly the weights the
pipeline loads (the plan's per-shard bitwidths, decoded from the store, depth n and
width m; ``tests/elastic/test_pipeline.py`` checks that the pipeline's logits equal
this batch evaluation), and its latency is measured by running the real pipeline
(emulated for presets) on dev examples after one warm-up run.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

from workbench.devices import profile_names
from workbench.elastic.baselines import METHODS, plan_method
from workbench.elastic.importance import importance_order

PAPER_NAMES = {"Load&Exec": "Load&Exec", "StdPL-2": "StdPL-2bit", "StdPL-6": "StdPL-6bit", "StdPL-32": "StdPL-full",
               "PreloadModel-6": "Preload-6bit", "PreloadModel-32": "Preload-full", "Ours-0MB": "Ours-0MB",
               "Ours": "Ours"}
"""Our method names -> the names in the paper's tables (``data/reference/wrx_table*.csv``)."""

DEFAULT_PRELOAD_MB = {"host": 1.0, "odroid-n2": 1.0, "jetson-nano": 5.0}
"""The paper's buffers: 1 MB on the Odroid, 5 MB on the Jetson (host: as the Odroid)."""


@dataclass(frozen=True, kw_only=True)
class CellResult:
    """One (device, target, method) cell of the evaluation: the plan, its accuracy, memory and latency."""
    device: str                # device profile name
    target_ms: float           # target latency
    method: str                # one of baselines.METHODS
    n: int                     # layers of the planned submodel
    m: int                     # shards per layer
    mean_bits: float           # mean bitwidth over the submodel's shards
    accuracy: float            # dev accuracy of exactly the weights the pipeline loads (0..1)
    preload_mb: float          # shard bytes in memory before the run (buffer, or the whole model)
    resident_mb: float         # embeddings, LayerNorms, biases, classifier
    memory_mb: float           # preload + resident
    predicted_ms: float        # the planner's predicted latency
    measured_ms: float         # median over the timed runs
    measured_max_ms: float     # slowest timed run
    runs: int                  # timed runs (after one warm-up)
    valid: bool                # the plan meets its method's model of time
    plan_ms: float             # time the planner took

    def as_row(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class CellRow(CellResult):
    """A row of `workbench bench elastic`'s ``elastic-cells`` table: a cell with the task, preset, dev examples
    and the full model's accuracy (``gold``) it was evaluated against; the page reads the table as these."""
    task: str
    preset: str
    dev_examples: int
    gold: float


class AccuracyCache:
    """Dev accuracy of (depth, width, per-shard bits) configurations, each evaluated once."""

    def __init__(self, store, dev, max_length: int):
        self.store, self.dev, self.max_length = store, dev, max_length
        self._memo: dict[tuple, float] = {}

    def __call__(self, n: int, m: int, bits: np.ndarray) -> float:
        from workbench.train.evaluate import evaluate

        bits = np.asarray(bits, dtype=int)
        key = (n, m, bits.tobytes())
        if key not in self._memo:
            cfg = self.store.cfg
            full = np.full((cfg.num_layers, cfg.num_heads), min(self.store.bitwidths), dtype=int)
            full[:n, :m] = bits[:n, :m]
            model = self.store.model_with_bits(full)
            self._memo[key] = evaluate(model, self.dev, self.max_length, depth=n, width=m)
        return self._memo[key]


def evaluate_cells(store, importance, dev, max_length: int, devices=tuple(profile_names("wrx")),
                   targets_ms=(150, 200, 400), methods=METHODS, preload_mb: dict | None = None, runs: int = 5,
                   progress: bool = True) -> list[CellResult]:
    """Plan, evaluate and run every (device, target, method) cell."""
    from tqdm.auto import tqdm

    from workbench.elastic.pipeline import ElasticEngine, PreloadBuffer, run_repeatedly
    from workbench.elastic.costmodel import device_cost_model
    from workbench.models.tokenizer import encoder_tokenizer

    preload_mb = {**DEFAULT_PRELOAD_MB, **(preload_mb or {})}
    accuracy = AccuracyCache(store, dev, max_length)
    tok = encoder_tokenizer(max_length)
    inputs = [tok([text], pad_to=max_length) for text in dev.texts[:max(1, runs)]]
    engine = ElasticEngine(store)
    resident = engine.resident_bytes()
    runs_done = []
    bar = tqdm(total=len(devices) * len(targets_ms) * len(methods), desc="elastic evaluation", disable=not progress)
    for device in devices:                       # every timed run first: accuracy work would disturb them
        cost_model = device_cost_model(device, store, max_length)
        emulate = None if device == "host" else cost_model
        for target in targets_ms:
            for method in methods:
                plan = plan_method(method, cost_model, target / 1e3, importance, preload_mb.get(device, 1.0) * 1e6)
                engine.buffer = PreloadBuffer(plan.memory_bytes)
                results = run_repeatedly(engine, plan, inputs, runs, emulate=emulate, warmup=1)
                runs_done.append((device, target, method, plan, [result.latency_s for result in results]))
                bar.update(1)
    cells = []
    for device, target, method, plan, lat in runs_done:
        acc = accuracy(plan.n, plan.m, plan.bits)
        cells.append(CellResult(device=device, target_ms=float(target), method=method, n=plan.n, m=plan.m,
                                mean_bits=float(plan.bits.mean()), accuracy=acc, preload_mb=plan.memory_bytes / 1e6,
                                resident_mb=resident / 1e6, memory_mb=(plan.memory_bytes + resident) / 1e6,
                                predicted_ms=1e3 * plan.predicted_s, measured_ms=1e3 * float(np.median(lat)),
                                measured_max_ms=1e3 * max(lat), runs=len(lat), valid=plan.valid,
                                plan_ms=1e3 * plan.plan_s))
    bar.close()
    return cells


def gold_accuracy(store, dev, max_length: int) -> float:
    """The full model at 32 bits: the accuracy every method is measured against."""
    cfg = store.cfg
    return AccuracyCache(store, dev, max_length)(cfg.num_layers, cfg.num_heads,
                                                 np.full((cfg.num_layers, cfg.num_heads), 32))


def importance_vs_random(store, importance, dev, max_length: int, submodel=(5, 3), budgets_mb=(0.1, 0.5, 1.0),
                         low_bits: int = 2, high_bits: int = 6, seeds: int = 5) -> list[dict]:
    """Table 7 analogue: extra IO budget upgrades shards of an all-``low_bits`` submodel to ``high_bits``,
    in importance order or in random order (mean over ``seeds`` orders)."""
    n, m = submodel
    accuracy = AccuracyCache(store, dev, max_length)
    cost = np.mean([store.entry(k, i, high_bits).nbytes - store.entry(k, i, low_bits).nbytes
                    for k in range(n) for i in range(m)])
    by_importance = importance_order(importance, n, m)
    rows = []
    for budget in budgets_mb:
        count = min(n * m, int(budget * 1e6 // cost))

        def acc_of(order):
            bits = np.full((n, m), low_bits, dtype=int)
            for k, i in order[:count]:
                bits[k, i] = high_bits
            return accuracy(n, m, bits)

        rng = np.random.default_rng(0)
        randoms = []
        for _ in range(seeds):
            perm = [by_importance[j] for j in rng.permutation(len(by_importance))]
            randoms.append(acc_of(perm))
        rows.append({"io_budget_mb": budget, "upgraded_shards": count, "submodel": f"{n}x{m}",
                     "importance": acc_of(by_importance), "random_mean": float(np.mean(randoms)),
                     "random_min": float(np.min(randoms)), "random_max": float(np.max(randoms)), "seeds": seeds})
    return rows


def plan_time_ms(cost_model, importance, preload_bytes: float, targets_s=(0.15, 0.2, 0.4), repeats: int = 50) -> dict:
    """Median and worst milliseconds of one ``plan_elastic`` call over targets."""
    from workbench.elastic.planner import plan_elastic

    samples = []
    for _ in range(repeats):
        for t in targets_s:
            start = time.perf_counter()
            plan_elastic(cost_model, t, importance, preload_bytes)
            samples.append(time.perf_counter() - start)
    return {"median_ms": 1e3 * float(np.median(samples)), "p95_ms": 1e3 * float(np.percentile(samples, 95)),
            "max_ms": 1e3 * max(samples), "plans": len(samples)}


def summarize(cells: list[CellResult], noise: float) -> dict:
    """Acceptance checks over the cells: Ours' latency, Ours vs baselines with no more memory, memory ratios."""
    out = {"latency_over_5pct": [], "accuracy_shortfalls": [], "memory_ratio": {}}
    by_cell: dict[tuple, dict[str, CellResult]] = {}
    for c in cells:
        by_cell.setdefault((c.device, c.target_ms), {})[c.method] = c
    ratios = {"PreloadModel-32": [], "PreloadModel-6": []}
    for (device, target), group in by_cell.items():
        ours = group.get("Ours")
        if ours is None:
            continue
        if device != "host" and ours.measured_ms > 1.05 * target:
            out["latency_over_5pct"].append((device, target, ours.measured_ms))
        for name, c in group.items():
            if name != "Ours" and c.preload_mb <= ours.preload_mb and c.accuracy > ours.accuracy + noise:
                out["accuracy_shortfalls"].append((device, target, name, c.accuracy, ours.accuracy))
        for ref in ratios:
            if ref in group and ours.preload_mb > 0:
                ratios[ref].append((group[ref].preload_mb / ours.preload_mb, group[ref].memory_mb / ours.memory_mb))
    for ref, pairs in ratios.items():
        if pairs:
            out["memory_ratio"][ref] = {"shard_memory": float(np.mean([a for a, _ in pairs])),
                                        "total_memory": float(np.mean([b for _, b in pairs]))}
    return out
