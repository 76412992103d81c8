"""The check every browser test relies on sees what a person sees: a figure clipped by its container, covered,
hidden or scrolled out of reach fails it (the first slice shipped figures inside 0 px containers with
overflow hidden, which a size read from the figure alone passes)."""
import pytest

from tests.browser.conftest import assert_figures_visible, assert_seen

FIGURE = "<div class='fig' style='width:600px;height:400px;background:#4C78A8'></div>"
CASES = {
    "clipped to 0 px": f"<div style='height:0;overflow:hidden'>{FIGURE}</div>",
    "clipped to 120 px": f"<div style='height:120px;overflow:hidden'>{FIGURE}</div>",
    "hidden ancestor": f"<div style='visibility:hidden'>{FIGURE}</div>",
    "placed absolutely in a clipping positioned box": "<div style='position:relative;height:0;overflow:hidden'>"
                                                     f"<div style='position:absolute;top:0'>{FIGURE}</div></div>",
    "covered": f"{FIGURE}<div style='position:absolute;left:0;top:0;width:800px;height:500px;background:#fff'></div>",
}


@pytest.mark.parametrize("case", CASES)
def test_what_a_person_cannot_see_fails(page, case):
    page.set_content(f"<body style='margin:0'>{CASES[case]}</body>")
    with pytest.raises(AssertionError):
        assert_seen(page.locator(".fig"), case, settle_s=0.5)      # a static page: nothing left to lay out


def test_a_figure_never_drawn_fails_with_what_the_page_shows(page):
    page.set_content("<body><div class='wb-figure' data-name='times'></div><div class='wb-error'>no partition: "
                     "the deadline is too tight</div></body>")
    with pytest.raises(AssertionError) as failed:
        assert_figures_visible(page, ["times"], timeout_ms=300)
    said = str(failed.value)
    assert "figure 'times' was not drawn in 0 s" in said and "times: revision none, no plot" in said
    assert "no partition: the deadline is too tight" in said


def test_a_box_placed_absolutely_escapes_an_unpositioned_clipping_parent_as_css_says(page):
    page.set_content("<body style='margin:0'><div style='height:0;overflow:hidden'>"
                     f"<div style='position:absolute;top:0'>{FIGURE}</div></div></body>")
    assert_seen(page.locator(".fig"), "escaping")          # JupyterLab's shell is laid out like this


def test_a_figure_in_plain_view_passes_and_one_below_the_fold_is_scrolled_to(page):
    page.set_content(f"<body style='margin:0'>{FIGURE}<div style='height:3000px'></div>{FIGURE}</body>")
    assert_seen(page.locator(".fig").first, "first")
    assert_seen(page.locator(".fig").last, "below the fold")


def draw(page, figure) -> None:
    """``figure`` drawn by the page's own plotly.js into ``.slot`` (600 x 300 px), as the pages draw theirs."""
    from workbench.ui.figure import _plotly_js

    page.set_content("<body style='margin:0'><div class='slot' style='width:600px;height:300px'></div></body>")
    page.add_script_tag(content=_plotly_js())
    page.evaluate("f => Plotly.newPlot(document.querySelector('.slot'), f.data, f.layout)", figure.to_plotly_json())


def fit_problems(page) -> list[str]:
    from tests.browser.test_pages import OUTSIDE_JS

    return page.locator(".slot").evaluate(OUTSIDE_JS)


def test_the_fit_check_names_a_label_outside_one_too_small_and_two_that_overlap(page):
    import plotly.graph_objects as go

    fig = go.Figure(go.Bar(x=["a", "b"], y=[1, 2], text=["(misses)", "ok"], textposition="inside",
                           textfont_size=6))
    fig.update_layout(width=600, height=300, margin=dict(l=40, r=40, t=40, b=40), annotations=[
        dict(x=1.3, xref="paper", y=0.5, yref="paper", text="deadline 200 ms", showarrow=False),
        dict(x=0.2, xref="paper", y=0.9, yref="paper", text="first label", showarrow=False),
        dict(x=0.22, xref="paper", y=0.9, yref="paper", text="second label", showarrow=False)])
    draw(page, fig)
    found = fit_problems(page)
    assert any(f.startswith('"deadline 200 ms"') and "outside" in f for f in found), found
    assert any(f.startswith('"(misses)" at 6.0 px') for f in found), found
    assert '"first label" overlaps "second label"' in found, found


def test_the_fit_check_passes_labels_that_fit(page):
    import plotly.graph_objects as go

    fig = go.Figure(go.Bar(x=["a", "b"], y=[1, 2], text=["(misses)", "ok"], textposition="outside"))
    fig.update_layout(width=600, height=300, title="A title", margin=dict(l=40, r=40, t=40, b=40), annotations=[
        dict(x=0.1, xref="paper", y=0.9, yref="paper", text="one", showarrow=False),
        dict(x=0.9, xref="paper", y=0.9, yref="paper", text="two", showarrow=False)])
    draw(page, fig)
    assert fit_problems(page) == []
