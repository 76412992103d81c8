"""The check every browser test relies on sees what a person sees: a figure clipped by its container, covered,
hidden or scrolled out of reach fails it (the first slice shipped figures inside 0 px containers with
overflow hidden, which a size read from the figure alone passes)."""
import pytest

from tests.browser.conftest import assert_seen

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
        assert_seen(page.locator(".fig"), case)


def test_a_box_placed_absolutely_escapes_an_unpositioned_clipping_parent_as_css_says(page):
    page.set_content("<body style='margin:0'><div style='height:0;overflow:hidden'>"
                     f"<div style='position:absolute;top:0'>{FIGURE}</div></div></body>")
    assert_seen(page.locator(".fig"), "escaping")          # JupyterLab's shell is laid out like this


def test_a_figure_in_plain_view_passes_and_one_below_the_fold_is_scrolled_to(page):
    page.set_content(f"<body style='margin:0'>{FIGURE}<div style='height:3000px'></div>{FIGURE}</body>")
    assert_seen(page.locator(".fig").first, "first")
    assert_seen(page.locator(".fig").last, "below the fold")
