"""The overview page, served by Voila and driven in Debian's chromium."""
import os
import time
from pathlib import Path

import pytest

from tests.browser.conftest import ARTIFACTS, assert_figures_visible
from workbench.devices import DISTILBERT, get_profile
from workbench.mechanisms import mechanisms
from workbench.serving import free_port
from workbench.serving import voila_server as serve

REPO = Path(__file__).resolve().parents[2]

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
    assert page.locator(".wb-overview-section").count() == sum(m.overview is not None for m in mechanisms())
    assert page.locator(".wb-section-missing").count() == 0


@pytest.fixture(scope="module")
def toy_server(prepared, tmp_path_factory):
    """A Voila server whose processes register tests/toy_mechanism.py as they start (a sitecustomize on their
    PYTHONPATH adds its line to REGISTERED), no shared file changed."""
    site = tmp_path_factory.mktemp("toy-site")
    (site / "sitecustomize.py").write_text(
        "import workbench.mechanisms as registry\n"
        "registry.REGISTERED = (*registry.REGISTERED, 'tests.toy_mechanism')\n")
    path = os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    ARTIFACTS.mkdir(exist_ok=True)
    with serve(free_port(), log_path=ARTIFACTS / "voila-toy.log",
               env={"WORKBENCH_PRESET": os.environ.get("WORKBENCH_PRESET", "quick"), "PYTHONPATH": path}) as base:
        yield base


def test_a_mechanism_declared_in_the_tests_shows_in_the_gallery_and_the_overview(toy_server, page):
    page.goto(f"{toy_server}/voila/render/index.ipynb", timeout=PAGE_TIMEOUT_MS)
    link = page.locator("a", has_text="Toy page")
    link.wait_for(timeout=PAGE_TIMEOUT_MS)
    assert link.get_attribute("href") == "toy.ipynb"
    page.goto(f"{toy_server}/voila/render/overview.ipynb", timeout=PAGE_TIMEOUT_MS)
    page.locator(".wb-toy-overview").wait_for(timeout=PAGE_TIMEOUT_MS)
    preset = os.environ.get("WORKBENCH_PRESET", "quick")
    assert f"toy artifacts of the {preset} preset" in page.locator(".wb-toy-overview").inner_text()
    assert page.locator(".wb-error").count() == 0


def test_every_overview_control_moves_the_title_and_data_of_its_figure(voila_server, page):
    """Layer and shard bits move the shared figure; the elastic section's task moves its grid."""
    from tests.browser.test_elastic_page import figure_state, wait_for_title
    from workbench.data import TASKS

    page.goto(f"{voila_server}/voila/render/overview.ipynb", timeout=PAGE_TIMEOUT_MS)
    page.locator(".wb-task-info").wait_for(timeout=PAGE_TIMEOUT_MS)
    assert_figures_visible(page, ["grid", "times"])
    before = figure_state(page, "times")
    assert "d=768" in before["title"] and "at 6 bits" in before["title"]

    page.locator(".widget-dropdown", has=page.locator("label", has_text="Layer")).locator("select").select_option(
        "MiniLM layer (d=384)")
    wait_for_title(page, "times", "d=384")
    moved = figure_state(page, "times")
    assert moved["data"] != before["data"]

    slider = page.locator(".widget-hslider, .widget-slider", has=page.locator("label", has_text="Shard bits")).first
    slider.locator(".noUi-handle").focus()
    page.keyboard.press("ArrowLeft")                        # 6 -> 5 bits
    wait_for_title(page, "times", "at 5 bits")
    bits = figure_state(page, "times")
    assert bits["data"] != moved["data"]

    grid = figure_state(page, "grid")
    page.locator(".widget-dropdown", has=page.locator("label", has_text="Task")).locator("select").select_option(
        label=TASKS["bbc"].title)
    wait_for_title(page, "grid", TASKS["bbc"].title)
    now = figure_state(page, "grid")
    assert now["title"] != grid["title"] and now["data"] != grid["data"]
    assert page.locator(".wb-error").count() == 0
