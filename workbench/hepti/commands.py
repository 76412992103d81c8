"""`workbench hepti plan|run`: Hepti's commands (`workbench partition hepti [--run]` stays as an alias).

``plan`` prints the mixed-integer program's mode, shares and reasons for a cluster (instant, no torch); ``run``
also runs the request on one process per device (a replay padded to the profiles, or ``--measured`` under CPU
limits and shaped links), optionally with memory falls and a killed device, and prints the run beside its
prediction. Every argument, faults included, is checked before anything starts.
"""
from __future__ import annotations

import argparse
import json

from workbench.distributed import limits
from workbench.models.shapes import SHAPES


def _fall(text: str):
    """NAME:LAYER:MB -> (name, (layer, bytes))."""
    try:
        name, layer, mb = text.rsplit(":", 2)
        layer, mb = int(layer), float(mb)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected DEVICE:LAYER:MB (e.g. rpi3:2:5), got {text!r}") from None
    if layer < 0 or not (mb >= 0) or mb > 1e7:
        raise argparse.ArgumentTypeError(f"the layer must be 0 or more and the memory 0 to 10000000 MB, got {text!r}")
    return name, (layer, mb * 1e6)


def _kill(text: str):
    """NAME:LAYER -> (name, layer)."""
    try:
        name, layer = text.rsplit(":", 1)
        layer = int(layer)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected DEVICE:LAYER (e.g. rpi4-b:3), got {text!r}") from None
    if layer < 0:
        raise argparse.ArgumentTypeError(f"the layer must be 0 or more, got {layer}")
    return name, layer


_fall.__name__ = "memory fall"
_kill.__name__ = "device and layer"


def _hepti(args) -> int:
    import math

    from workbench.devices import get_cluster
    from workbench.models.shapes import get_shape
    from workbench.hepti.plan import MODE_TITLES, hepti_partition
    from workbench.hepti.run import shape_of
    from workbench.distributed.shares import proportional_shares

    from workbench.errors import WorkbenchError

    cluster = get_cluster(args.cluster)
    devices = list(cluster.devices)
    model = get_shape(args.model)
    if model.kind != "encoder":
        raise WorkbenchError("Hepti's modes split encoder-style layers; choose an encoder model")
    faults = [("--memory-falls", name, layer) for name, (layer, _) in args.memory_falls]
    faults += [("--kill", *args.kill)] if args.kill else []
    if faults and not args.run:
        raise WorkbenchError(f"{faults[0][0]} acts on a run: add --run")
    if args.measured and not args.run:
        raise WorkbenchError("--measured acts on a run: add --run")
    shape = shape_of(model, args.seq_len)
    names = [d.name for d in devices]
    for option, name, layer in faults:
        if name not in names:
            raise WorkbenchError(f"{option}: no device {name!r} in cluster {args.cluster} ({', '.join(names)})")
        if layer >= model.num_layers:
            raise WorkbenchError(f"{option} {name}:{layer}: the layer must be 0 to {model.num_layers - 1} "
                                 f"({model.name} has {model.num_layers} layers)")
    deadline = math.inf if args.deadline_ms is None else args.deadline_ms / 1e3
    fixed = {"hepti": None, "even": [1 / len(devices)] * len(devices),
             "proportional": list(proportional_shares(devices))}[args.shares]
    mode = None if fixed is None else hepti_partition(devices, shape, deadline, num_layers=model.num_layers,
                                                      network=cluster.network).mode
    part = hepti_partition(devices, shape, deadline, num_layers=model.num_layers, mode=mode, fixed_shares=fixed,
                           network=cluster.network)
    taking_part = [d.name for d, n in zip(devices, part.sizes) if n]
    for option, name, _ in faults:
        if name not in taking_part:
            raise WorkbenchError(f"{option}: {name} takes no part in the plan (a fault there changes nothing); the "
                                 f"plan's devices: {', '.join(taking_part)}")
    out = {"network": cluster.network, "mode": part.mode, "shares": list(part.shares), "sizes": list(part.sizes), "dimension": part.dimension,
           "predicted_ms": 1e3 * part.predicted_latency_s, "binding": part.binding, "reasons": list(part.reasons)}
    if args.run:
        from workbench.hepti.run import run_hepti
        from workbench.models.split import PartitionModel

        run = run_hepti(devices, args.model, args.seq_len, deadline_s=deadline, memory_falls=dict(args.memory_falls),
                        kill_at=args.kill, shares=fixed, mode=mode, network=cluster.network, measured=args.measured)
        ref = PartitionModel(args.model)
        hidden, _ = ref.reference(ref.inputs(ref.token_ids(args.seq_len, 0)))
        import numpy as np

        out.update({"measured_ms": 1e3 * run.latency_s,
                    "max_abs_diff_hidden": float(np.abs(run.hidden - hidden.numpy()).max()),
                    "decisions": [{"layer": d.layer, "mode": d.mode, "why": d.changed} for d in run.decisions],
                    "faults": list(run.faults), "run": run.label, "check": run.check().note(), "note": run.note})
        if args.trace:
            run.timeline.save_chrome_trace(args.trace)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"Hepti on cluster {args.cluster} ({len(devices)} devices), {model.title}, T = {args.seq_len}: "
          f"{MODE_TITLES[part.mode]}, {out['predicted_ms']:.1f} ms predicted")
    for d, s, n in zip(devices, part.shares, part.sizes):
        print(f"  {d.name:18s} share {s:.3f}  {n:5d} {part.dimension}")
    print(f"  binding: {part.binding}")
    for reason in part.reasons:
        print(f"  {reason}")
    if args.run:
        print(f"  ran on {len(devices)} processes: {out['measured_ms']:.1f} ms {out['run']}, outputs equal the model "
              f"in one process to {out['max_abs_diff_hidden']:.1e}")
        for line in (out["note"], out["check"]):
            if line:
                print(f"  {line}")
        for d in out["decisions"]:
            print(f"  layer {d['layer']}: {d['mode']} ({d['why']})")
        for f in out["faults"]:
            print(f"  fault: {f}")
    return 0


def _options(parser: argparse.ArgumentParser, *, run: bool | None) -> None:
    """The options of ``plan`` (``run`` False), ``run`` (True) or the alias ``partition hepti`` (None: ``--run``
    chooses)."""
    from workbench.devices import CLUSTERS

    parser.add_argument("--cluster", choices=tuple(CLUSTERS), default="hepti", help="the devices (the first is the primary)")
    parser.add_argument("--model", choices=tuple(k for k, v in SHAPES.items() if v.kind == "encoder"), default="encoder",
                        help="the encoder-style model whose layers are split")
    parser.add_argument("--seq-len", type=limits.seq_len, default=128, help="input positions T")
    parser.add_argument("--deadline-ms", type=limits.deadline_ms, help="the SLO deadline (default: none)")
    parser.add_argument("--shares", choices=("hepti", "even", "proportional"), default="hepti",
                        help="Hepti's shares (the mixed-integer program's), or a baseline's in the same mode")
    if run is None:
        parser.add_argument("--run", action="store_true", help="also run it on one process per device")
    if run is not False:
        with_run = "(with --run) " if run is None else ""
        parser.add_argument("--measured", action="store_true",
                            help=f"{with_run}each process under its device's CPU limit, its link shaped by tc (root "
                                 "needed); without it the run is a replay padded to the devices' profiles")
        parser.add_argument("--memory-falls", type=_fall, action="append", default=[], metavar="DEVICE:LAYER:MB",
                            help=f"{with_run}the device's free memory falls to MB from LAYER on")
        parser.add_argument("--kill", type=_kill, metavar="DEVICE:LAYER",
                            help=f"{with_run}kill the device's process when the primary starts LAYER")
        parser.add_argument("--trace", help=f"{with_run}write the measured timeline as a Chrome/Perfetto trace")
    else:
        parser.set_defaults(measured=False, memory_falls=[], kill=None, trace=None)
    if run is not None:
        parser.set_defaults(run=run)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=_hepti)


def configure_plan(parser: argparse.ArgumentParser) -> None:
    _options(parser, run=False)


def configure_run(parser: argparse.ArgumentParser) -> None:
    _options(parser, run=True)


def configure_alias(parser: argparse.ArgumentParser) -> None:
    _options(parser, run=None)
