"""What `workbench prepare` builds for the LLM context service: the host's swap cost model and the
replays of a default trace (LLMS and every baseline) that the dashboard and notebooks open with."""
from __future__ import annotations

import json
from pathlib import Path

from workbench.cache import cache_dir
from workbench.errors import WorkbenchError
from workbench.kvcache.replays import METHODS

REPLAYS_FORMAT = 5
"""Bumped when what a replay records or how it emulates a device changes (2: presets read at their
bandwidth and pace eviction writes; 4: budgets hold the working cache of the call served; 5: values
quantized per token, so chunks are smaller); replays of another format are made again."""

DEFAULTS = {
    "full": {"contexts": 6, "calls": 30, "pattern": "markov", "device": "orin-nx", "budget_fraction": 0.3,
             "max_new_tokens": 1, "mean_interval_s": 300.0, "seed": 0},
    "quick": {"contexts": 3, "calls": 12, "pattern": "markov", "device": "orin-nx", "budget_fraction": 0.25,
              "max_new_tokens": 2, "mean_interval_s": 300.0, "seed": 0},
}
"""The default trace per preset. The quick one is the smallest whose contexts come back after eviction (so
every page and test sees loads and recomputes); LMK's recomputes make it take about two minutes on 2 cores.
The full one generates one token a call: the page and notebooks show switching, never the answers, and
each further token is a forward pass over the whole context under all five methods (`workbench bench llms`
replays with longer answers)."""


def replays_path(preset: str) -> Path:
    return cache_dir() / "llms" / f"replays-{preset}.json"


def replays_ready(preset: str) -> bool:
    path = replays_path(preset)
    if not path.exists():
        return False
    try:
        raw = json.loads(path.read_text())
        return (raw.get("format") == REPLAYS_FORMAT and raw["settings"] == DEFAULTS[preset]
                and set(raw["replays"]) == set(METHODS))
    except (ValueError, KeyError, AttributeError):
        return False


def run_replays(settings: dict, methods=METHODS, progress=None, should_stop=None, model=None) -> dict:
    """Replay one synthesized trace under every method; ``progress(done, total)`` counts calls over all."""
    from workbench.kvcache.replay import budget_for, replay
    from workbench.kvcache.traces import synthesize_trace
    from workbench.models.decoder import load_decoder

    model = model or load_decoder()
    trace = synthesize_trace(settings["contexts"], settings["calls"], settings["pattern"],
                             settings["mean_interval_s"], settings["seed"])
    budget = budget_for(trace, settings["budget_fraction"])
    total = len(methods) * len(trace.calls)
    results = {}
    for k, method in enumerate(methods):
        done = k * len(trace.calls)
        results[method] = replay(
            trace, method, memory_budget_bytes=budget, device=settings["device"], model=model,
            max_new_tokens=settings["max_new_tokens"], should_stop=should_stop,
            progress=None if progress is None else (lambda d, t, done=done: progress(done + d, total)))
        if should_stop is not None and should_stop():
            break
    return results


def prepare_replays(preset: str, progress: bool = False, force: bool = False) -> str:
    """Replay the preset's default trace under every method and keep the records (JSON)."""
    from workbench.cache import write_json
    from workbench.progress import progress_bar

    path = replays_path(preset)
    if replays_ready(preset) and not force:
        return f"cached: {path}"
    settings = DEFAULTS[preset]
    calls = len(METHODS) * settings["calls"]
    with progress_bar(calls, "llms replays", enabled=progress) as bar:
        results = run_replays(settings, progress=lambda done, total: bar.update(done - bar.done))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"format": REPLAYS_FORMAT, "settings": settings, "replays": {m: r.to_json() for m, r in results.items()}})
    means = ", ".join(f"{m} {1e3 * r.mean_switch_s():.1f} ms" for m, r in results.items())
    return f"mean switching latency on {settings['device']}: {means}"


def default_replays(preset: str | None = None) -> dict:
    """The prepared replays of the default trace: method -> ReplayResult."""
    from workbench.kvcache.records import ReplayResult
    from workbench.presets import default_preset, prepare_hint

    preset = preset or default_preset()
    if not replays_ready(preset):
        raise WorkbenchError(f"the LLMS replays of the {preset} preset are not prepared; run "
                               f"`{prepare_hint(preset)}`")
    raw = json.loads(replays_path(preset).read_text())
    return {m: ReplayResult.from_json(r) for m, r in raw["replays"].items()}


def default_settings(preset: str | None = None) -> dict:
    from workbench.presets import default_preset

    return dict(DEFAULTS[preset or default_preset()])
