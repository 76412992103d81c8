"""The worker entry point of partitioned inference: ``python -m workbench.partition.worker``.

It reads the rendezvous from the environment ``torch.distributed`` uses (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``), so the same command runs under the workbench's own worker group
on 127.0.0.1 and under ``torchrun`` across machines::

    torchrun --nnodes 2 --nproc-per-node 2 --node-rank 0 --rdzv-backend c10d \\
        --rdzv-endpoint HEAD:29500 -m workbench.partition.worker --scheme voltage --seq-len 128 --out run.json

Two modes:

- ``--control PATH``: the workbench started this group. Each rank connects to the parent's Unix
  socket, runs the jobs it is sent (one JSON line each, the plan's inputs), reports its progress
  after every step and its result, and keeps its model between jobs.
- otherwise (``torchrun``): one job from the command line; rank 0 gathers every rank's timeline and
  counts, checks the outputs against the whole model in one process, prints a summary and writes
  ``--out`` (JSON) and ``--trace`` (Chrome/Perfetto trace).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from dataclasses import asdict

import numpy as np

from workbench.distributed.wire import decode_array, encode_array
from workbench.distributed.worker import Runner


def plan_from_spec(spec: dict):
    """The plan a job names, built the same way on every rank (planning is pure and deterministic)."""
    from workbench.devices import DeviceProfile
    from workbench.partition.cost import get_shape
    from workbench.partition.plan import plan_partition

    devices = [DeviceProfile.from_dict(d) for d in spec["devices"]]
    return plan_partition(spec["scheme"], get_shape(spec["model"]), spec["seq_len"], devices,
                          shares=spec.get("shares", "even"), order=spec.get("order", "auto"),
                          network=spec.get("network", "switch"))


class _Runner(Runner):
    """One rank: its process group, its models and its PyTorch tensor-parallel layers, kept between jobs."""

    def __init__(self):
        super().__init__()
        self.torch_tp: dict = {}

    def run(self, spec: dict, progress=lambda i, label, extra=None: None) -> dict:
        import torch.distributed as dist

        from workbench.partition.execute import Comm, execute
        from workbench.models.split import cached_model

        plan = plan_from_spec(spec)
        if plan.K != self.world:
            raise RuntimeError(f"the plan has {plan.K} devices but this group {self.world} ranks")
        model = cached_model(spec["model"], spec.get("model_seed", 0))
        inputs = model.inputs(model.token_ids(plan.seq_len, spec.get("seed", 0)))
        tp = self._torch_tp(spec["model"], spec.get("model_seed", 0), model) if plan.scheme == "torch_tp" else None
        dist.barrier()
        started = time.perf_counter()
        result = execute(plan, self.rank, model, inputs, Comm(self.rank, self.world, self.groups), emulate=spec.get("emulate", True),
                         link=spec.get("link", "emulated"), progress=progress, torch_tp=tp,
                         limited=bool(spec.get("limited", False)))
        return {"rank": self.rank, "device": result.device, "t0": started,
                "timeline": result.timeline().to_dict(), "counts": [asdict(c) for c in result.counts],
                "wall_s": result.wall_s,
                "hidden": encode_array(result.hidden) if result.hidden is not None else None,
                "logits": encode_array(result.logits) if result.logits is not None else None}

    def _torch_tp(self, name: str, seed: int, model):
        key = (name, seed)
        if key not in self.torch_tp:
            from workbench.partition.torch_tp import TorchTP

            self.torch_tp[key] = TorchTP(model, self.world)
        return self.torch_tp[key]


def serve(control: str) -> int:
    """Connect to the parent's control socket and run its jobs until told to exit (the shared loop of
    :func:`workbench.distributed.worker.serve`, with this mechanism's runner)."""
    from workbench.distributed.worker import serve as serve_jobs

    return serve_jobs(control, _Runner)


def one_shot(args) -> int:
    """One job under torchrun: every rank runs it, rank 0 gathers and reports."""
    import torch.distributed as dist

    from workbench.devices import get_profile
    from workbench.partition.cost import get_shape
    from workbench.models.split import cached_model
    from workbench.timeline import Timeline

    runner = _Runner()
    world = runner.world
    problem = ""
    device = get_profile(args.device)
    if args.bandwidth_mbit is not None:
        from dataclasses import replace

        device = replace(device, net_bytes_per_s=args.bandwidth_mbit * 1e6 / 8)
    spec = {"scheme": args.scheme, "model": args.model, "seq_len": args.seq_len,
            "devices": [dict(device.to_dict(), name=f"{device.name}-{r}") for r in range(world)],
            "shares": args.shares, "emulate": args.emulate, "seed": args.seed}
    result = runner.run(spec)
    gathered = [None] * world if runner.rank == 0 else None
    dist.gather_object(result, gathered, dst=0)
    if runner.rank == 0:
        timeline = Timeline.merge([Timeline.from_dict(r["timeline"]) for r in gathered], name=f"{args.scheme} measured")
        model = cached_model(args.model)
        hidden, logits = model.reference(model.inputs(model.token_ids(args.seq_len, args.seed)))
        diff = float(np.abs(decode_array(gathered[0]["hidden"]) - hidden.numpy()).max())
        sent = [sum(c["sent"] for c in r["counts"]) for r in gathered]
        summary = {"scheme": args.scheme, "model": get_shape(args.model).title, "ranks": world,
                   "seq_len": args.seq_len, "wall_s": gathered[0]["wall_s"], "max_abs_diff_hidden": diff,
                   "sent_bytes_per_rank": sent}
        print(json.dumps(summary))
        if args.out:
            with open(args.out, "w") as f:
                json.dump({**summary, "timeline": timeline.to_dict()}, f)
        if args.trace:
            timeline.save_chrome_trace(args.trace)
        problem = outputs_problem(diff)
        if problem:
            print(f"workbench.partition.worker: {problem}", file=sys.stderr)
    dist.destroy_process_group()
    return 1 if runner.rank == 0 and problem else 0


OUTPUT_TOLERANCE = 1e-3
"""The largest difference of a distributed run's hidden states from the model run in one process that is still
float32 rounding (the tests see 1e-6 to 1e-4)."""


def outputs_problem(diff: float, tolerance: float = OUTPUT_TOLERANCE) -> str:
    """'' when the terminal's hidden states equal the one-process model's within ``tolerance``; else why not."""
    if diff <= tolerance:
        return ""
    return (f"the outputs differ from the model run in one process by {diff:.3g} (more than {tolerance:g}): "
            "the ranks did not compute the same model (versions, weights or inputs differ between machines?)")


def main(argv=None) -> int:
    from workbench.partition.plan import SCHEMES

    from workbench.argtypes import Parser, seed
    from workbench.distributed import limits
    from workbench.partition.cost import SHAPES

    parser = Parser(prog="python -m workbench.partition.worker",
                    description="a rank of partitioned inference (under the workbench or torchrun)")
    parser.add_argument("--control", help="the parent's control socket (set by the workbench)")
    parser.add_argument("--scheme", default="voltage", choices=list(SCHEMES))
    parser.add_argument("--model", default="encoder", choices=tuple(SHAPES), help="the model to split")
    parser.add_argument("--seq-len", type=limits.seq_len, default=128, help="input positions")
    parser.add_argument("--device", default="edge-vm", help="device profile every rank emulates")
    parser.add_argument("--bandwidth-mbit", type=limits.bandwidth_mbit, default=None,
                        help="link bandwidth (Mbit/s) to emulate")
    parser.add_argument("--shares", default="even", choices=("even", "proportional"), help="Voltage's share vector")
    parser.add_argument("--emulate", action=argparse.BooleanOptionalAction, default=False,
                        help="pad compute and communication to the device profile (default: run at full speed)")
    parser.add_argument("--seed", type=seed, default=0, help="seed of the input tokens")
    parser.add_argument("--out", help="write the summary and the merged timeline as JSON")
    parser.add_argument("--trace", help="write the merged timeline as a Chrome/Perfetto trace")
    args = parser.parse_args(argv)
    if args.control:
        return serve(args.control)
    problem = rendezvous_problem()
    if problem:
        print(f"workbench.partition.worker: {problem}", file=sys.stderr)
        return 2
    return one_shot(args)


def rendezvous_problem() -> str:
    """What is wrong with the rendezvous the environment names, before torch waits on it ('' if nothing)."""
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        return (f"no {', '.join(missing)} in the environment: start the worker with torchrun "
                "(or through the workbench, which sets them)")
    host, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"MASTER_PORT must be a TCP port, 1 to 65535, got {port!r}"
    try:
        socket.getaddrinfo(host, int(port))
    except OSError:
        return f"the rendezvous host {host!r} does not resolve; give torchrun a reachable --rdzv-endpoint HOST:PORT"
    return ""


if __name__ == "__main__":
    sys.exit(main())
