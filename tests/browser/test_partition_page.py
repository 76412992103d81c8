"""The partition (Voltage) page in Debian's chromium: every figure seen with the cost model's numbers, every
control moved off its default with the titles and data of its figures following, and "Run for real" drawing a
measured timeline and the bytes the run counted."""
import json
import time

import pytest

from tests.browser.conftest import assert_figures_visible
from workbench.bench.browser import page_quiet
from tests.browser.test_elastic_page import assert_rows_apart, figure_state, set_readout, wait_for_title
from tests.browser.test_kvcache_page import control
from workbench.distributed import limits
from workbench.mechanisms import dashboards
from workbench.partition.cost import SHAPES
from workbench.partition.plan import SCHEMES, DeviceRow, devices_from_table, devices_like, plan_partition

PAGE = "partition.ipynb"
PAGE_TIMEOUT_MS = 180_000
RUN_TIMEOUT_MS = 180_000
FIGURES = ["decision", "schemes", "orders", "timeline"]
TP = list(SCHEMES).index("tensor_parallel")


def test_the_partition_mechanism_serves_its_page():
    board = next(d for d in dashboards() if d.page == PAGE)
    assert (board.probe_control, board.probe_figure) == ("Bandwidth (Mbit/s)", "schemes")


def traces(page, name) -> list:
    """[name, x, y, z, base] of each trace the slot draws now."""
    return json.loads(figure_state(page, name)["data"])


def scheme_bars(page) -> tuple[list, list]:
    compute, comm = traces(page, "schemes")[:2]
    return compute[2], comm[2]


def select(page, description: str, **option) -> None:
    control(page, "widget-dropdown", description).locator("select").select_option(**option)


def set_cell(page, column: str, device: int, value) -> None:
    box = page.locator(f".wb-dev-{column}-{device} input")
    box.fill(str(value))
    box.press("Enter")


@pytest.mark.alone
def test_every_control_moves_its_figures_and_run_for_real_draws_the_measurement(voila_server, page):
    started = time.perf_counter()
    page.goto(f"{voila_server}/voila/render/{PAGE}", timeout=PAGE_TIMEOUT_MS)
    page.locator(".wb-reasons").wait_for(timeout=PAGE_TIMEOUT_MS)
    assert_figures_visible(page, FIGURES)
    print(f"\ncold page load until every figure shows: {time.perf_counter() - started:.1f} s")

    # the paper's set-up: six edge VMs at 500 Mbit/s, the encoder at N = 128
    encoder, reference = SHAPES["encoder"], devices_like(6, bandwidth_mbit=500)
    plans = {s: plan_partition(s, encoder, 128, reference) for s in SCHEMES}
    compute, comm = scheme_bars(page)
    for k, scheme in enumerate(SCHEMES):
        assert compute[k] == pytest.approx(1e3 * (plans[scheme].predicted_s - plans[scheme].comm_s())), scheme
        assert comm[k] == pytest.approx(1e3 * plans[scheme].comm_s()), scheme
    voltage = plans["voltage"]
    assert [t[4] for t in traces(page, "decision")] == [[b[i] for b in voltage.bounds] for i in range(6)]
    assert voltage.reasons[-1] in page.locator(".wb-reasons").inner_text()
    assert f"predicted {1e3 * voltage.predicted_s:.1f} ms" in figure_state(page, "timeline")["title"]
    assert "P = N/K = 21.3333" in figure_state(page, "orders")["title"]
    seen = {n: figure_state(page, n) for n in FIGURES}

    def moved(*names):
        page_quiet(page, 0.5)                           # the timeline a change defers, drawn too
        now = {n: figure_state(page, n) for n in FIGURES}
        for n in names:
            assert now[n]["title"] != seen[n]["title"] or now[n]["data"] != seen[n]["data"], f"{n} did not move"
        seen.update(now)

    # bandwidth down: the tensor-parallel communication bar grows by the cost model's seconds
    set_readout(page, "Bandwidth (Mbit/s)", 200)
    wait_for_title(page, "schemes", "200 Mbit/s links")
    wait_for_title(page, "timeline", "200 Mbit/s links")
    slow = plan_partition("tensor_parallel", encoder, 128, devices_like(6, bandwidth_mbit=200))
    grown = 1e3 * (slow.comm_s() - plans["tensor_parallel"].comm_s())
    assert scheme_bars(page)[1][TP] - comm[TP] == pytest.approx(grown) and grown > 0
    assert page.locator(".wb-dev-bandwidth-5 input").input_value() == "200"
    moved("schemes", "timeline")

    set_readout(page, "Devices", 4)
    wait_for_title(page, "schemes", "4 devices")
    wait_for_title(page, "orders", "P = N/K = 32")
    assert page.locator(".wb-dev-speed").count() == 4
    moved("schemes", "orders", "decision", "timeline")

    set_readout(page, "Sequence length", 256)
    wait_for_title(page, "decision", "N = 256")
    wait_for_title(page, "orders", "at N = 256, P = N/K = 64")
    moved("decision", "orders", "schemes", "timeline")

    select(page, "Model", label=SHAPES["gpt2"].title)
    wait_for_title(page, "orders", "order for gpt2")
    wait_for_title(page, "schemes", "gpt2, N = 256")
    moved("orders", "schemes", "decision", "timeline")

    set_cell(page, "speed", 0, 30)                         # one device three times as fast
    set_cell(page, "memory", 3, 2)
    set_cell(page, "bandwidth", 2, 300)                    # one slower link
    wait_for_title(page, "schemes", "links of 200 to 300 Mbit/s")
    select(page, "Shares", value="proportional")
    gpt2 = SHAPES["gpt2"]
    devices = devices_from_table([DeviceRow(30, 7.6, 200), DeviceRow(10, 7.6, 200), DeviceRow(10, 7.6, 300),
                                  DeviceRow(10, 2, 200)])
    proportional = plan_partition("voltage", gpt2, 256, devices, shares="proportional")
    assert proportional.bounds[0] == (0, 128, 171, 213, 256)
    page.wait_for_function(
        "b => { const gd = document.querySelector(\".wb-figure[data-name='decision'] .js-plotly-plot\");"
        " return gd && gd.data && gd.data[1].base[0] === b; }", arg=proportional.bounds[0][1], timeout=30_000)
    assert [t[4] for t in traces(page, "decision")] == [[b[i] for b in proportional.bounds] for i in range(4)]
    assert "50.0%" in page.locator(".wb-reasons").inner_text()
    moved("decision", "schemes", "timeline")

    select(page, "Scheme", label=SCHEMES["pipeline"])
    wait_for_title(page, "timeline", "layer pipeline timeline on 4 devices")
    wait_for_title(page, "decision", "layer pipeline: layers each device holds")
    pipeline = plan_partition("pipeline", gpt2, 256, devices)
    assert [len(t[2]) for t in traces(page, "decision")] == list(pipeline.layers)
    moved("decision", "timeline")
    assert page.locator(".wb-error").count() == 0

    top = int(limits.devices.maximum)                      # the table at its end scrolls, its rows apart
    set_readout(page, "Devices", top)
    assert_rows_apart(page, ".wb-dev-speed input", top)

    # Run for real: two worker processes on the encoder at a short sequence
    select(page, "Scheme", label=SCHEMES["voltage"])
    select(page, "Model", label=encoder.title)
    set_readout(page, "Devices", 2)
    set_readout(page, "Sequence length", 32)
    wait_for_title(page, "timeline", "Voltage timeline on 2 devices (encoder, N = 32")
    before = figure_state(page, "timeline")
    started = time.perf_counter()
    page.get_by_role("button", name="Run for real").click()
    page.locator(".wb-run-info", has_text="Measured").wait_for(timeout=RUN_TIMEOUT_MS)
    print(f"run for real on 2 worker processes, first start included: {time.perf_counter() - started:.1f} s")
    wait_for_title(page, "timeline", " ms vs predicted ")
    after = figure_state(page, "timeline")
    assert after["data"] != before["data"]
    assert {"compute (measured)", "comm (measured)"} <= {t[0] for t in traces(page, "timeline")}
    run = page.locator(".wb-run-info").inner_text()
    measured_ms = run.split("Measured ")[1].split(" ms")[0]
    assert f"measured {measured_ms} ms vs predicted" in after["title"]
    ran = plan_partition("voltage", encoder, 32, devices_from_table(
        [DeviceRow(30, 7.6, 200), DeviceRow(10, 7.6, 200)]), shares="proportional")       # the table's first two rows
    assert ran.bounds[0] == (0, 24, 32)
    rows = page.locator(".wb-bytes tr").all_inner_texts()
    assert len(rows) == 3
    for i in range(2):                                         # counted per layer = planned: its rows of 384 floats
        cells = rows[1 + i].split("\t")
        per_layer = (ran.bounds[0][i + 1] - ran.bounds[0][i]) * 384 * 4
        assert ran.traffic()[0][i].sent == per_layer
        # Algorithm 2: the terminal (device 0) sends nothing in the last layer, which goes to it
        assert cells[1] == cells[3] == (f"0 to {per_layer:,}" if i == 0 else f"{per_layer:,}")
    assert page.locator(".wb-error").count() == 0
