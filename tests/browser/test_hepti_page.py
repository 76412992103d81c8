"""The Hepti page in Debian's chromium: every figure seen with the engine's numbers, every control moved off its
default with the titles and data of its figures following (the device table's cells and memory falls
included), and "Run for real" with a memory fall and a killed device drawing the measured timeline with the fault
and the re-partitions marked."""
import json
import time
from dataclasses import replace

import pytest

from tests.browser.conftest import assert_figures_visible
from workbench.bench.browser import page_quiet
from tests.browser.test_elastic_page import assert_rows_apart, figure_state, set_readout, wait_for_title
from tests.browser.test_kvcache_page import control
from workbench.devices import get_cluster
from workbench.mechanisms import dashboards
from workbench.partition.cost import SHAPES
from workbench.hepti.plan import hepti_partition
from workbench.hepti.run import shape_of
from workbench.ui.hepti import MAX_ROWS

PAGE = "hepti.ipynb"
PAGE_TIMEOUT_MS = 180_000
RUN_TIMEOUT_MS = 240_000
FIGURES = ["decision", "breakdown", "compare", "timeline"]
CLUSTER = tuple(get_cluster("hepti").devices)


def test_the_hepti_mechanism_serves_its_page():
    board = next(d for d in dashboards() if d.page == PAGE)
    assert (board.probe_control, board.probe_figure) == ("Sequence length", "breakdown")
    assert board.panel == "workbench.ui.hepti:HeptiPanel" and board.requires == ()


def traces(page, name) -> list:
    """[name, x, y, z, base] of each trace the slot draws now."""
    return json.loads(figure_state(page, name)["data"])


def shares_drawn(page) -> list[list[float]]:
    """Per layer, each device's share in the decision figure."""
    bars = [t for t in traces(page, "decision")]
    return [[t[1][n] for t in bars] for n in range(len(bars[0][1]))]


def select(page, description: str, **option) -> None:
    control(page, "widget-dropdown", description).locator("select").select_option(**option)


def set_cell(page, column: str, device: int, value) -> None:
    box = page.locator(f".wb-dev-{column}-{device} input")
    box.fill(str(value))
    box.press("Enter")


@pytest.mark.alone
def test_every_control_moves_its_figures_and_run_for_real_marks_the_fault(voila_server, page):
    started = time.perf_counter()
    page.goto(f"{voila_server}/voila/render/{PAGE}", timeout=PAGE_TIMEOUT_MS)
    page.locator(".wb-reasons").wait_for(timeout=PAGE_TIMEOUT_MS)
    assert_figures_visible(page, FIGURES)
    print(f"\ncold page load until every figure shows: {time.perf_counter() - started:.1f} s")

    # Hepti's four boards, the encoder at T = 128, a 200 ms deadline
    shape = shape_of(SHAPES["encoder"], 128)
    p = hepti_partition(CLUSTER, shape, 0.2, num_layers=6)
    assert shares_drawn(page) == [list(p.shares)] * 6
    assert p.binding in page.locator(".wb-binding").inner_text()
    assert f"predicted {1e3 * p.predicted_latency_s:.1f} ms, meets the deadline of 200 ms" in \
        figure_state(page, "breakdown")["title"]
    even = hepti_partition(CLUSTER, shape, num_layers=6, mode="ws", fixed_shares=[0.25] * 4)
    compute, comm = traces(page, "compare")[:2]
    assert compute[1][:2] == ["Hepti's MILP", "even shares"]
    assert compute[2][1] + comm[2][1] == pytest.approx(1e3 * even.predicted_latency_s)
    assert "predicted" in figure_state(page, "timeline")["title"]
    seen = {n: figure_state(page, n) for n in FIGURES}

    def moved(*names, timeout_s=30.0):
        """Each named figure shows a new title or new data (within ``timeout_s``: the figures of one change reach
        the page one after another)."""
        deadline = time.monotonic() + timeout_s
        for n in names:
            while True:
                now = figure_state(page, n)
                if now["title"] != seen[n]["title"] or now["data"] != seen[n]["data"]:
                    break
                assert time.monotonic() < deadline, f"{n} did not move"
                time.sleep(0.2)
        page_quiet(page, 0.5)                           # the comparison and timeline a change defers, drawn too
        seen.update({n: figure_state(page, n) for n in FIGURES})

    set_readout(page, "Deadline (ms)", 180)
    wait_for_title(page, "breakdown", "meets the deadline of 180 ms")
    moved("breakdown", "compare")
    page.locator(".widget-checkbox", has_text="Meet a deadline").locator("input").uncheck()
    wait_for_title(page, "breakdown", "no deadline")
    moved("breakdown", "compare")

    set_readout(page, "Sequence length", 64)
    wait_for_title(page, "decision", "T = 64")
    p = hepti_partition(CLUSTER, shape_of(SHAPES["encoder"], 64), num_layers=6)
    wait_for_title(page, "breakdown", f"predicted {1e3 * p.predicted_latency_s:.1f} ms")
    moved("decision", "breakdown", "compare", "timeline")

    select(page, "Model", label=SHAPES["gpt2"].title)
    wait_for_title(page, "decision", "gpt2, T = 64")
    wait_for_title(page, "compare", "12 layers")
    moved("decision", "breakdown", "compare", "timeline")

    set_readout(page, "Devices", 3)
    wait_for_title(page, "decision", "3 devices")
    assert page.locator(".wb-dev-speed").count() == 3
    moved("decision", "breakdown", "compare", "timeline")

    set_cell(page, "speed", 0, 30)                         # one fast board
    set_cell(page, "bandwidth", 1, 300)                    # one slow link
    set_cell(page, "memory", 2, 0.5)
    gpt2 = shape_of(SHAPES["gpt2"], 64)
    mine = (replace(CLUSTER[0], flops_per_s=30e9), replace(CLUSTER[1], net_bytes_per_s=300e6 / 8),
            replace(CLUSTER[2], memory_bytes=0.5e9))
    p = hepti_partition(mine, gpt2, num_layers=12)
    wait_for_title(page, "breakdown", f"predicted {1e3 * p.predicted_latency_s:.1f} ms")
    assert shares_drawn(page)[0] == pytest.approx(list(p.shares))
    moved("decision", "breakdown", "compare", "timeline")

    select(page, "Shares", label="even")                  # (here the LP's shares are the proportional ones)
    wait_for_title(page, "decision", "shares: even")
    p = hepti_partition(mine, gpt2, num_layers=12, mode="ws", fixed_shares=[1 / 3] * 3)
    wait_for_title(page, "breakdown", f"predicted {1e3 * p.predicted_latency_s:.1f} ms")
    assert shares_drawn(page)[0] == pytest.approx([1 / 3] * 3)
    moved("decision", "breakdown", "compare")

    select(page, "Mode", label="1D-tiled WS forced")
    wait_for_title(page, "decision", "Hepti's decision: 1D-tiled WS,")
    wait_for_title(page, "compare", "the first three in 1D-tiled WS")
    moved("decision", "breakdown", "compare", "timeline")

    select(page, "Shares", label="Hepti's MILP")                 # (fixed shares would not fit the fall below)
    wait_for_title(page, "decision", "shares: Hepti's MILP")
    set_cell(page, "fall-mb", 2, 0)                        # rpi4-b's memory gone from layer 5: it is dropped
    page.locator(".wb-dev-fall-at-2 select").select_option(label="layer 5")
    page.locator(".wb-redecisions li[data-layer='5']").wait_for(timeout=30_000)
    assert "rpi4-b's free memory fell to 0.0 MB" in page.locator(".wb-redecisions").inner_text()
    page.wait_for_function("() => { const gd = document.querySelector(\".wb-figure[data-name='decision'] "
                           ".js-plotly-plot\"); return gd && gd.data && gd.data[2].x[5] === 0; }", timeout=30_000)
    moved("decision", "breakdown", "timeline")
    assert page.locator(".wb-error").count() == 0

    # back to the 180 ms deadline: nothing meets it now, and the page says so beside the controls
    page.locator(".widget-checkbox", has_text="Meet a deadline").locator("input").check()
    p = hepti_partition(mine[:2], gpt2, num_layers=12, mode="1d")       # layer 5 on: rpi4-b dropped
    page.locator(".wb-error", has_text="no partition meets the deadline of 180.0 ms").wait_for(timeout=30_000)
    assert page.locator(".wb-error").first.inner_text().startswith("no partition meets the deadline of 180.0 ms")
    assert "Traceback" not in page.locator(".wb-error").first.inner_text()
    set_readout(page, "Deadline (ms)", 30000)
    page.locator(".wb-error").first.wait_for(state="detached", timeout=30_000)

    # Run for real: the encoder at T = 32 on the four boards as they come, rpi4-b's memory falling to 20 MB at
    # layer 2, jetson killed at layer 4, memory reports alone deciding (a busy host's measured speeds move)
    select(page, "Mode", label="Hepti decides (by memory)")
    select(page, "Model", label=SHAPES["encoder"].title)
    set_readout(page, "Devices", 4)
    set_readout(page, "Sequence length", 32)
    set_cell(page, "speed", 0, 12)
    set_cell(page, "bandwidth", 1, 1000)
    set_cell(page, "memory", 2, 2)
    set_cell(page, "fall-mb", 2, 20)
    page.locator(".wb-dev-fall-at-2 select").select_option(label="layer 2")
    wait_for_title(page, "decision", "weight-stationary (WS) then 1D-tiled WS")
    wait_for_title(page, "timeline", "Hepti timeline on 4 devices (encoder, T = 32)")
    select(page, "Kill device", label="jetson-nano-cpu")
    select(page, "at", label="layer 4")
    page.locator(".widget-checkbox", has_text="Re-partition on measured speeds").locator("input").uncheck()
    assert {"mode switch (predicted)"} <= {t[0] for t in traces(page, "timeline")}
    before = figure_state(page, "timeline")
    started = time.perf_counter()
    page.get_by_role("button", name="Run for real").click()
    page.locator(".wb-run-info", has_text="Replayed").wait_for(timeout=RUN_TIMEOUT_MS)
    print(f"run for real on 4 worker processes with a fault: {time.perf_counter() - started:.1f} s")
    wait_for_title(page, "timeline", "1 fault")
    after = figure_state(page, "timeline")
    assert after["data"] != before["data"]
    names = {t[0] for t in traces(page, "timeline")}
    assert {"compute (measured)", "fault (measured)", "re-partition (measured)"} <= names
    run = page.locator(".wb-run-info").inner_text()
    measured_ms = run.split("Replayed ")[1].split(" ms")[0]
    assert f"replayed {measured_ms} ms vs predicted" in after["title"]
    fault = page.locator(".wb-fault").inner_text()
    assert "jetson-nano-cpu" in fault
    resumed = fault.split("resumed at layer ")[1].split(" ")[0]          # 4, or 5 when the kill lands late
    rows = page.locator(".wb-run-decisions tr").all_inner_texts()
    assert rows[0].split("\t") == ["layer", "mode", "shares", "why decided here"]
    by_layer = {r.split("\t")[0]: r.split("\t") for r in rows[1:]}
    assert list(by_layer) == ["0", "2", resumed]          # memory reports alone decide: the fall and the fault
    assert by_layer["2"][1] == "1D-tiled WS" and "rpi4-b's free memory fell to 20.0 MB" in by_layer["2"][3]
    assert by_layer[resumed][3] == "re-partition after the fault: jetson-nano-cpu lost"
    assert "jetson" not in by_layer[resumed][2]
    assert page.locator(".wb-error").count() == 0

    set_readout(page, "Devices", MAX_ROWS)                 # the table at its end scrolls, its rows apart
    assert_rows_apart(page, ".wb-dev-speed input", MAX_ROWS)
