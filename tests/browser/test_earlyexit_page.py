"""The E3 page in Debian's chromium: every figure seen with the engine's numbers, and every control moved off its
default with its figures following. The real Ray Serve run is left to the headless test
(tests/ui/test_earlyexit.py, on the suite's shared Ray): starting Ray inside the page's kernel on a loaded
2-core machine can take longer than a browser test should wait, and it would leave a second Ray running beside
the suite's."""
import json
import time

import pytest

from tests.browser.conftest import assert_figures_visible
from tests.browser.test_elastic_page import figure_state, set_readout, wait_for_title
from tests.browser.test_kvcache_page import control
from tests.ui.test_earlyexit import reference
from workbench.data import TASKS
from workbench.mechanisms import dashboards

PAGE = "earlyexit.ipynb"
PAGE_TIMEOUT_MS = 180_000
FIGURES = ["profile", "goodput", "plan", "bubbles"]


def test_the_earlyexit_mechanism_serves_its_page():
    board = next(d for d in dashboards() if d.page == PAGE)
    assert (board.probe_control, board.probe_figure) == ("SLO (ms)", "plan")


def traces(page, name) -> list:
    """[name, x, y, z, base] of each trace the slot draws now."""
    return json.loads(figure_state(page, name)["data"])


def select(page, description: str, **option) -> None:
    control(page, "widget-dropdown", description).locator("select").select_option(**option)


def set_gpus(page, gpu: str, count: int) -> None:
    box = page.locator(f".wb-gpu-{gpu} input")
    box.fill(str(count))
    box.press("Enter")


def wait_until_moved(page, seen: dict, *names, timeout_s: float = 90.0) -> None:
    """Each named figure shows another title or other data than in ``seen`` (then ``seen`` is updated)."""
    deadline = time.monotonic() + timeout_s
    for name in names:
        while True:
            now = figure_state(page, name)
            if now != seen[name]:
                seen[name] = now
                break
            assert time.monotonic() < deadline, f"{name} did not move"
            time.sleep(0.3)


TITLE_OVERFLOW_JS = """() => [...document.querySelectorAll('.wb-figure')].flatMap((slot) => {
  const box = slot.getBoundingClientRect();
  return [...slot.querySelectorAll('.gtitle, .annotation-text')].filter((t) => {
    const r = t.getBoundingClientRect();
    return r.width > 0 && (r.right > box.right + 2 || r.left < box.left - 2);
  }).map((t) => slot.dataset.name + ': ' + t.textContent);
})"""


def assert_titles_fit(page) -> None:
    """No figure's title or note runs past its slot (a title cut off on the right hides its key number)."""
    assert page.evaluate(TITLE_OVERFLOW_JS) == []


def plan_bars(page) -> list[tuple]:
    return [(t[4][0], t[4][0] + t[1][0], len(t[2])) for t in traces(page, "plan")]


def test_every_control_moves_its_figures(voila_server, page):
    started = time.perf_counter()
    page.goto(f"{voila_server}/voila/render/{PAGE}", timeout=PAGE_TIMEOUT_MS)
    page.locator(".wb-why").wait_for(timeout=PAGE_TIMEOUT_MS)
    assert_figures_visible(page, FIGURES)
    print(f"\ncold page load until every figure shows: {time.perf_counter() - started:.1f} s")

    series, plan, sim = reference()
    assert plan_bars(page) == [(s, e, r) for (s, e), r in zip(plan.splits, plan.replicas)]
    assert f"goodput {plan.goodput:,.0f} samples/s" in figure_state(page, "plan")["title"]
    forecast = traces(page, "profile")[-1]
    assert forecast[2] == pytest.approx([16 * f for f in series.forecast[-1].remaining])
    assert f"goodput {sim.goodput:,.0f} samples/s" in page.locator(".wb-sim-info").inner_text()
    assert plan.binding in page.locator(".wb-why").inner_text()
    seen = {n: figure_state(page, n) for n in FIGURES}
    assert_titles_fit(page)
    assert "leave before the last layer" in page.locator(".wb-few-exits").inner_text() or \
        page.locator(".wb-few-exits").count() == 0

    set_readout(page, "SLO (ms)", 20)
    wait_for_title(page, "plan", "of 16.0 ms")
    wait_for_title(page, "goodput", "SLO of 20 ms")
    wait_until_moved(page, seen, "plan", "goodput")

    set_readout(page, "Batch per replica", 32)
    wait_for_title(page, "plan", "batch 32 on every replica")
    wait_until_moved(page, seen, "plan", "profile", "goodput", "bubbles")

    set_gpus(page, "v100", 2)
    set_gpus(page, "k80", 3)
    set_gpus(page, "p100", 1)
    set_gpus(page, "a6000", 1)
    wait_until_moved(page, seen, "plan", "goodput")

    select(page, "Easy:hard mix", label="20:80")
    wait_until_moved(page, seen, "profile")
    set_readout(page, "Exit threshold (nats)", 0.5)
    page.locator(".wb-threshold-info", has_text="accuracy").wait_for(timeout=60_000)
    wait_until_moved(page, seen, "profile")

    select(page, "Arrivals", value="bursty")
    page.locator(".wb-sim-info", has_text="bursty requests").wait_for(timeout=60_000)
    wait_until_moved(page, seen, "bubbles")
    set_readout(page, "Rate (requests/s)", 5000)
    page.locator(".wb-sim-info", has_text="5,000 per second").wait_for(timeout=60_000)
    wait_until_moved(page, seen, "bubbles")

    select(page, "Task", label=TASKS["bbc"].title)
    page.locator(".wb-threshold-info", has_text="stock").wait_for(timeout=60_000)
    wait_until_moved(page, seen, "profile")
    _, plan, sim = reference(task="bbc", easy=0.2, gpus={"v100": 2, "p100": 1, "k80": 3, "a6000": 1}, slo_s=0.02, batch_size=32,
                             pattern="bursty", rate=5000)
    deadline = time.monotonic() + 60
    while plan_bars(page) != [(s, e, r) for (s, e), r in zip(plan.splits, plan.replicas)]:
        assert time.monotonic() < deadline, f"the plan drawn is not the engine's {plan.splits} {plan.replicas}"
        time.sleep(0.3)
    page.locator(".wb-sim-info", has_text=f"goodput {sim.goodput:,.0f} samples/s").wait_for(timeout=60_000)
    assert page.locator(".wb-error").count() == 0
    assert_titles_fit(page)

    set_readout(page, "SLO (ms)", 1)                          # no plan: the reason fits its half-width slot
    page.locator(".wb-figure[data-name='goodput'] .annotation-text", has_text="no batch size meets").wait_for(
        timeout=60_000)
    page.locator(".wb-figure[data-name='plan'] .annotation-text", has_text="raise the SLO").first.wait_for(
        timeout=60_000)
    assert_titles_fit(page)
