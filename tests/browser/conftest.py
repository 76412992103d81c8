"""A real Voila server on a free 127.0.0.1 port and Debian's chromium driven by Playwright."""
from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from workbench.serving import chromium, free_port
from workbench.serving import voila_server as serve

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
VOILA_LOG = ARTIFACTS / f"voila-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.log"
"""This worker's server log (each pytest-xdist worker serves the pages on a server of its own)."""


@pytest.fixture(scope="session")
def voila_server(prepared):
    """Serve the gallery like `workbench dashboards` does; stopped (with its kernels) by process group afterwards."""
    ARTIFACTS.mkdir(exist_ok=True)
    port = free_port()
    with serve(port, log_path=VOILA_LOG,
                      env={"WORKBENCH_PRESET": os.environ.get("WORKBENCH_PRESET", "quick")}) as base:
        yield base
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "voila still listening after being stopped"


@pytest.fixture(scope="session")
def browser():
    with chromium() as b:
        yield b


LOCAL_SCHEMES = ("data", "blob", "about")


def outside(url: str) -> bool:
    """A request that leaves this machine's loopback server."""
    parts = urlsplit(url)
    return parts.scheme not in LOCAL_SCHEMES and parts.hostname != "127.0.0.1"


VOILA_SHARE_SCOPE = re.compile(r"^(Unsatisfied version [\d.]+ from _JUPYTERLAB\.CORE_OUTPUT of shared singleton module "
                               r"@jupyterlab/[a-z-]+ \(required \^4\.5\.10\)|Unsatisfied version [\d.]+ from "
                               r"_JUPYTERLAB\.CORE_OUTPUT of shared singleton module @jupyterlab/(services|coreutils) "
                               r"\(required \^[67]\.5\.10\)|No satisfying version \(\^4\.5\.10\) of shared module "
                               r"@jupyterlab/[a-z-]+ found in shared scope default\.)")
"""The one family of console warnings a page may print: Voila 0.5.13 ships its JupyterLab core at 4.2.5 beside
its own widget manager built against 4.5.10, and webpack says so on every load (Voila's bundles, not ours;
the manager runs on the 4.2.5 core). Everything else a page prints as a warning or error fails its test."""


def console_problems(messages: list[tuple[str, str]]) -> list[str]:
    """The console warnings and errors (and uncaught page errors) that are not Voila's known share-scope lines."""
    return [f"{kind}: {text}" for kind, text in messages
            if kind in ("warning", "error", "pageerror") and not VOILA_SHARE_SCOPE.match(text)]


@pytest.fixture
def page(browser, request):
    """A fresh browser page; every request it makes is recorded (``page.outside_requests``: those that left
    127.0.0.1, which fail the test), so is its console (``page.console``: a warning or error other than
    Voila's own share-scope lines fails the test), and a failed test leaves a full-page screenshot in
    test-artifacts/."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 1600})
    pg = ctx.new_page()
    pg.set_default_timeout(120_000)          # a loaded 2-core CI host can take longer than 30 s to lay out 64 rows
    pg.outside_requests = []
    pg.console = []
    pg.on("request", lambda r: pg.outside_requests.append(r.url) if outside(r.url) else None)
    pg.on("console", lambda m: pg.console.append((m.type, m.text)))
    pg.on("pageerror", lambda e: pg.console.append(("pageerror", str(e))))
    yield pg
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        ARTIFACTS.mkdir(exist_ok=True)
        pg.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    ctx.close()
    assert not pg.outside_requests, f"the page fetched from outside 127.0.0.1: {pg.outside_requests}"
    problems = console_problems(pg.console)
    assert not problems, "the page printed to its console:\n" + "\n".join(problems[:20])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


SEEN_JS = """el => {
    // The part of el a person can see: its box cut by every ancestor that clips it (overflow other than
    // visible, on el's chain of containing blocks: an absolutely placed box escapes unpositioned ancestors,
    // a fixed one all of them; body and html hand their overflow to the viewport) and by the viewport; and
    // whether el itself is what shows at the centre of that part.
    const box = el.getBoundingClientRect();
    let [left, top, right, bottom] = [box.left, box.top, box.right, box.bottom];
    let why = '';
    let mode = getComputedStyle(el).position;
    for (let a = el.parentElement; a; a = a.parentElement) {
        const style = getComputedStyle(a);
        if (style.display === 'none' || style.visibility === 'hidden' || style.opacity === '0')
            return {width: 0, height: 0, hit: false, why: 'an ancestor is hidden'};
        const contains = mode === 'fixed' ? false : mode === 'absolute' ? style.position !== 'static' : true;
        if (contains) mode = style.position;
        const root = a === document.body || a === document.documentElement;
        if (contains && !root && (style.overflowX !== 'visible' || style.overflowY !== 'visible')) {
            const r = a.getBoundingClientRect();
            left = Math.max(left, r.left); top = Math.max(top, r.top);
            right = Math.min(right, r.right); bottom = Math.min(bottom, r.bottom);
            if (!why && (right - left < 1 || bottom - top < 1))
                why = `(clipped by ${a.tagName.toLowerCase()}.${[...a.classList].join('.')}, ` +
                      `${Math.round(r.width)} x ${Math.round(r.height)} px at y ${Math.round(r.top)}; ` +
                      `the element is at y ${Math.round(box.top)}, ${Math.round(box.height)} px high)`;
        }
    }
    left = Math.max(left, 0); top = Math.max(top, 0);
    right = Math.min(right, window.innerWidth); bottom = Math.min(bottom, window.innerHeight);
    const width = Math.max(0, right - left), height = Math.max(0, bottom - top);
    const at = width && height ? document.elementFromPoint((left + right) / 2, (top + bottom) / 2) : null;
    return {width, height, hit: !!at && (el === at || el.contains(at)), why};
}"""


def assert_seen(locator, label: str, min_px: int = 200, settle_s: float = 3.0, min_height: int | None = None) -> None:
    """``locator``'s element shows at least ``min_px`` x ``min_px`` (``min_height`` tall when given) on screen
    once scrolled to: its box cut by every clipping ancestor and the viewport, and nothing else drawn over its
    centre. (A size read from the element alone passes a figure whose container is 0 px tall with overflow
    hidden.) Scrolling and layout get ``settle_s`` to finish."""
    tall = min_px if min_height is None else min_height
    deadline = time.monotonic() + settle_s
    while True:
        locator.scroll_into_view_if_needed()
        seen = locator.evaluate(SEEN_JS)
        if (seen["width"] >= min_px and seen["height"] >= tall and seen["hit"]) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert seen["width"] >= min_px and seen["height"] >= tall, \
        f"{label} shows {seen['width']:.0f} x {seen['height']:.0f} px {seen['why']}".rstrip()
    assert seen["hit"], f"{label}: something else is drawn over its centre"


PAGE_REPORT_JS = """() => ({
    slots: [...document.querySelectorAll('.wb-figure')].map(el => `${el.dataset.name}: revision ${el.dataset.revision
        ?? 'none'}, ${el.querySelector('.main-svg') ? 'plot drawn' : 'no plot'}`),
    errors: [...document.querySelectorAll('.wb-error, .jp-OutputArea-output[data-mime-type*=error], pre')]
        .map(el => el.innerText.slice(0, 600)),
    text: document.body.innerText.slice(0, 1500),
    plotly: typeof window.Plotly,
})"""


def page_report(page, log_lines: int = 40) -> str:
    """What a page shows when a wait on it timed out (its figure slots, error texts, the start of its text,
    the console) and the end of the Voila server's log: the evidence a failure on a CI machine leaves."""
    try:
        seen = page.evaluate(PAGE_REPORT_JS)
    except Exception as exc:                                   # a page that no longer answers says so
        seen = {"unreadable": repr(exc)}
    console = [f"{kind}: {text}" for kind, text in getattr(page, "console", [])][-20:]
    lines = VOILA_LOG.read_text(errors="replace").splitlines() if VOILA_LOG.exists() else ["(none)"]
    warned = [line for line in lines if "WARNING" in line or "ERROR" in line or "Traceback" in line][-20:]
    return "\n".join([json.dumps(seen, indent=1), "console:", *console, f"{VOILA_LOG.name}, its warnings:", *warned,
                      f"{VOILA_LOG.name} (end):", *lines[-log_lines:]])


def assert_figures_visible(page, names, min_px: int = 200, timeout_ms: int = 180_000) -> None:
    """Each named figure slot is drawn (its plot rendered at the current revision) and seen (``assert_seen``),
    as tall as its figure asks to be where that is less than ``min_px`` (a short note such as "no results
    yet"; its own height, not its container's, so a figure squeezed by the page still fails)."""
    for name in names:
        slot = page.locator(f".wb-figure[data-name='{name}'][data-revision]").first
        svg = slot.locator(".main-svg").first
        try:
            svg.wait_for(timeout=timeout_ms)
        except PlaywrightTimeout:
            raise AssertionError(f"figure {name!r} was not drawn in {timeout_ms / 1e3:.0f} s; what the page "
                                 f"shows:\n{page_report(page)}") from None
        asked = float(svg.get_attribute("height") or min_px)
        assert_seen(slot, f"figure {name!r}", min_px, min_height=min(min_px, int(asked)))
