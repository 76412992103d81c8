"""`workbench earlyexit accuracy|plan|simulate|serve`: E3 from the command line.

``accuracy`` reads the trained ramps' dev record; ``plan`` prints E3's split plan and why; ``simulate``
serves arrivals through it in the SimPy simulator; ``serve`` deploys a plan on Ray Serve for real (a local
cluster started for the run, or an existing one with ``--address``) and prints the measured run beside the
simulator's prediction. Every value is checked while the arguments are parsed, before Ray or torch is
imported: a type named twice in ``--gpus``, a ``--mix`` whose parts do not sum to 100, a ``--address`` that
is not an address or where nothing answers are each one usage line and exit status 2. Run on the quick
preset's artifacts, every command says so in the quick-preset line on stderr (stdout may be JSON).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import socket

from workbench.argtypes import Bound, count, seed
from workbench.data import TASKS
from workbench.presets import add_preset_argument

from workbench.earlyexit.limits import batch, rate, replica_count, requests, slo_ms, threshold
from workbench.earlyexit.limits import slack as share


MIX_FORM = ("a mix is EASY:HARD, two percentages of 0 or more that sum to 100 (e.g. 80:20), or the easy share "
            "in 0..1 (e.g. 0.8)")


def _mix(text: str) -> float:
    """``80:20`` (easy:hard, percentages summing to 100) or the easy share itself, ``0.8``. Parts that sum to
    something else are refused rather than rescaled: ``80:30`` is a slip, not a 73:27 mix."""
    try:
        parts = [float(x) for x in text.split(":")] if ":" in text else [float(text)]
        if len(parts) > 2:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{MIX_FORM}; got {text!r}") from None
    if len(parts) == 1:
        if not 0 <= parts[0] <= 1:                     # NaN fails this too
            raise argparse.ArgumentTypeError(f"{MIX_FORM}; got {text!r}, an easy share outside 0..1")
        return parts[0]
    easy, hard = parts
    if not (easy >= 0 and hard >= 0):                  # NaN fails this too
        raise argparse.ArgumentTypeError(f"{MIX_FORM}; got {text!r}, a negative part")
    if not math.isclose(easy + hard, 100, abs_tol=1e-6):
        raise argparse.ArgumentTypeError(f"{MIX_FORM}; got {text!r}, which sums to {easy + hard:g}")
    return easy / (easy + hard)


def _gpus(text: str) -> dict[str, int]:
    from workbench.earlyexit.scenario import parse_gpus
    from workbench.errors import WorkbenchError

    try:
        return parse_gpus(text)
    except WorkbenchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ramps(text: str) -> tuple[int, ...]:
    try:
        ramps = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
        if any(k < 0 for k in ramps):
            raise ValueError
        return ramps
    except ValueError:
        raise argparse.ArgumentTypeError(f"ramps are layer numbers separated by commas (e.g. 1,2), got {text!r}") \
            from None


_mix.__name__, _gpus.__name__, _ramps.__name__ = "mix", "GPUs per type", "ramps"


def _task(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", choices=tuple(TASKS), default="sentiment", help="whose trained ramps to use")
    add_preset_argument(parser)


def _scenario_options(parser: argparse.ArgumentParser) -> None:
    from workbench.earlyexit.scenario import MODELS

    _task(parser)
    parser.add_argument("--model", choices=MODELS, default="encoder",
                        help="the shipped encoder (6 layers) or BERT-BASE/-LARGE's shape (exits of the same mix)")
    parser.add_argument("--gpus", type=_gpus, default={"v100": 4},
                        help="GPUs per type, e.g. v100=6,p100=8,k80=15 (published BERT batch curves, not measured here)")
    parser.add_argument("--slo-ms", type=slo_ms, default=50.0, help="the latency every request must meet")
    parser.add_argument("--batch-size", type=batch, default=16, help="the batch every replica runs")
    parser.add_argument("--mix", type=_mix, default=0.8, help="easy:hard mix of the workload, e.g. 80:20")
    parser.add_argument("--threshold", type=threshold, default=0.4, help="exit when a ramp's entropy is below this")
    parser.add_argument("--disable", type=_ramps, default=(), help="ramps switched off, e.g. 1,2")
    parser.add_argument("--disable-inside", action="store_true",
                        help="switch off the ramps inside each split of the plan and plan again (E3 §3.4)")
    parser.add_argument("--slack", type=share, default=0.2, help="share of the SLO kept back for queueing")
    parser.add_argument("--unpipelined", action="store_true",
                        help="plan a cycle that is the sum of the stages (the optimizer), and let a replica wait "
                             "for its send to finish (the simulator)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def _notice(args) -> None:
    """The quick-preset line on stderr once the command's artifacts are loaded (nothing for the full preset)."""
    from workbench.prepare import print_preset_notice

    print_preset_notice(args.preset)


def _scenario(args):
    from workbench.earlyexit.scenario import Scenario

    return Scenario(model=args.model, task=args.task, preset=args.preset, gpus=args.gpus, slo_s=args.slo_ms / 1e3,
                    batch_size=args.batch_size, easy=args.mix, threshold=args.threshold, disabled=args.disable,
                    slack=args.slack, pipelined=not args.unpipelined, disable_inside=args.disable_inside)


# ------------------------------------------------------------------------------------------ accuracy


def configure_accuracy(parser: argparse.ArgumentParser) -> None:
    _task(parser)
    parser.add_argument("--disable", type=_ramps, default=(), help="ramps switched off, e.g. 1,2")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=_accuracy)


def _accuracy(args) -> int:
    from workbench.earlyexit.artifacts import load_record

    rec = load_record(args.task, args.preset)
    _notice(args)
    rows = rec.table(disabled=args.disable)
    if args.json:
        print(json.dumps({"task": args.task, "stock_accuracy": rec.stock_accuracy(), "dev_examples": len(rec.labels),
                          "ramp_accuracy": rec.ramp_accuracy().tolist(), "thresholds": rows}))
        return 0
    print(f"{args.task}: {len(rec.labels)} dev examples, stock model {100 * rec.stock_accuracy():.1f}%; "
          f"each ramp alone: " + ", ".join(f"{100 * a:.1f}%" for a in rec.ramp_accuracy()))
    print(f"{'threshold':>9} {'accuracy':>9} {'loss':>7} {'mean layers':>11}")
    for r in rows:
        print(f"{r['threshold']:>9.3f} {100 * r['accuracy']:>8.1f}% {100 * r['loss']:>6.1f}% {r['mean_layers']:>11.2f}")
    return 0


# ------------------------------------------------------------------------------------------ plan


def configure_plan(parser: argparse.ArgumentParser) -> None:
    _scenario_options(parser)
    parser.set_defaults(func=_plan)


def _plan(args) -> int:
    sc = _scenario(args)
    profile = sc.profile()
    _notice(args)
    plan = sc.optimize()
    if args.json:
        print(json.dumps({"profile": list(profile.remaining), "plan": plan.to_dict()}, default=str))
        return 0
    print(f"{sc.model} ({sc.num_layers} layers), mix {100 * sc.easy:.0f}:{100 - 100 * sc.easy:.0f}, "
          f"threshold {sc.threshold:g}, GPUs " + ", ".join(f"{n} x {g}" for g, n in sc.gpus.items())
          + f", SLO {1e3 * sc.slo_s:g} ms, batch {sc.batch_size}")
    print("batch left after each ramp: " + " ".join(f"{x:.2f}" for x in profile.remaining))
    print(plan.explain())
    return 0 if plan else 2


# ------------------------------------------------------------------------------------------ simulate


def _arrival_options(parser: argparse.ArgumentParser, default_requests: int) -> None:
    from workbench.earlyexit.simulator import PATTERNS

    parser.add_argument("--pattern", choices=PATTERNS, default="poisson", help="how requests arrive")
    parser.add_argument("--rate", type=rate, default=None,
                        help="requests per second (default: 90%% of the plan's goodput)")
    parser.add_argument("--requests", type=requests, default=default_requests, help="how many requests")
    parser.add_argument("--seed", type=seed, default=0, help="seed of the arrivals and the exits")


def configure_simulate(parser: argparse.ArgumentParser) -> None:
    _scenario_options(parser)
    _arrival_options(parser, 2000)
    parser.add_argument("--trace", default=None, help="write the replicas' timeline as Perfetto/Chrome trace JSON")
    parser.set_defaults(func=_simulate)


def _summary(result) -> dict:
    return {"goodput": result.goodput, "throughput": result.throughput, "p50_latency_ms": 1e3 * result.p50_latency_s,
            "p95_latency_ms": 1e3 * result.p95_latency_s, "drop_rate": result.drop_rate,
            "duration_s": result.duration_s}


def _simulate(args) -> int:
    sc = _scenario(args)
    plan = sc.optimize()
    _notice(args)
    if not plan:
        print(plan.explain())
        return 2
    result = sc.simulate(plan, pattern=args.pattern, rate=args.rate, requests=args.requests, seed=args.seed)
    if args.trace:
        result.timeline.save_chrome_trace(args.trace)
    if args.json:
        print(json.dumps({"plan": plan.to_dict(), "simulated": _summary(result)}, default=str))
        return 0
    print(plan.explain())
    s = _summary(result)
    offered = args.rate if args.rate is not None else 0.9 * plan.goodput
    print(f"simulated {args.requests} {args.pattern} requests offered at {offered:,.0f}/s (the plan sustains "
          f"{plan.goodput:,.0f}/s): goodput {s['goodput']:,.0f}/s, p50 {s['p50_latency_ms']:.2f} ms, p95 {s['p95_latency_ms']:.2f} ms, "
          f"{100 * s['drop_rate']:.1f}% dropped")
    if args.trace:
        print(f"trace written to {args.trace}")
    return 0


# ------------------------------------------------------------------------------------------ serve



RAY_ADDRESS_FORM = "HOST:PORT with a port in 1..65535 (e.g. 127.0.0.1:6379), ray://HOST:PORT or auto"
REACH_TIMEOUT_S = 3.0
"""How long ``--address`` waits for a TCP connection before it says no Ray answers there."""
_HOST = re.compile(r"[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]")


def ray_address_problem(text: str) -> str | None:
    """What is wrong with ``--address`` (None: nothing): not one of the forms, or nothing accepts a TCP connection
    at host:port within REACH_TIMEOUT_S. Plain Python and one socket, so a bad address is refused before Ray or
    torch is imported (``serve.py`` checks the same again when it connects)."""
    if text == "auto":                  # Ray finds the cluster itself (RAY_ADDRESS or this machine's head)
        return None
    client = text.startswith("ray://")
    host, sep, port = text.removeprefix("ray://").rpartition(":")
    if not (sep and _HOST.fullmatch(host) and re.fullmatch(r"[0-9]{1,5}", port) and 1 <= int(port) <= 65535):
        return f"a Ray address is {RAY_ADDRESS_FORM}; got {text!r}"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S):
            return None
    except OSError as err:
        reason = err.strerror or str(err) or type(err).__name__
        start = f"--ray-client-server-port={port}" if client else f"--port={port}"
        return (f"no Ray cluster answers at {text} ({reason}); start one on that machine with "
                f"`ray start --head {start}`, or leave out --address to start a local one")


class _RayAddress(argparse.Action):
    """``--address``, checked as it is parsed (form and a TCP connection), so a bad one is a one-line usage
    error before anything is imported or started."""

    def __call__(self, parser, namespace, values, option_string=None):
        problem = ray_address_problem(values)
        if problem:
            raise argparse.ArgumentError(self, problem)
        setattr(namespace, self.dest, values)


def configure_serve(parser: argparse.ArgumentParser) -> None:
    _task(parser)
    parser.add_argument("--replicas", type=replica_count, default=4,
                        help="CPU replicas the plan may use in all (each a quarter of a core, one torch thread)")
    parser.add_argument("--slo-ms", type=slo_ms, default=1000.0, help="the latency every request must meet")
    parser.add_argument("--batch-size", type=batch, default=4, help="the batch every replica runs")
    parser.add_argument("--mix", type=_mix, default=0.8, help="easy:hard mix of the workload, e.g. 80:20")
    parser.add_argument("--threshold", type=threshold, default=0.4, help="exit when a ramp's entropy is below this")
    _arrival_options(parser, 64)
    parser.add_argument("--address", action=_RayAddress, default=None,
                        help="a running Ray cluster: host:port (as `ray start --head` prints), ray://host:port or "
                             "auto; default: start a local one for this run")
    parser.add_argument("--num-cpus", type=count(at_most=Bound(1024, "a large machine"), unit="CPUs"), default=2,
                        help="CPUs of the local Ray cluster (ignored with --address)")
    parser.add_argument("--trace", default=None, help="write the measured timeline as Perfetto/Chrome trace JSON")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=_serve)


def _serve(args) -> int:
    from workbench.earlyexit.realrun import real_run

    run = real_run(task=args.task, preset=args.preset, replicas=args.replicas, slo_s=args.slo_ms / 1e3,
                   batch_size=args.batch_size, easy=args.mix, threshold=args.threshold, pattern=args.pattern,
                   rate=args.rate, requests=args.requests, seed=args.seed, address=args.address,
                   num_cpus=args.num_cpus)
    _notice(args)
    if args.trace:
        run.served.timeline.save_chrome_trace(args.trace)
    if args.json:
        print(json.dumps(run.summary(), default=str))
        return 0 if run.equal else 1
    print(run.plan.explain())
    for line in run.lines():
        print(line)
    if args.trace:
        print(f"trace written to {args.trace}")
    return 0 if run.equal else 1
