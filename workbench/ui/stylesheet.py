"""The pages' one stylesheet: every piece of HTML the panels write names classes, never inline styles.

:class:`Stylesheet` is an invisible anywidget whose ``_css`` is :data:`STYLESHEET`; anywidget
puts that into the page's head when the widget's model is created in the browser, once per
page, in Voila and JupyterLab alike. Every figure view references it (so any panel with a
figure brings it), and the pages without figures (the gallery, a page waiting for its
artifacts, a notebook's preset line) show it themselves. Restyling a page is an edit here.
"""
from __future__ import annotations

from functools import lru_cache

import anywidget
import ipywidgets as widgets

STYLESHEET = """
.wb-title { margin: 4px 0; }
.wb-subtitle { margin: 12px 0 2px 0; }
.wb-lead { margin: 2px 0 8px 0; }
.wb-note { color: #555; font-size: 90%; }
.wb-warn { color: #9a3412; }
.wb-list { margin: 2px 0; padding-left: 18px; }
.wb-reasons, .wb-why { font-size: 90%; overflow-wrap: anywhere; }
.wb-table { border-collapse: collapse; }
.wb-table th, .wb-table td { padding: 1px 8px; text-align: left; }
.wb-table.wb-small { font-size: 90%; }
.wb-steps { font-size: 13px; margin: 4px 0; }
.wb-steps th, .wb-steps td { padding: 2px 10px; border-bottom: 1px solid #e5e7eb; }
.wb-steps progress { width: 120px; }
.wb-prepare p, .wb-serving { margin: 4px 0; }
.wb-offer { margin: 6px 0 2px 0; }
.wb-notice { background: #fff7e6; border: 1px solid #f0c36d; border-radius: 4px; padding: 4px 10px;
             margin: 2px 0 6px 0; color: #6b4e16; font-size: 13px; }
.wb-error { color: #b00020; background: #fdecea; padding: 4px 8px; border-radius: 4px; margin: 2px 0; }
.wb-error pre { white-space: pre-wrap; font-size: 11px; }
.wb-card { border: 1px solid #d0d7e2; border-radius: 6px; padding: 8px 12px; margin: 6px 0; background: #fbfcfe; }
.wb-column-head { font-weight: bold; font-size: 90%; }
.wb-figure { width: 100%; min-width: 0; }
.wb-figure-plot { width: 100%; }
.wb-figure.wb-stale { opacity: 0.45; transition: opacity 0.2s; }
"""
"""Every class the pages' HTML uses for its look (the ``wb-*`` names; others only tag elements for tests)."""


class Stylesheet(anywidget.AnyWidget):
    """Carries :data:`STYLESHEET` to the page; draws nothing."""
    _esm = "export default { render() {} };"
    _css = STYLESHEET

    def __init__(self):
        super().__init__(layout=widgets.Layout(display="none"))


@lru_cache(maxsize=1)
def stylesheet() -> Stylesheet:
    """The kernel's one stylesheet widget."""
    return Stylesheet()
