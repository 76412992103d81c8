"""A real Voila server on a free 127.0.0.1 port and Debian's chromium driven by Playwright."""
from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from workbench.serving import chromium, free_port
from workbench.serving import voila_server as serve

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="session")
def voila_server(prepared):
    """Serve the gallery like `workbench dashboards` does; stopped (with its kernels) by process group afterwards."""
    ARTIFACTS.mkdir(exist_ok=True)
    port = free_port()
    with serve(port, log_path=ARTIFACTS / "voila.log",
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


@pytest.fixture
def page(browser, request):
    """A fresh browser page; every request it makes is recorded (``page.outside_requests``: those that left
    127.0.0.1, which fail the test), and a failed test leaves a full-page screenshot in test-artifacts/."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 1600})
    pg = ctx.new_page()
    pg.outside_requests = []
    pg.on("request", lambda r: pg.outside_requests.append(r.url) if outside(r.url) else None)
    yield pg
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        ARTIFACTS.mkdir(exist_ok=True)
        pg.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    ctx.close()
    assert not pg.outside_requests, f"the page fetched from outside 127.0.0.1: {pg.outside_requests}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


def assert_figures_visible(page, names, min_px: int = 200, timeout_ms: int = 180_000) -> None:
    """Each named figure is drawn, and seen: at least ``min_px`` high and wide, inside the viewport once
    scrolled to (a figure clipped to 0 px by its container fails here)."""
    for name in names:
        figure = page.locator(f".wb-figure[data-name='{name}'][data-revision] .main-svg").first
        figure.wait_for(timeout=timeout_ms)
        figure.scroll_into_view_if_needed()
        box = figure.bounding_box()
        viewport = page.viewport_size
        assert box is not None, f"figure {name!r} has no box"
        assert box["height"] >= min_px and box["width"] >= min_px, f"figure {name!r} is {box['width']}x{box['height']} px"
        assert 0 <= box["y"] and box["y"] + min_px <= viewport["height"], f"figure {name!r} is outside the viewport: {box}"
        assert figure.is_visible(), f"figure {name!r} is hidden"
