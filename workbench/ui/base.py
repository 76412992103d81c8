"""The pattern every dashboard follows.

A :class:`Panel` is a VBox whose controls all call one ``refresh()``: it reads the
controls, calls the engine and hands the result to pure figure builders; Python
work happens once per settled value. Errors the user can act on appear as a
readable message in the panel, never as a traceback in the page.

Figures are shown by ``show_figure``, which displays the figure's JSON in an
``Output`` widget under Plotly's own MIME type (``application/vnd.plotly.v1+json``,
rendered by the jupyterlab-plotly extension in JupyterLab and Voila). Two
alternatives were measured and rejected: Plotly 7's ``FigureWidget`` updated in
place loses updates under anywidget (each update sets a ``_py2js_*`` trait to the
message and at once back to ``None``; when both land together the browser never
sees it: about 1 run in 3 in the browser test), and a new ``FigureWidget`` per
update ships its 4.6 MB JavaScript bundle each time (8 s from a slider release to
the redrawn page here). The MIME payload is a few kilobytes and is drawn at once.
``self.figures[name]`` keeps the last ``go.Figure`` shown, for tests and notebooks.

Stale work never piles up. The browser side already keeps at most one state message per widget in
flight and merges later values into the next one (12 arrow-key steps on a slider reached the
kernel as 2 changes in the browser test). On the kernel side, a change from the browser only marks
its update as pending; a flush runs ``SETTLE_S`` later on the kernel's event loop, once, with the
latest values, so changes to several controls that arrive together cost one engine call. Changes
made from Python (notebooks, tests) apply at once, so the next line sees their result.
"""
from __future__ import annotations

import asyncio
import html
import json

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.errors import WorkbenchError

SETTLE_S = 0.03
ERROR_STYLE = "color:#b00020;background:#fdecea;padding:4px 8px;border-radius:4px"


class Panel(widgets.VBox):
    """Base class: subclasses build controls and figures, then implement ``_refresh``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.message = widgets.HTML(value="", layout=widgets.Layout(min_height="0px"))
        self.figures: dict[str, go.Figure] = {}
        self._slots: dict[str, widgets.Output] = {}
        self._errors: dict[str, str] = {}      # update name -> its last error message
        self._keys: dict[str, object] = {}      # figure name -> key of what it shows
        self._message_slots: dict[str, widgets.HTML] = {}   # update name -> where its errors show
        self._pending: dict[str, object] = {}    # update name -> update waiting for the flush
        self._flush_handle = None
        self.updates_run = 0          # engine updates actually run (the coalescing test counts them)

    def figure_slot(self, name: str) -> widgets.Output:
        """A placeholder in the layout where figure ``name`` appears once first drawn."""
        return self._slots.setdefault(name, widgets.Output(layout=widgets.Layout(width="100%")))

    def show_figure(self, name: str, figure: go.Figure) -> go.Figure:
        """Draw ``figure`` in slot ``name``, replacing what was drawn there."""
        self.figures[name] = figure
        payload = json.loads(figure.to_json())
        payload["config"] = {"displaylogo": False, "responsive": True}
        title = figure.layout.title.text or name
        # Setting ``outputs`` directly (not ``with slot: display(...)``) also works from a worker thread.
        self.figure_slot(name).outputs = ({"output_type": "display_data", "metadata": {}, "data": {
            "application/vnd.plotly.v1+json": payload, "text/plain": f"<figure: {title}>"}},)
        return figure

    def show_if_changed(self, name: str, key, build) -> None:
        """Show ``build()`` in slot ``name`` unless the figure there already shows ``key``."""
        if name in self.figures and self._keys.get(name) == key:
            return
        self.show_figure(name, build())
        self._keys[name] = key

    def message_slot(self, *updates) -> widgets.HTML:
        """An error area for ``updates`` (methods), to place beside the controls that trigger them."""
        slot = widgets.HTML(value="", layout=widgets.Layout(min_height="0px"))
        for update in updates:
            self._message_slots[update.__name__] = slot
        return slot

    def observe_controls(self, *controls: widgets.Widget, update=None) -> None:
        """Call ``update`` (default: the whole ``_refresh``) whenever one of ``controls`` changes."""
        update = update or self._refresh
        for control in controls:
            control.observe(lambda _change, c=control: self._changed(c, update), names="value")

    def _changed(self, control: widgets.Widget, update) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        # ``_property_lock`` is set while ipywidgets applies a state message from the browser.
        if loop is None or not control._property_lock:
            self.refresh(update)
            return
        self._pending[update.__name__] = update
        if self._flush_handle is None:
            self._flush_handle = loop.call_later(SETTLE_S, self._flush)

    def _flush(self) -> None:
        """Run each pending update once, with the controls' latest values."""
        self._flush_handle = None
        pending, self._pending = self._pending, {}
        if "_refresh" in pending:                  # the full refresh covers every partial one
            pending = {"_refresh": pending["_refresh"]}
        for update in pending.values():
            self.refresh(update)

    def refresh(self, update=None) -> None:
        """Run ``update`` (default ``_refresh``); a user-facing error it raises shows inline until it next succeeds."""
        update = update or self._refresh
        self.updates_run += 1
        try:
            update()
        except (WorkbenchError, ValueError) as exc:
            self._errors[update.__name__] = str(exc)
        else:
            self._errors.pop(update.__name__, None)
        slots = {id(self.message): self.message, **{id(w): w for w in self._message_slots.values()}}
        for key, slot in slots.items():
            texts = [text for name, text in self._errors.items()
                     if id(self._message_slots.get(name, self.message)) == key]
            slot.value = "".join(f"<div class='wb-error' style='{ERROR_STYLE}'>{html.escape(text)}</div>"
                                 for text in texts)

    def _refresh(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError
