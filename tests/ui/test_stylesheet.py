"""The pages' look lives in one stylesheet: no inline ``style`` attribute in the HTML the panels write, every
rule of the sheet used by some page, and every page able to carry the sheet (figures reference it; pages
without figures show it)."""
import re
from pathlib import Path

import workbench.ui as ui_package
from workbench.ui.figure import FigureView
from workbench.ui.stylesheet import STYLESHEET, Stylesheet, stylesheet

UI = Path(ui_package.__file__).parent
INLINE = re.compile(r"(?<![\w])style\s*=\s*\\?['\"]")     # style='..' in HTML; not button_style= or style=label


def sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(UI.glob("*.py")) if p.name != "stylesheet.py"}


def test_no_page_writes_an_inline_style():
    found = [f"{name}:{text[:m.start()].count(chr(10)) + 1}" for name, text in sources().items()
             for m in INLINE.finditer(text)]
    assert found == []


def test_the_inline_style_check_sees_one():
    assert INLINE.search("f\"<span class='wb-miss' style='color:#9a3412'>\"")
    assert INLINE.search('<h2 style="margin:4px 0">')
    assert not INLINE.search('widgets.Button(button_style="primary")')
    assert not INLINE.search("widgets.IntSlider(style=label)")


def test_every_rule_of_the_sheet_is_used_by_a_page():
    """A class the sheet styles that no page writes is a dead rule (or a renamed class the sheet missed)."""
    text = "\n".join(sources().values())
    styled = set(re.findall(r"\.(wb-[\w-]+)", STYLESHEET))
    assert styled and sorted(c for c in styled if c not in text) == []


def test_figures_carry_the_one_sheet_and_the_sheet_draws_nothing():
    view = FigureView("probe")
    assert view.styles is stylesheet() and isinstance(view.styles, Stylesheet)
    assert stylesheet()._css == STYLESHEET and stylesheet().layout.display == "none"


def test_a_notebooks_preset_line_shows_the_sheet(monkeypatch):
    """(The gallery and a waiting page show it too: tests/ui/test_gallery.py, tests/test_prepare_job.py.)"""
    from workbench.ui.base import show_preset_notice

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *objs: shown.extend(objs))
    show_preset_notice("quick")
    sheet, line = shown
    assert sheet is stylesheet() and "class='wb-notice wb-preset-notice'" in line.data   # kept by a saved notebook
