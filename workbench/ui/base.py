"""The pattern every dashboard follows.

A :class:`Panel` is a VBox whose controls call small update methods: each reads the
controls, calls the engine and hands the result to pure figure builders, whose figures
are drawn by the panel's in-place figure views (:mod:`workbench.ui.figure`).

Errors. An update that raises :class:`~workbench.errors.WorkbenchError` (something the
user can act on) shows its message in the message slot placed beside the controls that
trigger it (:meth:`Panel.message_slot`), until the update next succeeds. Any other
exception is a bug: it shows as "internal error" with the traceback in a collapsed
details element and is logged, never disguised as a user error.

Stale work never piles up. The browser keeps at most one state message per widget in
flight and merges later values into the next one. On the kernel side, a change from the
browser only marks its update as pending; a flush runs ``SETTLE_S`` later on the
kernel's event loop, once, with the latest values, so changes to several controls that
arrive together cost one engine call. Changes made from Python (notebooks, tests) apply
at once, so the next line sees their result.

The figure being steered first. An update may hand its costly, secondary part (a
comparison over every mode, a simulation) to :meth:`Panel.defer`: for a change from the
browser it runs once the page has been quiet for ``DEFER_S``, and every further change
postpones it, so a slider being moved redraws the figures it drives at once and the
rest catch up when the hand pauses; meanwhile those figures are drawn dimmed as stale.
Changes made from Python run it at once, as before.

Long work runs off the kernel's main thread in a :class:`BackgroundRun` (a button, a
progress bar with the time left, Cancel and a run counter), so the page stays live.
"""
from __future__ import annotations

import asyncio
import html
import logging
import threading
import time
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.errors import WorkbenchError
from workbench.ui.figure import DEFAULT_HEIGHT_PX, FigureView
from workbench.ui.messages import error_html
from workbench.ui.stylesheet import stylesheet

SETTLE_S = 0.005
DEFER_S = 0.3
"""Quiet time after a change from the browser before a panel's deferred (secondary) updates run."""
log = logging.getLogger("workbench.ui")

Update = Callable[[], None]


def kernel_loop() -> asyncio.AbstractEventLoop | None:
    """The running Jupyter kernel's event loop, where widget changes belong; None outside a kernel.

    Outside a kernel (scripts, tests) an event loop may still be registered as running
    (Playwright's sync API leaves one) without anyone serving it, so a loop alone is no
    sign that callbacks posted to it will run.
    """
    try:
        from ipykernel.kernelbase import Kernel
    except ImportError:
        return None
    if not Kernel.initialized():
        return None
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def preset_notice_html(preset: str | None = None) -> str:
    """The quick-preset line (``workbench.prepare.preset_notice``) as HTML; '' for the full preset."""
    from workbench.prepare import preset_notice
    from workbench.presets import default_preset

    text = preset_notice(preset or default_preset())
    return f"<div class='wb-notice wb-preset-notice'>{html.escape(text)}</div>" if text else ""


def preset_notice_widget(preset: str | None = None) -> widgets.HTML | None:
    """The quick-preset line as a widget (``None`` for the full preset)."""
    notice = preset_notice_html(preset)
    return widgets.HTML(notice) if notice else None


def show_preset_notice(preset: str | None = None) -> None:
    """In a notebook: display the quick-preset line, or nothing for the full preset. The line is HTML, so a
    saved or statically rendered notebook keeps it; the stylesheet widget before it styles it in a live one."""
    from IPython.display import HTML, display

    notice = preset_notice_html(preset)
    if notice:
        display(stylesheet(), HTML(notice))


class Panel(widgets.VBox):
    """Base class: subclasses build controls and figure slots, then implement ``_refresh``."""

    dashboard_page = ""       # the Voila page this panel is (its Dashboard in the mechanism registry)

    @classmethod
    def page(cls, preset: str | None = None, **kwargs) -> widgets.Widget:
        """The panel as its dashboard shows it: the prepare progress of what it needs until that is ready."""
        from workbench.mechanisms import dashboards
        from workbench.presets import page_preset
        from workbench.ui.preparing import prepared_page

        preset = preset or page_preset()
        board = next(d for d in dashboards() if d.page == cls.dashboard_page)
        page = prepared_page(lambda chosen: cls(chosen, **kwargs), board.requires, board.title, preset)
        notice = preset_notice_widget(preset)
        return page if notice is None else widgets.VBox([notice, page])

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.message = widgets.HTML(value="", layout=widgets.Layout(min_height="0px"))
        self._views: dict[str, FigureView] = {}
        self._keys: dict[str, object] = {}                       # figure name -> key of what it shows
        self._errors: dict[Update, str] = {}                     # update -> html of its last error
        self._message_slots: dict[Update, widgets.HTML] = {}     # update -> where its errors show
        self._pending: dict[Update, None] = {}                   # updates waiting for the flush, in order
        self._flush_handle = None
        self._deferred: dict[Update, tuple[str, ...]] = {}       # secondary updates waiting for quiet, in order
        self._defer_handle = None
        self._flushing = False
        self.updates_run = 0          # engine updates actually run (the coalescing test counts them)

    def bench_sweeps(self) -> dict[str, tuple[widgets.Widget, list]]:
        """Controls `workbench bench ui` moves, each with the values it sets in turn ({}: the page's probe
        control over its range)."""
        return {}

    # -- figures

    @property
    def figures(self) -> dict[str, go.Figure]:
        """The last figure shown in each slot (for tests and notebooks)."""
        return {name: view.last for name, view in self._views.items() if view.last is not None}

    def figure_slot(self, name: str, height: int = DEFAULT_HEIGHT_PX) -> FigureView:
        """The view where figure ``name`` is drawn; created once and redrawn in place."""
        if name not in self._views:
            self._views[name] = FigureView(name=name, height=height)
        return self._views[name]

    def show_figure(self, name: str, figure: go.Figure) -> go.Figure:
        """Draw ``figure`` in slot ``name``."""
        self._keys.pop(name, None)
        return self.figure_slot(name).show(figure)

    def show_if_changed(self, name: str, key, build: Callable[[], go.Figure]) -> None:
        """Draw ``build()`` in slot ``name`` unless it already shows ``key``."""
        if name in self._keys and self._keys[name] == key:
            return
        self.figure_slot(name).show(build())
        self._keys[name] = key

    # -- errors

    def message_slot(self, *updates: Update) -> widgets.HTML:
        """An error area for ``updates`` (bound methods), to place beside the controls that trigger them."""
        slot = widgets.HTML(value="", layout=widgets.Layout(min_height="0px"))
        for update in updates:
            self._message_slots[update] = slot
        return slot

    def _show_errors(self) -> None:
        slots = {id(self.message): self.message, **{id(w): w for w in self._message_slots.values()}}
        for key, slot in slots.items():
            slot.value = "".join(text for update, text in self._errors.items()
                                 if id(self._message_slots.get(update, self.message)) == key)

    def report(self, update: Update, exc: BaseException | None) -> None:
        """Record how ``update`` ended (None: success) and redraw the message slots."""
        if exc is None:
            self._errors.pop(update, None)
        else:
            if not isinstance(exc, WorkbenchError):
                log.error("internal error in %s", getattr(update, "__qualname__", update), exc_info=exc)
            self._errors[update] = error_html(exc)
        self._show_errors()

    # -- updates

    def observe_controls(self, *controls: widgets.Widget, update: Update | None = None) -> None:
        """Call ``update`` (default: the whole ``_refresh``) whenever one of ``controls`` changes."""
        update = update or self._refresh
        for control in controls:
            control.observe(lambda _change, c=control: self._changed(c, update), names="value")

    def _changed(self, control: widgets.Widget, update: Update) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        # ``_property_lock`` is set while ipywidgets applies a state message from the browser.
        if loop is None or not control._property_lock:
            self.refresh(update)
            return
        self._pending[update] = None
        if self._defer_handle is not None:            # the hand is still moving: secondary work waits
            self._defer_handle.cancel()
            self._defer_handle = None
        if self._flush_handle is None:
            self._flush_handle = loop.call_later(SETTLE_S, self._flush)

    def _flush(self) -> None:
        """Run each pending update once, with the controls' latest values."""
        self._flush_handle = None
        pending, self._pending = list(self._pending), {}
        if self._refresh in pending:                  # the full refresh covers every partial one
            pending = [self._refresh]
        self._flushing = True
        try:
            for update in pending:
                self.refresh(update)
        finally:
            self._flushing = False
        if self._deferred and self._defer_handle is None:
            self._defer_handle = asyncio.get_running_loop().call_later(DEFER_S, self._run_deferred)

    def defer(self, update: Update, *figures: str) -> None:
        """Run ``update``, a secondary part of the current change that draws ``figures``: at once for a change
        made from Python, else once the page is quiet (``DEFER_S`` after the last change from the browser),
        with those figures dimmed until then."""
        if not self._flushing:
            self.refresh(update)
            return
        self._deferred[update] = figures
        for name in figures:
            self.figure_slot(name).stale = True

    @property
    def deferred(self) -> list[Update]:
        """Secondary updates still waiting for the page to be quiet."""
        return list(self._deferred)

    def _run_deferred(self) -> None:
        self._defer_handle = None
        deferred, self._deferred = dict(self._deferred), {}
        for update, figures in deferred.items():
            self.refresh(update)
            for name in figures:
                self.figure_slot(name).stale = False

    def refresh(self, update: Update | None = None) -> None:
        """Run ``update`` (default ``_refresh``) and show how it ended."""
        update = update or self._refresh
        self.updates_run += 1
        try:
            update()
        except Exception as exc:                      # shown in the page: a user error, or a bug with its trace
            self.report(update, exc)
        else:
            self.report(update, None)

    def _refresh(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


R = TypeVar("R")


class Memo:
    """Engine results a panel computed, by their inputs: the last ``size`` kept, the least recently used going
    first. A ``WorkbenchError`` the engine raised is kept too and raised again, so a setting it refuses is not
    computed again each time the page comes back to it."""

    def __init__(self, size: int):
        from collections import OrderedDict

        self.size = size
        self._kept: OrderedDict = OrderedDict()

    def get_or(self, key: Hashable, make: Callable[[], Any]):
        if key in self._kept:
            self._kept.move_to_end(key)
        else:
            try:
                self._kept[key] = make()
            except WorkbenchError as exc:
                self._kept[key] = exc
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        value = self._kept[key]
        if isinstance(value, WorkbenchError):
            raise value.with_traceback(None)
        return value

    def __len__(self) -> int:
        return len(self._kept)


@dataclass(frozen=True)
class RunOutcome(Generic[R]):
    """What a panel's background run gives back: ``key``, the settings it ran with as the panel keys them (the
    page draws the run only while its settings give the same key), ``result``, the engine's own typed result
    (a Hepti run, a partition run, a replay per method ...), ``made_with`` what it was made from where the page
    needs more than the key (a plan), and ``note``, a line the page shows beside it."""
    key: Hashable
    result: R
    made_with: Any = None
    note: str = ""


class KeptRuns(Generic[R]):
    """A panel's last ``size`` real runs by key, the latest last: running a key again replaces its run and
    moves it last; beyond ``size`` the oldest go first."""

    def __init__(self, size: int):
        self.size = size
        self._runs: dict[Hashable, RunOutcome[R]] = {}

    def keep(self, outcome: RunOutcome[R]) -> None:
        self._runs.pop(outcome.key, None)
        self._runs[outcome.key] = outcome
        while len(self._runs) > self.size:
            self._runs.pop(next(iter(self._runs)))

    def get(self, key: Hashable) -> RunOutcome[R] | None:
        return self._runs.get(key)

    def __getitem__(self, key: Hashable) -> RunOutcome[R]:
        return self._runs[key]

    def values(self) -> list[RunOutcome[R]]:
        """The runs kept, the oldest first."""
        return list(self._runs.values())

    def latest_first(self) -> Iterator[RunOutcome[R]]:
        return reversed(self.values())

    def __len__(self) -> int:
        return len(self._runs)


class RunHandle:
    """What work running in a :class:`BackgroundRun` sees: progress reporting and the Cancel flag."""

    def __init__(self, run: "BackgroundRun"):
        self._run = run
        self.cancelled = threading.Event()

    def progress(self, done: int, total: int) -> None:
        """Report ``done`` of ``total`` units (the bar shows it with the time left)."""
        self._run._post(self._run._show_progress, done, total)

    def should_stop(self) -> bool:
        return self.cancelled.is_set()

    def on_page(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` where widgets may change (the kernel's event loop): how work says more than its progress,
        e.g. the stage it is in."""
        self._run._post(fn)


class BackgroundRun(widgets.HBox):
    """A button that runs ``work(handle)`` off the kernel's main thread, with progress, Cancel and a counter.

    ``work`` runs in a worker thread and must touch no widget: it reports through its
    :class:`RunHandle`. Its result goes to ``on_done(result, cancelled)`` on the kernel's
    event loop, where widgets may change. Errors go to the owning panel's message slot
    for ``work`` (user errors inline; anything else as an internal error, logged). The
    state shared by the two threads (the running flag and the counter) is guarded by a
    lock. Outside a Jupyter kernel (a plain Python session, the tests) the work runs at
    once, in the calling thread.
    """

    def __init__(self, panel: Panel, label: str, work: Callable[[RunHandle], Any],
                 on_done: Callable[[Any, bool], None], icon: str = "play"):
        self.panel, self.work, self.on_done = panel, work, on_done
        self.button = widgets.Button(description=label, button_style="primary", icon=icon,
                                     tooltip="runs in the background; the page stays live")
        self.bar = widgets.IntProgress(value=0, min=0, max=1, layout=widgets.Layout(width="160px",
                                                                                    visibility="hidden"))
        self.status = widgets.HTML("", layout=widgets.Layout(min_width="0px"))
        self.cancel_button = widgets.Button(description="Cancel", icon="stop",
                                            layout=widgets.Layout(visibility="hidden"))
        self.counter = widgets.HTML("<span class='wb-run-count'>0 runs</span>")
        self.message = panel.message_slot(work)
        self._lock = threading.Lock()
        self._handle: RunHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = 0.0
        self.runs_finished = 0
        self.button.on_click(lambda _b: self.start())
        self.cancel_button.on_click(lambda _b: self.cancel())
        super().__init__([self.button, self.bar, self.status, self.cancel_button, self.counter, self.message])

    @property
    def running(self) -> bool:
        with self._lock:
            return self._handle is not None

    def start(self) -> None:
        with self._lock:
            if self._handle is not None:
                self.panel.report(self.work, WorkbenchError("a run is already in progress; cancel it or wait for it"))
                return
            handle = self._handle = RunHandle(self)
        self._loop = kernel_loop()
        self._started = time.monotonic()
        self.button.disabled = True
        self.bar.value, self.bar.max = 0, 1
        self.bar.layout.visibility = self.cancel_button.layout.visibility = "visible"
        self.status.value = "<span class='wb-run-status'>starting ...</span>"
        self.panel.report(self.work, None)
        if self._loop is None:
            self._execute(handle)
        else:
            threading.Thread(target=self._execute, args=(handle,), daemon=True, name="workbench-run").start()

    def cancel(self) -> None:
        with self._lock:
            if self._handle is not None:
                self._handle.cancelled.set()
        self.status.value = "<span class='wb-run-status'>cancelling ...</span>"

    def _post(self, fn, *args) -> None:
        """Run ``fn(*args)`` on the kernel's event loop (at once when there is none)."""
        if self._loop is None:
            fn(*args)
        else:
            self._loop.call_soon_threadsafe(fn, *args)

    def _show_progress(self, done: int, total: int) -> None:
        self.bar.max, self.bar.value = max(1, total), min(done, max(1, total))
        elapsed = time.monotonic() - self._started
        left = f", about {elapsed / done * (total - done):.0f} s left" if 0 < done < total else ""
        self.status.value = f"<span class='wb-run-status'>{done} of {total}{left}</span>"

    def _execute(self, handle: RunHandle) -> None:
        try:
            result, error = self.work(handle), None
        except Exception as exc:                      # reported in the page by _finish
            result, error = None, exc
        self._post(self._finish, handle, result, error)

    def _finish(self, handle: RunHandle, result, error: BaseException | None) -> None:
        cancelled = handle.cancelled.is_set()
        with self._lock:
            self._handle = None
            self.runs_finished += 1
            finished = self.runs_finished
        self.button.disabled = False
        self.bar.layout.visibility = self.cancel_button.layout.visibility = "hidden"
        self.counter.value = f"<span class='wb-run-count'>{finished} run{'s' if finished != 1 else ''}</span>"
        self.status.value = ("<span class='wb-run-status'>cancelled</span>" if cancelled else
                             "<span class='wb-run-status'>failed</span>" if error is not None else
                             f"<span class='wb-run-status'>done in {time.monotonic() - self._started:.1f} s</span>")
        if error is None:
            try:
                self.on_done(result, cancelled)
            except Exception as exc:                  # shown beside the button like the work's own errors
                error = exc
        self.panel.report(self.work, error)


class DeviceRowWidgets(widgets.HBox):
    """One editable row of a device table: a label, speed (GFLOP/s), memory (GB) and link (Mbit/s), then a
    page's own ``extra`` (kind, widget) cells. Each cell carries the classes ``wb-dev-KIND`` and
    ``wb-dev-KIND-INDEX`` (the pages' tests find it by them); the engine's limits check the values when the
    page builds its devices, and a value out of range is said in the page. A page's rows and its
    :meth:`header` share ``CELL_WIDTH`` and ``LABEL_WIDTH``, so the column names stand over their cells."""

    CELL_WIDTH = "120px"
    LABEL_WIDTH = "80px"
    COLUMNS = ("device", "speed (GFLOP/s)", "memory (GB)", "link (Mbit/s)")

    def __init__(self, index: int, label_html: str, speed_gflops: float, memory_gb: float, bandwidth_mbit: float,
                 *, extra: tuple = ()):
        self.index = index
        box = widgets.Layout(width=self.CELL_WIDTH)
        self.speed = widgets.FloatText(value=speed_gflops, layout=box)
        self.memory = widgets.FloatText(value=memory_gb, layout=box)
        self.bandwidth = widgets.FloatText(value=bandwidth_mbit, layout=box)
        kinds = (("speed", self.speed), ("memory", self.memory), ("bandwidth", self.bandwidth), *extra)
        for kind, cell in kinds:
            cell.add_class(f"wb-dev-{kind}")
            cell.add_class(f"wb-dev-{kind}-{index}")
        self.cells: tuple[widgets.Widget, ...] = tuple(cell for _, cell in kinds)
        label = widgets.HTML(label_html, layout=widgets.Layout(width=self.LABEL_WIDTH))
        super().__init__([label, *self.cells], layout=widgets.Layout(flex="0 0 auto"))   # rows keep their height

    @classmethod
    def header(cls) -> widgets.HBox:
        """The table's column names (``COLUMNS``: the label's, then one per cell), each as wide as its cells."""
        first, *rest = cls.COLUMNS
        names = [widgets.HTML(html.escape(first), layout=widgets.Layout(width=cls.LABEL_WIDTH))]
        names += [widgets.HTML(html.escape(c), layout=widgets.Layout(width=cls.CELL_WIDTH)) for c in rest]
        box = widgets.HBox(names)
        box.add_class("wb-column-head")
        return box


def html_table(head, rows: list[str], *classes: str) -> str:
    """A small HTML table: a header row of ``head``, then ``rows`` (from :func:`table_row`), styled by the
    stylesheet's ``wb-table`` and tagged with ``classes`` (the pages' tests find it by them)."""
    return (f"<table class='{' '.join(('wb-table', *classes))}'>{table_row(head, 'th')}{''.join(rows)}</table>")


def table_row(cells, tag: str = "td", **data) -> str:
    """One row of a small HTML table, each cell escaped; ``data`` (``device=2``, ``layer=4``) tags the row as
    ``data-device='2'`` and so on, for the page's tests."""
    tags = "".join(f" data-{k}='{html.escape(str(v))}'" for k, v in data.items() if v is not None)
    return f"<tr{tags}>" + "".join(f"<{tag}>{html.escape(str(c))}</{tag}>" for c in cells) + "</tr>"
