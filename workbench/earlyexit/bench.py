"""`workbench bench e3`: E3's optimizer, simulator and goodput at the paper's scale (§5), and the simulator
against a real Ray Serve run on this host.

Tables:

- ``optimizer`` (Figure 20): median wall time of the split optimizer on BERT-BASE and BERT-LARGE shaped problems
  with 16 V100 and with 46 GPUs of four types (:func:`~workbench.earlyexit.evaluation.time_optimizer`); the paper
  took 0.87-3.63 s, the target here is under 0.1 s.
- ``validation``: the simulator out of sample: calibrated on one run served for real on Ray Serve
  (:mod:`workbench.earlyexit.serve`, single-thread replicas) at half the rate, it predicts another run of the
  plan with this host's measured layer profile, in the evaluation's mode (deadline batching, budget drops)
  (:func:`~workbench.earlyexit.validation.validate_out_of_sample`): goodput and p50/p95 latency errors, target
  within 20%. Skipped, with the reason printed, when Ray Serve cannot be used here or ``--no-serve`` is given.
- ``goodput`` (Figures 7, 13, 16): simulated goodput of E3, the early-exit model as is and the stock model per
  cluster (16 V100; 6 V100 + 8 P100 + 15 K80), easy:hard mix and batch size (every replica at that batch),
  with the band of E3's ratios over the GPU curves' saturation.
- ``cost`` (Figures 14, 15): GPUs and dollars per second each needs for a fixed goodput: the cheapest
  data-parallel counts for the baselines, E3's optimizer at that request rate with ``--alpha`` (analytic).
- ``misprediction`` (§5.8.2-5.8.3): a drifting mix forecast window by window with ARIMA, each plan made with the
  forecast and served the measured profile; ARIMA's own errors and the capacity lost.
- ``ramps`` (§5.8.6): E3's plans with the ramps inside each split disabled.

The GPU latencies are published BERT batch curves (:mod:`workbench.earlyexit.gpu_curves`; derived for the P100,
K80 and A6000), not measured here; the mixes are measured on the trained model when `workbench prepare` has
made it (rescaled to the deeper model), else parametric (the paper's Figure 3; the summary says which).
``--quick`` keeps the whole run to about a minute.
"""
from __future__ import annotations

import math
import time

from workbench.argtypes import Bound, Number, Parser, count, positive, seed

TABLES = ("optimizer", "validation", "goodput", "cost", "misprediction", "ramps")
MIX_NAMES = ("80:20", "50:50", "20:80")
PAPER_OPTIMIZER_S = {("bert-base", "homogeneous"): 0.87, ("bert-base", "heterogeneous"): 2.09,
                     ("bert-large", "homogeneous"): 1.53, ("bert-large", "heterogeneous"): 3.63}
OPTIMIZER_TARGET_S = 0.1
SERVE_SLO_S = 2.0
MIN_EARLY = 0.05
"""A measured mix is used (``--mix-source auto``) when at least this share of some mix leaves early."""

QUICK = {"batches": [1, 4, 8], "mixes": ["80:20"], "requests": 600, "min_span_slos": 2.0, "repeats": 2,
         "mispredict_batches": [8], "windows": 8, "ramp_batches": [8], "serve_requests": 40,
         "profile_batches": [1, 2, 4, 8]}
"""--quick: three batch sizes, the 80:20 mix, 600 simulated requests, two optimizer repeats, one batch size for
the misprediction and ramp tables, 40 real requests."""

BATCHES = count(1, unit="samples", at_most=Bound(64, "the largest batch the layer profiles tabulate"))
REQUESTS = count(50, unit="requests", at_most=Bound(200_000, "a simulation that still takes seconds"))



def parser() -> Parser:
    p = Parser(prog="workbench bench e3",
               description="E3's optimizer times, simulated goodput against the early-exit and stock models, cost, "
                           "misprediction and disabled ramps at the paper's scale, and the simulator against Ray Serve")
    p.add_argument("--model", choices=("bert-base", "bert-large"), default="bert-base",
                   help="the model shape of the goodput, cost, misprediction and ramp tables")
    p.add_argument("--clusters", nargs="+", choices=("homogeneous", "heterogeneous"),
                   default=["homogeneous", "heterogeneous"], help="16 V100, and 6 V100 + 8 P100 + 15 K80")
    p.add_argument("--batches", nargs="+", type=BATCHES, default=[1, 2, 4, 8, 16], help="batch sizes")
    p.add_argument("--mixes", nargs="+", choices=MIX_NAMES, default=list(MIX_NAMES), help="easy:hard mixes")
    p.add_argument("--slo-ms", type=positive("ms", Bound(10_000, "ten seconds")), default=100.0, help="the SLO")
    p.add_argument("--requests", type=REQUESTS, default=2000, help="simulated requests per run (at least)")
    p.add_argument("--min-span-slos", type=positive("SLOs", Bound(100, "a hundred SLOs")), default=4.0,
                   help="a run's arrivals span at least this many SLOs")
    p.add_argument("--seed", type=seed, default=0, help="seed of the simulated arrivals and exits")
    p.add_argument("--repeats", type=count(1, unit="runs", at_most=Bound(100, "a hundred")), default=5,
                   help="optimizer runs per problem (the median is kept)")
    p.add_argument("--target-goodput", type=positive("samples/s", Bound(1e7, "ten million")), default=6000.0,
                   help="the fixed goodput of the cost table (the paper: 6000)")
    p.add_argument("--mispredict-batches", nargs="+", type=BATCHES, default=[4, 8, 16],
                   help="batch sizes of the misprediction table")
    p.add_argument("--windows", type=count(3, unit="windows", at_most=Bound(1000, "a thousand")), default=24,
                   help="windows of the drifting mix in the misprediction table")
    p.add_argument("--alpha", type=positive("", Bound(100, "a hundred times the baseline's cost")), default=1.0,
                   help="E3's cost bound over the cheaper baseline's in the cost table")
    p.add_argument("--ramp-batches", nargs="+", type=BATCHES, default=[4, 8, 16],
                   help="batch sizes of the ramp-disabling table")
    p.add_argument("--no-serve", action="store_true", help="skip the real Ray Serve run (the validation table)")
    p.add_argument("--serve-requests", type=count(4, unit="requests", at_most=Bound(5000, "a few minutes")),
                   default=400, help="requests of the real run (the last partial batches, which wait out their "
                                     "slack, set the p95 of short runs)")
    p.add_argument("--profile-batches", nargs="+", type=BATCHES, default=[1, 2, 4, 8, 16, 32, 64],
                   help="batch sizes of the host's layer profile (measured once, cached)")
    p.add_argument("--task", choices=("sentiment", "bbc"), default="sentiment",
                   help="the task whose trained model gives the measured mixes")
    p.add_argument("--mix-source", choices=("auto", "measured", "parametric"), default="auto",
                   help="the mixes' batch profiles: measured on the trained model (auto: when it has one whose "
                        "ramps let inputs leave early), or parametric")
    p.add_argument("--preset", default=None, help="the preset the model was prepared with (default: $WORKBENCH_PRESET)")
    sizes = "; ".join(f"--{key.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                      for key, v in QUICK.items())
    p.add_argument("--quick", action="store_true", help=f"these sizes, where not given: {sizes}")
    p.add_argument("--tables", nargs="+", choices=TABLES, default=list(TABLES), help="tables to make")
    return p


def options(args: list[str]):
    """The options; ``--quick`` changes the defaults of :data:`QUICK`'s options, not those given."""
    p = parser()
    if "--quick" in args:
        p.set_defaults(**QUICK)
    return p.parse_args(args)


def _scenario(opts):
    from workbench.earlyexit.pools import EvalSettings

    return EvalSettings(shape=opts.model, slo_s=opts.slo_ms / 1e3, requests=opts.requests, seed=opts.seed,
                    min_span_slos=opts.min_span_slos)


def measured_mixes(opts) -> tuple[dict | None, str]:
    """The mixes' profiles measured on the trained model of ``opts.task`` (6 layers), or None and why not:
    ``--mix-source parametric``, no trained model, or one from which (almost) nobody leaves early (the quick
    preset's briefly trained ramps are rarely confident at the paper's entropy 0.4)."""
    if opts.mix_source == "parametric":
        return None, "parametric (--mix-source parametric)"
    try:
        from workbench.earlyexit.artifacts import MIXES, load_record, mix_profile
        from workbench.earlyexit.record import DEFAULT_THRESHOLD
        from workbench.presets import default_preset

        preset = opts.preset or default_preset()
        record = load_record(opts.task, preset)
        got = {m: mix_profile(record, MIXES[m], DEFAULT_THRESHOLD) for m in opts.mixes}
    except Exception as exc:  # noqa: BLE001 - any reason falls back to the parametric mixes, and says why
        if opts.mix_source == "measured":
            raise
        return None, f"parametric ({type(exc).__name__}: {exc})"
    early = {m: 1 - p.remaining[-2] for m, p in got.items()}
    if opts.mix_source == "auto" and max(early.values()) < MIN_EARLY:
        return None, (f"parametric: the trained {opts.task} model (preset {preset}) lets at most "
                      f"{100 * max(early.values()):.1f} % leave early at entropy {DEFAULT_THRESHOLD}")
    return got, (f"measured on the trained {opts.task} model (preset {preset}; "
                 + ", ".join(f"{m}: {100 * e:.0f} % leave early" for m, e in early.items())
                 + f"), rescaled to {opts.model}")


# ----------------------------------------------------------------------------- tables

def optimizer_table(opts) -> list[dict]:
    from workbench.earlyexit.evaluation import time_optimizer

    rows = []
    for r in time_optimizer(repeats=opts.repeats, slo_s=opts.slo_ms / 1e3):
        paper = PAPER_OPTIMIZER_S[(r["model"], r["cluster"])]
        rows.append({"model": r["model"], "cluster": r["cluster"], "gpus": r["gpus"], "types": r["types"],
                     "median_s": r["median_s"], "min_s": r["min_s"], "paper_s": paper,
                     "under_target": r["median_s"] < OPTIMIZER_TARGET_S, "splits": len(r["splits"]),
                     "replicas": " ".join(map(str, r["replicas"])), "goodput": r["goodput"]})
    return rows


def serve_problem() -> str | None:
    """None when the real serving can run here, else why not."""
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401

        from workbench.earlyexit import serve as _serve  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None


def validation_table(opts) -> tuple[list[dict], str]:
    """One real Ray Serve run against the simulator; returns the rows and a line for the summary.

    With the task's model prepared, :func:`~workbench.earlyexit.realrun.real_run`: the trained ramps on an
    80:20 workload at the paper's threshold, two CPU replicas, Poisson arrivals at a quarter of what the plan
    sustains (small batches, as the issue asks). Without it, the untrained model (nobody exits early)."""
    import numpy as np

    from workbench.earlyexit.artifacts import model_ready
    from workbench.earlyexit.record import DEFAULT_THRESHOLD
    from workbench.presets import default_preset

    preset = opts.preset or default_preset()
    if model_ready(opts.task, preset):
        from workbench.earlyexit.realrun import real_run
        from workbench.earlyexit.scenario import Scenario

        settings = dict(task=opts.task, preset=preset, slo_s=SERVE_SLO_S, batch_size=8, easy=0.8,
                        threshold=DEFAULT_THRESHOLD)
        plan = Scenario(model="encoder", gpus={"host": 2}, **settings).optimize()
        if not plan:
            return [], f"validation: no plan on this host within {SERVE_SLO_S:g} s ({plan.reason})"
        rate = 0.25 * plan.goodput
        print(f"validation: {plan.explain().splitlines()[0]}; {opts.serve_requests} requests at {rate:.3g}/s",
              flush=True)
        run = real_run(replicas=2, pattern="poisson", rate=rate, requests=opts.serve_requests, seed=opts.seed,
                       **settings)
        v, model = run.validation, f"trained ({preset}), 80:20, entropy {DEFAULT_THRESHOLD}"
        split_queue = run.split_queue
        if not run.equal:
            print(f"validation: {run.mismatches} served outputs differ from the one-process model", flush=True)
    else:
        v, plan, rate, split_queue = _untrained_validation(opts)
        if v is None:
            return [], plan
        model = "untrained ramps (no prepared model)"
    L = plan.splits[-1][1]
    row = {"model": model, "plan": " | ".join(f"{st.start}-{st.end - 1} x{st.replicas} @ {st.batch_size}"
                                               for st in plan.stages),
           "rate": rate, **v.row(), "exits_early": int(np.sum(v.real.exit_layers[v.real.served] < L - 1)),
           "dropped_real": int(v.real.dropped), "dropped_predicted": sum(1 for r in v.sim.requests if r.dropped)}
    if split_queue is not None:
        row.update({f"split_queue_{k}": split_queue.row()[k] for k in
                    ("goodput_error_pct", "p50_error_pct", "p95_error_pct")})
    line = (f"simulator vs Ray Serve out of sample ({row['plan']}, {opts.serve_requests} requests at {rate:.3g}/s, "
            f"{model}; {v.note}): goodput {row['goodput_error_pct']:+.1f} %, p50 {row['p50_error_pct']:+.1f} %, "
            f"p95 {row['p95_error_pct']:+.1f} % (target within {row['target_pct']:g} %: "
            f"{'met' if v.within_target else 'MISSED'}); dropped {row['dropped_real']} served, "
            f"{row['dropped_predicted']} predicted; Ray Serve hops {row.get('hop_ms', 0):.1f} ms"
            + (f"; with one ideal queue per split instead {row['split_queue_goodput_error_pct']:+.1f} / "
               f"{row['split_queue_p50_error_pct']:+.1f} / {row['split_queue_p95_error_pct']:+.1f} %"
               if split_queue is not None else ""))
    return [row], line


def _untrained_validation(opts):
    """The validation on the untrained model (nobody exits early): calibrated on one served run at half the rate,
    the simulator predicts another; (Validation, plan, rate, Validation with one queue per split), or (None,
    reason, None, None)."""
    import torch

    from workbench.earlyexit.validation import calibrate, validate_out_of_sample
    from workbench.earlyexit.optimizer import optimize_splits
    from workbench.earlyexit.profiles import host_layer_profile
    from workbench.earlyexit.serve import ModelSpec, Workload, serve_plan
    from workbench.earlyexit.simulator import ArrivalProcess

    profile = host_layer_profile(batch_sizes=opts.profile_batches, task=opts.task)
    print(f"host layer profile: {profile.source}", flush=True)
    L = profile.num_layers
    batch = min(4, profile.max_batch)
    plan = optimize_splits(profile.adapter(), [1.0] * (L - 1) + [0.0], {"host": 2}, SERVE_SLO_S,
                           batch_size=batch, num_layers=L)
    if not plan:
        return None, f"validation: no plan on this host within {SERVE_SLO_S:g} s ({plan.reason})", None, None
    rate = 0.25 * plan.goodput
    spec = ModelSpec.untrained(seed=opts.seed)
    gen = torch.Generator().manual_seed(opts.seed)

    def workload(n: int, at: float):
        ids = torch.randint(1000, 30000, (n, profile.seq_len), generator=gen)
        return Workload.from_arrivals(ids, torch.ones_like(ids), ArrivalProcess("uniform", rate=at, count=n))

    warm = serve_plan(spec, plan, workload(max(8, opts.serve_requests // 2), rate / 2), slo_s=SERVE_SLO_S)
    target = serve_plan(spec, plan, workload(opts.serve_requests, rate), slo_s=SERVE_SLO_S)
    cal = calibrate(warm, profile, source=f"a calibration run of {len(warm.requests)} other requests at "
                                          f"{rate / 2:.3g}/s")
    v, by_split = (validate_out_of_sample(cal, target, plan, profile, SERVE_SLO_S, exits=[L - 1] * len(target.requests),
                                          queues=q) for q in ("replica", "split"))
    return v, plan, rate, by_split


def _geo(values) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def goodput_summary(rows: list[dict]) -> list[str]:
    lines = []
    e3 = [r for r in rows if r["system"] == "e3"]
    for cluster in sorted({r["cluster"] for r in e3}):
        for mix in sorted({r["mix"] for r in e3}, reverse=True):
            part = [r for r in e3 if r["cluster"] == cluster and r["mix"] == mix]
            big = [r for r in part if r["batch"] >= 4]
            beats = all(r["e3_over_as_is"] >= 1 for r in big)

            def ratio(r, other):
                lo, hi = r[f"e3_over_{other}_band"]
                return f"b={r['batch']} {r[f'e3_over_{other}']:.2f}x [{lo:.2f}-{hi:.2f}]"
            lines.append(f"{cluster} {mix}: E3 / as is " + ", ".join(ratio(r, "as_is") for r in part)
                         + "; E3 / stock " + ", ".join(ratio(r, "stock") for r in part)
                         + "; E3 deploys " + ", ".join(f"b={r['batch']} {r['deploys']}" for r in part)
                         + (f"; E3 >= as is for every batch >= 4: {'yes' if beats else 'NO'}" if big else ""))
    if not e3:
        return lines
    best = max(e3, key=lambda r: r["e3_over_as_is"])
    lines.append("[band]: the ratio of analytic capacities over the GPU curves' saturation (published, flatter, "
                 "steeper)")
    lines.append(f"largest gain over the as-is model {best['e3_over_as_is']:.2f}x ({best['cluster']}, "
                 f"{best['mix']}, b={best['batch']}); paper: up to 1.44x homogeneous, 1.70x heterogeneous; "
                 f"over stock up to {max(r['e3_over_stock'] for r in e3):.2f}x (paper: up to 1.30x)")
    return lines


def run(args: list[str]) -> dict[str, list[dict]]:
    from workbench.earlyexit import evaluation as ev

    opts = options(args)
    t0 = time.perf_counter()
    print(f"$ workbench bench e3 {' '.join(args)}".rstrip(), flush=True)
    tables: dict[str, list[dict]] = {}
    summary: list[str] = []
    scenario = _scenario(opts)
    measured, origin = (None, "parametric (not needed)")
    if {"goodput", "cost", "misprediction", "ramps"} & set(opts.tables):
        measured, origin = measured_mixes(opts)
        summary.append(f"mixes: {origin}")
    if "optimizer" in opts.tables:
        tables["optimizer"] = rows = optimizer_table(opts)
        summary.append("optimizer median time: " + ", ".join(
            f"{r['model']} {r['gpus']} GPUs/{r['types']} types {1e3 * r['median_s']:.1f} ms (paper {r['paper_s']} s)"
            for r in rows) + f"; under {OPTIMIZER_TARGET_S:g} s: {'yes' if all(r['under_target'] for r in rows) else 'NO'}")
    if "validation" in opts.tables:
        problem = "--no-serve given" if opts.no_serve else serve_problem()
        if problem:
            summary.append(f"validation: skipped ({problem})")
            tables["validation"] = []
        else:
            tables["validation"], line = validation_table(opts)
            summary.append(line)
    if "goodput" in opts.tables:
        tables["goodput"] = goodput_rows = ev.goodput_table(opts.batches, opts.mixes, opts.clusters, scenario,
                                                            measured)
        summary.extend(goodput_summary(goodput_rows))
    if "cost" in opts.tables:
        tables["cost"] = rows = ev.cost_table(opts.batches, opts.mixes, opts.clusters, scenario,
                                              opts.target_goodput, opts.alpha, measured=measured)
        savings = [r["saving_pct"] for r in rows if r["system"] == "e3" and math.isfinite(r["saving_pct"])]
        none = sum(1 for r in rows if r["system"] == "e3" and r["plan"] == "the model as is, data parallel")
        summary.append(f"cost for {opts.target_goodput:g} samples/s (analytic, alpha {opts.alpha:g}): "
                       + (f"E3 saves {min(savings):.0f} to {max(savings):.0f} % over the cheaper baseline"
                          if savings else "E3 has no plan")
                       + (f"; E3 runs the model as is in {none} case(s) (no plan of its own within alpha, or a "
                          "dearer one)" if none else "") + " (paper: 35-78 %)")
    if "misprediction" in opts.tables:
        tables["misprediction"] = rows = ev.misprediction_table(opts.mispredict_batches, opts.mixes, "homogeneous",
                                                                scenario, measured, windows=opts.windows,
                                                                seed=opts.seed)
        for r in rows:
            summary.append(f"ARIMA on a drifting {r['mix']} mix ({r['windows']} windows, b={r['batch']}): mean "
                           f"error {r['arima_mean_abs_error_pct']:.1f} % (worst {r['arima_worst_abs_error_pct']:.1f}"
                           f" %), capacity lost {r['loss_mean_pct']:.1f} % mean, {r['loss_worst_pct']:.1f} % worst "
                           f"(paper: {ev.PAPER_MISPREDICTION_LOSS_PCT[0]}-{ev.PAPER_MISPREDICTION_LOSS_PCT[1]} % at "
                           "20 % error)")
    if "ramps" in opts.tables:
        tables["ramps"] = rows = ev.ramp_table(opts.ramp_batches, opts.mixes, ("homogeneous",), scenario, measured)
        gains = [r["gain_pct"] for r in rows if math.isfinite(r["gain_pct"])]
        summary.append(f"disabling ramps inside splits: {min(gains):+.1f} to {max(gains):+.1f} % goodput "
                       f"(paper: up to {ev.PAPER_RAMP_GAIN_PCT} %)" if gains else
                       "disabling ramps inside splits: no split plan at these batch sizes (E3 ran the model as is)")
    print(f"\n== summary ({time.perf_counter() - t0:.0f} s)\n$ workbench bench e3 {' '.join(args)}".rstrip())
    for line in summary:
        print(line)
    return tables
