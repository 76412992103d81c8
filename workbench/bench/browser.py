"""`workbench bench browser`: each dashboard served by Voila and driven in Debian's chromium.

Per dashboard (the overview and every registered mechanism's page), printed:

- ``cold_s``: from navigation to the page's probe figure drawn for the first time (by
  default the server preheats: one kernel per page waits with its notebook already run,
  as `workbench dashboards` serves; ``--no-preheat`` measures a kernel started on request);
- ``redraw_median_ms`` / ``redraw_p95_ms``: from a key press on the probe slider (the
  handle focused; an arrow key away from its nearer end, turning at an end, so each change
  is to a value the page has not drawn yet, as long as the slider has steps) until the probe
  figure is redrawn in the page (its ``data-revision`` moved on and ``Plotly.react``
  finished), over ``--changes`` changes made one after another, as a hand moving the slider
  makes them: a page that defers its secondary figures (``Panel.defer``) redraws only the
  steered ones while the changes keep coming;
- ``settled_ms``: after the page has been quiet, one more change until every figure of the
  page has been redrawn and none is drawn stale (the hand paused: the deferred figures too).

With ``--at-ends`` each page's controls are first set in the page to their ends (``Dashboard.ends``: most
devices, longest sequence, tightest deadline ...; each change awaited until the probe figure settles), and
the probe slider then walks inward from its end.

The server side of the same change (re-plan and build the figures) is ``bench ui``.
"""
from __future__ import annotations

import re
import time

import numpy as np

PAGE_TIMEOUT_MS = 180_000
REDRAW_TIMEOUT_S = 30


def _revision(page, figure: str) -> int:
    value = page.locator(f".wb-figure[data-name='{figure}']").get_attribute("data-revision")
    return int(value or 0)


SETTLE_S = 1.5
"""A figure whose revision has not moved for this long after a control change is taken as settled."""


def widget_labelled(page, label: str):
    """The ipywidgets control whose description is exactly ``label``."""
    exact = page.locator("label.widget-label").filter(has_text=re.compile(rf"^\s*{re.escape(label)}\s*$"))
    return page.locator(".widget-inline-hbox", has=exact).first


def set_control(page, label: str, value) -> None:
    """Set the control labelled ``label`` the way a person does: a slider's readout typed (``"max"`` / ``"min"``
    its end, by the End or Home key), a dropdown's option picked by its label, a text box typed, a checkbox
    clicked to ``value``."""
    if isinstance(value, bool):
        box = page.locator(".widget-checkbox", has=page.locator("label", has_text=label)).first.locator("input")
        if box.is_checked() != value:
            box.click()
        return
    widget = widget_labelled(page, label)
    if widget.locator(".noUi-handle").count():
        if value in ("max", "min"):                   # a selection slider's readout takes no typing: its keys
            widget.locator(".noUi-handle").first.focus()
            page.keyboard.press("End" if value == "max" else "Home")
            return
        widget.locator(".widget-readout").click()
        page.keyboard.press("Control+A")
        page.keyboard.type(str(value))
        page.keyboard.press("Enter")
    elif widget.locator("select").count():
        widget.locator("select").select_option(label=str(value))
    else:
        field = widget.locator("input")
        field.fill(str(value))
        field.press("Enter")


_PAGE_STATE = """() => Array.from(document.querySelectorAll('.wb-figure')).map(
    el => `${el.dataset.name}:${el.dataset.revision}:${el.classList.contains('wb-stale')}`).join('|')"""


SETTLED_QUIET_S = 5.0
"""How long no figure may change before a page counts as settled after a change (longer than a deferred
update's wait plus the slowest gap between one figure's redraw and the next)."""


def _figure_state(figure: str) -> str:
    return f"() => {{ const el = document.querySelector(\".wb-figure[data-name='{figure}']\"); " \
           "return el ? `${el.dataset.revision}` : ''; }"


def _quiet(page, state_js: str, since: float, last: str, quiet_s: float, timeout_s: float,
           changes: bool = False) -> tuple[float, str]:
    """Wait until ``state_js`` has read the same for ``quiet_s`` with no figure stale in it (with ``changes``:
    after one change at least); the time and state of the last change seen (``since`` and ``last`` if none)."""
    changed, started = not changes, time.perf_counter()
    while True:
        page.wait_for_timeout(25)
        now, state = time.perf_counter(), page.evaluate(state_js)
        if state != last:
            last, since, changed = state, now, True
        elif changed and now - since >= quiet_s and ":true" not in state:
            return since, state
        if now - started > timeout_s:
            raise TimeoutError(f"the page kept redrawing for {timeout_s:.0f} s")


def settle(page, figure: str, quiet_s: float = SETTLE_S, timeout_s: float = 120.0) -> None:
    """Wait until ``figure``'s revision has not moved for ``quiet_s``."""
    state_js = _figure_state(figure)
    _quiet(page, state_js, time.perf_counter(), page.evaluate(state_js), quiet_s, timeout_s)


def page_quiet(page, quiet_s: float = SETTLE_S, timeout_s: float = 120.0) -> None:
    """Wait until no figure of the page has been redrawn for ``quiet_s`` and none is drawn stale."""
    _quiet(page, _PAGE_STATE, time.perf_counter(), page.evaluate(_PAGE_STATE), quiet_s, timeout_s)


def settled_after(page, press, quiet_s: float = SETTLE_S, timeout_s: float = 120.0) -> float:
    """Once the page is quiet, seconds from ``press()`` until its last figure redraw, with no figure left stale."""
    _, last = _quiet(page, _PAGE_STATE, time.perf_counter(), page.evaluate(_PAGE_STATE), quiet_s, timeout_s)
    moved = time.perf_counter()
    press()
    changed, _ = _quiet(page, _PAGE_STATE, moved, last, quiet_s, timeout_s, changes=True)
    return changed - moved


def _inward(key: str, handle, low: float, high: float) -> str:
    """``key``, or the other arrow when the slider already stands at the end ``key`` moves towards."""
    now = float(handle.get_attribute("aria-valuenow"))
    if (key == "ArrowRight" and now >= high) or (key == "ArrowLeft" and now <= low):
        return "ArrowLeft" if key == "ArrowRight" else "ArrowRight"
    return key


def measure_page(browser, base: str, dashboard, changes: int, at_ends: bool = False) -> dict:
    """Cold load and redraw times of one dashboard page (at its controls' ends with ``at_ends``)."""
    context = browser.new_context(viewport={"width": 1280, "height": 1600})
    page = context.new_page()
    try:
        started = time.perf_counter()
        page.goto(f"{base}/voila/render/{dashboard.page}", timeout=PAGE_TIMEOUT_MS)
        figure = page.locator(f".wb-figure[data-name='{dashboard.probe_figure}'][data-revision]")
        figure.wait_for(timeout=PAGE_TIMEOUT_MS)
        cold_s = time.perf_counter() - started
        if at_ends:
            for label, value in dashboard.ends:
                set_control(page, label, value)
                settle(page, dashboard.probe_figure)
        handle = widget_labelled(page, dashboard.probe_control).locator(".noUi-handle").first
        handle.focus()
        low, high = (float(handle.get_attribute(f"aria-value{end}")) for end in ("min", "max"))
        now = float(handle.get_attribute("aria-valuenow"))
        key = "ArrowLeft" if now - low > high - now else "ArrowRight"
        samples = []
        for _ in range(changes):
            key = _inward(key, handle, low, high)
            before = _revision(page, dashboard.probe_figure)
            moved = time.perf_counter()
            page.keyboard.press(key)
            page.wait_for_function(
                "([name, before]) => { const el = document.querySelector(`.wb-figure[data-name='${name}']`);"
                " return el && Number(el.dataset.revision) > before; }",
                arg=[dashboard.probe_figure, before], timeout=1000 * REDRAW_TIMEOUT_S)
            samples.append(time.perf_counter() - moved)
        key = _inward(key, handle, low, high)
        settled_s = settled_after(page, lambda: page.keyboard.press(key), quiet_s=SETTLED_QUIET_S)
        return {"page": dashboard.page, "at_ends": at_ends, "cold_s": cold_s, "changes": len(samples),
                "redraw_median_ms": 1e3 * float(np.median(samples)),
                "redraw_p95_ms": 1e3 * float(np.percentile(samples, 95)), "redraw_max_ms": 1e3 * max(samples),
                "settled_ms": 1e3 * settled_s}
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
    p.add_argument("--at-ends", action="store_true",
                   help="first set each page's controls to their ends (most devices, longest sequence, tightest "
                        "deadline ...), then time the probe slider stepping from its end")
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
            row = measure_page(browser, base, dashboard, opts.changes, opts.at_ends)
            where = " at its controls' ends" if opts.at_ends else ""
            print(f"{dashboard.page}{where}: first figure {row['cold_s']:.1f} s after navigation; control change -> "
                  f"redrawn figure median {row['redraw_median_ms']:.0f} ms, p95 {row['redraw_p95_ms']:.0f} ms; "
                  f"every figure settled {row['settled_ms']:.0f} ms after a change made in a pause",
                  flush=True)
            rows.append({"preset": opts.preset, "preheat": opts.preheat, **row})
    return rows
