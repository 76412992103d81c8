"""What elastic pipelining (WRX) brings to the workbench: prepare steps, commands, benchmarks, page, notebooks."""
from __future__ import annotations

from workbench.data import TASKS
from workbench.elastic import commands
from workbench.mechanisms import Command, Dashboard, InfoSection, Mechanism, Notebook, OverviewSection, PrepareStep

ESTIMATES_S = {
    # Seconds measured on 2 cores from an empty cache (`workbench prepare --preset full`, 23.7 min in all;
    # the quick preset in the test set-up). They drive the gallery's "time left".
    ("fine-tuning", "sentiment"): {"full": 403, "quick": 20}, ("fine-tuning", "bbc"): {"full": 475, "quick": 25},
    ("store", "sentiment"): {"full": 7, "quick": 9}, ("store", "bbc"): {"full": 6, "quick": 9},
    ("importance", "sentiment"): {"full": 138, "quick": 12}, ("importance", "bbc"): {"full": 372, "quick": 15},
}


def _fine_tune(task: str, preset: str, progress: bool, force: bool) -> str:
    from workbench.elastic.artifacts import prepare_model

    em = prepare_model(task, preset, progress=progress, force=force)
    return f"full-model dev accuracy {100 * em.accuracy_grid[-1, -1]:.1f}% on {em.dev_examples} examples"


def _build_store(task: str, preset: str, progress: bool, force: bool) -> str:
    from workbench.elastic.artifacts import prepare_store

    store = prepare_store(task, preset, progress=progress, force=force)
    return f"{store.cfg.num_layers} x {store.cfg.num_heads} shards at {list(store.bitwidths)} bits"


def _importance(task: str, preset: str, progress: bool, force: bool) -> str:
    from workbench.elastic.artifacts import prepare_importance

    imp = prepare_importance(task, preset, progress=progress)
    return f"{imp.dev_examples} dev examples; all-{imp.low_bits}-bit accuracy {100 * imp.baseline_accuracy:.1f}%"


def _ready(what: str, task: str, preset: str) -> bool:
    from workbench.elastic import artifacts

    return getattr(artifacts, f"{what}_ready")(task, preset)


def _steps(preset: str) -> list[PrepareStep]:
    steps = []
    for task in TASKS:
        for label, run, what, key in (("elastic fine-tuning", _fine_tune, "model", "fine-tuning"),
                                      ("shard store", _build_store, "store", "store"),
                                      ("shard importance", _importance, "importance", "importance")):
            steps.append(PrepareStep(
                name=f"{label}: {task}", task=task,
                run=lambda preset, progress, force, run=run, task=task: run(task, preset, progress, force),
                ready=lambda preset, what=what, task=task: _ready(what, task, preset),
                estimate_s=ESTIMATES_S[(key, task)]))
    return steps


FIRST_TASK = "sentiment"
"""The task the page opens with (the tutorial's): its steps alone make the page ready; the others follow."""


def _task_steps(task: str) -> tuple[str, ...]:
    return tuple(f"{what}: {task}" for what in ("elastic fine-tuning", "shard store", "shard importance"))


def _info(preset: str) -> InfoSection:
    """The full model's dev accuracy of each task, None where it is not fine-tuned yet."""
    from workbench.elastic.artifacts import model_summary
    from workbench.errors import WorkbenchError

    accuracy = {}
    for task in TASKS:
        try:
            accuracy[task] = float(model_summary(task, preset)["accuracy_grid"][-1, -1])
        except WorkbenchError:
            accuracy[task] = None
    lines = tuple(f"{task:<9} " + (f"full-model dev accuracy {100 * acc:.1f}%" if acc is not None else "not fine-tuned")
                  for task, acc in accuracy.items())
    return InfoSection(data={"full_model_dev_accuracy": accuracy}, lines=lines)


def _test_artifacts(preset: str) -> dict[str, object]:
    """The fine-tuned elastic model of each task, by task name."""
    from workbench.elastic.artifacts import prepare_model

    return {task: prepare_model(task, preset, progress=False) for task in TASKS}


MECHANISM = Mechanism(
    name="elastic",
    title="Elastic pipelining (WRX)",
    paper="WRX: an N x M x K sharded model, shard importance, a two-stage planner with AIBs, an IO/compute pipeline",
    prepare_steps=_steps,
    commands=(
        Command(name="plan", help="plan one elastic-pipelining configuration", configure=commands.configure_plan,
                top_level_alias=True),
        Command(name="run", help="plan and run the pipeline for real on a text", configure=commands.configure_run,
                top_level_alias=True),
        Command(name="profile", help="measure a prepared model: shard importance, or a device's cost model",
                configure=commands.configure_profile, top_level_alias=True),
    ),
    benchmarks={"elastic": "workbench.elastic.bench", "sharding": "workbench.elastic.bench_sharding"},
    dashboard=Dashboard(
        first=True,
        page="elastic.ipynb", title="Elastic pipelining (WRX)",
        summary="target latency, preload buffer and device -> the chosen submodel, per-shard bitwidths, AIBs through "
                "every allocation step, the IO/compute pipeline predicted and measured, accuracy vs memory",
        requires=_task_steps(FIRST_TASK),
        later=tuple(name for task in TASKS if task != FIRST_TASK for name in _task_steps(task)),
        probe_control="Target (ms)", probe_figure="gantt",
        ends=(("Preload (MB)", "max"), ("Target (ms)", "min")), panel="workbench.ui.elastic:ElasticPanel"),
    notebooks=(
        Notebook(path="elastic_pipelining.ipynb", title="Elastic pipelining: a tutorial", kind="tutorial"),
        Notebook(path="labs/elastic_lab.ipynb", title="Elastic pipelining: a teaching lab", kind="lab"),
        Notebook(path="elastic_evaluation.ipynb", title="Elastic pipelining beside the paper", kind="evaluation"),
    ),
    info=_info,
    overview=OverviewSection(title="Elastic pipelining (WRX): accuracy of every n x m submodel",
                             panel="workbench.ui.elastic:ElasticOverview",
                             requires=(f"elastic fine-tuning: {FIRST_TASK}",)),
    test_artifacts=_test_artifacts,
)
