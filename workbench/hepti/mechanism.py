"""What Hepti (heterogeneous partitioning) brings to the workbench: its commands (`workbench hepti plan|run`,
and `workbench partition hepti` as the alias from before), its benchmark, dashboard, lab and evaluation.
Nothing to prepare: the shipped encoder is read from its package.
"""
from __future__ import annotations

from workbench.hepti import commands
from workbench.mechanisms import Command, Dashboard, Mechanism, Notebook, OverviewSection

MECHANISM = Mechanism(
    name="hepti",
    title="Heterogeneous partitioning (Hepti)",
    paper="Hepti: three weight-stationary modes and LP-based workload shares over unequal edge devices",
    commands=(
        Command(name="plan", help="Hepti's mode, shares and reasons over a cluster of unequal devices (the "
                                  "mixed-integer program; instant)", configure=commands.configure_plan),
        Command(name="run", help="plan, then run the request on one process per device (replayed, or --measured "
                                 "under CPU limits), optionally with memory falls and a killed device",
                configure=commands.configure_run),
        Command(name="hepti", help="Hepti's plan, and with --run its run", configure=commands.configure_alias,
                group="partition"),
    ),
    benchmarks={"hepti": "workbench.hepti.bench"},
    dashboard=Dashboard(
        page="hepti.ipynb", title="Heterogeneous partitioning (Hepti)",
        summary="an editable table of unequal devices (speed, memory, link, a mid-run memory fall), a deadline, "
                "a mode and a share rule -> Hepti's shares and mode per layer with the reasons and the binding "
                "constraint, latency per device against the deadline, Hepti's MILP beside even and proportional "
                "shares and each mode, the per-layer timeline with mode switches, re-partitions and faults marked "
                "(predicted, and measured on real processes)",
        probe_control="Sequence length", probe_figure="breakdown",
        ends=(("Devices", "max"), ("Meet a deadline", True), ("Deadline (ms)", "min"), ("Sequence length", "max")),
        panel="workbench.ui.hepti:HeptiPanel"),
    notebooks=(
        Notebook(path="labs/hepti_lab.ipynb", title="Heterogeneous partitioning: a teaching lab", kind="lab"),
        Notebook(path="hepti_evaluation.ipynb", title="Heterogeneous partitioning beside the paper",
                 kind="evaluation"),
    ),
    overview=OverviewSection(title="Heterogeneous partitioning (Hepti): the mode and shares it picks",
                             panel="workbench.ui.hepti:HeptiOverview"),
)
