"""The overview page, served by Voila and driven in Debian's chromium."""
import time

from tests.browser.conftest import assert_figures_visible
from workbench.devices import DISTILBERT, get_profile

PAGE_TIMEOUT_MS = 180_000


def test_gallery_index_links_the_overview(voila_server, page):
    page.goto(f"{voila_server}/voila/render/index.ipynb", timeout=PAGE_TIMEOUT_MS)
    link = page.locator("a", has_text="Overview")
    link.wait_for(timeout=PAGE_TIMEOUT_MS)
    assert link.get_attribute("href") == "overview.ipynb"
    assert "from workbench" not in page.content()       # no notebook source leaks into the page


def test_overview_renders_and_reacts_to_the_device_control(voila_server, page):
    started = time.perf_counter()
    page.goto(f"{voila_server}/voila/render/overview.ipynb", timeout=PAGE_TIMEOUT_MS)
    page.locator(".wb-task-info").wait_for(timeout=PAGE_TIMEOUT_MS)
    assert_figures_visible(page, ["grid", "times"])          # both drawn and seen before any control moves
    print(f"\ncold page load until both figures show: {time.perf_counter() - started:.1f} s")
    assert "Odroid-N2+" in page.locator(".wb-device-info").inner_text()

    device = page.locator(".widget-dropdown", has=page.locator("label", has_text="Device")).locator("select")
    moved = time.perf_counter()
    device.select_option("jetson-nano")
    expected = f"full layer computes in {get_profile('jetson-nano').layer_compute_s(12, DISTILBERT) * 1e3:.2f} ms"
    page.locator(".wb-device-info", has_text=expected).wait_for(timeout=30_000)
    page.locator(".gtitle", has_text="Jetson Nano GPU").wait_for(timeout=30_000)
    print(f"device change -> redrawn figure: {(time.perf_counter() - moved) * 1e3:.0f} ms")
    assert page.locator(".wb-error").count() == 0
