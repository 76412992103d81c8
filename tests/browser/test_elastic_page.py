"""The elastic-pipelining page in Debian's chromium: move the target slider, see the engine's new plan."""
import time

from tests.browser.conftest import assert_figures_visible
from tests.conftest import PRESET
from workbench.elastic.planner import plan_elastic
from workbench.elastic.artifacts import load_context

PAGE_TIMEOUT_MS = 180_000


def engine_plan(target_ms):
    ctx = load_context("sentiment", "odroid-n2", PRESET)
    return plan_elastic(ctx.cost_model, target_ms / 1e3, ctx.importance.accuracy, 1e6)


def test_target_slider_replans_gantt_and_submodel(voila_server, page):
    started = time.perf_counter()
    page.goto(f"{voila_server}/voila/render/elastic.ipynb", timeout=PAGE_TIMEOUT_MS)
    page.locator(".wb-submodel").wait_for(timeout=PAGE_TIMEOUT_MS)
    assert_figures_visible(page, ["importance", "candidates", "aib", "gantt", "memory"])
    print(f"\ncold page load until the plan shows: {time.perf_counter() - started:.1f} s")
    first = engine_plan(200)
    assert f"Submodel {first.n} x {first.m}" in page.locator(".wb-submodel").inner_text()

    slider = page.locator(".widget-slider", has=page.locator("label", has_text="Target (ms)"))
    readout = slider.locator(".widget-readout")
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("150")
    moved = time.perf_counter()
    page.keyboard.press("Enter")              # one settled value, as a released drag gives
    new = engine_plan(150)
    label = f"predicted {1e3 * new.predicted_s:.1f} ms of 150 ms"
    page.locator(".wb-submodel", has_text=label).wait_for(timeout=30_000)
    page.locator(".gtitle", has_text=f"Pipeline of {new.n} x {new.m}").wait_for(timeout=30_000)
    print(f"slider moved -> new submodel and Gantt in the page: {(time.perf_counter() - moved) * 1e3:.0f} ms")
    assert f"Submodel {new.n} x {new.m}" in page.locator(".wb-submodel").inner_text()
    assert page.locator(".wb-error").count() == 0

    # Arrow keys held on the slider: a burst of settled values. The page must end on the last one's plan,
    # however many of them the kernel coalesced.
    before = int(page.locator(".wb-submodel").get_attribute("data-plans"))
    slider.locator(".noUi-handle").focus()
    presses = 12
    for _ in range(presses):
        page.keyboard.press("ArrowRight")
    final = 150 + 10 * presses
    page.locator(".widget-readout", has_text=str(final)).wait_for(timeout=30_000)
    last = engine_plan(final)
    page.locator(".wb-submodel", has_text=f"predicted {1e3 * last.predicted_s:.1f} ms of {final} ms").wait_for(
        timeout=30_000)
    page.locator(".gtitle", has_text=f"Pipeline of {last.n} x {last.m}").wait_for(timeout=30_000)
    page.wait_for_timeout(500)                # stale work, if any were queued, would land after the last value
    assert f"of {final} ms" in page.locator(".wb-submodel").inner_text()
    plans = int(page.locator(".wb-submodel").get_attribute("data-plans")) - before
    print(f"{presses} arrow-key steps -> {plans} plan(s) computed in the kernel")
    assert 1 <= plans <= presses
