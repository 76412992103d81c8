"""Every served page as a first-time visitor meets it: its figures seen, nothing fetched from outside
127.0.0.1, button icons drawn from the local Font Awesome, the quick-preset line, no spinner left."""
import pytest

from tests.browser.conftest import assert_figures_visible
from tests.conftest import PRESET
from workbench.bench.browser import page_quiet, set_control, settle, widget_labelled
from workbench.mechanisms import dashboards
from workbench.prepare import preset_notice

PAGE_TIMEOUT_MS = 180_000
PAGES = ["index.ipynb"] + [d.page for d in dashboards()]
ENDS = {d.page for d in dashboards() if d.ends}
STYLED_JS = """() => {
    const title = document.querySelector('.wb-title');
    return Boolean(title) && getComputedStyle(title).marginTop === '4px';
}"""


def assert_styled(page) -> None:
    """The page's stylesheet (``workbench.ui.stylesheet``) reached it: its title has the sheet's margin, not
    the browser's default for a heading."""
    page.wait_for_function(STYLED_JS, timeout=30_000)


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


@pytest.mark.parametrize("name", [p for p in PAGES if p not in ENDS])
def test_page_as_a_visitor_meets_it(voila_server, page, name):
    """A page without control ends (the gallery): :func:`meets_as_visitor`; the others are met so on their way
    to their ends."""
    page.goto(f"{voila_server}/voila/render/{name}", timeout=PAGE_TIMEOUT_MS)
    meets_as_visitor(page, name)


def meets_as_visitor(page, name: str) -> None:
    """The page just opened, as a first-time visitor meets it: every figure drawn, seen and with titles that
    fit; nothing fetched from outside 127.0.0.1; icons drawn; the preset line; no spinner or error; styled."""
    if name == "index.ipynb":
        page.locator(".wb-card").first.wait_for(timeout=PAGE_TIMEOUT_MS)
    else:
        probe = next(d.probe_figure for d in dashboards() if d.page == name)
        assert_figures_visible(page, [probe])
        figures = [f.get_attribute("data-name") for f in page.locator(".wb-figure[data-name]").all()]
        assert probe in figures
        assert_figures_visible(page, figures)          # every figure of the page, not only the probe
        clipped = {f: page.locator(f".wb-figure[data-name='{f}']").first.evaluate(OUTSIDE_JS) for f in figures}
        assert {f: texts for f, texts in clipped.items() if texts} == {}
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
    assert_styled(page)


OUTSIDE_JS = """slot => {
    const box = slot.getBoundingClientRect();
    const said = t => `"${t.textContent.slice(0, 40)}"`;
    const found = [];
    for (const t of slot.querySelectorAll('.gtitle, .xtitle, .ytitle, .annotation-text')) {
        const r = t.getBoundingClientRect();
        const out = Math.max(box.left - r.left, r.right - box.right, box.top - r.top, r.bottom - box.bottom);
        if (t.textContent && r.width > 0 && out > 1) found.push(`${said(t)} ${out.toFixed(0)} px outside`);
    }
    for (const t of slot.querySelectorAll('.annotation-text, .bartext, .textpoint text')) {
        const size = parseFloat(t.style.fontSize || getComputedStyle(t).fontSize);
        if (t.textContent && t.getBoundingClientRect().width > 0 && size < 9)
            found.push(`${said(t)} at ${size.toFixed(1)} px, too small to read`);
    }
    const notes = Array.from(slot.querySelectorAll('.annotation-text')).filter(t => t.textContent)
        .map(t => [t, t.getBoundingClientRect()]).filter(([, r]) => r.width > 0);
    for (let i = 0; i < notes.length; i++)
        for (let j = i + 1; j < notes.length; j++) {
            const [a, p] = notes[i], [b, q] = notes[j];
            const w = Math.min(p.right, q.right) - Math.max(p.left, q.left);
            const h = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
            if (w > 2 && h > 2) found.push(`${said(a)} overlaps ${said(b)}`);
        }
    return found;
}"""
"""Titles, axis titles and annotations outside their figure; annotation and bar texts under 9 px; annotations
overlapping each other."""


@pytest.mark.parametrize("board", [d for d in dashboards() if d.ends], ids=lambda d: d.page)
def test_each_page_as_a_visitor_meets_it_then_at_its_controls_ends_draws_every_figure_with_titles_that_fit(
        voila_server, page, board):
    """The page as a visitor meets it (:func:`meets_as_visitor`), then every control the page declares an end
    for (most devices, 32 GPUs of each type, the tightest deadline, the longest sequence ...) set in the page as
    a person does, at 1280 px: the controls show their ends, no internal error, every figure drawn and seen, no
    figure left stale, and every figure's titles and annotations inside it, readable and apart
    (``OUTSIDE_JS``). One page load serves both: each load starts a kernel."""
    page.goto(f"{voila_server}/voila/render/{board.page}", timeout=PAGE_TIMEOUT_MS)
    meets_as_visitor(page, board.page)
    for label, value in board.ends:
        set_control(page, label, value)
        settle(page, board.probe_figure)
    page_quiet(page)
    for label, value in board.ends:
        handle = widget_labelled(page, label).locator(".noUi-handle")
        if handle.count():
            end = handle.first.get_attribute(f"aria-value{value}") if value in ("max", "min") else str(value)
            assert float(handle.first.get_attribute("aria-valuenow")) == float(end), f"{label} is not at {value}"
    assert page.locator(".wb-error", has_text="internal error").count() == 0
    figures = [f.get_attribute("data-name") for f in page.locator(".wb-figure[data-name]").all()]
    assert_figures_visible(page, figures)
    assert page.locator(".wb-figure.wb-stale").count() == 0
    clipped = {name: page.locator(f".wb-figure[data-name='{name}']").first.evaluate(OUTSIDE_JS) for name in figures}
    assert {name: texts for name, texts in clipped.items() if texts} == {}


@pytest.fixture(scope="module")
def full_server(prepared, tmp_path_factory):
    """The gallery and the flagship page served for the full preset, as `workbench dashboards` does on a fresh
    machine (preheated kernels), from a folder holding only those two pages."""
    import os
    import shutil

    from tests.browser.conftest import ARTIFACTS
    from workbench.prepare import steps
    from workbench.serving import DASHBOARDS_DIR, free_port, voila_server

    board = next(d for d in dashboards() if d.first)
    full = {s.name: s for s in steps("full")}
    if all(full[n].ready("full") for n in board.requires):
        pytest.skip("the full preset is prepared in this cache, so no page waits for it (CI's fresh cache has none)")
    pages = tmp_path_factory.mktemp("full-pages")
    for name in ("index.ipynb", board.page):
        shutil.copy(DASHBOARDS_DIR / name, pages / name)
    ARTIFACTS.mkdir(exist_ok=True)
    with voila_server(free_port(), log_path=ARTIFACTS / "voila-full.log", directory=pages,
                      env={"WORKBENCH_PRESET": "full", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}) as base:
        yield base, board


def test_a_page_waiting_for_the_full_preset_opens_its_quick_version_in_one_click(full_server, page):
    """While the full preset is prepared, the gallery links the flagship's quick version (a preheated kernel
    learns the link's ``?preset=quick`` when the page is asked for), and the waiting page opens it with one
    button; both say it is the quick version."""
    base, board = full_server
    page.goto(f"{base}/voila/render/index.ipynb", timeout=PAGE_TIMEOUT_MS)
    page.locator(".wb-serving", has_text="Serving the full preset").wait_for(timeout=PAGE_TIMEOUT_MS)
    link = page.locator(f"a.wb-quick-link[href='{board.page}?preset=quick']")
    assert link.inner_text() == "open its quick version now"
    link.click()
    page.wait_for_url(f"**/{board.page}?preset=quick", timeout=PAGE_TIMEOUT_MS)
    page.locator(".wb-quick-version", has_text="Quick version.").wait_for(timeout=PAGE_TIMEOUT_MS)
    assert_figures_visible(page, [board.probe_figure])
    assert page.locator(".wb-error").count() == 0

    page.goto(f"{base}/voila/render/{board.page}", timeout=PAGE_TIMEOUT_MS)
    page.get_by_text("needs artifacts that are still being prepared").wait_for(timeout=PAGE_TIMEOUT_MS)
    assert_styled(page)                                 # a page without figures carries the stylesheet itself
    page.get_by_role("button", name="Open the quick version now").click()
    page.locator(".wb-quick-version", has_text="Quick version.").wait_for(timeout=PAGE_TIMEOUT_MS)
    assert_figures_visible(page, [board.probe_figure])
    assert page.locator(".wb-error").count() == 0
