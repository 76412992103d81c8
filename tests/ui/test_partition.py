"""The partition page headless: every control off its default, the figures following the cost model's numbers
(plans made here independently, on devices built another way), bad input said in the page, and one real run on
two worker processes whose measured timeline reaches the timeline slot."""
import html
import re

import pytest

from workbench.partition.cost import SHAPES, comm_bytes
from workbench.partition.plan import SCHEMES, DeviceRow, devices_from_table, devices_like, plan_partition
from workbench.ui.partition import PartitionPanel
from workbench.viz.partition import scheme_label

FIGURES = {"decision", "schemes", "orders", "timeline"}
TP = list(SCHEMES).index("tensor_parallel")


@pytest.fixture(scope="module", autouse=True)
def stop_workers():
    yield
    from workbench.partition.runtime import close_shared

    close_shared()


def cells(text: str, device: int) -> list[str]:
    """The cells of a device's row in a table of the page."""
    row = text.split(f"<tr data-device='{device}'>")[1].split("</tr>")[0]
    return [html.unescape(c) for c in re.findall(r">([^<]*)</td>", row)]


def bars(panel, name="schemes"):
    compute, comm = panel.figures[name].data[:2]
    return list(compute.y), list(comm.y)


def test_first_load_shows_every_figure_with_the_paper_set_up():
    """Six edge VMs at 500 Mbit/s, the shipped encoder at N = 128: the table's defaults are the edge-vm preset,
    so the page's plans equal the engine's on ``devices_like(6)``."""
    panel = PartitionPanel()
    assert panel.message.value == "" and set(panel.figures) == FIGURES
    assert len(panel.table.children) == 6 and panel.bandwidth.description == "Bandwidth (Mbit/s)"
    reference = devices_like(6, bandwidth_mbit=500)
    compute, comm = bars(panel)
    for k, scheme in enumerate(SCHEMES):
        plan = plan_partition(scheme, SHAPES["encoder"], 128, reference)
        assert compute[k] + comm[k] == pytest.approx(1e3 * plan.predicted_s), scheme
        assert comm[k] == pytest.approx(1e3 * plan.comm_s()), scheme
    voltage = plan_partition("voltage", SHAPES["encoder"], 128, reference)
    assert [list(t.base) for t in panel.figures["decision"].data] == [[b[i] for b in voltage.bounds]
                                                                      for i in range(6)]
    assert all(f"<li>{r}</li>" in html.unescape(panel.reasons.value) for r in voltage.reasons)
    assert f"predicted {1e3 * voltage.predicted_s:.1f} ms" in panel.figures["timeline"].layout.title.text
    assert "at N = 128, P = N/K = 21.3333" in panel.figures["orders"].layout.title.text
    line = panel.figures["schemes"].layout.shapes[0]
    assert line.y0 == pytest.approx(1e3 * plan_partition("single", SHAPES["encoder"], 128, reference).predicted_s)


def test_bandwidth_down_grows_the_tensor_parallel_bar_by_the_cost_models_amount():
    panel = PartitionPanel()
    before = bars(panel)[1][TP]
    decision, orders = panel.figures["decision"], panel.figures["orders"]
    panel.bandwidth.value = 200
    after = bars(panel)[1][TP]
    old = plan_partition("tensor_parallel", SHAPES["encoder"], 128, devices_like(6, bandwidth_mbit=500))
    new = plan_partition("tensor_parallel", SHAPES["encoder"], 128, devices_like(6, bandwidth_mbit=200))
    assert after - before == pytest.approx(1e3 * (new.comm_s() - old.comm_s())) and after > before
    assert all(row.bandwidth.value == 200 for row in panel.rows)          # the slider sets every link
    assert "200 Mbit/s links" in panel.figures["schemes"].layout.title.text
    assert "200 Mbit/s links" in panel.figures["timeline"].layout.title.text
    assert panel.figures["decision"] is decision and panel.figures["orders"] is orders   # neither depends on it


def test_every_control_off_its_default_reaches_the_plan_and_the_figures():
    panel = PartitionPanel()
    titles = lambda: {n: f.layout.title.text for n, f in panel.figures.items()}
    panel.model.value = "bert-large"
    assert "bert-large" in titles()["schemes"] and "bert-large" in titles()["orders"]
    panel.seq_len.value = 256
    assert "N = 256" in titles()["decision"] and "at N = 256" in titles()["orders"]
    panel.count.value = 4
    assert len(panel.table.children) == 4 and "4 devices" in titles()["schemes"]
    assert "P = N/K = 64" in titles()["orders"]
    panel.bandwidth.value = 800
    panel.rows[0].speed.value = 30.0                     # one fast device
    panel.rows[3].memory.value = 2.0
    panel.rows[2].bandwidth.value = 300.0                # one slow link
    panel.shares.value = "proportional"
    assert "links of 300 to 800 Mbit/s" in titles()["schemes"]
    devices = devices_from_table([DeviceRow(30, 7.6, 800, "vm0"), DeviceRow(10, 7.6, 800, "vm1"),
                                  DeviceRow(10, 7.6, 300, "vm2"), DeviceRow(10, 2.0, 800, "vm3")])
    voltage = plan_partition("voltage", SHAPES["bert-large"], 256, devices, shares="proportional")
    assert panel.plan == voltage and voltage.bounds[0] == (0, 128, 171, 213, 256)     # 3 : 1 : 1 : 1
    assert [list(t.base) for t in panel.figures["decision"].data] == [[b[i] for b in voltage.bounds]
                                                                      for i in range(4)]
    panel.scheme.value = "pipeline"
    pipeline = plan_partition("pipeline", SHAPES["bert-large"], 256, devices)
    assert panel.plan == pipeline and pipeline.layers[3] < pipeline.layers[0]           # layers follow memory
    assert [len(t.y) for t in panel.figures["decision"].data] == list(pipeline.layers)
    assert titles()["timeline"].startswith("layer pipeline timeline on 4 devices")
    assert "layers per device by memory" in panel.reasons.value
    compute, comm = bars(panel)
    for k, scheme in enumerate(SCHEMES):
        plan = plan_partition(scheme, SHAPES["bert-large"], 256, devices, shares="proportional")
        assert compute[k] == pytest.approx(1e3 * (plan.predicted_s - plan.comm_s()))
        assert comm[k] == pytest.approx(1e3 * plan.comm_s())
    assert panel.message.value == ""


def test_bad_table_values_show_the_engines_message_and_clear_when_fixed():
    panel = PartitionPanel()
    panel.rows[2].speed.value = 0.0
    assert "device 2&#x27;s speed: must be more than 0 GFLOP/s, got 0" in panel.message.value
    assert "Traceback" not in panel.message.value and "internal error" not in panel.message.value
    assert "no devices" in panel.figures["schemes"].layout.annotations[0].text
    panel.rows[2].speed.value = 20.0
    assert panel.message.value == "" and len(panel.figures["schemes"].data) == 2
    panel.rows[1].bandwidth.value = 1e9
    assert "device 1&#x27;s bandwidth: must be at most 100000 Mbit/s" in panel.message.value
    panel.rows[1].bandwidth.value = 500.0
    panel.rows[0].memory.value = -1.0
    assert "device 0&#x27;s memory: must be more than 0 GB" in panel.message.value


def test_a_plan_the_engine_refuses_is_said_and_the_other_schemes_still_drawn():
    panel = PartitionPanel()
    panel.count.value = 16                                 # more devices than the encoder's 12 heads
    assert panel.message.value == ""
    notes = {a.x: a.hovertext for a in panel.figures["schemes"].layout.annotations if a.text == "not possible"}
    assert "splits 12 heads over at most 12 devices, got 16" in notes[scheme_label("tensor_parallel")]
    panel.scheme.value = "tensor_parallel"
    assert "splits 12 heads over at most 12 devices, got 16" in panel.message.value
    assert "no tensor parallel plan" in panel.figures["decision"].layout.annotations[0].text
    panel.scheme.value = "voltage"
    panel.seq_len.value = 10                               # fewer positions than devices
    assert "a sequence of 10 positions is shorter than the 16 devices" in panel.message.value
    panel.seq_len.value = 64
    assert panel.message.value == ""


def test_the_model_bounds_the_sequence_slider():
    panel = PartitionPanel(model="decoder", seq_len=4000)
    assert panel.seq_len.max == 8192 and panel.message.value == ""
    panel.model.value = "encoder"
    assert panel.seq_len.max == 512 and panel.seq_len.value == 512
    assert "N = 512" in panel.figures["decision"].layout.title.text and panel.message.value == ""


def test_more_devices_than_worker_processes_is_refused_beside_the_button():
    from workbench.distributed import limits

    panel = PartitionPanel()
    panel.count.value = int(limits.ranks.maximum) + 1
    assert panel.message.value == "" and panel.plan.K == panel.count.value      # the cost model still plans
    panel.runner.button.click()
    said = panel.runner.message.value
    assert f"at most {int(limits.ranks.maximum)}" in said and "set Devices to" in said
    assert panel.message.value == "" and len(panel.runs) == 0


@pytest.mark.alone
@pytest.mark.integration
def test_cancel_stops_the_workers_then_run_for_real_draws_the_measured_timeline_and_the_counted_bytes(cancel_a_run):
    """Cancel pressed as the first run starts: the runtime stops its processes, the page says so beside the
    button and keeps no run. The next run starts a fresh group: two worker processes on the encoder at N = 32,
    the measured run overlays the prediction; the bytes each device sent per layer are the runtime's counts,
    and after tensor parallelism ran too, their ratio."""
    panel = PartitionPanel(devices=2, seq_len=32)
    cancel_a_run(panel)
    panel.runner.button.click()                            # no event loop in a test: the run completes here
    assert panel.runner.message.value == "" and panel.message.value == "" and len(panel.runs) == 1
    (run,) = panel.runs.values()
    result, plan = run.result, panel.plan
    assert run.made_with is plan and run.key == panel.plan_key(plan)
    names = {t.name for t in panel.figures["timeline"].data}
    assert {"compute (predicted)", "compute (measured)", "comm (measured)"} <= names
    measured = [t for t in panel.figures["timeline"].data if t.name == "compute (measured)"][0]
    assert len(measured.x) == len(result.timeline.of_kind("compute"))
    title = panel.figures["timeline"].layout.title.text
    assert f"measured {1e3 * result.latency_s:.1f} ms vs predicted {1e3 * plan.predicted_s:.1f} ms" in title
    assert f"Measured {1e3 * result.latency_s:.1f} ms" in panel.run_info.value
    from workbench.partition.runtime import limits_problem

    if limits_problem() is None:       # root: held to the devices for real, links shaped
        assert result.mode == "measured" and len(result.calibrations) == 2 and result.shaped
        assert "each held to its device's speed by a CPU limit; links shaped by tc" in panel.run_info.value
    else:
        assert result.mode == "unlimited" and "cannot emulate the devices" in panel.run_info.value
    assert "Replayed" not in panel.run_info.value
    per_layer = result.traffic()[0][1].sent
    assert per_layer == plan.traffic()[0][1].sent == 16 * 384 * 4          # its 16 rows of 384 floats, once
    for device in range(2):
        row = cells(panel.bytes_info.value, device)
        sent = [layer[device].sent for layer in result.traffic()]
        # Algorithm 2: the All-Gathers send its rows; in the last layer only device 1 sends, to the terminal
        assert sent == [per_layer] * 5 + [per_layer if device else 0]
        assert row[1] == row[3] == (f"0 to {per_layer:,}" if device == 0 else f"{per_layer:,}")
        input_bytes = 32 * 384 * 4 if device == 0 else 0                    # the terminal sends the input
        assert row[4] == f"{sum(sent) + input_bytes:,}" == f"{result.total_traffic()[device].sent:,}"
    assert "Run tensor parallel too" in panel.bytes_info.value

    panel.scheme.value = "tensor_parallel"
    assert "compute (measured)" not in {t.name for t in panel.figures["timeline"].data}
    panel.runner.button.click()
    assert panel.runner.message.value == ""
    tp = panel.runs[panel.plan_key(panel.plan)].result
    ratio = tp.traffic()[0][0].sent / result.traffic()[0][0].sent
    assert ratio == pytest.approx(comm_bytes("tensor_parallel", 32, 384, 2) / comm_bytes("voltage", 32, 384, 2))
    assert f"<b>1 : {ratio:.2f}</b>" in panel.bytes_info.value and ratio == pytest.approx(4.0)
    panel.scheme.value = "voltage"                          # back to the settings of the first run: it shows again
    assert "compute (measured)" in {t.name for t in panel.figures["timeline"].data}
    assert f"<b>1 : {ratio:.2f}</b>" in panel.bytes_info.value


