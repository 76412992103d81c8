"""The LLMS page in Debian's chromium: every figure seen on first load, the engine's numbers in the summary,
and the call slider (and its Play button) moving the chunk map and only the per-call figures through the trace."""
import re
import time

import pytest

from tests.browser.conftest import assert_figures_visible
from tests.conftest import PRESET
from workbench.mechanisms import dashboards
from workbench.viz.kvcache import format_ms

PAGE = "kvcache.ipynb"
PAGE_TIMEOUT_MS = 180_000
FIGURES = ["latency", "chunks", "queue", "gantt", "events"]



def test_the_kvcache_mechanism_serves_its_page():
    assert any(d.page == PAGE for d in dashboards())


@pytest.fixture(scope="module")
def replays():
    """The prepared replays the page opens with (its prepare steps run here first when missing)."""
    board = next(d for d in dashboards() if d.page == PAGE)
    from workbench.kvcache.artifacts import default_replays
    from workbench.prepare import steps

    for step in steps(PRESET):
        if step.name in board.requires and not step.ready(PRESET):
            step.run(PRESET, False, False)
    return default_replays(PRESET)


def test_call_slider_moves_the_chunk_map_through_the_trace(replays, voila_server, page):
    started = time.perf_counter()
    page.goto(f"{voila_server}/voila/render/{PAGE}", timeout=PAGE_TIMEOUT_MS)
    page.locator(".wb-kv-summary").wait_for(timeout=PAGE_TIMEOUT_MS)
    assert_figures_visible(page, FIGURES)
    print(f"\ncold page load until every figure shows: {time.perf_counter() - started:.1f} s")
    for method, result in replays.items():
        shown = page.locator(f".wb-kv-mean[data-method='{method}']").inner_text()
        assert shown == format_ms(result.mean_switch_s()), method

    chunks = page.locator(".wb-figure[data-name='chunks']")
    latency = page.locator(".wb-figure[data-name='latency']")
    assert "after call 0 (LLMS)" in chunks.get_attribute("data-title")
    revision, latency_revision = chunks.get_attribute("data-revision"), latency.get_attribute("data-revision")

    target = min(2, len(replays["llms"].calls) - 1)
    slider = page.locator(".widget-slider", has=page.locator("label", has_text=re.compile(r"^Call$")))
    slider.locator(".widget-readout").click()
    page.keyboard.press("Control+A")
    page.keyboard.type(str(target))
    moved = time.perf_counter()
    page.keyboard.press("Enter")
    page.locator(f".wb-figure[data-name='chunks'][data-title*='after call {target} (LLMS)']").wait_for(timeout=30_000)
    print(f"call slider moved -> chunk map of call {target} in the page: {(time.perf_counter() - moved) * 1e3:.0f} ms")
    assert chunks.get_attribute("data-revision") != revision
    record = replays["llms"].calls[target]
    page.locator(".wb-kv-call", has_text=f"Call {target} of").wait_for(timeout=30_000)
    assert f"switch {format_ms(record.switch_s)}" in page.locator(".wb-kv-call").inner_text()
    for name in ("queue", "gantt", "events"):
        page.locator(f".wb-figure[data-name='{name}'][data-title*='call {target}']").wait_for(timeout=30_000)
    assert latency.get_attribute("data-revision") == latency_revision        # the trace-wide view stays

    if target < len(replays["llms"].calls) - 1:                              # Play steps on from the slider
        page.locator(".widget-play button:has(i.fa-play)").click()
        page.locator(f".wb-figure[data-name='chunks'][data-title*='after call {target + 1} (LLMS)']").wait_for(
            timeout=30_000)
        page.locator(".widget-play button:has(i.fa-stop)").click()
    assert latency.get_attribute("data-revision") == latency_revision
    assert page.locator(".wb-error").count() == 0
