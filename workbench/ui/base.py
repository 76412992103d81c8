"""The pattern every dashboard follows.

A :class:`Panel` is a VBox whose controls all call one ``refresh()``: it reads the
controls, calls the engine and hands the result to pure figure builders; Python
work happens once per settled value. Errors the user can act on appear as a
readable message in the panel, never as a traceback in the page.

Figures are shown by ``show_figure``, which puts a new ``FigureWidget`` built from
the figure into the figure's slot and closes the old one. Plotly 7's in-place
updates are not reliable under anywidget: each update is sent by setting a
``_py2js_*`` trait to the message and at once back to ``None``, and the browser
reads the trait when its change event fires, so when both settings land together
the update is silently lost (the browser test saw it in about 1 run in 3). A new
widget carries its whole state when it opens, so nothing can be lost.
"""
from __future__ import annotations

import html

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.errors import WorkbenchError

ERROR_STYLE = "color:#b00020;background:#fdecea;padding:4px 8px;border-radius:4px"


class Panel(widgets.VBox):
    """Base class: subclasses build controls and figures, then implement ``_refresh``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.message = widgets.HTML(value="", layout=widgets.Layout(min_height="0px"))
        self.figures: dict[str, go.FigureWidget] = {}
        self._slots: dict[str, widgets.VBox] = {}
        self._errors: dict[str, str] = {}      # update name -> its last error message

    def figure_slot(self, name: str) -> widgets.VBox:
        """A placeholder in the layout where figure ``name`` appears once first drawn."""
        return self._slots.setdefault(name, widgets.VBox(layout=widgets.Layout(width="100%")))

    def show_figure(self, name: str, figure: go.Figure) -> go.FigureWidget:
        """Show ``figure`` in slot ``name``, replacing (and closing) the widget shown there before."""
        old = self.figures.get(name)
        widget = self.figures[name] = go.FigureWidget(figure)
        self.figure_slot(name).children = (widget,)
        if old is not None:
            old.close()
        return widget

    def observe_controls(self, *controls: widgets.Widget, update=None) -> None:
        """Call ``update`` (default: the whole ``_refresh``) whenever one of ``controls`` changes."""
        update = update or self._refresh
        for control in controls:
            control.observe(lambda _change: self.refresh(update), names="value")

    def refresh(self, update=None) -> None:
        """Run ``update`` (default ``_refresh``); a user-facing error it raises shows inline until it next succeeds."""
        update = update or self._refresh
        try:
            update()
        except (WorkbenchError, ValueError) as exc:
            self._errors[update.__name__] = str(exc)
        else:
            self._errors.pop(update.__name__, None)
        self.message.value = "".join(f"<div class='wb-error' style='{ERROR_STYLE}'>{html.escape(text)}</div>"
                                     for text in self._errors.values())

    def _refresh(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError
