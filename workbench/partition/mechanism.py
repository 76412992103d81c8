"""What position-wise partitioning (Voltage) brings to the workbench: commands, its benchmark, page and notebooks.

Nothing to prepare: the shipped encoder is read from its package, the decoder from the conversion
the LLM context service prepares (made on first use otherwise), and the paper's shapes are random
layers drawn from a seed.
"""
from __future__ import annotations

from workbench.mechanisms import Command, Dashboard, InfoSection, Mechanism, Notebook, OverviewSection
from workbench.partition import commands


def _info(preset: str) -> InfoSection:
    """The cost model's verdict at the paper's set-up (six devices, 500 Mbit/s) on the shipped encoder."""
    from workbench.partition.cost import SHAPES
    from workbench.partition.plan import devices_like, plan_partition

    devices = devices_like(6)
    single = plan_partition("single", SHAPES["encoder"], 128, devices).predicted_s
    voltage = plan_partition("voltage", SHAPES["encoder"], 128, devices).predicted_s
    tp = plan_partition("tensor_parallel", SHAPES["encoder"], 128, devices).predicted_s
    data = {"devices": 6, "bandwidth_mbit": 500, "seq_len": 128,
            "predicted_ms": {"single": 1e3 * single, "voltage": 1e3 * voltage, "tensor_parallel": 1e3 * tp}}
    return InfoSection(data=data, lines=(
        f"partition 6 x edge-vm at 500 Mbit/s, encoder N=128 (cost model): one device {1e3 * single:.0f} ms, "
        f"Voltage {1e3 * voltage:.0f} ms, tensor parallel {1e3 * tp:.0f} ms",))


MECHANISM = Mechanism(
    name="partition",
    title="Position-wise partitioning (Voltage)",
    paper="Voltage: each layer split over devices by position, the attention order chosen, one All-Gather per layer",
    commands=(
        Command(name="plan", help="what the cost model predicts for each scheme (Voltage, tensor parallel, "
                                  "layer pipeline, one device)", configure=commands.configure_plan),
        Command(name="run", help="run one scheme on real worker processes and compare with its prediction",
                configure=commands.configure_run),
    ),
    benchmarks={"partition": "workbench.partition.bench"},
    dashboard=Dashboard(
        page="partition.ipynb", title="Position-wise partitioning (Voltage)",
        summary="device count, link bandwidth, sequence length, model, scheme and a table of unequal devices -> "
                "which positions each device computes and why, communication against compute per scheme, the "
                "per-layer timeline across devices (predicted, and measured on real processes), Theorem 2's "
                "order map",
        probe_control="Bandwidth (Mbit/s)", probe_figure="schemes",
        ends=(("Devices", "max"), ("Sequence length", "max"), ("Bandwidth (Mbit/s)", "min")),
        panel="workbench.ui.partition:PartitionPanel"),
    notebooks=(
        Notebook(path="partition_voltage.ipynb", title="Position-wise partitioning: a tutorial", kind="tutorial"),
        Notebook(path="labs/partition_lab.ipynb", title="Position-wise partitioning: a teaching lab", kind="lab"),
        Notebook(path="partition_evaluation.ipynb", title="Position-wise partitioning beside the paper",
                 kind="evaluation"),
    ),
    info=_info,
    overview=OverviewSection(title="Position-wise partitioning (Voltage): predicted latency of each scheme",
                             panel="workbench.ui.partition:PartitionOverview"),
)
