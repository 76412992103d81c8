"""`workbench elastic plan|run|profile ...`: the elastic slice's commands.

Arguments are checked before anything loads (``workbench.argtypes``), in the units the
user typed; heavy modules are imported inside the commands, so ``workbench --help``
stays fast.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from workbench.argtypes import seed, text, text_file, writable_file
from workbench.elastic import limits
from workbench.data import TASKS
from workbench.devices import profile_names
from workbench.prepare import print_preset_notice
from workbench.presets import add_preset_argument


def format_grid(grid, scale: float = 100.0, fmt: str = "{:5.1f}") -> list[str]:
    """An (N, M) array as text rows with layer and shard headers."""
    rows = [" layer " + " ".join(f"{i:>5d}" for i in range(len(grid[0])))]
    rows += [f"{n:>6d} " + " ".join(fmt.format(v * scale) for v in row) for n, row in enumerate(grid)]
    return rows


# ----------------------------------------------------------------------------- profile importance | costs


def _profile_importance(args) -> int:
    from workbench.elastic.artifacts import prepare_importance
    from workbench.elastic.importance import ranking_agreement

    started = time.perf_counter()
    try:
        imp = prepare_importance(args.task, args.preset, args.dev_size, args.seed, progress=not args.quiet)
        print_preset_notice(args.preset)
    except KeyboardInterrupt:
        print("\ninterrupted: finished layers are saved; run the same command again to resume", file=sys.stderr)
        return 130
    seconds = time.perf_counter() - started
    result = {"task": args.task, "preset": args.preset, "seed": args.seed, "dev_examples": imp.dev_examples,
              "low_bits": imp.low_bits, "high_bits": imp.high_bits, "baseline_accuracy": imp.baseline_accuracy,
              "accuracy": imp.accuracy.tolist(), "loss": imp.loss.tolist(), "order": imp.order(),
              "seconds": seconds}
    if args.compare_seed is not None:
        other = prepare_importance(args.task, args.preset, args.dev_size, args.compare_seed, progress=not args.quiet)
        result["agreement"] = {"seed": args.compare_seed, **ranking_agreement(imp, other)}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"shard importance of {args.task!r} ({args.preset}): {imp.dev_examples} dev examples (seed {args.seed}), "
          f"all shards at {imp.low_bits} bits except one at {imp.high_bits}; {seconds:.1f} s")
    print(f"all-{imp.low_bits}-bit accuracy: {100 * imp.baseline_accuracy:.1f}%; "
          f"dev accuracy (%) with shard (layer, i) raised:")
    print("\n".join(format_grid(imp.accuracy)))
    print("most important:", ", ".join(f"({a},{b})" for a, b in imp.order()[:10]))
    if "agreement" in result:
        ag = result["agreement"]
        print(f"against seed {ag['seed']}: Spearman {ag['spearman_accuracy']:.2f} (accuracy), "
              f"{ag['spearman_loss']:.2f} (loss); top-{ag['top_k']} overlap {100 * ag['top_overlap']:.0f}%")
    return 0


def _profile_costs(args) -> int:
    from workbench.data import task_spec
    from workbench.elastic.artifacts import load_store
    from workbench.elastic.costmodel import device_cost_model, host_cost_model

    spec = task_spec(args.task)
    store = load_store(args.task, args.preset)
    print_preset_notice(args.preset)
    costs = (host_cost_model(store, spec.max_length, remeasure=args.remeasure) if args.device == "host"
             else device_cost_model(args.device, store, spec.max_length))
    if args.out:
        costs.save(args.out)
    if args.json:
        print(json.dumps(costs.to_dict()))
        return 0
    print(f"{costs.device} ({costs.source}; {costs.notes}) for {args.task!r} at {costs.seq_len} tokens")
    print("t_io(k) per shard: " + ", ".join(f"{k}b {1e3 * v:.3f} ms" for k, v in sorted(costs.io_s.items())))
    print("t_comp(m) per layer: " + ", ".join(f"{m}:{1e3 * v:.2f}" for m, v in enumerate(costs.comp_s, 1)) + " ms")
    if args.out:
        print(f"saved to {args.out}")
    return 0


def configure_profile(parser: argparse.ArgumentParser) -> None:
    what = parser.add_subparsers(dest="what", required=True, metavar="{importance,costs}")
    p = what.add_parser("importance", help="WRX shard-importance ablation on a seeded dev subset (cached, resumable)")
    p.add_argument("--task", required=True, choices=list(TASKS), help="the task whose model is profiled")
    add_preset_argument(p)
    p.add_argument("--dev-size", type=limits.dev_examples,
                   help="dev examples (default: 512 full, 24 quick; capped at the split)")
    p.add_argument("--seed", type=seed, default=0, help="seed that draws the dev subset")
    p.add_argument("--compare-seed", type=seed, help="also profile with this seed and report how the rankings agree")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_profile_importance)
    for name in ("costs", "device"):
        p = what.add_parser(name, help="t_io(k) and t_comp(m) of a device for a task's model (host: measured)"
                            if name == "costs" else "old name of `costs`")
        p.add_argument("--task", required=True, choices=list(TASKS), help="the task whose model is profiled")
        p.add_argument("--device", default="host", choices=profile_names(),
                       help="host (measured) or a device profile (emulated)")
        add_preset_argument(p)
        p.add_argument("--remeasure", action="store_true", help="measure the host again instead of the cached figures")
        p.add_argument("--out", type=writable_file, help="also save the cost model as JSON here")
        p.add_argument("--json", action="store_true", help="print the cost model as JSON")
        p.set_defaults(func=_profile_costs)


# ----------------------------------------------------------------------------- plan | run


def _plan_for(args, ctx):
    from workbench.elastic.baselines import plan_method

    return plan_method(args.method, ctx.cost_model, args.target_ms / 1e3, ctx.importance.accuracy,
                       args.preload_mb * 1e6)


def _print_plan(plan) -> None:
    print(plan.describe())
    if not plan.found:
        return
    if plan.io is not None:
        print(f"slack {1e3 * plan.io.slack_s:.1f} ms, uniform first pass {plan.io.uniform_bits} bits, "
              f"{sum(s.kind == 'upgrade' for s in plan.io.steps)} upgrades; final AIB (ms): "
              + " ".join(f"{1e3 * a:.1f}" for a in plan.io.aib))
    print("bits per shard (rows: layers; * = preloaded):")
    for k in range(plan.n):
        print(f"  layer {k}: " + " ".join(f"{int(b):>2d}{'*' if p else ' '}" for b, p in
                                         zip(plan.bits[k], plan.preloaded[k])))


def _plan(args) -> int:
    from workbench.elastic.artifacts import load_context

    ctx = load_context(args.task, args.device, args.preset)
    print_preset_notice(args.preset)
    plan = _plan_for(args, ctx)
    if args.json:
        print(json.dumps({"method": plan.method, "n": plan.n, "m": plan.m, "bits": plan.bits.tolist(),
                          "preloaded": plan.preloaded.tolist(), "predicted_ms": 1e3 * plan.predicted_s,
                          "memory_bytes": plan.memory_bytes, "valid": plan.valid, "reason": plan.reason,
                          "aib_ms": [1e3 * a for a in plan.io.aib] if plan.io is not None else None}))
    else:
        _print_plan(plan)
    if args.trace and plan.found:
        print(f"predicted timeline written to {plan.timeline.save_chrome_trace(args.trace)}")
    return 0 if plan.found else 1


def _run(args) -> int:
    from workbench.elastic.artifacts import load_context
    from workbench.elastic.pipeline import ElasticEngine, PreloadBuffer, run_repeatedly
    from workbench.models.tokenizer import encoder_tokenizer

    ctx = load_context(args.task, args.device, args.preset)
    print_preset_notice(args.preset)
    plan = _plan_for(args, ctx)
    _print_plan(plan)
    if not plan.found:
        return 1
    engine = ElasticEngine(ctx.store, PreloadBuffer(plan.memory_bytes))
    encoded = encoder_tokenizer(ctx.task.max_length).encode_text(args.text, pad_to=ctx.task.max_length)
    if encoded.truncated:
        print(encoded.note())
    inputs = [(encoded.ids, encoded.mask)]

    def report(r, result):
        probs = result.logits.softmax(-1)[0]
        print(f"run {r + 1}: {ctx.task.labels[int(probs.argmax())]!r} (p={float(probs.max()):.2f}); measured "
              f"{1e3 * result.latency_s:.1f} ms, predicted {1e3 * plan.predicted_s:.1f} ms, "
              f"stalls {1e3 * result.timeline.busy('stall'):.1f} ms")
        note = result.check(plan).note()
        if note:
            print(f"  note: {note}")

    results = run_repeatedly(engine, plan, inputs, args.repeat, emulate=None if args.device == "host"
                             else ctx.cost_model, on_run=report)
    if args.trace:
        print(f"measured timeline written to {results[-1].timeline.save_chrome_trace(args.trace)}")
    return 0


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    from workbench.elastic.baselines import METHODS

    parser.add_argument("--task", default="sentiment", choices=list(TASKS), help="the task whose model runs")
    parser.add_argument("--device", default="odroid-n2", choices=profile_names(),
                        help="host (real speed) or a preset (emulated)")
    parser.add_argument("--target-ms", type=limits.target_ms, default=200.0, help="target latency (ms)")
    parser.add_argument("--preload-mb", type=limits.preload_mb, default=1.0, help="preload buffer (MB)")
    parser.add_argument("--method", default="Ours", choices=METHODS, help="WRX (Ours) or one of its baselines")
    add_preset_argument(parser)
    parser.add_argument("--trace", type=writable_file,
                        help="write the timeline as Chrome/Perfetto trace JSON to this file")


def configure_plan(parser: argparse.ArgumentParser) -> None:
    _plan_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(func=_plan)


def configure_run(parser: argparse.ArgumentParser) -> None:
    _plan_arguments(parser)
    given = parser.add_mutually_exclusive_group()
    given.add_argument("--text", type=text, default="A gripping, beautifully acted film.",
                       help="text to classify (cut to the task's token limit, which is then stated)")
    given.add_argument("--text-file", type=text_file, dest="text", help="classify the text of this UTF-8 file")
    parser.add_argument("--repeat", type=limits.runs, default=3, help="pipeline runs, each measured")
    parser.set_defaults(func=_run)
