"""What a page shows while `workbench prepare` is still building what it needs.

:class:`PrepareStatus` lists prepare steps with their state (ready, running with its
percent and time left, waiting, failed), read from the background job's status file
and from the steps' own readiness checks, and reads them again every second while
anything is missing. :func:`prepared_page` shows that list in place of a dashboard
whose artifacts are not ready, and builds the dashboard in the same place as soon as
they are: a page opened during the prepare works without a reload (and a reload works
too). While the full artifacts are made, a waiting page offers its quick version in one
click, under a banner that says so, once the quick preset has what it needs (the
background job makes those first).
"""
from __future__ import annotations

import asyncio
import html
import time
from typing import Callable

import ipywidgets as widgets

from workbench.presets import default_preset, prepare_hint
from workbench.ui.messages import error_html
from workbench.ui.stylesheet import stylesheet

POLL_S = 1.0


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def running_progress(progress: dict, elapsed_s: float, estimate_s: float) -> tuple[float, float, str]:
    """A running step's (fraction done, seconds left, detail). With a progress report ("replays: 81 of 150"),
    the fraction is the report's own and the time left comes from the rate it was done at, so the bar, the
    detail and the time agree; without one, the elapsed time against the step's estimate (never 100 %)."""
    done, total = progress.get("done", 0), progress.get("total") or 0
    if total:
        detail = f"{progress['desc']}: {done} of {total}"
        spent = progress.get("elapsed_s") or 0.0
        left = spent * (total - done) / done if done and spent > 0 else max(0.0, estimate_s - elapsed_s)
        return done / total, left, detail
    fraction = min(0.99, elapsed_s / estimate_s) if estimate_s else 0.0
    return fraction, max(0.0, estimate_s - elapsed_s), ""


def describe_steps(preset: str, names: list[str] | None, ready: dict[str, bool], status: dict | None) -> list[dict]:
    """One row per step: name, state, percent (running step), seconds left (running or waiting)."""
    from workbench.prepare import host_step_times, step_estimate, steps

    by_name = {s["name"]: s for s in (status or {}).get("steps", [])}
    job_state = (status or {}).get("state")
    measured = host_step_times()
    rows = []
    for step in steps(preset):
        if names is not None and step.name not in names:
            continue
        entry = by_name.get(step.name, {})
        estimate = step_estimate(step, preset, measured)
        if ready.get(step.name):
            rows.append({"name": step.name, "state": "ready", "percent": 100.0, "left_s": 0.0})
        elif entry.get("state") == "running" and job_state == "running":
            elapsed = time.time() - entry.get("started", time.time())
            fraction, left, detail = running_progress(entry.get("progress") or {}, elapsed, estimate)
            rows.append({"name": step.name, "state": "running", "percent": 100 * fraction, "detail": detail,
                         "left_s": left})
        elif entry.get("state") in ("failed", "stopped") or job_state in ("failed", "stopped", "dead"):
            rows.append({"name": step.name, "state": "not ready", "percent": 0.0, "left_s": estimate})
        else:
            rows.append({"name": step.name, "state": "waiting", "percent": 0.0, "left_s": estimate})
    return rows


class PrepareStatus(widgets.VBox):
    """The state of prepare steps (all, or ``names``), kept current while any is missing."""

    def __init__(self, preset: str | None = None, names: list[str] | None = None,
                 on_ready: Callable[[], None] | None = None):
        super().__init__()
        self.preset = preset or default_preset()
        self.names = names
        self.on_ready = None                      # the caller sees the first state itself; later changes call it
        self.view = widgets.HTML()
        self.children = [self.view]
        self.ready: dict[str, bool] = {}          # step -> ready (checked until true: artifacts do not vanish)
        self.status: dict | None = None           # the job's last status, as read_status gives it
        self.all_ready = False
        self.on_refresh: Callable[[], None] | None = None   # told after every refresh (the quick-version offer)
        self.refresh()
        self.on_ready = on_ready
        if not self.all_ready:
            self._schedule()

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            try:
                loop = asyncio.get_event_loop()
            except RuntimeError:
                return                      # no loop (a plain script): call refresh() yourself
        loop.call_later(POLL_S, self._tick)

    def _tick(self) -> None:
        try:
            self.refresh()
        except Exception as exc:            # shown in the page: a status file being replaced, or a bug
            self.view.value = error_html(exc)
        if not self.all_ready:
            self._schedule()

    def refresh(self) -> bool:
        """Read readiness and the job's status again and redraw; True when every step is ready."""
        from workbench.prepare import steps
        from workbench.prepare_job import read_status

        for step in steps(self.preset):
            if (self.names is None or step.name in self.names) and not self.ready.get(step.name):
                self.ready[step.name] = step.ready(self.preset)
        self.status = read_status(self.preset)
        rows = describe_steps(self.preset, self.names, self.ready, self.status)
        was_ready, self.all_ready = self.all_ready, all(r["state"] == "ready" for r in rows)
        self.view.value = self._html(rows, self.status)
        if self.on_refresh is not None:
            self.on_refresh()
        if self.all_ready and not was_ready and self.on_ready is not None:
            self.on_ready()
        return self.all_ready

    def _html(self, rows: list[dict], status: dict | None) -> str:
        missing = [r for r in rows if r["state"] != "ready"]
        if not missing:
            return (f"<div class='wb-prepare wb-prepare-ready'>All {len(rows)} prepare steps of the "
                    f"{html.escape(self.preset)} preset are ready.</div>")
        state = (status or {}).get("state")
        left = sum(r["left_s"] for r in missing)
        if state == "running":
            phase = status.get("phase") or None
            first = ""
            if phase:
                first_left = max(0.0, phase["estimate_s"] - (time.time() - phase["started"]))
                left += first_left
                first = (f" It makes the {html.escape(phase['preset'])} versions first (about {_minutes(first_left)} "
                         f"left of those), so each page can open one meanwhile.")
            head = (f"Preparing the {html.escape(self.preset)} preset in the background: {len(rows) - len(missing)} "
                    f"of {len(rows)} steps ready, about {_minutes(left)} left.{first} Log: "
                    f"<code>{html.escape(str(status.get('log', '')))}</code>")
        elif state in ("failed", "stopped", "dead"):
            reason = html.escape(status.get("error") or "the job was stopped")
            said = "is dead" if state == "dead" else state
            head = (f"The background prepare {said} ({reason}); run <code>{html.escape(prepare_hint(self.preset))}"
                    f"</code> to finish it (it resumes where it stopped).")
        else:
            head = (f"{len(missing)} prepare step(s) missing; run <code>{html.escape(prepare_hint(self.preset))}"
                    f"</code> or start <code>workbench dashboards</code>, which prepares in the background.")
        cells = []
        for r in rows:
            bar = (f"<progress max='100' value='{r['percent']:.0f}'></progress> "
                   f"{r['percent']:.0f}%" if r["state"] == "running" else "")
            left_text = _minutes(r["left_s"]) if r["state"] in ("running", "waiting") and r["left_s"] else ""
            cells.append(f"<tr class='wb-step' data-state='{r['state']}'><td>{html.escape(r['name'])}"
                         f"</td><td>{r['state']}</td><td>{bar}</td><td>{left_text}</td><td><small>"
                         f"{html.escape(r.get('detail', ''))}</small></td></tr>")
        return (f"<div class='wb-prepare'><p>{head}</p><table class='wb-table wb-steps'><tr><th>step</th><th>state</th>"
                f"<th>progress</th><th>time left</th><th></th></tr>{''.join(cells)}</table></div>")


QUICK = "quick"
QUICK_NOTE = ("the quick artifacts: every prepare step run on a few batches, in minutes. The engine and figures are "
              "real, but the models are barely trained, so accuracies and speed-ups are rough")


def quick_ready(requires: tuple[str, ...]) -> bool:
    """Whether the quick preset has every step in ``requires`` ready."""
    from workbench.prepare import steps

    return all(s.ready(QUICK) for s in steps(QUICK) if s.name in requires)


def when_requested(callback: Callable[[], None]) -> bool:
    """In a kernel Voila preheated (run before anyone asked for the page), call ``callback`` on the kernel's
    event loop once the page is requested, when the request's query string is in ``$QUERY_STRING`` (a
    preheated kernel learns it only then); returns whether it will. Elsewhere the query string, if any, was
    there from the start and nothing is scheduled."""
    import os
    import threading

    if os.environ.get("VOILA_PREHEAT") != "True" or not os.environ.get("VOILA_KERNEL_ID"):
        return False
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False

    def wait() -> None:
        from voila.utils import wait_for_request

        wait_for_request()
        loop.call_soon_threadsafe(callback)

    threading.Thread(target=wait, daemon=True, name="voila-request").start()
    return True


RESEND_S = (1.0, 3.0, 8.0, 20.0, 45.0)
"""Delays after a change made on the page's request at which the change is sent again (:func:`resend_state`):
soon for a page that loads at once, later for one a busy machine takes tens of seconds to load."""


def resend_state(widget: widgets.Widget, key: str, loop) -> None:
    """Send ``widget``'s ``key`` again after each of :data:`RESEND_S` seconds on ``loop``. A change a preheated
    kernel makes as its page is requested reaches a browser that is still reading the kernel's widgets, and
    Voila 0.5's page can drop it there (it keeps the state it read first); the same state sent again once it
    has loaded lands. Sending an unchanged state again changes nothing where it was not lost."""
    for delay in RESEND_S:
        loop.call_later(delay, lambda: widget.send_state(key))


def quick_banner(extra: str = "") -> widgets.HTML:
    return widgets.HTML(f"<div class='wb-notice wb-quick-version'><b>Quick version.</b> This page shows "
                        f"{html.escape(QUICK_NOTE)}.{extra}</div>")


def prepared_page(build: Callable[[str], widgets.Widget], requires: tuple[str, ...], title: str,
                  preset: str | None = None) -> widgets.Widget:
    """``build(preset)`` if every step in ``requires`` is ready; else the steps' progress, replaced by
    ``build(preset)`` in place once they are. Meanwhile, once the quick preset has the steps, a button opens
    the page on them (``build("quick")``, under a banner saying so); the full page then waits behind a
    button of its own, so nobody's controls are swept away."""
    preset = preset or default_preset()
    page = widgets.VBox()
    showing: dict[str, bool] = {"quick": False}

    def full_ready() -> None:
        if not showing["quick"]:
            page.children = [build(preset)]
            return
        switch = widgets.Button(description=f"Switch to the {preset} version", icon="check",
                                button_style="success", layout=widgets.Layout(width="auto"))
        switch.on_click(lambda _b: setattr(page, "children", [build(preset)]))
        page.children = [widgets.HTML(f"<div class='wb-notice wb-full-ready'>The {html.escape(preset)} "
                                      f"artifacts are ready.</div>"), switch, *page.children[1:]]

    status = PrepareStatus(preset, list(requires), on_ready=full_ready)
    if status.all_ready:
        return build(preset)
    intro = widgets.HTML(f"<h2 class='wb-title'>{html.escape(title)}</h2><p class='wb-lead'>This page "
                         "needs artifacts that are still being prepared; it appears here by itself when they "
                         "are ready.</p>")
    offer = widgets.VBox()
    built: list[widgets.Widget] = []              # the quick version, built once
    preheated = False                             # whether a preheated kernel waits for the page's request

    def quick_children() -> list[widgets.Widget]:
        if not built:
            built.extend([quick_banner(f" The {html.escape(preset)} version is still being prepared; a button "
                                       f"here switches to it when it is ready."), build(QUICK)])
        return built

    def open_quick(_button=None) -> None:
        showing["quick"] = True
        status.on_refresh = None
        page.children = quick_children()

    def check_quick() -> None:
        if offer.children or preset == QUICK or not quick_ready(requires):
            return
        if preheated:
            # A preheated kernel builds the quick version before anyone asks for the page: a switch on the
            # ``?preset=quick`` request then only points the page at widgets the browser is told of when it
            # loads. Widgets made while the browser fetches the kernel's widget list can be named by a box
            # the browser reads before it learns of them ("widget model not found").
            quick_children()
        button = widgets.Button(description="Open the quick version now", icon="bolt", button_style="info",
                                layout=widgets.Layout(width="auto"))
        button.on_click(open_quick)
        offer.children = [widgets.HTML(f"<p class='wb-offer'>Meanwhile, this page can open on "
                                       f"{html.escape(QUICK_NOTE)}.</p>"), button]

    def requested() -> None:
        from workbench.presets import page_preset

        if page_preset() == QUICK and not showing["quick"] and not status.all_ready and quick_ready(requires):
            open_quick()
            try:
                resend_state(page, "children", asyncio.get_running_loop())
            except RuntimeError:                  # no loop (called from a script): nothing to send again
                pass

    page.children = [intro, offer, status, stylesheet()]
    status.on_refresh = check_quick
    if preset != QUICK:
        preheated = when_requested(requested)
    check_quick()
    return page
