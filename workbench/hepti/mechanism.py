"""What Hepti (heterogeneous partitioning) brings to the workbench: its dashboard, lab and evaluation.

Hepti's engine lives in :mod:`workbench.partition` (:mod:`~workbench.partition.hepti`,
:mod:`~workbench.partition.hepti_run`) beside Voltage's, and so do its command (`workbench partition hepti`)
and its benchmark (`workbench bench hepti`); this declaration gives it a page of its own in the gallery.
Nothing to prepare: the shipped encoder is read from its package.
"""
from __future__ import annotations

from workbench.mechanisms import Dashboard, Mechanism, Notebook

MECHANISM = Mechanism(
    name="hepti",
    title="Heterogeneous partitioning (Hepti)",
    paper="Hepti: three weight-stationary modes and LP-based workload shares over unequal edge devices",
    dashboard=Dashboard(
        page="hepti.ipynb", title="Heterogeneous partitioning (Hepti)",
        summary="an editable table of unequal devices (speed, memory, link, a mid-run memory fall), a deadline, "
                "a mode and a share rule -> Hepti's shares and mode per layer with the reasons and the binding "
                "constraint, latency per device against the deadline, Hepti's MILP beside even and proportional "
                "shares and each mode, the per-layer timeline with mode switches, re-partitions and faults marked "
                "(predicted, and measured on real processes)",
        probe_control="Sequence length", probe_figure="breakdown",
        panel="workbench.ui.hepti:HeptiPanel"),
    notebooks=(
        Notebook(path="labs/hepti_lab.ipynb", title="Heterogeneous partitioning: a teaching lab", kind="lab"),
        Notebook(path="hepti_evaluation.ipynb", title="Heterogeneous partitioning beside the paper",
                 kind="evaluation"),
    ),
)
