"""The pattern every dashboard follows.

A :class:`Panel` is a VBox whose controls all call one ``refresh()``: it reads the
controls, calls the engine, hands the result to pure figure builders and copies
the new figures into ``FigureWidget``s in place (one ``batch_update`` each), so
the browser redraws once per settled value.

A FigureWidget shows in the browser only the state it was constructed with plus
the changes made while a view of it exists, so each one is created from its first
figure (``show_figure``) inside a placeholder slot, and updated in place after. Errors the user can act on appear as
a readable message in the panel, never as a traceback in the page.
"""
from __future__ import annotations

import html

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.errors import WorkbenchError

ERROR_STYLE = "color:#b00020;background:#fdecea;padding:4px 8px;border-radius:4px"


def update_figure(target: go.FigureWidget, new: go.Figure) -> None:
    """Make ``target`` show ``new``: restyle traces in place when their types match, else replace them."""
    with target.batch_update():
        same = len(target.data) == len(new.data) and all(a.type == b.type for a, b in zip(target.data, new.data))
        if same:
            for old, trace in zip(target.data, new.data):
                spec = trace.to_plotly_json()
                spec.pop("type", None)
                old.update(spec, overwrite=True)
        else:
            target.data = ()
            target.add_traces(list(new.data))
        target.layout = new.layout


class Panel(widgets.VBox):
    """Base class: subclasses build controls and figures, then implement ``_refresh``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.message = widgets.HTML(value="", layout=widgets.Layout(min_height="0px"))
        self.figures: dict[str, go.FigureWidget] = {}
        self._slots: dict[str, widgets.VBox] = {}

    def figure_slot(self, name: str) -> widgets.VBox:
        """A placeholder in the layout where figure ``name`` appears once first drawn."""
        return self._slots.setdefault(name, widgets.VBox(layout=widgets.Layout(width="100%")))

    def show_figure(self, name: str, figure: go.Figure) -> go.FigureWidget:
        widget = self.figures.get(name)
        if widget is None:
            widget = self.figures[name] = go.FigureWidget(figure)
            self.figure_slot(name).children = (widget,)
        else:
            update_figure(widget, figure)
        return widget

    def observe_controls(self, *controls: widgets.Widget) -> None:
        for control in controls:
            control.observe(self._on_change, names="value")

    def _on_change(self, _change) -> None:
        self.refresh()

    def refresh(self) -> None:
        try:
            self._refresh()
        except (WorkbenchError, ValueError) as exc:
            self.show_error(str(exc))
        else:
            self.message.value = ""

    def show_error(self, text: str) -> None:
        self.message.value = f"<div class='wb-error' style='{ERROR_STYLE}'>{html.escape(text)}</div>"

    def _refresh(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError
