"""`workbench bench ui`: server-side cost of one control change on the elastic dashboard.

A sweep of target-latency values (and of preload sizes) is applied to an
``ElasticPanel`` the way a slider does; each change re-plans and rebuilds every
figure widget. Printed: median and 95th percentile per control (target: median
<= 100 ms). The browser round trip is printed by the browser test.
"""
from __future__ import annotations

import time

import numpy as np

from workbench.argtypes import Parser
from workbench.devices import profile_names
from workbench.presets import add_preset_argument


def parser() -> Parser:
    p = Parser(prog="workbench bench ui")
    add_preset_argument(p)
    p.add_argument("--device", default="odroid-n2", choices=profile_names(), help="the device the panel plans for")
    return p


def run(args: list[str]) -> list[dict]:
    from workbench.ui.elastic import ElasticPanel

    opts = parser().parse_args(args)
    panel = ElasticPanel(opts.preset, device=opts.device)
    rows = []
    sweeps = {"target": (panel.target, [float(v) for v in range(60, 1001, 20)]),
              "preload": (panel.preload, [float(v) for v in np.arange(0, 32.01, 0.75)])}
    for name, (control, values) in sweeps.items():
        samples = []
        for v in values:
            start = time.perf_counter()
            control.value = v
            samples.append(time.perf_counter() - start)
        if panel.message.value:
            print(f"note: the panel reported {panel.message.value}")
        rows.append({"control": name, "changes": len(samples), "median_ms": 1e3 * float(np.median(samples)),
                     "p95_ms": 1e3 * float(np.percentile(samples, 95)), "max_ms": 1e3 * max(samples)})
    return rows
