"""E3's evaluation at the paper's scale, simulated: goodput of E3 against the early-exit model run as is and
against the stock model, cost for a fixed goodput, batch-profile misprediction, disabled ramps. (The check of
the simulator against real Ray Serve runs is :mod:`workbench.earlyexit.validation`.)

Every function is pure (plain inputs, plain dataclasses and rows out) and every goodput comes from the SimPy
simulator (:mod:`workbench.earlyexit.simulator`) with per-layer service times, not from the optimizer's own
number; the optimizer's (and the analytic capacities below) only say where to start looking.

The three systems (paper §5.1), on the same GPUs:

- **E3**: :func:`~workbench.earlyexit.optimizer.optimize_splits` plans splits, replicas and GPU types with every
  replica at the table's batch ``b`` (survivors merged into full batches between splits). Where the early-exit
  model as is, data parallel on every GPU (which one GPU type per split cannot express), has the larger capacity,
  E3 deploys that instead, as the paper's optimizer may; the rows say which (``deploys``). Ramps run at every
  layer (the paper's main results do not use its exit wrapper).
- **as is**: the early-exit model on every GPU, data parallel at batch ``b``; samples leave right after their
  ramp and the batch shrinks as it goes (the simulator's per-layer times).
- **stock**: the same model without exits (no ramps but the classifier): every sample runs every layer.

Deployments are pools of replicas whose sustained goodput the simulator measures (:mod:`workbench.earlyexit.pools`:
how mixed GPUs are fed, how requests queue and are dropped, how a sustained rate is found).

Easy:hard mixes. The paper bins GLUE inputs into easy and hard ones and varies their ratio (80:20, 50:50,
20:80). A mix is a :class:`~workbench.earlyexit.batchprofile.BatchProfile`: measured on the trained model
(``workbench.earlyexit.artifacts.mix_profile``, 6 layers, rescaled to the deeper model by relative depth with
:func:`rescale_profile`) when given, else :func:`parametric_mix`: the easy share leaves along the whole model
so that half an 80:20 batch has left by the middle layer (the paper's Figure 3, DeeBERT at ramp 6 of 12), the
hard share runs to the end.

Latencies are read off published BERT batch curves (:func:`~workbench.earlyexit.profiles.gpu_profile`; derived
for the P100, K80 and A6000), transfers fp32 activations over 10 Gbps, one merged batch to one replica. The
band of every goodput ratio is over the curves' saturation (``saturation``: flatter and steeper by the
sources' disagreement), from analytic capacities: a simulated ratio can lie just outside it.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from workbench.earlyexit.batchprofile import BatchProfile
from workbench.earlyexit.limits import check_easy_share
from workbench.earlyexit.pools import (EvalSettings, Pool, Sustained, best_pools, data_parallel, latency_for,
                                       pool_capacity, sustained_goodput, transfer_fn, worst_latency)
from workbench.errors import WorkbenchError

MIXES = {"80:20": 0.8, "50:50": 0.5, "20:80": 0.2}
CLUSTER_PRESETS = {"homogeneous": "e3-v100", "heterogeneous": "e3-mixed"}
"""The paper's two clusters of equal cost ($0.013 per second, §5.2): 16 V100, and 6 V100 + 8 P100 + 15 K80."""
SYSTEMS = ("e3", "as_is", "stock")
PAPER_MISPREDICTION_LOSS_PCT = (4, 8)
PAPER_RAMP_GAIN_PCT = 16
PAPER_TARGET_GOODPUT = 6000.0


def cluster_gpus(cluster: str | Mapping[str, int]) -> dict[str, int]:
    """GPU type -> count of ``"homogeneous"``, ``"heterogeneous"``, a devices cluster name, or a mapping."""
    if isinstance(cluster, Mapping):
        return {str(g): int(n) for g, n in cluster.items() if n}
    from workbench.devices import CLUSTERS

    name = CLUSTER_PRESETS.get(cluster, cluster)
    if name not in CLUSTERS:
        raise WorkbenchError(f"unknown cluster {cluster!r}; known: {', '.join(CLUSTER_PRESETS)}")
    return CLUSTERS[name].counts()


# ------------------------------------------------------------------------------------------------ mixes

EASY_LEFT_AT_MIDDLE = 0.375
"""The share of the easy inputs still present at the middle layer in :func:`parametric_mix`: with 80:20 it
leaves half the batch there, as the paper's Figure 3 shows for DeeBERT (about half gone by ramp 6 of 12)."""


def parametric_mix(easy: float, num_layers: int) -> BatchProfile:
    """The fallback profile of an easy:hard mix with ``easy`` easy inputs: the easy ones leave along the whole
    model, ``(1 - depth) ** a`` of them still present at a relative depth, ``a`` set so that
    :data:`EASY_LEFT_AT_MIDDLE` remain at the middle (the paper's Figure 3); the hard ones run to the end."""
    check_easy_share(easy)
    a = math.log(EASY_LEFT_AT_MIDDLE) / math.log(0.5)
    left = [(1 - easy) + easy * (1 - (k + 1) / num_layers) ** a for k in range(num_layers)]
    return BatchProfile.nearest(left[:-1] + [0.0])


def rescale_profile(profile: BatchProfile, num_layers: int) -> BatchProfile:
    """``profile`` stretched onto ``num_layers`` layers by relative depth: the fraction left after layer k of
    the new model is the old profile's at depth (k + 1) / num_layers, linear between its layers."""
    old = np.concatenate([[1.0], np.asarray(profile.remaining, dtype=float)])
    depth = np.linspace(0, 1, old.size)
    new = np.interp((np.arange(num_layers) + 1) / num_layers, depth, old)
    new[-1] = 0.0
    return BatchProfile.nearest(new)


def mix_profiles(num_layers: int, measured: Mapping[str, BatchProfile] | None = None,
                 mixes: Iterable[str] = MIXES) -> dict[str, tuple[BatchProfile, str]]:
    """Each mix's profile on ``num_layers`` layers and where it came from ("measured" or "parametric")."""
    out = {}
    for mix in mixes:
        if mix not in MIXES:
            raise WorkbenchError(f"unknown mix {mix!r}; known: {', '.join(MIXES)}")
        if measured and mix in measured:
            out[mix] = (rescale_profile(measured[mix], num_layers), "measured")
        else:
            out[mix] = (parametric_mix(MIXES[mix], num_layers), "parametric")
    return out


def mispredicted(profile: BatchProfile, error: float) -> BatchProfile:
    """The profile an estimator off by ``error`` would give: every fraction left times ``1 + error`` (the
    paper's example: 8 of 16 left predicted as 12 at +50%), clipped to [0, 1]."""
    return BatchProfile.nearest([min(1.0, max(0.0, f * (1 + error))) for f in profile.remaining])


# ------------------------------------------------------------------------------------------- the systems

def e3_plan(batch: int, plan_profile: BatchProfile, gpus: Mapping[str, int], profiles: Mapping[str, Any],
            scenario: EvalSettings, *, prices: Mapping[str, float] | None = None, **options):
    """E3's plan with every replica at batch ``batch`` (:func:`~workbench.earlyexit.optimizer.optimize_splits`);
    None when none meets the SLO. ``options``: more of the optimizer's keywords (request_rate, alpha, ...)."""
    from workbench.earlyexit.optimizer import optimize_splits

    plan = optimize_splits(latency_for(profiles, True), list(plan_profile.remaining), dict(gpus), scenario.slo_s,
                           transfer_s=transfer_fn(scenario.shape), slack=scenario.slack, batch_size=batch,
                           num_layers=len(plan_profile), prices=prices, **options)
    return plan if plan else None


def plan_pool(plan, ramps: Any = True) -> Pool:
    """A :class:`Pool` of a ``SplitPlan`` with ``ramps`` enabled (see :class:`Pool`)."""
    return Pool(tuple(plan.splits), tuple(plan.replicas), tuple(plan.batch_sizes), tuple(plan.gpu_types),
                tuple(plan.transfers_s), ramps=ramps)


def useless_ramps(plan, profile: BatchProfile, profiles: Mapping[str, Any]) -> frozenset[int]:
    """The ramps inside the plan's splits that E3 disables (§3.4): greedily, from the model's end, each whose
    removal raises the plan's analytic capacity (its own time saved outweighs the later layers the samples
    that left by it now run). A split's last ramp stays: its survivors are counted there."""
    ends = {e - 1 for _, e in plan.splits}
    enabled = set(range(len(profile)))
    best = pool_capacity(plan_pool(plan, frozenset(enabled)), profile, latency_for(profiles, frozenset(enabled)))
    for k in sorted(set(range(len(profile))) - ends, reverse=True):
        trial = frozenset(enabled - {k})
        got = pool_capacity(plan_pool(plan, trial), profile, latency_for(profiles, trial))
        if got > best:
            enabled, best = set(trial), got
    return frozenset(set(range(len(profile))) - enabled)


def _price(gpus: Mapping[str, int]) -> float:
    from workbench.devices import PRESETS

    return sum(PRESETS[g].price_per_s * n for g, n in gpus.items())


def _fitting(pools: list[Pool], profiles, scenario: EvalSettings) -> list[Pool]:
    return [p for p in pools if worst_latency(p, latency_for(profiles, p.ramps)) <= scenario.budget_s + 1e-12]


def e3_deployment(batch: int, plan_profile: BatchProfile, gpus: Mapping[str, int], profiles: Mapping[str, Any],
                  scenario: EvalSettings) -> tuple[list[Pool], Any]:
    """What E3 runs at ``batch``: its best plan (:func:`e3_plan`), or the early-exit model as is on every GPU
    when that has the larger capacity under ``plan_profile`` (the optimizer's no-cut plan puts one GPU type
    on the whole model; data parallel over every type it cannot express). Returns the pools and the plan
    (None for the fallback)."""
    plan = e3_plan(batch, plan_profile, gpus, profiles, scenario)
    as_is = _fitting(data_parallel(batch, gpus, len(plan_profile), exits=True), profiles, scenario)
    lat = latency_for(profiles, True)
    mine = pool_capacity(plan_pool(plan), plan_profile, lat) if plan else 0.0
    theirs = sum(pool_capacity(p, plan_profile, lat) for p in as_is)
    if plan and mine >= theirs:
        return [plan_pool(plan)], plan
    return as_is, None


def system_pools(system: str, batch: int, profile: BatchProfile, gpus: Mapping[str, int],
                 profiles: Mapping[str, Any], scenario: EvalSettings) -> tuple[list[Pool], Any]:
    """The deployment of ``system`` at ``batch`` on ``gpus`` (and E3's plan, else None)."""
    L = len(profile)
    if system == "e3":
        return e3_deployment(batch, profile, gpus, profiles, scenario)
    if system in ("as_is", "stock"):
        return _fitting(data_parallel(batch, gpus, L, exits=system == "as_is"), profiles, scenario), None
    raise WorkbenchError(f"unknown system {system!r}; known: {', '.join(SYSTEMS)}")


def _row(cluster: str, mix: str, batch: int, system: str, pools: list[Pool], got: Sustained, plan) -> dict:
    gpus: dict[str, int] = {}
    for p in pools:
        for g, n in p.gpus.items():
            gpus[g] = gpus.get(g, 0) + n
    deploys = ((f"its plan, {len(plan.splits)} split(s)" if plan is not None else "the model as is, data parallel")
               if system == "e3" else system)
    return {"cluster": cluster, "mix": mix, "batch": batch, "system": system, "deploys": deploys,
            "goodput": got.goodput,
            "capacity": got.capacity, "optimizer_goodput": plan.goodput if plan else math.nan,
            "offered_rate": got.rate, "attainment": got.attainment, "p50_ms": 1e3 * got.p50_latency_s,
            "p95_ms": 1e3 * got.p95_latency_s, "gpus": sum(gpus.values()), "cost_per_s": _price(gpus),
            "simulations": got.simulations, "deployment": _describe(pools)}


def _describe(pools: Sequence[Pool]) -> str:
    return " | ".join(p.describe() for p in pools) or "none fits"


def capacities(batch: int, profile: BatchProfile, gpus: Mapping[str, int], profiles: Mapping[str, Any],
               scenario: EvalSettings) -> dict[str, float]:
    """Each system's analytic capacity (input samples per second, :func:`pool_capacity`) at ``batch``."""
    out = {}
    for system in SYSTEMS:
        pools, _ = system_pools(system, batch, profile, gpus, profiles, scenario)
        out[system] = sum(pool_capacity(p, profile, latency_for(profiles, p.ramps)) for p in pools)
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (math.inf if a > 0 else math.nan)


def goodput_table(batches: Sequence[int] = (1, 2, 4, 8, 16), mixes: Iterable[str] = tuple(MIXES),
                  clusters: Iterable[str] = ("homogeneous", "heterogeneous"), scenario: EvalSettings = EvalSettings(),
                  measured: Mapping[str, BatchProfile] | None = None) -> list[dict]:
    """Figures 7, 13 and 16: simulated goodput of E3, the as-is early-exit model and the stock model per
    cluster, mix and batch size (every replica at that batch), with E3's ratio over each; and the band of those
    ratios over the GPU curves' saturation: the smallest and largest ratio of analytic capacities with the
    published curves and with their rise above batch 1 flatter and steeper by the sources' disagreement
    (:data:`~workbench.earlyexit.profiles.SATURATIONS`)."""
    from workbench.earlyexit.profiles import gpu_profiles, model_shape

    L = model_shape(scenario.shape)[1]
    profs = mix_profiles(L, measured, mixes)
    rows = []
    for cluster in clusters:
        gpus = cluster_gpus(cluster)
        profiles = gpu_profiles(gpus, scenario.shape)
        bands = {sat: gpu_profiles(gpus, scenario.shape, saturation=sat) for sat in ("flatter", "steeper")}
        for mix, (profile, origin) in profs.items():
            for batch in batches:
                got = {}
                for system in SYSTEMS:
                    pools, plan = system_pools(system, batch, profile, gpus, profiles, scenario)
                    pools, sustained = best_pools(pools, profile, profiles, scenario)
                    got[system] = _row(cluster, mix, batch, system, pools, sustained, plan)
                    got[system]["mix_profile"] = origin
                band = {sat: capacities(batch, profile, gpus, alt, scenario) for sat, alt in bands.items()}
                band["published"] = {s: got[s]["capacity"] for s in SYSTEMS}
                for system in SYSTEMS:
                    row = got[system]
                    for sat in bands:
                        row[f"capacity_{sat}"] = band[sat][system]
                    for other in ("as_is", "stock"):
                        if system == "e3":
                            row[f"e3_over_{other}"] = _ratio(got["e3"]["goodput"], got[other]["goodput"])
                            ratios = [_ratio(band[sat]["e3"], band[sat][other]) for sat in band]
                            row[f"e3_over_{other}_band"] = (float(min(ratios)), float(max(ratios)))
                        else:
                            row[f"e3_over_{other}"] = math.nan
                            row[f"e3_over_{other}_band"] = (math.nan, math.nan)
                    rows.append(row)
    return rows


def cheapest_data_parallel(capacity: Mapping[str, float], prices: Mapping[str, float], target: float,
                           max_per_type: int) -> dict[str, int] | None:
    """The cheapest GPU counts (then the fewest GPUs) whose data-parallel capacities (input samples per second
    per GPU of each type) add up to ``target``; None when ``max_per_type`` of each do not reach it."""
    types = [g for g, c in capacity.items() if c > 0]
    if not types:
        return None
    grids = np.meshgrid(*[np.arange(max_per_type + 1)] * len(types), indexing="ij")
    n = np.stack([g.ravel() for g in grids], axis=1)
    served = n @ np.array([capacity[g] for g in types])
    ok = served >= target * (1 - 1e-12)
    if not ok.any():
        return None
    cost = n @ np.array([prices[g] for g in types])
    idx = np.nonzero(ok)[0]
    best = idx[np.lexsort((n[idx].sum(axis=1), cost[idx]))[0]]
    return {g: int(k) for g, k in zip(types, n[best]) if k}


def _span(s: int, e: int) -> str:
    return f"{s}" if e == s + 1 else f"{s}-{e - 1}"


def cost_table(batches: Sequence[int] = (1, 2, 4, 8, 16), mixes: Iterable[str] = tuple(MIXES),
               clusters: Iterable[str] = ("homogeneous", "heterogeneous"), scenario: EvalSettings = EvalSettings(),
               target: float = PAPER_TARGET_GOODPUT, alpha: float = 1.0, max_per_type: int = 64,
               measured: Mapping[str, BatchProfile] | None = None) -> list[dict]:
    """Figures 14 and 15: what each system pays for ``target`` input samples per second, every replica at the
    batch size, buying up to ``max_per_type`` GPUs of each of the cluster's types (Figure 14 the homogeneous
    cluster's, Figure 15 the heterogeneous one's).

    The baselines buy the cheapest data-parallel counts (:func:`cheapest_data_parallel`, each GPU's capacity
    analytic); E3 asks its optimizer for the cheapest plan that sustains the target (``request_rate``: batches
    fill at that rate, and that wait counts in the SLO) with ``alpha``: its cost at most ``alpha`` x the
    cheaper baseline's (the paper's Cost <= alpha x Cost_baseline); where the early-exit model as is costs less
    (or E3 has no plan within alpha), E3 runs that, as in the goodput table. Analytic, not simulated."""
    from workbench.devices import PRESETS
    from workbench.earlyexit.profiles import gpu_profiles, model_shape

    L = model_shape(scenario.shape)[1]
    rows = []
    for cluster in clusters:
        types = tuple(cluster_gpus(cluster))
        prices = {g: PRESETS[g].price_per_s for g in types}
        profiles = gpu_profiles(types, scenario.shape)
        for mix, (profile, origin) in mix_profiles(L, measured, mixes).items():
            for batch in batches:
                bought = {}
                for system in ("as_is", "stock"):
                    cap = {}
                    for g in types:
                        pools, _ = system_pools(system, batch, profile, {g: 1}, profiles, scenario)
                        cap[g] = sum(pool_capacity(p, profile, latency_for(profiles, p.ramps)) for p in pools)
                    bought[system] = cheapest_data_parallel(cap, prices, target, max_per_type)
                base_costs = [sum(prices[g] * n for g, n in b.items()) for b in bought.values() if b]
                base = min(base_costs) if base_costs else math.inf
                plan = e3_plan(batch, profile, {g: max_per_type for g in types}, profiles, scenario,
                               prices=prices, request_rate=target,
                               **({"alpha": alpha, "baseline_cost_per_s": base} if math.isfinite(base) else {}))
                if plan is not None and plan.goodput < target * (1 - 1e-9):
                    plan = None
                mine = sum(prices[g] * n for g, n in plan.gpus_used.items()) if plan is not None else math.inf
                as_is = bought["as_is"]
                if as_is and sum(prices[g] * n for g, n in as_is.items()) < mine:   # E3 runs the model as is
                    plan = None
                bought["e3"] = dict(plan.gpus_used) if plan is not None else as_is
                for system in SYSTEMS:
                    counts = bought[system]
                    cost = sum(prices[g] * n for g, n in counts.items()) if counts else math.inf
                    rows.append({"cluster": cluster, "mix": mix, "mix_profile": origin, "batch": batch,
                                 "system": system, "target": target, "alpha": alpha if system == "e3" else math.nan,
                                 "gpus_for_target": sum(counts.values()) if counts else math.inf,
                                 "cost_per_s_for_target": cost,
                                 "bought": " ".join(f"{n}x{g}" for g, n in counts.items()) if counts else "none",
                                 "plan": ((" | ".join(f"{_span(st.start, st.end)} on {st.replicas}x{st.gpu_type}"
                                                      for st in plan.stages)
                                           if plan is not None else "the model as is, data parallel")
                                          if system == "e3" else ""),
                                 "saving_pct": (100 * (1 - cost / base) if system == "e3" and math.isfinite(cost)
                                                and math.isfinite(base) else math.nan)})
    return rows


def drifting_series(profile_at: Callable[[float], BatchProfile], easy: float, *, windows: int = 24,
                    window_size: int = 256, drift: float = 0.2, period: int = 12, seed: int = 0,
                    order=(1, 1, 0)) -> list[dict]:
    """A workload whose easy share swings by ``drift`` around ``easy`` over ``period`` windows: each window's
    batch profile is measured from ``window_size`` exits drawn from ``profile_at(share)``, and forecast by
    :class:`~workbench.earlyexit.batchprofile.BatchProfileEstimator` (ARIMA) before the window is seen. One row
    per window from the second on: the share, the measured profile, the forecast and ARIMA's own error."""
    from workbench.earlyexit.batchprofile import BatchProfileEstimator

    rng = np.random.default_rng(seed)
    est = None
    out = []
    for w in range(windows):
        share = float(np.clip(easy + drift * np.sin(2 * np.pi * w / period), 0.0, 1.0))
        truth = profile_at(share)
        seen = BatchProfile.from_exit_layers(truth.sample_exit_layers(window_size, rng), len(truth))
        if est is None:
            est = BatchProfileEstimator(len(truth), order=order)
        elif len(est.observations) >= 2:
            forecast = est.forecast()
            out.append({"window": w, "easy": share, "measured": seen, "forecast": forecast,
                        "error": est.error(seen).mean_abs,
                        "signed_error": float(np.mean(np.asarray(forecast.remaining) - np.asarray(seen.remaining)))})
        est.update(seen)
    return out


def misprediction_table(batches: Sequence[int] = (4, 8, 16), mixes: Iterable[str] = tuple(MIXES),
                        cluster: str = "homogeneous", scenario: EvalSettings = EvalSettings(),
                        measured: Mapping[str, BatchProfile] | None = None, windows: int = 24,
                        window_size: int = 256, drift: float = 0.2, seed: int = 0) -> list[dict]:
    """§5.8.2-5.8.3 with ARIMA's own errors: a workload whose mix drifts (:func:`drifting_series`), each window
    planned with the estimator's forecast and served the window's measured profile, against planning with the
    measured profile itself. Per mix and batch: ARIMA's mean absolute error on the fractions left, and the
    capacity lost (analytic, each plan under the measured profile), mean and worst over the windows. The paper:
    4-8% lost at 20% error."""
    from workbench.earlyexit.profiles import gpu_profiles, model_shape

    L = model_shape(scenario.shape)[1]
    gpus = cluster_gpus(cluster)
    profiles = gpu_profiles(gpus, scenario.shape)
    lat = latency_for(profiles, True)
    rows = []
    for mix in mixes:
        if mix not in MIXES:
            raise WorkbenchError(f"unknown mix {mix!r}; known: {', '.join(MIXES)}")
        base = measured.get(mix) if measured else None

        def profile_at(share, base=base):
            if base is None:
                return parametric_mix(share, L)
            shift = share - MIXES[mix]                     # a measured mix shifted by the drift of its easy share
            left = np.clip(np.asarray(rescale_profile(base, L).remaining) * (1 - shift), 0, 1)
            return BatchProfile.nearest(list(left[:-1]) + [0.0])

        series = drifting_series(profile_at, MIXES[mix], windows=windows, window_size=window_size, drift=drift,
                                 seed=seed)
        for batch in batches:
            losses, errors = [], []
            for w in series:
                truth = w["measured"]
                right, _ = e3_deployment(batch, truth, gpus, profiles, scenario)
                guessed, _ = e3_deployment(batch, w["forecast"], gpus, profiles, scenario)
                best = sum(pool_capacity(p, truth, lat) for p in right)
                got = sum(pool_capacity(p, truth, lat) for p in guessed)
                losses.append(100 * (1 - got / best) if best > 0 else math.nan)
                errors.append(w["error"])
            rows.append({"cluster": cluster, "mix": mix, "mix_profile": "measured" if base is not None else
                         "parametric", "batch": batch, "windows": len(series),
                         "arima_mean_abs_error_pct": 100 * float(np.mean(errors)),
                         "arima_worst_abs_error_pct": 100 * float(np.max(errors)),
                         "loss_mean_pct": float(np.nanmean(losses)), "loss_worst_pct": float(np.nanmax(losses))})
    return rows


def ramp_table(batches: Sequence[int] = (4, 8, 16), mixes: Iterable[str] = tuple(MIXES),
               clusters: Iterable[str] = ("homogeneous",), scenario: EvalSettings = EvalSettings(),
               measured: Mapping[str, BatchProfile] | None = None) -> list[dict]:
    """§5.8.6: E3's plan served with every ramp, then with the ramps inside its splits that are not useful
    disabled (:func:`useless_ramps`: a ramp's own time saved; the samples that would have left there ride on
    to the next enabled ramp, assumed confident enough by then to leave). The paper: up to 16% more goodput."""
    from workbench.earlyexit.profiles import gpu_profiles, model_shape

    L = model_shape(scenario.shape)[1]
    rows = []
    for cluster in clusters:
        gpus = cluster_gpus(cluster)
        profiles = gpu_profiles(gpus, scenario.shape)
        for mix, (profile, origin) in mix_profiles(L, measured, mixes).items():
            for batch in batches:
                pools, plan = e3_deployment(batch, profile, gpus, profiles, scenario)
                if plan is None:          # E3 runs the model as is here: no split to disable ramps inside
                    continue
                off = useless_ramps(plan, profile, profiles)
                enabled = frozenset(range(L)) - off
                with_all = sustained_goodput([plan_pool(plan)], profile, profiles, scenario)
                fewer = sustained_goodput([plan_pool(plan, enabled)], profile, profiles, scenario) if off else with_all
                rows.append({"cluster": cluster, "mix": mix, "mix_profile": origin, "batch": batch,
                             "splits": len(plan.splits), "ramps_disabled": len(off),
                             "disabled": " ".join(map(str, sorted(off))),
                             "goodput_all_ramps": with_all.goodput, "goodput_useful_ramps": fewer.goodput,
                             "gain_pct": 100 * (fewer.goodput / with_all.goodput - 1) if with_all.goodput > 0
                             else math.nan, "plan": plan_pool(plan).describe()})
    return rows


# -------------------------------------------------------------------------------------- optimizer timing

TIMING_CLUSTERS = {"homogeneous": {"v100": 16}, "heterogeneous": {"v100": 6, "p100": 8, "k80": 15, "a6000": 17}}
"""The optimizer-time problems' clusters (the paper's Figure 20: 16 V100, and 46 GPUs of four types)."""


def bert_problem(model: str = "bert-base", cluster: str | Mapping[str, int] = "heterogeneous", *,
                 batch_size: int = 16, slo_s: float = 0.1, easy: float = 0.8, priced: bool = True) -> dict:
    """Keyword arguments for :func:`optimize_splits` on a BERT-shaped problem: each GPU's layer and ramp times
    from the published BERT batch curves (:func:`~workbench.earlyexit.profiles.gpu_profile`), transfers of a
    merged batch's activations (fp32, sequence x hidden per sample) over the presets' 10 Gbps links, and the
    parametric exit profile of an ``easy`` share (:func:`~workbench.earlyexit.evaluation.parametric_mix`, the
    paper's Figure 3). The GPU curves and presets are read here, not in the optimizer."""
    from workbench.devices import PRESETS, LayerShape             # only the benchmark needs the presets
    from workbench.earlyexit.profiles import BERT_SHAPES, gpu_profiles, latency_by_type

    if model not in BERT_SHAPES:
        raise WorkbenchError(f"unknown model {model!r}; known: {', '.join(BERT_SHAPES)}")
    dims, layers = BERT_SHAPES[model]
    shape = LayerShape(*dims)
    gpus = dict(TIMING_CLUSTERS[cluster]) if isinstance(cluster, str) else dict(cluster)
    layer_latency = latency_by_type(gpu_profiles([g for g, n in gpus.items() if n], model))

    link = PRESETS["v100"]

    def transfer_s(boundary: int, batch: int) -> float:
        return link.send_s(batch * shape.seq_len * shape.hidden * 4) if batch else 0.0

    profile = list(parametric_mix(easy, layers).remaining)
    kwargs = dict(layer_latency=layer_latency, batch_profile=profile, gpus=gpus, slo_s=slo_s, transfer_s=transfer_s,
                  batch_size=batch_size, num_layers=layers)
    if priced:
        kwargs["prices"] = {g: PRESETS[g].price_per_s for g in gpus}
    return kwargs


def time_optimizer(repeats: int = 5, models: Sequence[str] = ("bert-base", "bert-large"),
                   clusters: Sequence[str] = ("homogeneous", "heterogeneous"), **problem) -> list[dict]:
    """Median wall time of :func:`optimize_splits` on each BERT-shaped problem (:func:`bert_problem`), with the
    plan it finds; ``problem``: more :func:`bert_problem` arguments (batch_size, slo_s, ...)."""
    import statistics
    import time

    from workbench.earlyexit.optimizer import optimize_splits

    rows = []
    for model in models:
        for cluster in clusters:
            kwargs = bert_problem(model, cluster, **problem)
            times, plan = [], None
            for _ in range(repeats):
                t0 = time.perf_counter()
                plan = optimize_splits(**kwargs)
                times.append(time.perf_counter() - t0)
            rows.append({"model": model, "cluster": cluster, "gpus": sum(kwargs["gpus"].values()),
                         "types": len(kwargs["gpus"]), "median_s": statistics.median(times), "min_s": min(times),
                         "splits": plan.splits, "replicas": plan.replicas, "gpu_types": plan.gpu_types,
                         "goodput": plan.goodput, "probes": len(plan.probes)})
    return rows
