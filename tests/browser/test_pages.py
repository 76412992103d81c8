"""Every served page as a first-time visitor meets it: its figures seen, nothing fetched from outside
127.0.0.1, button icons drawn from the local Font Awesome, the quick-preset line, no spinner left."""
import pytest

from tests.browser.conftest import assert_figures_visible
from tests.conftest import PRESET
from workbench.mechanisms import dashboards
from workbench.prepare import preset_notice

PAGE_TIMEOUT_MS = 180_000
PAGES = ["index.ipynb"] + [d.page for d in dashboards()]


def icons_drawn(page) -> list[str]:
    """Names of Font Awesome icons in the page whose glyph did not render (font missing or no glyph)."""
    return page.evaluate("""async () => {
        await document.fonts.ready;
        const missing = [];
        for (const el of document.querySelectorAll('i.fa')) {
            const glyph = getComputedStyle(el, '::before').content;
            const family = getComputedStyle(el).fontFamily;
            const weight = getComputedStyle(el).fontWeight;
            const loaded = document.fonts.check(`${weight} 16px ${family}`);
            if (!glyph || glyph === 'none' || !family.includes('Font Awesome') || !loaded
                || el.getBoundingClientRect().width === 0) missing.push(el.className);
        }
        return missing;
    }""")


@pytest.mark.parametrize("name", PAGES)
def test_page_as_a_visitor_meets_it(voila_server, page, name):
    page.goto(f"{voila_server}/voila/render/{name}", timeout=PAGE_TIMEOUT_MS)
    if name == "index.ipynb":
        page.locator(".wb-card").first.wait_for(timeout=PAGE_TIMEOUT_MS)
    else:
        probe = next(d.probe_figure for d in dashboards() if d.page == name)
        assert_figures_visible(page, [probe])
        figures = [f.get_attribute("data-name") for f in page.locator(".wb-figure[data-name]").all()]
        assert probe in figures
        assert_figures_visible(page, figures)          # every figure of the page, not only the probe
    page.wait_for_timeout(1000)                        # late requests (fonts, lazy chunks) land in the record

    assert page.outside_requests == [], f"{name} fetched from outside 127.0.0.1: {page.outside_requests}"
    assert icons_drawn(page) == [], f"{name}: icons without a glyph"
    notice = page.locator(".wb-preset-notice")
    if preset_notice(PRESET):
        assert notice.is_visible() and notice.inner_text().startswith(f"{PRESET} preset")
    else:
        assert notice.count() == 0
    assert not page.get_by_text("Executing", exact=False).is_visible(), f"{name}: a spinner is still showing"
    assert page.locator(".wb-error").count() == 0
