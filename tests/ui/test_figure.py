"""The figure widget: every view shares one plotly.js library widget, which reaches the page as a script the
library's small module starts (anywidget gives a module 2 s to load and initialize)."""
import plotly.graph_objects as go

from workbench.ui.figure import FigureView, _plotly_js, plotly_library


def test_every_view_shares_one_library_whose_module_is_small_and_whose_source_is_plotly_js():
    """Catches: plotly.js made the library's own module again (4.8 MB to parse inside anywidget's 2 s), a
    library per view (the bundle sent once per figure), the source cut or not plotly.js."""
    first, second = FigureView("a"), FigureView("b")
    assert first.library is second.library is plotly_library()
    library = plotly_library()
    assert len(library._esm) < 2_000 and "initialize" in library._esm and "data-wb-plotly" in library._esm
    assert library.source == _plotly_js() and len(library.source) > 3_000_000
    assert "plotly.js v" in library.source[:200] and "export default" not in library.source[-200:]


def test_show_draws_in_place_and_counts_revisions():
    view = FigureView("x", height=300)
    view.show(go.Figure(go.Bar(x=[1], y=[2]), layout={"title": {"text": "t"}}))
    view.show(go.Figure(go.Bar(x=[1], y=[3])))
    assert view.revision == 2 and view.figure["data"][0]["y"] == [3] and view.layout.min_height == "300px"
