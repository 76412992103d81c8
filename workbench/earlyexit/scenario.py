"""The knobs of an E3 study turned into the optimizer's and the simulator's inputs, in one place.

A :class:`Scenario` is what the page, the commands and the notebooks set: the model (the shipped encoder
with its trained ramps, or BERT-BASE/-LARGE's shape), GPUs per type, SLO, the batch every replica runs, easy:hard mix,
exit threshold, disabled ramps, slack and pipelining. From it come the batch profile (the trained ramps'
real exits on a workload of that mix; for the BERT shapes, which have no trained ramps here, a profile of
the same mix drawn like the shipped model's), the layer latencies (E3's GPUs, read off published BERT batch curves; or the host's
measured profile for a real run), the transfers between splits, E3's plan and its simulation.

A :class:`StudySettings` is the same knobs as the page holds them (plus its arrivals), unchecked and hashable:
its :meth:`~StudySettings.scenario` makes the checked Scenario; beside it, what the page derives from the
engine's answers (the default threshold, the stock model, the goodput rows, the simulation's length).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from numbers import Real
from typing import Mapping

from workbench.earlyexit import limits
from workbench.earlyexit.batchprofile import BatchProfile
from workbench.errors import WorkbenchError

MODELS = ("encoder", "bert-base", "bert-large")
MAX_GPUS_PER_TYPE = 64
LINK_DEVICE = "v100"
"""Whose link carries the activations between splits (the presets' 10 Gbit/s network)."""


def _number(x) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x)


def parse_gpus(text: str | Mapping[str, int]) -> dict[str, int]:
    """``"v100=6,p100=8"`` (or a mapping) -> {type: count}: each type one of E3's presets (or "host") and named
    once, counts 0..64, at least one GPU in all. A type given twice is refused, not summed: ``v100=6,v100=2`` is
    more likely a slip for another type than a wish for 8."""
    from workbench.devices import PRESETS

    known = [n for n, p in PRESETS.items() if p.paper == "e3"] + ["host"]
    example = "e.g. v100=6,p100=8"
    if isinstance(text, Mapping):
        items = list(text.items())
    else:
        items = []
        for part in filter(None, (p.strip() for p in str(text).split(","))):
            name, sep, count = part.partition("=")
            if not sep:
                raise WorkbenchError(f"GPUs are given as TYPE=COUNT pairs ({example}), got {part!r}")
            items.append((name.strip(), count.strip()))
    out: dict[str, int] = {}
    given: dict[str, object] = {}
    for name, count in items:
        if name not in known:
            raise WorkbenchError(f"unknown GPU type {name!r}: GPUs are TYPE=COUNT with TYPE one of "
                                 f"{', '.join(known)} ({example})")
        if name in given:
            raise WorkbenchError(f"GPU type {name} is given twice ({name}={given[name]} and {name}={count}): give "
                                 f"each type once, TYPE=COUNT ({example})")
        given[name] = count
        try:
            n = int(count)
            ok = str(count).strip() == str(n) if isinstance(count, str) else n == count
        except (TypeError, ValueError):
            ok = False
        if not ok or not 0 <= n <= MAX_GPUS_PER_TYPE:
            raise WorkbenchError(f"the count of {name} GPUs is a whole number in 0..{MAX_GPUS_PER_TYPE}, got {count!r}")
        out[name] = n
    if sum(out.values()) == 0:
        raise WorkbenchError(f"no GPUs: give a count above 0 for at least one type ({example}); a plan needs "
                             "somewhere to run")
    return out


@dataclass(frozen=True, kw_only=True)
class Scenario:
    model: str = "encoder"
    task: str = "sentiment"
    preset: str = "full"
    gpus: Mapping[str, int] = field(default_factory=lambda: {"v100": 4})
    slo_s: float = 0.05
    batch_size: int = 16
    easy: float = 0.8
    threshold: float = 0.4
    disabled: tuple[int, ...] = ()
    slack: float = 0.2
    pipelined: bool = True
    disable_inside: bool = False       # E3 §3.4: switch off the ramps inside each split of the plan

    def __post_init__(self):
        from workbench.earlyexit.artifacts import check_easy_fraction
        from workbench.earlyexit.record import check_threshold

        if self.model not in MODELS:
            raise WorkbenchError(f"unknown model {self.model!r}; known: {', '.join(MODELS)}")
        object.__setattr__(self, "gpus", parse_gpus(self.gpus))
        limits.slo_ms.check("the SLO", 1e3 * self.slo_s if _number(self.slo_s) else self.slo_s)
        limits.batch.check("the batch per replica", self.batch_size)
        limits.slack.check("the slack (a share of the SLO)", self.slack)
        check_easy_fraction(self.easy)
        check_threshold(self.threshold)
        if "host" in self.gpus and self.model != "encoder":
            raise WorkbenchError(f"the host's measured profile is the shipped encoder's; {self.model} runs on "
                                 "E3's GPU presets only (drop host=...)")
        from workbench.earlyexit.optimizer import MAX_CELLS

        cells = math.prod(n + 1 for n in self.gpus.values())
        if cells > MAX_CELLS:
            raise WorkbenchError(f"{', '.join(f'{n} x {g}' for g, n in self.gpus.items())} is too many GPUs to plan "
                                 f"over: the product of (count + 1) over the types must stay under {MAX_CELLS:,} "
                                 f"(it is {cells:,}); use fewer types or fewer of each")
        last = self.num_layers - 1
        bad = [k for k in self.disabled if not (isinstance(k, int) and 0 <= k < last)]
        if bad:
            raise WorkbenchError(f"ramps {bad} cannot be disabled: {self.model}'s ramps 0..{last - 1} can (ramp "
                                 f"{last} is its classifier)")

    def with_(self, **changes) -> Scenario:
        return replace(self, **changes)

    @property
    def num_layers(self) -> int:
        from workbench.earlyexit.profiles import model_shape

        return model_shape(self.model)[1]

    # ------------------------------------------------------------------ inputs

    def record(self):
        from workbench.earlyexit.artifacts import load_record

        return load_record(self.task, self.preset)

    def profile(self, n: int = 2048, seed: int = 0) -> BatchProfile:
        """The batch profile of this mix: the trained ramps' exits on it (the encoder), or, for a BERT shape,
        the encoder's profile (no ramp disabled) stretched over its depth by
        :func:`~workbench.earlyexit.evaluation.rescale_profile`, then the samples of each disabled ramp (in the
        BERT's own layer numbers) moved on to the next enabled one."""
        from workbench.earlyexit.artifacts import mix_profile
        from workbench.earlyexit.evaluation import rescale_profile

        if self.model == "encoder":
            return mix_profile(self.record(), self.easy, self.threshold, self.disabled, n=n, seed=seed)
        left = list(rescale_profile(mix_profile(self.record(), self.easy, self.threshold, n=n, seed=seed),
                                    self.num_layers).remaining)
        for k in sorted(self.disabled):
            left[k] = left[k - 1] if k else 1.0
        return BatchProfile(tuple(left))

    @property
    def seq_len(self) -> int:
        """Tokens per request: the task's length for the shipped encoder, the shape's own for BERT."""
        from workbench.data import task_spec
        from workbench.earlyexit.profiles import model_shape

        return task_spec(self.task).max_length if self.model == "encoder" else model_shape(self.model)[0].seq_len

    def layer_profiles(self) -> dict:
        from workbench.earlyexit.profiles import gpu_profiles, host_layer_profile

        out = gpu_profiles([g for g in self.gpus if g != "host"], self.model, seq_len=self.seq_len)
        if "host" in self.gpus:
            out["host"] = host_layer_profile(task=self.task)
        return out

    def layer_latency(self, disabled=None):
        from workbench.earlyexit.profiles import latency_by_type

        off = set(self.disabled if disabled is None else disabled)
        return latency_by_type(self.layer_profiles(), ramps=[k for k in range(self.num_layers) if k not in off])

    def transfer_s(self):
        from workbench.devices import PRESETS
        from workbench.earlyexit.profiles import model_shape

        shape = model_shape(self.model)[0]
        link = PRESETS[LINK_DEVICE]
        per_sample = self.seq_len * shape.hidden * 4

        def transfer(boundary: int, batch: int) -> float:
            return link.send_s(batch * per_sample) if batch else 0.0
        return transfer

    # ------------------------------------------------------------------ decisions

    def optimize(self, profile: BatchProfile | None = None):
        """E3's plan for this scenario (``profile``: plan for another profile, e.g. a forecast); with
        ``disable_inside`` the ramps inside the plan's splits are then switched off (their samples ride to the
        split's end) and the plan is made again for the cheaper layers and the later exits."""
        from workbench.earlyexit.optimizer import optimize_splits

        profile = profile or self.profile()
        plan = optimize_splits(self.layer_latency(), list(profile.remaining), self.gpus, self.slo_s,
                               pipelined=self.pipelined, transfer_s=self.transfer_s(), slack=self.slack,
                               batch_size=self.batch_size, num_layers=self.num_layers)
        if self.disable_inside and plan:
            inside = inside_ramps(plan.splits)
            return self.with_(disabled=tuple(sorted(set(self.disabled) | inside)), disable_inside=False).optimize()
        return plan

    def simulate(self, plan, *, pattern: str = "poisson", rate: float | None = None, requests: int = 2000,
                 seed: int = 0, profile: BatchProfile | None = None):
        """Serve ``requests`` arrivals through ``plan`` in the simulator, exits drawn from this scenario's
        profile (or ``profile``: the truth when the plan was made for a forecast). ``rate`` defaults to 90 %
        of the plan's goodput. Samples that have spent the SLO's slack waiting are dropped (``drop="budget"``), so
        an overloaded plan keeps serving what can still make it. Each replica has its queue, routed as Ray Serve
        routes. A send between splits carries one merged batch to
        one replica over that replica's own link, as the optimizer counts it."""
        from workbench.earlyexit.pools import QUEUES
        from workbench.earlyexit.simulator import ArrivalProcess, simulate_plan

        if not plan:
            raise WorkbenchError(f"nothing to simulate: {plan.reason}")
        rate = 0.9 * plan.goodput if rate is None else rate
        if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
            raise WorkbenchError(f"the arrival rate is requests per second > 0, got {rate!r}")
        send = self.transfer_s()
        per_link = [send(plan.splits[i][1], plan.batch_sizes[i + 1]) for i in range(len(plan.splits) - 1)]
        return simulate_plan(plan, slo_s=self.slo_s, arrivals=ArrivalProcess(pattern, rate, count=requests),
                             layer_latency=self.layer_latency(), transfer_s=per_link or 0.0,
                             exits=profile or self.profile(), slack=self.slack, seed=seed, pipelined=self.pipelined,
                             drop="budget", queues=QUEUES)


def inside_ramps(splits) -> set[int]:
    """The ramps strictly inside the splits (every layer but each split's last)."""
    return {k for s, e in splits for k in range(s, e - 1)}


# -- a study as its page sets it ---------------------------------------------------------------------

SIM_REQUESTS = 2000
"""The fewest requests a study's simulation serves (the bubbles figure shows the run's start)."""
SIM_SLOS = 20
"""A simulation covers at least this many SLOs of arrivals (``rate x SLO_S x SIM_SLOS`` requests) ..."""
SIM_BURSTS = 5
"""... and, for bursty arrivals, about this many on/off cycles (each ``burst_s x burst_factor`` on average) ..."""
SIM_MAX_REQUESTS = 20_000
"""... but at most this many requests: about 0.4 to 0.7 s of SimPy on a 2-core host (measured), so that a page's
redraw stays under about a second; the page's caption says when the cap shortens the run."""


@dataclass(frozen=True)
class StudySettings:
    """The numbers a study of the shipped encoder sets (the E3 page's controls), unchecked and hashable: the key
    of the page's memos and of its kept runs. :meth:`scenario` checks them and makes the engine's Scenario."""
    task: str
    easy: float
    threshold: float
    slo_s: float
    batch_size: int
    gpus: tuple[tuple[str, int], ...]      # (type, count), the types with none left out
    pattern: str                           # the simulator's arrival pattern
    rate: float                            # requests per second

    @property
    def gpu_counts(self) -> dict[str, int]:
        return dict(self.gpus)

    def scenario(self, preset: str) -> Scenario:
        return Scenario(model="encoder", task=self.task, preset=preset, gpus=self.gpu_counts, slo_s=self.slo_s,
                        batch_size=self.batch_size, easy=self.easy, threshold=self.threshold)

    def sim_requests(self) -> int:
        """Requests one simulation serves: at least :data:`SIM_REQUESTS`, :data:`SIM_SLOS` SLOs of arrivals and,
        for bursty arrivals, :data:`SIM_BURSTS` on/off cycles; at most :data:`SIM_MAX_REQUESTS`."""
        from workbench.earlyexit.simulator import ArrivalProcess

        want = max(SIM_REQUESTS, self.rate * self.slo_s * SIM_SLOS)
        if self.pattern == "bursty":
            arrivals = ArrivalProcess("bursty", self.rate, count=1)
            want = max(want, self.rate * arrivals.burst_s * arrivals.burst_factor * SIM_BURSTS)
        return int(min(SIM_MAX_REQUESTS, math.ceil(want)))


def default_threshold(record) -> float:
    """The largest entropy threshold of the record's table that keeps accuracy within a point of the stock
    model's while some samples exit; DeeBERT's default when none does."""
    from workbench.earlyexit.record import DEFAULT_THRESHOLD

    good = [row["threshold"] for row in record.table()
            if row["loss"] <= 0.01 and row["mean_layers"] < record.num_layers]
    return max(good, default=DEFAULT_THRESHOLD)


def exit_share(profile) -> float:
    """The share of samples that leave before the last layer: 1 - the fraction left after the last ramp
    before the classifier."""
    return 1.0 - float(profile[-2]) if len(profile) > 1 else 0.0


def stock_of(sc: Scenario) -> Scenario:
    """The scenario of the same model without exits: every ramp but the classifier off."""
    return sc.with_(disabled=tuple(range(sc.num_layers - 1)))


@dataclass(frozen=True)
class GoodputRow:
    """One batch per replica of the goodput comparison: samples/s meeting the SLO of E3's plan, of the early-exit
    model as is and of the stock model (both data parallel on the same GPUs); 0 where no plan meets the SLO."""
    batch: int
    e3: float
    early_exit: float
    stock: float


def goodput_rows(plans: Mapping[int, object], stock: Mapping[int, object]) -> list[GoodputRow]:
    """Per batch (every replica's), the optimizer's goodput of E3's plan, of the early-exit model as is and of the
    stock model, both data parallel on all the same GPUs (the plans' baselines); 0 where none meets the SLO."""
    def unsplit(plan) -> float:
        return plan.baseline.goodput if plan.baseline else 0.0

    return [GoodputRow(b, plans[b].goodput, unsplit(plans[b]), unsplit(stock[b])) for b in plans]
