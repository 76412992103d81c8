"""`workbench bench ui`: server-side cost of one control change on each dashboard.

Every registered page with a panel (``Dashboard.panel``: the overview and each mechanism's page) is
built for the preset; the controls its panel names (``Panel.bench_sweeps``, by default the page's probe
control over its range) are set the way a slider does, each change running the updates it triggers and
redrawing the figures. Printed per page and control: median and 95th percentile (target: median
<= 100 ms). The browser round trip is printed by `workbench bench browser`.
"""
from __future__ import annotations

import time

import numpy as np

from workbench.argtypes import Parser
from workbench.devices import profile_names
from workbench.presets import add_preset_argument

PROBE_VALUES = 48
"""Values a probe control without a sweep of its own is set to, spread over its range."""


def measured_pages():
    """The dashboards `bench ui` can build: those that name their panel."""
    from workbench.mechanisms import dashboards

    return [d for d in dashboards() if d.panel]


def parser() -> Parser:
    p = Parser(prog="workbench bench ui")
    add_preset_argument(p)
    p.add_argument("--device", default="odroid-n2", choices=profile_names(),
                   help="the device each page plans for, where it has a Device control offering it")
    p.add_argument("--pages", nargs="*", choices=[d.page for d in measured_pages()],
                   help="pages to measure (default: every page with a panel)")
    return p


def controls(widget):
    """``widget`` and every widget inside it."""
    yield widget
    for child in getattr(widget, "children", ()):
        yield from controls(child)


def control(panel, label: str):
    """The control of ``panel`` whose description is ``label`` (None if it has none)."""
    return next((w for w in controls(panel) if getattr(w, "description", None) == label and hasattr(w, "value")),
                None)


def probe_values(widget) -> list:
    """Values spread over ``widget``'s range: its options, or PROBE_VALUES steps from min to max."""
    options = getattr(widget, "_options_values", None)
    if options is not None:
        return list(options)
    values = np.linspace(widget.min, widget.max, PROBE_VALUES)
    return sorted({type(widget.value)(v) for v in values})


def sweeps(panel, dashboard) -> dict[str, tuple[object, list]]:
    """What to move on ``panel``: its own sweeps, else the page's probe control back and forth over its range."""
    declared = panel.bench_sweeps()
    if declared:
        return declared
    probe = control(panel, dashboard.probe_control)
    if probe is None:
        return {}
    values = probe_values(probe)
    return {dashboard.probe_control: (probe, values[1:] + values[-2::-1])}


def time_changes(widget, values: list) -> list[float]:
    samples = []
    for v in values:
        start = time.perf_counter()
        widget.value = v
        samples.append(time.perf_counter() - start)
    return samples


def run(args: list[str]) -> list[dict]:
    from workbench.mechanisms import load

    opts = parser().parse_args(args)
    rows = []
    for dashboard in measured_pages():
        if opts.pages and dashboard.page not in opts.pages:
            continue
        panel = load(dashboard.panel)(opts.preset)
        device = control(panel, "Device")
        if device is not None and opts.device in getattr(device, "_options_values", ()):
            device.value = opts.device
        found = sweeps(panel, dashboard)
        if not found:
            print(f"note: {dashboard.page} has no control named {dashboard.probe_control!r} to move")
        for name, (widget, values) in found.items():
            samples = time_changes(widget, values)
            if panel.message.value:
                print(f"note: {dashboard.page} reported {panel.message.value}")
            rows.append({"page": dashboard.page, "control": name, "changes": len(samples),
                         "median_ms": 1e3 * float(np.median(samples)),
                         "p95_ms": 1e3 * float(np.percentile(samples, 95)), "max_ms": 1e3 * max(samples)})
    return rows
