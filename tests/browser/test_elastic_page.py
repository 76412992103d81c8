"""The elastic-pipelining page in Debian's chromium: move the target slider, see the engine's new plan."""
import time

from tests.conftest import PROFILE
from workbench.elastic.importance import load_importance
from workbench.elastic.planner import plan_elastic
from workbench.elastic.profile import device_profile
from workbench.elastic.store import load_store

PAGE_TIMEOUT_MS = 180_000


def engine_plan(target_ms):
    store = load_store("sentiment", PROFILE)
    return plan_elastic(device_profile("odroid-n2", store, 64), target_ms / 1e3,
                        load_importance("sentiment", PROFILE).accuracy, 1e6)


def test_target_slider_replans_gantt_and_submodel(voila_server, page):
    started = time.perf_counter()
    page.goto(f"{voila_server}/voila/render/elastic.ipynb", timeout=PAGE_TIMEOUT_MS)
    page.locator(".wb-submodel").wait_for(timeout=PAGE_TIMEOUT_MS)
    page.locator(".js-plotly-plot .barlayer").first.wait_for(timeout=PAGE_TIMEOUT_MS)
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
