"""One trace replayed under every method with the same settings: what the LLMS page's "Replay" runs.

:class:`ReplaySettings` is the typed form of a replay's settings (the page's controls give one, and
:meth:`ReplaySettings.of_results` reads one back from the records of replays made earlier);
:func:`replay_methods` synthesizes the trace and replays it under each method of :data:`METHODS` on one
decoder, checking every setting before anything loads."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from workbench.errors import WorkbenchError
from workbench.kvcache.records import ReplayResult

METHODS = ("llms", "vllm_sq", "vllm_s", "swapping", "lmk")
"""LLMS and the paper's baselines, in the paper's order."""
FRACTION, MEGABYTES = "of the working set", "MB"
BUDGET_UNITS = (FRACTION, MEGABYTES)


@dataclass(frozen=True)
class ReplaySettings:
    """What a replay is run with: the trace (``contexts``, ``calls``, ``pattern``, ``mean_interval_s``,
    ``seed``), the device it is priced on, the memory budget (``budget`` in ``budget_unit``: a fraction of the
    trace's working set or MB), the service settings every method takes where they apply (``global_ratio``,
    ``chunk_size``, ``policy``) and the idle time per trace minute between calls."""
    contexts: int
    calls: int
    pattern: str
    mean_interval_s: float
    seed: int
    device: str
    budget: float
    budget_unit: str
    global_ratio: float
    chunk_size: int
    policy: str
    idle_s_per_min: float = 0.0

    @classmethod
    def of_results(cls, results: dict[str, ReplayResult], fallback: ReplaySettings) -> ReplaySettings | None:
        """The settings replays were made with, as far as their records say (LLMS's first, else any one's);
        ``fallback``'s values where a record is silent. None when there are no replays."""
        first = results.get("llms") or next(iter(results.values()), None)
        if first is None:
            return None
        fraction = first.setting("budget_fraction")
        return cls(
            contexts=first.contexts, calls=int(first.setting("calls", len(first.calls))), pattern=first.pattern,
            mean_interval_s=float(first.setting("mean_interval_s", fallback.mean_interval_s)),
            seed=int(first.setting("seed", fallback.seed)), device=first.device,
            budget=float(fraction) if fraction is not None else
            round(first.setting("requested_budget_bytes", first.memory_budget_bytes) / 1e6, 3),
            budget_unit=FRACTION if fraction is not None else MEGABYTES,
            global_ratio=round(float(first.setting("global_ratio", fallback.global_ratio)), 4),
            chunk_size=int(first.setting("chunk_size", fallback.chunk_size)),
            policy=str(first.setting("policy", fallback.policy)),
            idle_s_per_min=round(60 * float(first.setting("idle_scale", 0.0)), 6))

    def budget_bytes(self, trace=None, model=None) -> int:
        """The memory budget in bytes: given in MB, or a fraction of ``trace``'s working set (0 without a
        trace: the range is still checked)."""
        if self.budget_unit == MEGABYTES:
            if self.budget <= 0:
                raise WorkbenchError(f"the memory budget must be positive, got {self.budget} MB")
            return int(self.budget * 1e6)
        if self.budget_unit != FRACTION:
            raise WorkbenchError(f"a budget is given {' or '.join(BUDGET_UNITS)}, got {self.budget_unit!r}")
        if not 0 < self.budget <= 1:
            raise WorkbenchError(f"a budget as a fraction of the working set lies in (0, 1], got {self.budget}; "
                                 f"switch the unit to MB for an absolute budget")
        if trace is None:
            return 0
        from workbench.kvcache.replay import budget_for

        return int(budget_for(trace, self.budget, model=model, chunk_size=self.chunk_size))

    def service_configs(self) -> dict:
        """Per method, the service configuration it replays with: its preset with the settings that apply to
        it (``replay.method_config``); a value the configuration refuses raises ``WorkbenchError``."""
        from workbench.kvcache.replay import method_config

        return {m: method_config(m, chunk_size=self.chunk_size, global_ratio=self.global_ratio,
                                 policy=self.policy) for m in METHODS}


def replay_methods(settings: ReplaySettings, load_model: Callable[[], object], *, new_tokens: int,
                   progress: Callable[[int, int], None] = lambda done, total: None,
                   should_stop: Callable[[], bool] = lambda: False) -> dict[str, ReplayResult]:
    """The trace of ``settings`` replayed under every method of :data:`METHODS` on the decoder ``load_model()``
    gives (called once every setting has been checked, e.g. ``models.decoder.load_decoder``), each call
    generating ``new_tokens``; stops after the method running when ``should_stop()`` turns true (its replay
    keeps the calls it made)."""
    from workbench.kvcache.replay import idle_gaps, replay
    from workbench.kvcache.traces import synthesize_trace

    settings.budget_bytes()                                   # a wrong budget is said before anything loads
    configs = settings.service_configs()
    trace = synthesize_trace(settings.contexts, settings.calls, settings.pattern, settings.mean_interval_s,
                             settings.seed)
    idle_scale = settings.idle_s_per_min / 60
    idle_gaps(trace, idle_scale, replays=len(METHODS))      # too much idle is said before anything loads
    model = load_model()
    budget = settings.budget_bytes(trace, model)
    total = len(METHODS) * len(trace.calls)
    results = {}
    progress(0, total)
    for k, method in enumerate(METHODS):
        done = k * len(trace.calls)
        results[method] = replay(trace, method, memory_budget_bytes=budget, device=settings.device, model=model,
                                 max_new_tokens=new_tokens, should_stop=should_stop,
                                 progress=lambda d, _t, done=done: progress(done + d, total),
                                 config=configs[method], idle_scale=idle_scale)
        if should_stop():
            break
    return results
