"""The elastic-pipelining page in Debian's chromium: move the target slider, see the engine's new plan."""
import time

from tests.browser.conftest import assert_figures_visible
from workbench.bench.browser import page_quiet
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


FIGURE_JS = """slot => {
    const gd = slot.querySelector('.js-plotly-plot');
    const title = slot.querySelector('.gtitle');
    const data = gd && gd.data ? JSON.stringify(gd.data.map(t => [t.name, t.x, t.y, t.z, t.base])) : '';
    return {title: title ? title.textContent : '', data: data};
}"""


def figure_state(page, name):
    """The title and the data a figure slot shows in the page now."""
    return page.locator(f".wb-figure[data-name='{name}'][data-revision]").first.evaluate(FIGURE_JS)


def wait_for_title(page, name, text, timeout_ms=60_000):
    page.locator(f".wb-figure[data-name='{name}'] .gtitle", has_text=text).first.wait_for(timeout=timeout_ms)


def set_readout(page, label, value):
    """Type ``value`` into the readout of the slider labelled ``label`` and settle it with Enter."""
    slider = page.locator(".widget-slider", has=page.locator("label", has_text=label))
    slider.locator(".widget-readout").click()
    page.keyboard.press("Control+A")
    page.keyboard.type(str(value))
    page.keyboard.press("Enter")


def test_every_control_moves_the_titles_and_data_of_its_figures(voila_server, page):
    """Task, device, target, preload, AIB step and runs, each off its default: the figures drawn from each
    show a new title naming the new value, and new data."""
    from workbench.data import TASKS

    page.goto(f"{voila_server}/voila/render/elastic.ipynb", timeout=PAGE_TIMEOUT_MS)
    page.locator(".wb-submodel").wait_for(timeout=PAGE_TIMEOUT_MS)
    assert_figures_visible(page, ["importance", "candidates", "aib", "gantt", "memory"])
    names = ("importance", "candidates", "aib", "gantt", "memory")
    seen = {n: figure_state(page, n) for n in names}

    def changed(*which):
        page_quiet(page, 0.5)                       # the figures a re-plan defers are drawn too
        now = {n: figure_state(page, n) for n in names}
        for n in which:
            assert now[n]["title"] != seen[n]["title"], f"figure {n!r} kept its title {now[n]['title']!r}"
        seen.update(now)
        return now

    before = dict(seen)
    page.locator(".widget-dropdown", has=page.locator("label", has_text="Task")).locator("select").select_option(
        label=TASKS["bbc"].title)
    wait_for_title(page, "importance", TASKS['bbc'].title)
    now = changed("importance")
    assert now["importance"]["data"] != before["importance"]["data"]        # bbc's importance, not sentiment's

    page.locator(".widget-dropdown", has=page.locator("label", has_text="Device")).locator("select").select_option(
        "jetson-nano")
    wait_for_title(page, "candidates", "on jetson-nano")
    wait_for_title(page, "gantt", "on jetson-nano")
    changed("candidates", "gantt", "memory")

    before = dict(seen)
    set_readout(page, "Target (ms)", 300)
    wait_for_title(page, "candidates", "at 300 ms on jetson-nano")
    now = changed("candidates", "memory")
    assert now["candidates"]["data"] != before["candidates"]["data"]

    before = dict(seen)
    set_readout(page, "Preload (MB)", 4.5)
    wait_for_title(page, "aib", "4.50 MB preload buffer")
    now = changed("aib")
    assert now["aib"]["data"] != before["aib"]["data"]

    before = dict(seen)
    set_readout(page, "AIB step", 0)
    wait_for_title(page, "aib", "step 0/")
    now = changed("aib")
    assert now["aib"]["data"] != before["aib"]["data"]

    runs = page.locator(".widget-text", has=page.locator("label", has_text="runs")).locator("input")
    runs.fill("1")
    runs.press("Enter")
    before = dict(seen)
    page.locator("button", has_text="Run for real").click()
    page.locator(".wb-run-info", has_text="1 real run(s)").wait_for(timeout=120_000)
    page.wait_for_timeout(500)
    now = {n: figure_state(page, n) for n in names}
    assert now["gantt"]["data"] != before["gantt"]["data"]          # the measured run overlaid
    assert page.locator(".wb-error").count() == 0


def assert_rows_apart(page, selector: str, count: int) -> None:
    """The device table holds ``count`` rows, each input of ``selector`` at least 20 px tall and below the one
    above it (rows squeezed into the scrolled table used to overlap at 32 and 64 devices)."""
    page.wait_for_function(f"() => document.querySelectorAll({selector!r}).length === {count}", timeout=30_000)
    boxes = [page.locator(selector).nth(i).bounding_box() for i in range(min(count, 10))]
    for above, below in zip(boxes, boxes[1:]):
        assert below["height"] >= 20 and below["y"] >= above["y"] + above["height"] - 0.5, (above, below)
