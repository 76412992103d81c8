"""`workbench bench browser`: each dashboard served by Voila and driven in Debian's chromium.

Per dashboard (the overview and every registered mechanism's page), printed:

- ``cold_s``: from navigation to the page's probe figure drawn for the first time (by
  default the server preheats: one kernel per page waits with its notebook already run,
  as `workbench dashboards` serves; ``--no-preheat`` measures a kernel started on request);
- ``redraw_median_ms`` / ``redraw_p95_ms``: from a key press on the probe slider (the
  handle focused; ArrowRight and ArrowLeft in turn, so the value stays in range) until
  the probe figure is redrawn in the page (its ``data-revision`` moved on and
  ``Plotly.react`` finished), over ``--changes`` changes made one after another.

The server side of the same change (re-plan and build the figures) is ``bench ui``.
"""
from __future__ import annotations

import time

import numpy as np

PAGE_TIMEOUT_MS = 180_000
REDRAW_TIMEOUT_S = 30


def _revision(page, figure: str) -> int:
    value = page.locator(f".wb-figure[data-name='{figure}']").get_attribute("data-revision")
    return int(value or 0)


def measure_page(browser, base: str, dashboard, changes: int) -> dict:
    """Cold load and redraw times of one dashboard page."""
    context = browser.new_context(viewport={"width": 1280, "height": 1600})
    page = context.new_page()
    try:
        started = time.perf_counter()
        page.goto(f"{base}/voila/render/{dashboard.page}", timeout=PAGE_TIMEOUT_MS)
        figure = page.locator(f".wb-figure[data-name='{dashboard.probe_figure}'][data-revision]")
        figure.wait_for(timeout=PAGE_TIMEOUT_MS)
        cold_s = time.perf_counter() - started
        slider = page.locator(".widget-slider", has=page.locator("label", has_text=dashboard.probe_control))
        slider.locator(".noUi-handle").focus()
        samples = []
        for k in range(changes):
            before = _revision(page, dashboard.probe_figure)
            moved = time.perf_counter()
            page.keyboard.press("ArrowRight" if k % 2 == 0 else "ArrowLeft")
            page.wait_for_function(
                "([name, before]) => { const el = document.querySelector(`.wb-figure[data-name='${name}']`);"
                " return el && Number(el.dataset.revision) > before; }",
                arg=[dashboard.probe_figure, before], timeout=1000 * REDRAW_TIMEOUT_S)
            samples.append(time.perf_counter() - moved)
        return {"page": dashboard.page, "cold_s": cold_s, "changes": len(samples),
                "redraw_median_ms": 1e3 * float(np.median(samples)),
                "redraw_p95_ms": 1e3 * float(np.percentile(samples, 95)), "redraw_max_ms": 1e3 * max(samples)}
    finally:
        context.close()


def parser():
    from workbench.argtypes import LONGEST_RUN_S, Bound, Parser, count, non_negative
    from workbench.mechanisms import dashboards
    from workbench.presets import add_preset_argument
    from workbench.serving import KERNEL_CULL_S

    p = Parser(prog="workbench bench browser")
    add_preset_argument(p)
    p.add_argument("--changes", type=count(20, unit="changes", at_most=Bound(
        LONGEST_RUN_S // REDRAW_TIMEOUT_S, f"an hour's run of changes at the {REDRAW_TIMEOUT_S} s a redraw may take")),
        default=24, help="control changes timed per page")
    p.add_argument("--pages", nargs="*", choices=[d.page for d in dashboards()],
                   help="pages to measure (default: every dashboard)")
    p.add_argument("--no-preheat", dest="preheat", action="store_false",
                   help="start each page's kernel on request (what a page costs without a waiting kernel)")
    p.add_argument("--pool-wait-s", type=non_negative("s", Bound(
        KERNEL_CULL_S, f"the server stops kernels idle for {KERNEL_CULL_S} s")), default=40.0,
                   help="with preheating, seconds to let the server start and run its waiting kernels first")
    return p


def run(args: list[str]) -> list[dict]:
    from workbench.mechanisms import dashboards
    from workbench.serving import chromium, voila_server

    opts = parser().parse_args(args)
    pages = [d for d in dashboards() if not opts.pages or d.page in opts.pages]
    rows = []
    with voila_server(preheat=opts.preheat, env={"WORKBENCH_PRESET": opts.preset}) as base, chromium() as browser:
        if opts.preheat:
            time.sleep(opts.pool_wait_s)
        for dashboard in pages:
            row = measure_page(browser, base, dashboard, opts.changes)
            print(f"{dashboard.page}: first figure {row['cold_s']:.1f} s after navigation; control change -> "
                  f"redrawn figure median {row['redraw_median_ms']:.0f} ms, p95 {row['redraw_p95_ms']:.0f} ms",
                  flush=True)
            rows.append({"preset": opts.preset, "preheat": opts.preheat, **row})
    return rows
