"""What early-exit serving (E3) brings to the workbench: the trained exit ramps, commands, its benchmark,
page and notebooks."""
from __future__ import annotations

from workbench.data import TASKS
from workbench.mechanisms import Command, Dashboard, InfoSection, Mechanism, Notebook, OverviewSection, PrepareStep

ESTIMATES_S = {
    # full: bbc took 186 s on 2 cores; sentiment 1036 s at a load of 5-9 (other jobs), about 450 s on its own
    "full": {"sentiment": 450, "bbc": 200}, "quick": {"sentiment": 10, "bbc": 12}}


def _step_name(task: str) -> str:
    return f"exit ramps: {task}"


def _train(task: str, preset: str, progress: bool, force: bool) -> str:
    from workbench.earlyexit.artifacts import prepare_model
    from workbench.earlyexit.record import DEFAULT_THRESHOLD

    prepared = prepare_model(task, preset, progress=progress, force=force)
    rec = prepared.record
    return (f"stock accuracy {100 * rec.stock_accuracy():.1f}%; at entropy {DEFAULT_THRESHOLD}: "
            f"{100 * rec.accuracy(DEFAULT_THRESHOLD):.1f}%, {rec.exits(DEFAULT_THRESHOLD).mean() + 1:.2f} layers "
            f"of {rec.num_layers} on average ({len(rec.labels)} dev examples)")


def _ready(task: str, preset: str) -> bool:
    from workbench.earlyexit.artifacts import model_ready

    return model_ready(task, preset)


def _steps(preset: str) -> list[PrepareStep]:
    return [PrepareStep(name=_step_name(task), task=task,
                        run=lambda preset, progress, force, task=task: _train(task, preset, progress, force),
                        ready=lambda preset, task=task: _ready(task, preset),
                        estimate_s={p: ESTIMATES_S[p][task] for p in ESTIMATES_S})
            for task in TASKS]


def _info(preset: str) -> InfoSection:
    """Per task: the stock model's dev accuracy and the early-exit model's at the default threshold."""
    from workbench.earlyexit.artifacts import load_record, model_ready
    from workbench.earlyexit.record import DEFAULT_THRESHOLD

    data, lines = {}, []
    for task in TASKS:
        if not model_ready(task, preset):
            data[task] = None
            lines.append(f"{task:<9} exit ramps not trained")
            continue
        rec = load_record(task, preset)
        data[task] = {"stock_accuracy": rec.stock_accuracy(), "threshold": DEFAULT_THRESHOLD,
                      "accuracy": rec.accuracy(DEFAULT_THRESHOLD),
                      "mean_layers": float(rec.exits(DEFAULT_THRESHOLD).mean() + 1)}
        lines.append(f"{task:<9} early exit at entropy {DEFAULT_THRESHOLD}: {100 * data[task]['accuracy']:.1f}% "
                     f"(stock {100 * data[task]['stock_accuracy']:.1f}%), {data[task]['mean_layers']:.2f} layers "
                     f"on average")
    return InfoSection(data=data, lines=tuple(lines))


def _test_artifacts(preset: str) -> dict[str, object]:
    """Each task's trained early-exit model (``prepared["exit_ramps"]["sentiment"]``)."""
    from workbench.earlyexit.artifacts import prepare_model

    return {"exit_ramps": {task: prepare_model(task, preset, progress=False) for task in TASKS}}


def _configure(name: str):
    def configure(parser):
        from workbench.earlyexit import commands

        getattr(commands, f"configure_{name}")(parser)
    return configure


MECHANISM = Mechanism(
    name="earlyexit",
    title="Early-exit serving (E3)",
    paper="E3: early-exit models split where the batch shrinks, early splits replicated so every batch runs full",
    prepare_steps=_steps,
    commands=(
        Command(name="accuracy", help="accuracy and mean exit layer per entropy threshold of the trained ramps",
                configure=_configure("accuracy")),
        Command(name="plan", help="E3's split plan (splits, replicas, GPU types, batch sizes) for a cluster and SLO",
                configure=_configure("plan")),
        Command(name="simulate", help="simulate serving a split plan (SimPy): goodput, latency, drops",
                configure=_configure("simulate")),
        Command(name="serve", help="serve a split plan for real on Ray Serve (a local cluster, or --address)",
                configure=_configure("serve")),
    ),
    benchmarks={"e3": "workbench.earlyexit.bench"},
    dashboard=Dashboard(
        page="earlyexit.ipynb", title="Early-exit serving (E3)",
        summary="SLO, batch size, GPUs per type, easy:hard mix, exit threshold and arrivals -> the batch size at "
                "every ramp (measured and forecast), E3's split plan and why, pipeline bubbles per replica "
                "(simulated, and measured on Ray Serve), goodput of E3 against the early-exit and stock models",
        requires=tuple(_step_name(t) for t in TASKS), probe_control="SLO (ms)", probe_figure="plan",
        ends=(("A6000", 32), ("V100", 32), ("P100", 32), ("K80", 32), ("Batch per replica", "max"),
              ("Arrivals", "bursty"), ("Rate (requests/s)", "max"), ("SLO (ms)", "max")),
        panel="workbench.ui.earlyexit:EarlyExitPanel"),
    notebooks=(
        Notebook(path="earlyexit_e3.ipynb", title="Early-exit serving: a tutorial", kind="tutorial"),
        Notebook(path="labs/earlyexit_lab.ipynb", title="Early-exit serving: a teaching lab", kind="lab"),
        Notebook(path="earlyexit_evaluation.ipynb", title="Early-exit serving beside the paper", kind="evaluation"),
    ),
    info=_info,
    overview=OverviewSection(title="Early-exit serving (E3): the split plan and its pipeline bubbles",
                             panel="workbench.ui.earlyexit:EarlyExitOverview", requires=(_step_name("sentiment"),)),
    test_artifacts=_test_artifacts,
)
