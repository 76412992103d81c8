"""A real E3 run on this machine, end to end: the trained model, a plan for CPU replicas, Ray Serve, the check.

:func:`real_run` plans for ``replicas`` CPU replicas with the host's measured layer profile, draws a workload of
the chosen easy:hard mix from the dev set (every request padded to the task's length, so a request's result
does not depend on who it is batched with) and serves it on Ray Serve twice, as E3 serves (deadline batching,
requests that cannot make the SLO dropped): a calibration run at half the rate on other requests, whose
measured replica slowdown and Ray Serve costs calibrate the simulator, then the run itself, which the simulator
predicts out of sample (:func:`~workbench.earlyexit.validation.validate_out_of_sample`). The same requests run
through the model in one process: the served labels and exit layers must equal those. The page's
"Run for real", ``workbench earlyexit serve`` and the benchmark all come here.

:func:`drift_run` serves a workload whose mix drifts halfway (``easy`` to ``drift_to``) with E3's online loop
on: every ``window_s`` the served exits update the ARIMA estimator and the scenario's optimizer re-plans for the
forecast; a different plan is deployed in place, and the run records each re-plan (E3 §3.1, §4).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from workbench.errors import WorkbenchError


def _pct(error: float) -> str:
    """A relative error as a signed percentage, "n/a" where it is undefined (a real figure of 0)."""
    return f"{100 * error:+.1f}%" if np.isfinite(error) else "n/a"


def _ms(value: float) -> str:
    return f"{value:.1f} ms" if np.isfinite(value) else "n/a (none served)"


@dataclass(frozen=True)
class RealRun:
    plan: object                      # SplitPlan for the "host" replicas
    validation: object                # validation.Validation: served vs simulated
    equal: bool                       # every request's label and exit layer equal the one-process model's
    mismatches: int
    max_logit_diff: float
    pattern: str
    rate: float
    split_queue: object = None        # the same prediction with one ideal queue per split (not how Ray Serve routes)

    @property
    def served(self):
        return self.validation.real

    @property
    def simulated(self):
        return self.validation.sim

    def summary(self) -> dict:
        v, s = self.validation, self.served
        return {"plan": self.plan.to_dict(), "pattern": self.pattern, "rate": self.rate, "requests": len(s.requests),
                "served": {"goodput": s.goodput, "p50_latency_ms": 1e3 * s.p50_latency_s,
                           "p95_latency_ms": 1e3 * s.p95_latency_s, "met_slo": s.met,
                           "batch_counts": [dict(c) for c in s.batch_counts], "deploy_s": s.deploy_s},
                "simulated": {"goodput": v.sim_goodput, "p50_latency_ms": 1e3 * v.sim_p50_s,
                              "p95_latency_ms": 1e3 * v.sim_p95_s},
                "dropped": {"served": s.dropped, "simulated": sum(1 for r in self.simulated.requests if r.dropped)},
                "errors": {"goodput": v.goodput_error, "p50": v.p50_error, "p95": v.p95_error},
                "note": v.note, "equal_to_one_process": self.equal, "mismatches": self.mismatches,
                "max_logit_diff": self.max_logit_diff}

    def lines(self) -> list[str]:
        d = self.summary()
        sv, sm, err = d["served"], d["simulated"], d["errors"]
        dropped = d["dropped"]
        out = [f"served {d['requests']} {self.pattern} requests at {self.rate:.1f}/s on Ray Serve: goodput "
               f"{sv['goodput']:.1f}/s, p50 {_ms(sv['p50_latency_ms'])}, p95 {_ms(sv['p95_latency_ms'])}, "
               f"{sv['met_slo']} met the SLO, {dropped['served']} dropped (deployed in {sv['deploy_s']:.1f} s)",
               f"predicted by the simulator ({d['note']}; same plan, arrivals and exits): goodput "
               f"{sm['goodput']:.1f}/s, p50 {_ms(sm['p50_latency_ms'])}, p95 {_ms(sm['p95_latency_ms'])}, "
               f"{dropped['simulated']} dropped",
               f"simulator error out of sample: goodput {_pct(err['goodput'])}, p50 {_pct(err['p50'])}, "
               f"p95 {_pct(err['p95'])} (target within {100 * self.validation.target:g}% each)",
               "batches served per split: " + "; ".join(
                   f"split {i + 1}: " + ", ".join(f"{n} x {b}" for b, n in sorted(c.items()))
                   for i, c in enumerate(sv["batch_counts"])),
               ("outputs equal the model run in one process, request by request" if self.equal else
                f"{self.mismatches} requests differ from the model run in one process")]
        return out


def _ready(sc, threshold: float, address: str | None, rate: float | None):
    """What a run on the host needs, in order: the head checked (one that is not there, refuses our token or sits
    on loopback is named now), the trained model at ``threshold``, the scenario's plan, and the arrival rate
    (default 80 % of the plan's goodput)."""
    if address is not None:
        from workbench.earlyexit.raycluster import check_head

        check_head(str(address))
    from workbench.earlyexit.artifacts import load_model

    prepared = load_model(sc.task, sc.preset)
    model = prepared.model.configure(threshold=threshold, disabled=())
    plan = sc.optimize()
    if not plan:
        raise WorkbenchError(f"no plan for {sum(sc.gpus.values())} CPU replicas: {plan.reason}")
    return prepared, model, plan, float(rate if rate is not None else 0.8 * plan.goodput)


def real_run(*, task: str = "sentiment", preset: str = "full", replicas: int = 4, slo_s: float = 1.0,
             batch_size: int = 4, easy: float = 0.8, threshold: float = 0.4, pattern: str = "poisson",
             rate: float | None = None, requests: int = 64, seed: int = 0, address: str | None = None,
             num_cpus: float = 2, progress: Callable[[int, int], None] | None = None) -> RealRun:
    """Plan, serve, simulate and check one run (see the module docstring); ``rate`` defaults to 80 % of the
    plan's goodput. Bad input raises before Ray starts; a plan no replica count meets raises with the reason."""
    from workbench.earlyexit.scenario import Scenario
    from workbench.earlyexit.simulator import PATTERNS, ArrivalProcess

    if pattern not in PATTERNS:
        raise WorkbenchError(f"unknown arrival pattern {pattern!r}; known: {', '.join(PATTERNS)}")
    if not (isinstance(requests, int) and 1 <= requests <= 10_000):
        raise WorkbenchError(f"a real run serves 1..10000 requests, got {requests!r}")
    sc = Scenario(model="encoder", task=task, preset=preset, gpus={"host": replicas}, slo_s=slo_s,
                  batch_size=batch_size, easy=easy, threshold=threshold)
    if rate is not None and not (isinstance(rate, (int, float)) and np.isfinite(rate) and rate > 0):
        raise WorkbenchError(f"the arrival rate is requests per second > 0, got {rate!r}")
    import torch

    from workbench.data import task_spec
    from workbench.earlyexit.artifacts import mix_texts
    from workbench.earlyexit.validation import calibrate, validate_out_of_sample
    from workbench.earlyexit.serve import Workload, serve_plan
    from workbench.models.tokenizer import encoder_tokenizer

    prepared, model, plan, rate = _ready(sc, threshold, address, rate)

    length = task_spec(task).max_length
    tokenize = encoder_tokenizer(length)

    def workload_of(n: int, at: float, offset: int):
        ids, mask = tokenize(mix_texts(prepared, easy, n, seed + offset), pad_to=length)
        return Workload.from_arrivals(ids, mask, ArrivalProcess(pattern, at, count=n), seed=seed + offset)

    workload = workload_of(requests, rate, 0)
    host = sc.layer_profiles()["host"]
    common = dict(slo_s=slo_s, slack=sc.slack, address=address, num_cpus=num_cpus)
    warm = serve_plan(model, plan, workload_of(max(8, requests // 2), rate / 2, 1), **common)
    calibration = calibrate(warm, host, source=f"a calibration run of {len(warm.requests)} other requests at "
                                               f"{rate / 2:.3g}/s")
    target = serve_plan(model, plan, workload, progress=progress, **common)
    with torch.no_grad():
        one = model(workload.ids, workload.mask)
    validation, split_queue = (validate_out_of_sample(calibration, target, plan, host, slo_s, slack=sc.slack,
                                                      exits=np.asarray(one.exit_layers), queues=q)
                               for q in ("replica", "split"))
    served = target
    kept = served.served
    same = ((served.labels == np.asarray(one.labels)) & (served.exit_layers == np.asarray(one.exit_layers)))[kept]
    diff = (float((served.logits[torch.as_tensor(kept)] - one.logits[torch.as_tensor(kept)]).abs().max())
            if served.logits is not None and kept.any() else float("nan"))
    return RealRun(plan, validation, bool(same.all()), int((~same).sum()), diff, pattern, rate, split_queue)


@dataclass(frozen=True)
class DriftRun:
    """A served run whose mix drifts, re-planned online: the run, the first plan, the check against the model."""
    served: object                    # serve.ServeRun, with .windows and .replans
    plan: object                      # the plan for the starting mix
    equal: bool                       # every served request's label and exit layer equal the one-process model's
    mismatches: int
    mixes: tuple[float, float]
    rate: float

    def lines(self) -> list[str]:
        s = self.served
        a, b = (f"{100 * m:.0f}:{100 - 100 * m:.0f}" for m in self.mixes)
        out = [f"served {len(s.requests)} requests at {self.rate:.1f}/s, mix {a} then {b}: {s.met} met the SLO, "
               f"{s.dropped} dropped, {len(s.windows)} windows observed"]
        for r in s.replans:
            out.append(f"re-plan at {r.at_s:.1f} s (after window {r.window + 1}): splits {r.old['splits']} x "
                       f"{r.old['replicas']} -> {r.new['splits']} x {r.new['replicas']} for the forecast "
                       + " ".join(f"{x:.2f}" for x in r.forecast))
        if not s.replans:
            out.append("no re-plan: every forecast gave the plan already deployed")
        out.append("outputs equal the model run in one process, request by request" if self.equal else
                   f"{self.mismatches} served requests differ from the model run in one process")
        return out


def drift_run(*, task: str = "sentiment", preset: str = "full", replicas: int = 4, slo_s: float = 1.0,
              batch_size: int = 4, easy: float = 0.8, drift_to: float = 0.2, threshold: float = 0.4,
              rate: float | None = None, requests: int = 120, window_s: float = 2.0, seed: int = 0,
              address: str | None = None, num_cpus: float = 2, replan: Callable | None = None,
              progress: Callable[[int, int], None] | None = None) -> DriftRun:
    """Serve ``requests`` uniform arrivals, the first half of mix ``easy`` and the rest of ``drift_to``, with
    re-planning every ``window_s`` (``replan(forecast)`` defaults to the scenario's optimizer); ``rate`` defaults
    to 80 % of the first plan's goodput. Bad input raises before Ray starts."""
    from workbench.earlyexit.scenario import Scenario
    from workbench.earlyexit.simulator import ArrivalProcess

    if not (isinstance(requests, int) and 2 <= requests <= 10_000):
        raise WorkbenchError(f"a drifting run serves 2..10000 requests, got {requests!r}")
    if not (isinstance(window_s, (int, float)) and np.isfinite(window_s) and window_s > 0):
        raise WorkbenchError(f"window_s is seconds > 0, got {window_s!r}")
    sc = Scenario(model="encoder", task=task, preset=preset, gpus={"host": replicas}, slo_s=slo_s,
                  batch_size=batch_size, easy=easy, threshold=threshold)
    Scenario(model="encoder", task=task, preset=preset, gpus={"host": replicas}, slo_s=slo_s,
             batch_size=batch_size, easy=drift_to, threshold=threshold)        # the second mix is valid too
    if rate is not None and not (isinstance(rate, (int, float)) and np.isfinite(rate) and rate > 0):
        raise WorkbenchError(f"the arrival rate is requests per second > 0, got {rate!r}")
    import torch

    from workbench.data import task_spec
    from workbench.earlyexit.artifacts import mix_texts
    from workbench.earlyexit.serve import Workload, serve_plan
    from workbench.models.tokenizer import encoder_tokenizer

    prepared, model, plan, rate = _ready(sc, threshold, address, rate)
    half = requests // 2
    texts = mix_texts(prepared, easy, half, seed) + mix_texts(prepared, drift_to, requests - half, seed + 1)
    length = task_spec(task).max_length
    ids, mask = encoder_tokenizer(length)(texts, pad_to=length)
    workload = Workload.from_arrivals(ids, mask, ArrivalProcess("uniform", rate, count=requests), seed=seed)
    run = serve_plan(model, plan, workload, slo_s=slo_s, slack=sc.slack, address=address, num_cpus=num_cpus,
                     window_s=window_s, replan=replan if replan is not None else sc.optimize, progress=progress)
    with torch.no_grad():
        one = model(workload.ids, workload.mask)
    served = run.served
    same = (run.labels == np.asarray(one.labels)) & (run.exit_layers == np.asarray(one.exit_layers))
    return DriftRun(run, plan, bool(same[served].all()), int((~same[served]).sum()), (easy, drift_to), rate)
