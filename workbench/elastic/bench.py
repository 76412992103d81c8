"""`workbench bench elastic`: WRX and its baselines, planned and run for real (Tables 5, 6 and 7).

Tables: ``cells`` (device x target x method: submodel, accuracy, memory, predicted and
measured latency), ``table7`` (extra IO budget by importance vs random order) and
``planning`` (time of one plan). A summary checks the acceptance points: Ours'
measured latency within 5% of the target on emulated devices, Ours at least as
accurate as every baseline that holds no more shard memory (up to one standard
error of the dev accuracy), and the memory ratios to PreloadModel-32 and -6.
"""
from __future__ import annotations

import numpy as np

from workbench.argtypes import Parser
from workbench.elastic import limits
from workbench.data import TASKS
from workbench.devices import profile_names
from workbench.presets import add_preset_argument


def parser() -> Parser:
    p = Parser(prog="workbench bench elastic")
    p.add_argument("--task", default="sentiment", choices=list(TASKS), help="the task of the cells")
    add_preset_argument(p)
    p.add_argument("--devices", nargs="+", default=profile_names("wrx"), choices=profile_names(),
                   help="devices of the cells (host: real speed; others emulated)")
    p.add_argument("--targets", nargs="+", type=limits.target_ms, default=[150, 200, 400],
                   help="target latencies (ms)")
    p.add_argument("--runs", type=limits.runs, default=5, help="measured pipeline runs per cell (after a warm-up)")
    p.add_argument("--eval-size", type=limits.dev_examples, help="dev examples for accuracy (default: the whole split)")
    p.add_argument("--seeds", type=limits.orders, default=5, help="random orders in the Table 7 analogue")
    p.add_argument("--table7-tasks", nargs="+", default=["sentiment", "bbc"], choices=list(TASKS),
                   help="tasks of the Table 7 analogue (the paper averages over its benchmarks)")
    p.add_argument("--table7-only", action="store_true", help="skip the cells (Tables 5 and 6)")
    return p


def run(args: list[str]) -> dict[str, list[dict]]:
    from workbench.data import load_task, task_spec
    from workbench.elastic import evaluate as ev
    from workbench.elastic.artifacts import load_importance, prepare_store
    from workbench.elastic.costmodel import device_cost_model

    opts = parser().parse_args(args)
    if opts.table7_only:
        table7 = _table7(opts, ev, load_task, task_spec, load_importance, prepare_store)
        return {"table7": table7}

    spec = task_spec(opts.task)
    store = prepare_store(opts.task, opts.preset)
    importance = load_importance(opts.task, opts.preset).accuracy
    dev = load_task(opts.task).dev
    if opts.eval_size:
        dev = dev.sample(min(opts.eval_size, len(dev)), 0)
    cells = ev.evaluate_cells(store, importance, dev, spec.max_length, opts.devices, opts.targets, runs=opts.runs)
    gold = ev.gold_accuracy(store, dev, spec.max_length)
    acc = np.mean([c.accuracy for c in cells if c.method == "Ours"])
    noise = float(np.sqrt(acc * (1 - acc) / len(dev)))
    table7 = _table7(opts, ev, load_task, task_spec, load_importance, prepare_store)
    timing = ev.plan_time_ms(device_cost_model(opts.devices[-1], store, spec.max_length), importance, 1e6)
    summary = ev.summarize(cells, noise)

    print(f"\n{opts.task} ({opts.preset}), {len(dev)} dev examples; gold (full model, 32 bits) {100 * gold:.1f}%; "
          f"dev-set noise (one standard error) {100 * noise:.1f} pp")
    print(f"planning one configuration: median {timing['median_ms']:.2f} ms, p95 {timing['p95_ms']:.2f} ms, "
          f"max {timing['max_ms']:.2f} ms over {timing['plans']} plans")
    over = summary["latency_over_5pct"]
    print("Ours' measured latency within 5% of the target on emulated devices:",
          "yes, every cell" if not over else f"NO in {over}")
    short = summary["accuracy_shortfalls"]
    print("Ours at least as accurate as every baseline with no more shard memory (up to the noise):",
          "yes, every cell" if not short else f"NO: {short}")
    for ref, r in summary["memory_ratio"].items():
        print(f"memory of {ref} / Ours: {r['shard_memory']:.1f}x in shard memory, "
              f"{r['total_memory']:.2f}x with resident parameters")
    tag = {"task": opts.task, "preset": opts.preset, "dev_examples": len(dev), "gold": gold}
    return {"cells": [ev.CellRow(**tag, **c.as_row()).as_row() for c in cells], "table7": table7, "planning": [timing]}


def _table7(opts, ev, load_task, task_spec, load_importance, prepare_store) -> list[dict]:
    """Importance vs random upgrades per task (whole dev split), with the per-task and overall mean gain."""
    rows = []
    for task in opts.table7_tasks:
        store = prepare_store(task, opts.preset)
        dev = load_task(task).dev
        part = ev.importance_vs_random(store, load_importance(task, opts.preset).accuracy, dev,
                                       task_spec(task).max_length, seeds=opts.seeds)
        gain = np.mean([r["importance"] - r["random_mean"] for r in part])
        print(f"Table 7 analogue, {task} ({len(dev)} dev examples): importance order beats random order by "
              f"{100 * gain:.2f} pp on average")
        rows += [{"task": task, "preset": opts.preset, "dev_examples": len(dev), **r} for r in part]
    gain = np.mean([r["importance"] - r["random_mean"] for r in rows])
    print(f"Table 7 analogue over {len(opts.table7_tasks)} task(s): importance beats random by {100 * gain:.2f} pp "
          f"on average; in {sum(r['importance'] > r['random_mean'] for r in rows)} of {len(rows)} cells")
    return rows
