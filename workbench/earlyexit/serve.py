"""E3's pipelined early-exit serving for real, on Ray Serve (E3 §3.1-§3.3, §4).

A split plan (``.splits``, ``.replicas``, ``.batch_sizes`` and optionally ``.gpu_types``, e.g. the optimizer's
``SplitPlan``) becomes one Ray Serve application (:mod:`workbench.earlyexit.serveapp`): an ingress deployment
that walks each request through one deployment per split, passing the survivors' activations between splits as
object references, so no split holds a request open while a later one works. Each split deployment has the
plan's replicas, each holding the whole early-exit model, runs its layers in ``@serve.batch`` batches of the
plan's size and asks Ray for one unit of its GPU type's custom resource (``gpu_type_<type>``), so on a cluster
it lands on the nodes holding that type (:mod:`workbench.earlyexit.raycluster`).

What the run does, as the paper's serving does it:

- **Backpressure and drops** (§3.1, §4): the ingress and the splits take a bounded number of requests
  (``max_ongoing_requests``) and queue a bounded number more (``max_queued_requests``); a request refused by
  a full queue, or that can no longer return by its deadline (now + the rest of the plan at full batches >
  arrival + SLO: the simulator's ``drop="budget"``), is dropped and counted, so an overloaded run serves what
  can still make it instead of letting every latency grow. ``drop="never"`` serves everyone.
- **Deadline batching** (§4): a split's batch leaves when full or when the slack of the request that opened it
  runs out (arrival + SLO x (1 - slack) - the rest of the plan); ``batch_wait_s`` instead fixes the wait, as
  Ray Serve's plain ``batch_wait_timeout_s`` does.
- **Re-planning** (§3.1, §4): every ``window_s`` the exit layers of the requests served in that window update
  the ARIMA :class:`~workbench.earlyexit.batchprofile.BatchProfileEstimator`; its forecast goes to ``replan``,
  and a plan that differs is deployed in place (``serve.run`` under the same application name: replicas are
  reconfigured, scaled, or moved to another GPU type), make before break: the new plan's splits come up while
  the ingress still routes by the old one, then it switches, and a split the new plan no longer has stays
  until the requests that entered under the old plan are done. :attr:`ServeRun.replans` records each one.
- **Stragglers** (§3.3): with ``exclude_stragglers_after=n`` a replica whose measured batch times exceed its
  split peers' by more than ``straggler_tolerance`` after n batches gets no more work (never a split's last);
  :attr:`ServeRun.stragglers` records when. ``replica_slowdown`` emulates a slower GPU on chosen replicas.

The inputs and results (:class:`ModelSpec`, :class:`Workload`, :class:`ServeRun`, ...) live in
:mod:`workbench.earlyexit.served`, which needs no Ray, and are re-exported here. Their vocabulary and
shapes mirror :mod:`workbench.earlyexit.simulator`: per request ``exit_layer``,
``latency_s``, ``met_slo``, ``dropped``; ``goodput`` (requests meeting the SLO per second, from the first
arrival at 0 to the last answer), ``p50_latency_s``/``p95_latency_s`` over served requests (NumPy's linear
interpolation), ``drop_rate``, ``batch_counts`` per split and a measured :class:`~workbench.timeline.Timeline`
with a lane ``"split i · replica r"`` of ``compute`` spans and a lane ``"split i · replica r queue"`` of
``queue`` spans (a batch's first request entering the replica to the batch's compute start).

Choices where the issue leaves room:

- **The model** is rebuilt inside every replica from a picklable :class:`ModelSpec`: either the untrained
  model of a seed or a full state dict, which the driver puts once into Ray's object store.
- **Fixed length.** Every request is one row of the workload's (n, T) token ids, so a batch is a plain stack
  and no request's result depends on who it was batched with.
- **Threads and CPUs.** A replica runs one torch thread and asks Ray for ``REPLICA_CPUS`` (0.25) of a CPU, so
  8 replicas fit on a 2-core local cluster; that share is only for placement: replicas on one host time-share
  its cores, and the measured times are those.
- **Clock.** Replicas stamp ``time.time()``; every time in the result is seconds after the run's start. On a
  cluster of several hosts deadlines and spans carry each host's clock error.
- **Arrivals** come from :class:`~workbench.earlyexit.simulator.ArrivalProcess` (see
  :meth:`Workload.from_arrivals`); the driver sends each request at its arrival time from one asyncio loop,
  and its latency counts from that scheduled time (``sent_s`` records when it was actually sent).
- **Service times** for the drop and batching rules start from ``service_s`` (or the plan's ``stage_s``) and
  follow the measured batch times as the run goes.
"""
from __future__ import annotations

import asyncio
import math
import threading
import time
import uuid
from collections import Counter
from dataclasses import replace
from typing import Any, Callable

import numpy as np
import torch

from workbench.earlyexit.raycluster import (RaySession, check_reachable, check_type_resources, ray_session,
                                            start_serve, type_resource)
from workbench.earlyexit.served import (ModelSpec, Replan, ServedRequest, ServeRun, Window, Workload, _Plan,
                                        _read_plan, as_spec, check_plan)
from workbench.errors import WorkbenchError
from workbench.timeline import Span, Timeline

REPLICA_THREADS = 1
"""Torch threads per replica (the layer profiles are measured with the same single thread)."""
REPLICA_CPUS = 0.25
"""Ray CPUs each split replica asks for: 8 replicas fit on a 2-core local cluster (placement only)."""
APP_NAME = "workbench-e3"
"""The Ray Serve application a run deploys; a run deletes it when done."""
DEFAULT_BATCH_WAIT_S = 0.05
"""A fixed batch wait for callers that want Ray Serve's plain ``batch_wait_timeout_s`` (``batch_wait_s=``)."""
DROP_RULES = ("budget", "never")
SPLIT_QUEUE_BATCHES = 8
"""Requests a split's callers may queue for it: this many full batches per replica (then it refuses)."""
INGRESS_MIN_REQUESTS = 32
REDEPLOY_TIMEOUT_S = 120.0
"""How long a re-plan waits for its new splits to come up and for the ingress to switch."""
UNBOUNDED_ONGOING = 1_000_000
"""With ``drop="never"`` nothing is refused: the ingress takes every request and queues are unbounded."""
_check_reachable = check_reachable

__all__ = ["ModelSpec", "Workload", "ServedRequest", "ServeRun", "Replan", "Window", "serve_plan", "check_plan",
           "ray_session", "RaySession"]


def _positive_seconds(value, what: str, allow_zero: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if isinstance(value, bool) or not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise WorkbenchError(f"{what} {value!r} must be a finite number of seconds {'>= 0' if allow_zero else '> 0'}")
    return v


# -- the run ----------------------------------------------------------------------------------------

class _Deployer:
    """Builds and (re)deploys the application of each plan generation under one name and one version."""

    def __init__(self, spec: ModelSpec, opts: dict, slo_s: float):
        self.spec, self.opts, self.slo_s = spec, opts, slo_s
        self.version = f"e3-{uuid.uuid4().hex[:12]}"     # fixed for the run: re-plans reconfigure in place
        self.gen = -1
        self.split_cfgs: list[dict] = []

    def configs(self, plan: _Plan) -> tuple[dict, list[dict]]:
        o, n = self.opts, len(plan.splits)
        gen = self.gen + 1
        service = None
        if o["service_s"] is not None:
            service = [float(o["service_s"](i, plan.batch_sizes[i])) for i in range(n)]
        elif plan.stage_s is not None:
            service = list(plan.stage_s)
        budget = self.slo_s * (1.0 - o["slack"])
        bounded = o["drop"] != "never"
        split_cfgs = []
        for i in range(n):
            b, r = plan.batch_sizes[i], plan.replicas[i]
            split_cfgs.append({
                "gen": gen, "index": i, "layers": list(plan.splits[i]), "batch": b, "replicas": r,
                "resource": type_resource(plan.gpu_types[i]) if plan.gpu_types[i] is not None else None,
                "fixed_wait": o["batch_wait_s"], "wait_cap": budget,
                "max_queued": SPLIT_QUEUE_BATCHES * b * r if bounded else -1,
                "slowdown": {str(rr): float(f) for (ii, rr), f in o["slowdown"].items() if ii == i}})
        held = sum((SPLIT_QUEUE_BATCHES + 2) * b * r for b, r in zip(plan.batch_sizes, plan.replicas))
        capacity = max(INGRESS_MIN_REQUESTS, held) if bounded else UNBOUNDED_ONGOING
        cfg = {"gen": gen, "app": APP_NAME, "splits": [list(s) for s in plan.splits], "replicas": list(plan.replicas),
               "batch_sizes": list(plan.batch_sizes), "service_s": service, "slo_s": self.slo_s,
               "slack": o["slack"], "drop": o["drop"] == "budget", "fixed_wait": o["batch_wait_s"],
               "exclude_after": o["exclude_after"], "tolerance": o["tolerance"], "max_ongoing": capacity,
               "max_queued": capacity if bounded else -1}
        return cfg, split_cfgs

    def deploy(self, plan: _Plan):
        """Deploy ``plan`` as the next generation, make before break: first the splits as the new plan wants them
        (replicas run whatever layers a request asks for, so the old plan's requests still pass) while the
        ingress keeps routing by the old plan; once each of the new plan's splits has a running replica, the
        ingress switches; the old plan's extra splits go when its requests are done (one SLO later). Returns
        (handle, seconds until the switch, when it switched)."""
        from ray import serve

        from workbench.earlyexit.serveapp import build_app, split_name

        def run(ingress_cfg, splits, wait):
            app = build_app(self.spec, ingress_cfg, splits, self.version)
            logs = {"log_level": "WARNING", "enable_access_log": False}
            if wait:
                return serve.run(app, name=APP_NAME, route_prefix=None, logging_config=logs)
            return serve.run_many([serve.RunTarget(target=app, name=APP_NAME, route_prefix=None, logging_config=logs)],
                                  wait_for_applications_running=False)[0]

        cfg, split_cfgs = self.configs(plan)
        draining = self.split_cfgs[len(split_cfgs):]          # the old plan's later splits, kept while it drains
        began = time.perf_counter()
        if self.gen < 0:
            handle = run(cfg, split_cfgs, wait=True)
        else:
            run(self.cfg, split_cfgs + draining, wait=False)   # the new splits come up; routing unchanged
            _wait_for(lambda: all(_running(split_name(i)) for i in range(len(split_cfgs))), REDEPLOY_TIMEOUT_S,
                      "the new plan's splits to have a running replica")
            handle = run(cfg, split_cfgs + draining, wait=False)
            _wait_for(lambda: handle.generation.remote().result(timeout_s=REDEPLOY_TIMEOUT_S) == cfg["gen"],
                      REDEPLOY_TIMEOUT_S, "the ingress to take the new plan")
        took = time.perf_counter() - began
        live = time.time()
        self.gen, self.split_cfgs, self.cfg = cfg["gen"], split_cfgs, cfg
        if draining:
            # Requests that entered under the old plan answer within the SLO (or are dropped): then let go.
            time.sleep(self.slo_s)
            run(cfg, split_cfgs, wait=False)
        return handle, took, live


def _running(deployment: str) -> bool:
    """Whether a deployment of the run's application has a running replica."""
    from ray import serve

    app = serve.status().applications.get(APP_NAME)
    found = app.deployments.get(deployment) if app is not None else None
    if found is None:
        return False
    return any(str(getattr(state, "value", state)) == "RUNNING" and n > 0 for state, n in found.replica_states.items())


def _wait_for(ready: Callable[[], bool], timeout_s: float, what: str) -> None:
    limit = time.time() + timeout_s
    while not ready():
        if time.time() > limit:
            raise WorkbenchError(f"re-plan: waited {timeout_s:.0f} s for {what}; the cluster may lack the resources")
        time.sleep(0.2)


def _drive(handle, workload: Workload, timeout_s: float, progress: Callable[[int, int], None] | None,
           monitor: Callable | None) -> tuple[float, list]:
    """Send each request at its arrival time; returns the start time and (sent, done, answer) per request."""
    n = len(workload)
    out: list = [None] * n
    done_count = 0

    async def one(j: int, t0: float) -> None:
        nonlocal done_count
        from ray.serve.exceptions import BackPressureError

        arrival = t0 + float(workload.arrival_s[j])
        delay = arrival - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        sent = time.time()
        # clone: a row view would pickle the whole (n, T) storage
        request = {"id": j, "ids": workload.ids[j].clone(), "mask": workload.mask[j].clone(), "arrival": arrival}
        try:
            answer = await handle.remote(request)
        except BackPressureError:
            answer = {"id": j, "dropped": True, "split": -1, "at": time.time(), "reason": "queue full", "trace": []}
        out[j] = (sent, time.time(), answer)
        done_count += 1
        if progress is not None:
            progress(done_count, n)

    async def main() -> float:
        t0 = time.time()
        watcher = asyncio.create_task(monitor(t0, out)) if monitor is not None else None
        try:
            await asyncio.wait_for(asyncio.gather(*(one(j, t0) for j in range(n))), timeout_s)
        except asyncio.TimeoutError:
            raise WorkbenchError(f"the served run did not finish within {timeout_s:.0f} s "
                                 f"({done_count} of {n} requests answered)") from None
        finally:
            if watcher is not None:
                watcher.cancel()
                try:
                    await watcher
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the run's own outcome matters more
                    pass
        return t0

    return _run_async(main), out


def _run_async(main):
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    # Called from a running event loop (a notebook): drive from a thread with its own loop.
    box: dict = {}

    def worker():
        try:
            box["value"] = asyncio.run(main())
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=worker, name="e3-serve-driver")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class _Monitor:
    """Every window: the served requests' exits update the estimator; a forecast that moves the plan redeploys
    (in the background: windows go on being observed meanwhile; one redeploy at a time)."""

    def __init__(self, deployer: _Deployer, plan: _Plan, num_layers: int, window_s: float, estimator, replan,
                 lock: threading.Lock):
        self.deployer, self.plan, self.num_layers = deployer, plan, num_layers
        self.window_s, self.estimator, self.replan, self.lock = window_s, estimator, replan, lock
        self.target = plan                # the plan deployed, or being deployed
        self.windows: list[Window] = []
        self.replans: list[Replan] = []
        self.deploying: asyncio.Task | None = None

    async def __call__(self, t0: float, out: list) -> None:
        k = 0
        while True:
            end = t0 + (k + 1) * self.window_s
            await asyncio.sleep(max(end - time.time(), 0.0))
            start = end - self.window_s
            exits = [int(a["exit_layer"]) for item in out if item is not None
                     for _, done, a in [item] if start <= done < end and not a.get("dropped")]
            if self.deploying is not None and self.deploying.done():
                self.deploying = None
            if exits:
                new, forecast = await asyncio.to_thread(self._window, k, start - t0, end - t0, exits)
                if new is not None and self.deploying is None and new.key() != self.target.key():
                    self.target = new
                    self.deploying = asyncio.create_task(asyncio.to_thread(self._deploy, k, new, forecast, t0))
            k += 1

    def _window(self, k: int, start_s: float, end_s: float, exits: list[int]):
        observed = self.estimator.update(exits)
        details = self.estimator.forecast_details()
        forecast = details.profile
        note = ""
        new = None
        if self.replan is not None:
            try:
                candidate = self.replan(forecast)
                if candidate:
                    new = _read_plan(candidate, self.num_layers)
                    check_type_resources(new.type_needs())
            except WorkbenchError as err:
                note, new = f"re-plan not used: {err}", None
        self.windows.append(Window(k, start_s, end_s, len(exits), tuple(observed.remaining),
                                   tuple(forecast.remaining), tuple(details.methods), note))
        return new, tuple(forecast.remaining)

    def _deploy(self, k: int, new: _Plan, forecast: tuple, t0: float) -> None:
        with self.lock:               # held until recorded: the run deletes its application only after
            try:
                _, took, live = self.deployer.deploy(new)
            except Exception as err:  # noqa: BLE001 - a failed re-plan is reported with its window; serving goes on
                self.windows = [replace(w, note=f"re-plan failed: {err}") if w.index == k else w
                                for w in self.windows]
                self.target = self.plan
                return
            self.replans.append(Replan(live - t0, k, self.plan.to_dict(), new.to_dict(), forecast, took))
            self.plan = new


def _results(out: list, t0: float, workload: Workload, plan: _Plan, slo_s: float, num_classes: int,
             deploy_s: float, report: dict, monitor: _Monitor | None) -> ServeRun:
    n = len(workload)
    requests, logits = [], torch.full((n, num_classes), math.nan)
    batches: dict[tuple, dict] = {}
    nodes: dict[tuple[int, int], dict] = {}
    for j, (sent, done, answer) in enumerate(out):
        arrival = float(workload.arrival_s[j])
        completion = done - t0
        for record in answer.get("trace") or []:
            batches[(record["split"], record["rid"], record["index"])] = record
            nodes[(record["split"], record["replica"])] = {"node": record["node"], "ip": record["ip"]}
        if answer.get("dropped"):
            requests.append(ServedRequest(j, arrival, -1, -1, -1, completion, math.nan, False, sent - t0, math.nan,
                                          True, int(answer.get("split", -1)), str(answer.get("reason", "")),
                                          int(answer.get("gen", 0))))
            continue
        last = answer["trace"][-1]
        latency = completion - arrival
        requests.append(ServedRequest(j, arrival, int(answer["exit_layer"]), int(last["split"]), int(answer["label"]),
                                      completion, latency, latency <= slo_s, sent - t0, answer["exited"] - t0,
                                      plan=int(answer.get("gen", 0))))
        logits[j] = answer["logits"]
    n_splits = max([len(plan.splits)] + [rec["split"] + 1 for rec in batches.values()])
    counts = [Counter() for _ in range(n_splits)]
    spans = []
    for (i, _, k), rec in sorted(batches.items(), key=lambda kv: kv[1]["start"]):
        a, b = rec["layers"]
        r = rec["replica"]
        counts[i][rec["size"]] += 1
        meta = {"split": i, "replica": r, "batch": rec["size"], "layers": [a, b - 1], "index": k,
                "requests": list(rec["ids"]), "rows": list(rec["rows"]), "node": rec["node"], "ip": rec["ip"],
                "plan": rec.get("gen", 0)}            # the plan in force when its requests were routed
        if rec.get("entered"):                 # each request's own arrival at the replica
            meta["entered"] = [t - t0 for t in rec["entered"]]
        lane = f"split {i} · replica {r}"
        spans.append(Span(lane + " queue", "queue", rec["queued"] - t0, rec["start"] - t0,
                          f"batch of {rec['size']} waiting", dict(meta)))
        spans.append(Span(lane, "compute", rec["start"] - t0, rec["end"] - t0,
                          f"layers {a}-{b - 1} · batch of {rec['size']}", meta))
    spans.sort(key=lambda s: s.start)
    timeline = Timeline(tuple(spans), "measured", name="E3 served run (Ray Serve)")
    duration = max(r.completion_s for r in requests)
    served = np.array([r.latency_s for r in requests if not r.dropped])
    met = sum(r.met_slo for r in requests)
    stragglers = tuple(dict(e, at_s=e["at"] - t0) for e in report.get("exclusions", []))
    return ServeRun(
        requests=tuple(requests), timeline=timeline,
        batch_counts=tuple(dict(sorted(c.items())) for c in counts),
        splits=plan.splits, replicas=plan.replicas, batch_sizes=plan.batch_sizes, slo_s=slo_s, duration_s=duration,
        goodput=met / duration if duration > 0 else 0.0,
        throughput=served.size / duration if duration > 0 else 0.0,
        p50_latency_s=float(np.percentile(served, 50)) if served.size else math.nan,
        p95_latency_s=float(np.percentile(served, 95)) if served.size else math.nan,
        drop_rate=(n - served.size) / n, deploy_s=deploy_s, logits=logits, gpu_types=plan.gpu_types,
        replans=tuple(monitor.replans) if monitor else (), windows=tuple(monitor.windows) if monitor else (),
        stragglers=stragglers, replica_nodes=nodes)


def serve_plan(model_spec: ModelSpec | Any, plan: Any, workload: Workload, *, slo_s: float,
               address: str | None = None, num_cpus: float = 2, batch_wait_s: float | None = None,
               slack: float = 0.2, drop: str = "budget", service_s: Callable[[int, int], float] | None = None,
               timeout_s: float | None = None, progress: Callable[[int, int], None] | None = None,
               window_s: float | None = None, replan: Callable[[Any], Any] | None = None, estimator=None,
               exclude_stragglers_after: int | None = None, straggler_tolerance: float = 0.2,
               replica_slowdown: dict[tuple[int, int], float] | None = None) -> ServeRun:
    """Deploy ``plan`` on Ray Serve with the model of ``model_spec`` (a :class:`ModelSpec` or an
    EarlyExitModel), send ``workload``'s requests at their arrival times, and measure the run.

    - ``plan``: anything with ``.splits`` (contiguous (start, end) layer ranges covering the model),
      ``.replicas`` and ``.batch_sizes`` (whole numbers >= 1 per split); ``.gpu_types`` (optional) place each
      split on the nodes holding its type's resource.
    - ``slo_s``/``slack``: a request meets the SLO when its latency is <= slo_s; batching plans for
      ``slo_s x (1 - slack)``. ``drop``: "budget" (drop what cannot return in time) or "never".
    - ``address``/``num_cpus``: as :func:`~workbench.earlyexit.raycluster.ray_session`; a Ray this call starts
      or joins is closed (with the Serve it started) when the run ends; one already initialised is reused.
    - ``batch_wait_s``: a fixed batch wait instead of the deadline rule. ``service_s(split, batch)``: seconds
      a replica takes for a batch, the rules' first estimate (default: the plan's ``stage_s``, if any).
    - ``window_s``/``estimator``/``replan``: every window the served exits update ``estimator`` (default a
      :class:`~workbench.earlyexit.batchprofile.BatchProfileEstimator`); ``replan(forecast)`` returns a
      plan-like object, deployed in place when it differs.
    - ``exclude_stragglers_after``/``straggler_tolerance``/``replica_slowdown``: see the module docstring.
    - ``timeout_s``: give up (WorkbenchError) if the requests are not all answered by then (default: the
      last arrival plus 120 s). ``progress(done, total)``: called as requests are answered.

    Every input is checked before Ray is touched.
    """
    spec = as_spec(model_spec)
    first = _read_plan(plan, spec.num_layers)
    slo_s = _positive_seconds(slo_s, "slo_s")
    if batch_wait_s is not None:
        batch_wait_s = _positive_seconds(batch_wait_s, "batch_wait_s", allow_zero=True)
    if not (isinstance(slack, (int, float)) and not isinstance(slack, bool) and 0 <= slack < 1):
        raise WorkbenchError(f"slack {slack!r} is a fraction of the SLO in [0, 1)")
    if drop not in DROP_RULES:
        raise WorkbenchError(f"drop rule {drop!r} is not one of {', '.join(DROP_RULES)}")
    if not isinstance(workload, Workload):
        raise WorkbenchError(f"workload must be a Workload (ids, mask, arrival_s); got {type(workload).__name__}")
    workload.check(getattr(spec.cfg, "max_positions", None))
    if window_s is not None:
        window_s = _positive_seconds(window_s, "window_s")
    elif replan is not None or estimator is not None:
        raise WorkbenchError("replan and estimator work per window: give window_s (seconds) too")
    if replan is not None and not callable(replan):
        raise WorkbenchError("replan must be a function of a BatchProfile returning a plan")
    if exclude_stragglers_after is not None and not (
            isinstance(exclude_stragglers_after, int) and not isinstance(exclude_stragglers_after, bool)
            and exclude_stragglers_after >= 1):
        raise WorkbenchError(f"exclude_stragglers_after {exclude_stragglers_after!r} is a number of batches >= 1")
    if not (isinstance(straggler_tolerance, (int, float)) and straggler_tolerance >= 0):
        raise WorkbenchError(f"straggler_tolerance {straggler_tolerance!r} must be >= 0")
    slowdown = dict(replica_slowdown or {})
    for key, factor in slowdown.items():
        if not (isinstance(key, tuple) and len(key) == 2 and 0 <= key[0] < len(first.splits)
                and 0 <= key[1] < first.replicas[key[0]]):
            raise WorkbenchError(f"replica_slowdown key {key!r} is not a (split, replica) of this plan")
        if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor >= 1):
            raise WorkbenchError(f"replica_slowdown {factor!r} for {key} must be a factor >= 1")
    last = float(np.max(workload.arrival_s))
    timeout_s = last + 120.0 if timeout_s is None else _positive_seconds(timeout_s, "timeout_s")
    need = sum(first.replicas) * REPLICA_CPUS
    import ray

    if not ray.is_initialized() and address is None and need > num_cpus + 1e-9:
        raise WorkbenchError(f"the plan has {sum(first.replicas)} replicas x {REPLICA_CPUS} CPU = {need:g} CPUs, "
                             f"more than the {num_cpus:g} of the local Ray it would start: give fewer replicas or "
                             f"more num_cpus")
    if window_s is not None and estimator is None:
        from workbench.earlyexit.batchprofile import BatchProfileEstimator
        estimator = BatchProfileEstimator(spec.num_layers)

    session = ray_session(address, num_cpus)
    try:
        if need > session.num_cpus + 1e-9:
            raise WorkbenchError(f"the plan has {sum(first.replicas)} replicas x {REPLICA_CPUS} CPU = {need:g} "
                                 f"CPUs, more than the Ray cluster's {session.num_cpus:g}: give fewer replicas or a "
                                 f"larger cluster")
        check_type_resources(first.type_needs(), address)
        if spec.state is not None and isinstance(spec.state, dict):
            spec = ModelSpec(spec.cfg, spec.num_classes, spec.threshold, spec.disabled, spec.seed,
                             ray.put(spec.state))
        start_serve()
        opts = {"service_s": service_s, "slack": float(slack), "batch_wait_s": batch_wait_s, "drop": drop,
                "exclude_after": exclude_stragglers_after, "tolerance": float(straggler_tolerance),
                "slowdown": slowdown}
        deployer = _Deployer(spec, opts, slo_s)
        lock = threading.Lock()          # a re-plan's deploy finishes before the application is deleted
        try:
            handle, deploy_s, _ = deployer.deploy(first)
            monitor = (_Monitor(deployer, first, spec.num_layers, window_s, estimator, replan, lock)
                       if window_s is not None else None)
            t0, out = _drive(handle, workload, timeout_s, progress, monitor)
            report = _run_async(lambda: _report(handle))
        finally:
            with lock:
                _delete_app()
        return _results(out, t0, workload, first, slo_s, spec.num_classes, deploy_s, report, monitor)
    finally:
        if session.started:
            session.close()


async def _report(handle) -> dict:
    try:
        return await handle.report.remote()
    except Exception:  # noqa: BLE001 - the run's requests are what matter; a lost report leaves no exclusions
        return {}


def _delete_app() -> None:
    from ray import serve

    try:
        serve.delete(APP_NAME)
    except Exception:  # noqa: BLE001 - the run's own error matters more
        pass
