"""`workbench partition plan|run`: the partition mechanism's commands.

``plan`` prints what the cost model predicts for each scheme (instant, no torch); ``run`` starts real
worker processes (or reuses none: the command's group ends with it), runs one scheme for real, checks
its outputs against the whole model in one process, and prints the measured latency beside the
prediction and the bytes every rank counted. Arguments are checked before anything starts.
"""
from __future__ import annotations

import argparse
import json
import sys

from workbench.argtypes import seed
from workbench.distributed import limits
from workbench.partition.cost import NETWORKS, SHAPES
from workbench.partition.plan import DEFAULT_DEVICE, SCHEMES


def _devices(args):
    from workbench.partition.plan import devices_like

    return devices_like(args.devices, args.device, bandwidth_mbit=args.bandwidth_mbit, latency_ms=args.latency_ms)


def _common(parser: argparse.ArgumentParser, schemes) -> None:
    from workbench.devices import profile_names

    parser.add_argument("--model", choices=tuple(SHAPES), default="encoder",
                        help="the shipped encoder or decoder (prefill), or random layers of BERT-Large's or GPT-2's shape")
    parser.add_argument("--seq-len", type=limits.seq_len, default=128, help="input positions N")
    parser.add_argument("--device", choices=profile_names(host=False), default=DEFAULT_DEVICE,
                        help="the device profile every device copies")
    parser.add_argument("--bandwidth-mbit", type=limits.bandwidth_mbit, default=500.0,
                        help="each device's link bandwidth, Mbit/s")
    parser.add_argument("--latency-ms", type=limits.latency_ms, default=0.5, help="one-way link latency, ms")
    parser.add_argument("--shares", choices=("even", "proportional"), default="even",
                        help="Voltage's share vector: even, or in proportion to each device's speed")
    parser.add_argument("--scheme", choices=schemes, default=schemes[0], help="how the model is split")
    parser.add_argument("--network", choices=NETWORKS, default="switch",
                        help="how collectives cross the links: a switch (one full-duplex link per device) or a "
                             "shared medium (Hepti's Eq. 6, what each device receives summed)")


def _plan(args) -> int:
    from workbench.partition.cost import get_shape
    from workbench.partition.plan import plan_partition

    schemes = tuple(SCHEMES) if args.scheme == "all" else (args.scheme,)
    devices = _devices(args)
    rows = []
    for scheme in schemes:
        plan = plan_partition(scheme, get_shape(args.model), args.seq_len, devices, shares=args.shares,
                              network=args.network)
        per_layer = plan.traffic()[0]
        rows.append({"scheme": scheme, "predicted_ms": 1e3 * plan.predicted_s,
                     "compute_ms": [1e3 * s for s in plan.compute_s()], "comm_ms": 1e3 * plan.comm_s(),
                     "sent_bytes_per_layer": [t.sent for t in per_layer], "reasons": list(plan.reasons),
                     "orders": list(plan.orders[0]) if plan.orders else []})
    if args.json:
        print(json.dumps({"model": args.model, "seq_len": args.seq_len, "devices": args.devices, "plans": rows}))
        return 0
    print(f"{get_shape(args.model).title}, N = {args.seq_len}, {args.devices} x {args.device} at "
          f"{args.bandwidth_mbit:g} Mbit/s, {args.latency_ms:g} ms")
    for r in rows:
        print(f"  {r['scheme']:16s} {r['predicted_ms']:9.1f} ms predicted  (communication {r['comm_ms']:.1f} ms, "
              f"device 0 sends {r['sent_bytes_per_layer'][0] / 1e3:.1f} kB per layer)")
        for reason in r["reasons"]:
            print(f"  {'':16s} {reason}")
    return 0


def configure_plan(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", type=limits.devices, default=4, help="devices the model is split over")
    _common(parser, ("all", *SCHEMES))
    parser.add_argument("--json", action="store_true", help="print the plans as JSON")
    parser.set_defaults(func=_plan)


def _run(args) -> int:
    import numpy as np

    from workbench.partition.cost import get_shape
    from workbench.models.split import PartitionModel
    from workbench.partition.plan import plan_partition
    from workbench.partition.runtime import PartitionRuntime, limit_speeds, probe_shape

    plan = plan_partition(args.scheme, get_shape(args.model), args.seq_len, _devices(args), shares=args.shares,
                          network=args.network)
    mode, note = args.mode, ""
    if mode == "measured":
        from workbench.partition.runtime import limits_problem

        problem = limits_problem()
        if problem:
            mode, note = "unlimited", f"cannot emulate the devices ({problem}): running at this host's full speed"
            print(note, file=sys.stderr, flush=True)
    links = args.links or ("shaped" if mode == "measured" else "emulated")
    if links == "shaped":
        from workbench.distributed.shaping import check_shaping_available

        check_shaping_available()
    shaped = [d.net_bytes_per_s for d in plan.devices] if links == "shaped" else None
    cpu = limit_speeds(plan) if mode == "measured" else None
    model = PartitionModel(args.model)
    hidden, logits = model.reference(model.inputs(model.token_ids(plan.seq_len, args.seed)))
    print(f"starting {plan.K} worker processes ({links} links"
          f"{', each held to its device by a CPU limit' if cpu else ''}) ...", file=sys.stderr, flush=True)
    with PartitionRuntime(plan.K, shaped=shaped, cpu=cpu, probe_layer=probe_shape(plan)) as runtime:
        results = [runtime.run(plan, emulate=mode == "replay", seed=args.seed) for _ in range(args.repeats)]
        calibrations = [c.describe() for c in runtime.calibrations]
    last = results[-1]
    diff = float(np.abs(last.hidden - hidden.numpy()).max())
    counted = [t.sent for t in last.traffic()[0]]
    label = "measured" if mode != "replay" else "replayed"
    summary = {"scheme": args.scheme, "model": args.model, "seq_len": plan.seq_len, "devices": plan.K,
               "links": links, "mode": mode, "note": note, "cpu_limits": calibrations,
               f"{label}_ms": [1e3 * r.latency_s for r in results], "predicted_ms": 1e3 * plan.predicted_s,
               "max_abs_diff_hidden": diff, "max_abs_diff_logits": float(np.abs(last.logits - logits.numpy()).max()),
               "counted_sent_bytes_layer0": counted,
               "predicted_sent_bytes_layer0": [t.sent for t in plan.traffic()[0]],
               "check": last.check().note()}
    if args.trace:
        last.timeline.save_chrome_trace(args.trace)
        summary["trace"] = args.trace
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"{SCHEMES[args.scheme]} on {plan.K} processes, {get_shape(args.model).title}, N = {plan.seq_len}")
    times = ", ".join(f"{m:.1f}" for m in summary[f"{label}_ms"])
    if mode == "replay":
        print(f"  replay of the prediction (padded to it, not a measurement): {times} ms; predicted "
              f"{summary['predicted_ms']:.1f} ms ({links} links)")
    else:
        held = "each rank held to its device by a CPU limit" if mode == "measured" else "unlimited: this host's speed"
        print(f"  measured {times} ms ({held}, {links} links); predicted {summary['predicted_ms']:.1f} ms")
    for rank, text in enumerate(calibrations):
        print(f"  rank {rank}: {text}")
    print(f"  outputs equal the model in one process to {diff:.1e} (hidden states)")
    print(f"  bytes sent in layer 0 per device: counted {counted}, cost model {summary['predicted_sent_bytes_layer0']}")
    if summary["check"]:
        print(f"  {summary['check']}")
    if args.trace:
        print(f"  Perfetto trace: {args.trace} (open it at ui.perfetto.dev or chrome://tracing)")
    return 0


def configure_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", type=limits.ranks, default=4, help="worker processes started on this machine")
    _common(parser, tuple(SCHEMES))
    parser.add_argument("--links", choices=("emulated", "shaped"), default=None,
                        help="emulate link speed in the processes, or shape real traffic with tc in network "
                             "namespaces (root); default: shaped when measured, else emulated")
    parser.add_argument("--mode", choices=("measured", "replay", "unlimited"), default="measured",
                        help="measured: every rank held to its device's speed by a CPU cgroup (root; without it "
                             "the run says so and runs unlimited); replay: padded to the prediction (not a "
                             "measurement); unlimited: this host's full speed")
    parser.add_argument("--repeats", type=limits.repeats, default=2, help="runs on the same processes")
    parser.add_argument("--seed", type=seed, default=0, help="seed of the input tokens")
    parser.add_argument("--trace", help="write the last run's timeline as a Chrome/Perfetto trace (JSON)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=_run)
