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
REPLAY_TIMEOUT_MS = 400_000          # a first replay at 8-token chunks measures this host for them (once)
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


def control(page, kind: str, label: str):
    """The widget of ``kind`` (its CSS class) whose description is exactly ``label``."""
    return page.locator(f".{kind}", has=page.locator("label", has_text=re.compile(f"^{re.escape(label)}$")))


def set_slider(page, label: str, value) -> None:
    readout = control(page, "widget-slider", label).locator(".widget-readout")
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type(str(value))
    page.keyboard.press("Enter")


def set_number(page, label: str, value) -> None:
    box = control(page, "widget-inline-hbox", label).locator("input")
    box.fill(str(value))
    box.press("Enter")


def test_every_control_off_its_value_replays_with_it(replays, voila_server, page):
    """Every replay setting moved in the page, then Replay: the summary and figures show replays made with
    each of them (a tiny trace: 2 contexts, 3 calls), and no error is shown."""
    page.goto(f"{voila_server}/voila/render/{PAGE}", timeout=PAGE_TIMEOUT_MS)
    page.locator(".wb-kv-summary").wait_for(timeout=PAGE_TIMEOUT_MS)
    assert_figures_visible(page, FIGURES)
    llms = replays["llms"]
    opened = {"contexts": llms.contexts, "calls": len(llms.calls), "chunk": llms.settings["config"]["chunk_size"],
              "policy": llms.settings["config"]["policy"], "device": llms.device, "pattern": llms.pattern}
    assert opened == {"contexts": 3, "calls": 12, "chunk": 16, "policy": "lctru", "device": "orin-nx",
                      "pattern": "markov"}                       # the values moved below differ from these
    chunks, latency = page.locator(".wb-figure[data-name='chunks']"), page.locator(".wb-figure[data-name='latency']")
    revisions = chunks.get_attribute("data-revision"), latency.get_attribute("data-revision")

    page.locator(".widget-dropdown select", has=page.locator("option", has_text="of the working set")).select_option(
        "of the working set")
    set_number(page, "Memory budget", 0.4)
    set_slider(page, "Active contexts", 2)
    set_number(page, "Calls", 3)
    set_slider(page, "Global ratio", 0.75)
    for label, value in (("Chunk (tokens)", "8"), ("Eviction policy", "lru"), ("Switching pattern", "random"),
                         ("Device", "host")):
        control(page, "widget-dropdown", label).locator("select").select_option(value)
    set_number(page, "Mean interval (s)", 120)
    set_number(page, "Idle (s/trace min)", 0.3)
    set_number(page, "Seed", 7)
    page.locator(".wb-kv-stale").wait_for(timeout=30_000)

    started = time.perf_counter()
    page.get_by_role("button", name="Replay").click()
    made = page.locator(".wb-kv-made", has_text="replayed with 0.30 s idle per trace minute")
    made.wait_for(timeout=REPLAY_TIMEOUT_MS)
    print(f"\nreplay of 5 methods x 3 calls with idle: {time.perf_counter() - started:.1f} s")
    text = made.inner_text()
    assert "Trace: random switching, seed 7, calls every" in text
    assert "Service: 8-token chunks for every method; LLMS at global ratio 0.75 with LRU eviction." in text
    summary = page.locator(".wb-kv-summary").inner_text()
    assert "(3 calls, 2 contexts, host," in summary
    assert chunks.get_attribute("data-revision") != revisions[0]
    assert latency.get_attribute("data-revision") != revisions[1]
    assert "after call 0 (LLMS)" in chunks.get_attribute("data-title")
    page.locator(".wb-figure[data-name='queue'][data-title*='(LLMS, LRU)']").wait_for(timeout=30_000)  # drawn after the summary
    assert page.locator(".wb-kv-stale").count() == 0 and page.locator(".wb-error").count() == 0

    set_slider(page, "Call", 1)
    page.locator(".wb-figure[data-name='chunks'][data-title*='after call 1 (LLMS)']").wait_for(timeout=30_000)
    assert re.search(r"served at [0-9.]+ min after [0-9.]+ s idle", chunks.get_attribute("data-title"))
    assert page.locator(".wb-error").count() == 0


def test_the_live_view_attaches_to_a_service_that_a_client_is_calling(voila_server, page, tmp_path):
    """A real `workbench serve llms` on a socket of its own; the page attaches with the operator's token (each
    control moved off its value) and its chunk map, queue and counters follow a client's calls."""
    import subprocess
    import sys
    from pathlib import Path

    from workbench.kvcache.client import connect

    sock, swap = tmp_path / "llms.sock", tmp_path / "swap"
    proc = subprocess.Popen([str(Path(sys.executable).with_name("workbench")), "serve", "llms", "--address",
                             f"unix:{sock}", "--swap-dir", str(swap), "--memory-mb", "40",
                             "--max-context-tokens", "512"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if "llms: serving on" in line:
                break
        else:
            raise AssertionError("the service never started")
        page.goto(f"{voila_server}/voila/render/{PAGE}", timeout=PAGE_TIMEOUT_MS)
        page.locator(".wb-kv-live-status", has_text="not attached").wait_for(timeout=PAGE_TIMEOUT_MS)
        assert_figures_visible(page, ["live_chunks", "live_queue"])
        control(page, "widget-inline-hbox", "Service address").locator("input").fill(f"unix:{sock}")
        control(page, "widget-inline-hbox", "Operator token").locator("input").fill(
            (swap / "operator.token").read_text().strip())
        set_number(page, "Refresh (s)", 0.5)
        page.get_by_role("button", name="Attach").click()
        page.locator(".wb-kv-live-status", has_text=f"attached to unix:{sock}: 0 contexts").wait_for(timeout=60_000)
        page.locator(".wb-kv-live-status", has_text="every 0.5 s").wait_for(timeout=10_000)
        with connect("notes", f"unix:{sock}") as notes, connect("mail", f"unix:{sock}") as mail:
            a, b = notes.new_ctx(), mail.new_ctx()
            notes.call(a, "Name a colour.", 4)
            mail.call(b, "Name a bird.", 4)
            notes.call(a, "Another one?", 4)
            ids = [c["id"] for c in notes.contexts()] + [c["id"] for c in mail.contexts()]
        chunks = page.locator(".wb-figure[data-name='live_chunks'][data-title*='2 contexts']")
        chunks.wait_for(timeout=30_000)
        assert "last call: uid" in chunks.get_attribute("data-title")
        page.locator(".wb-kv-live-counters td[data-counter='calls']", has_text="3").wait_for(timeout=30_000)
        text = page.locator(".wb-figure[data-name='live_chunks']").inner_text()
        assert all(f"· {i[:6]}" in text for i in ids)                   # each context is a labelled row
        page.locator(".wb-figure[data-name='live_queue'][data-title*='chunks in memory may leave']").wait_for(
            timeout=30_000)
        page.get_by_role("button", name="Detach").click()
        page.locator(".wb-kv-live-status", has_text="detached from").wait_for(timeout=10_000)
        assert page.locator(".wb-error").count() == 0
    finally:
        proc.terminate()
        proc.wait(60)
