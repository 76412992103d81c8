"""`workbench bench ui`: server-side cost of one control change on each dashboard.

Every registered page with a panel (``Dashboard.panel``: the overview and each mechanism's page) is
built for the preset; the controls its panel names (``Panel.bench_sweeps``, by default the page's probe
control over its range) are set the way a slider does, each change running the updates it triggers and
redrawing the figures. Printed per page and control: median and 95th percentile (target: median
<= 100 ms). With ``--at-ends`` each page's controls are first set to their ends (``Dashboard.ends``: most
devices, longest sequence, tightest deadline ...) and the probe control walks inward from its end one step
at a time, each step to a value not seen before. The browser round trip is printed by `workbench bench browser`.
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
    p.add_argument("--at-ends", action="store_true",
                   help="first set each page's controls to their ends, then walk the probe control inward from its end")
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


def end_value(widget, value):
    """The value ``value`` names for ``widget``: "max" / "min" a slider's end, an option's label, or itself."""
    options = getattr(widget, "_options_values", None)
    if value in ("max", "min"):
        return (options[-1] if value == "max" else options[0]) if options is not None else getattr(widget, value)
    labels = getattr(widget, "_options_labels", None)
    if labels is not None and value in labels:
        return options[labels.index(value)]
    return value


def set_ends(panel, dashboard) -> None:
    """Set ``panel``'s controls to the ends its page declares, in order (each change runs its updates)."""
    for label, value in dashboard.ends:
        widget = control(panel, label)
        if widget is None:
            raise LookupError(f"{dashboard.page} declares an end for {label!r} but has no such control")
        widget.value = end_value(widget, value)


def end_steps(widget, changes: int = PROBE_VALUES // 2) -> list:
    """Up to ``changes`` values walking ``widget`` from its current value, one step each, away from its nearer
    end: each a value not seen before, so no page's cache answers it."""
    options = getattr(widget, "_options_values", None)
    if options is not None:
        values, at = list(options), list(options).index(widget.value)
    else:
        step = widget.step or 1
        count = int(round((widget.max - widget.min) / step)) + 1
        values = [type(widget.value)(widget.min + k * step) for k in range(count)]
        at = int(round((widget.value - widget.min) / step))
    down = at > len(values) - 1 - at
    walk = values[at - 1::-1] if down else values[at + 1:]
    return walk[:changes]


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
        if opts.at_ends:
            set_ends(panel, dashboard)
            probe = control(panel, dashboard.probe_control)
            found = {} if probe is None else {dashboard.probe_control: (probe, end_steps(probe))}
        else:
            found = sweeps(panel, dashboard)
        if not found:
            print(f"note: {dashboard.page} has no control named {dashboard.probe_control!r} to move")
        for name, (widget, values) in found.items():
            samples = time_changes(widget, values)
            if panel.message.value:
                print(f"note: {dashboard.page} reported {panel.message.value}")
            rows.append({"page": dashboard.page, "control": name, "at_ends": opts.at_ends, "changes": len(samples),
                         "median_ms": 1e3 * float(np.median(samples)),
                         "p95_ms": 1e3 * float(np.percentile(samples, 95)), "max_ms": 1e3 * max(samples)})
    return rows
