import dataclasses

import pytest

from workbench import mechanisms as registry
from workbench.devices import DISTILBERT, MINILM, get_profile
from workbench.ui import OverviewPanel
from workbench.ui.elastic import ElasticOverview
from workbench.ui.kvcache import KVCacheOverview
from workbench.viz.kvcache import format_ms, method_label

NAMES = [m.name for m in registry.mechanisms()]


@pytest.fixture
def only_prepared(monkeypatch):
    """``only_prepared(name)``: every registered mechanism but ``name`` reads as not prepared (its steps'
    ``ready()`` says no), as on a machine where only that mechanism's prepare ran."""
    def unready(m: registry.Mechanism) -> registry.Mechanism:
        steps = lambda preset, m=m: [dataclasses.replace(s, ready=lambda preset: False) for s in m.prepare_steps(preset)]
        return dataclasses.replace(m, prepare_steps=steps)

    def only(name: str) -> None:
        found = tuple(m if m.name == name else unready(m) for m in registry.load_registered(registry.REGISTERED))
        monkeypatch.setattr(registry, "mechanisms", lambda: found)
    return only


def test_the_device_half_redraws_and_each_mechanism_has_its_section(prepared):
    panel = OverviewPanel("quick")
    assert panel.message.value == ""
    assert list(panel.sections) == [m.name for m in registry.mechanisms() if m.overview]
    assert list(panel.children[-len(panel.sections):]) == list(panel.sections.values())
    times_fig = lambda: panel.figures["times"]
    panel.device.value = "jetson-nano"
    assert times_fig().data[0].y[11] == pytest.approx(get_profile("jetson-nano").layer_compute_s(12, DISTILBERT) * 1e3)
    panel.shape.value = "MiniLM layer (d=384)"
    panel.bits.value = 2
    assert times_fig().data[1].y[0] == pytest.approx(get_profile("jetson-nano").shard_read_s(2, MINILM) * 1e3)
    assert isinstance(panel.section("elastic"), ElasticOverview)
    assert isinstance(panel.section("kvcache"), KVCacheOverview)


def test_the_elastic_section_shows_each_tasks_grid(prepared):
    section = OverviewPanel("quick").section("elastic")
    grid_fig = lambda: section.figures["grid"]
    assert section.message.value == ""
    assert grid_fig().data[0].z[5][11] == pytest.approx(prepared["sentiment"].accuracy_grid[5, 11] * 100)
    first = grid_fig()
    section.task.value = "bbc"
    assert grid_fig().data[0].z[5][11] == pytest.approx(prepared["bbc"].accuracy_grid[5, 11] * 100)
    assert "BBC News" in grid_fig().layout.title.text and first is not grid_fig()
    assert section.figure_slot("grid").figure["layout"]["title"]["text"] == grid_fig().layout.title.text


def test_the_llms_section_shows_the_prepared_replays(prepared):
    section = OverviewPanel("quick").section("kvcache")
    assert section.message.value == ""
    names = [t.name for t in section.figures["latency"].data]
    for method, result in prepared["replays"].items():
        assert f"data-method='{method}'" in section.summary.value
        assert f"{method_label(method)}: mean {format_ms(result.mean_switch_s())}" in names


def test_the_voltage_section_draws_each_schemes_prediction():
    from workbench.distributed.shares import devices_like
    from workbench.partition.cost import get_shape
    from workbench.partition.plan import plan_partition
    from workbench.ui.partition import PartitionOverview

    section = PartitionOverview("quick")
    section.count.value = 6
    fig = section.figures["schemes"]
    assert "on 6 equal devices" in fig.layout.title.text
    voltage = plan_partition("voltage", get_shape("encoder"), 128, devices_like(6))
    bars = {t.name: dict(zip(t.x, t.y)) for t in fig.data}
    drawn = bars["compute (predicted)"]["Voltage"] + bars["communication (predicted)"]["Voltage"]
    assert drawn == pytest.approx(1e3 * voltage.predicted_s)


def test_the_hepti_section_switches_mode_as_the_secondaries_memory_falls():
    from workbench.hepti.plan import MODE_TITLES
    from workbench.ui.hepti import HeptiOverview

    section = HeptiOverview("quick")
    titles = {}
    for mb in (4000, 10):
        section.free.value = mb
        titles[mb] = (section.partition.mode, section.figures["decision"].layout.title.text)
    assert titles[4000][0] == "ws" and titles[10][0] != "ws"                  # WS needs about 33 MB a board
    for mb, (mode, title) in titles.items():
        assert title.startswith(f"Hepti picks {MODE_TITLES[mode]} with {mb:,} MB free")
    shares = [t.x[0] for t in section.figures["decision"].data if t.type == "bar"]
    assert sum(shares) == pytest.approx(1.0) and shares == pytest.approx(list(section.partition.shares))


def test_the_e3_section_is_the_pages_plan_at_its_defaults(prepared):
    from workbench.ui.earlyexit import EarlyExitOverview, EarlyExitPanel

    section, page = EarlyExitOverview("quick"), EarlyExitPanel("quick")
    assert section.plan.splits == page.plan.splits and section.plan.replicas == page.plan.replicas
    assert section.figures["plan"].layout.title.text == page.figures["plan"].layout.title.text
    drawn = {t.name for t in section.figures["bubbles"].data}
    assert "busy (simulated)" in drawn and drawn & {"bubble, waiting for upstream (simulated)",
                                                    "idle, nothing arrived (simulated)"}


@pytest.mark.parametrize("name", NAMES)
def test_the_overview_serves_with_one_mechanism_prepared(prepared, only_prepared, name):
    only_prepared(name)
    panel = OverviewPanel("quick")
    assert panel.message.value == "" and "times" in panel.figures
    for other, box in panel.sections.items():
        text = " ".join(getattr(w, "value", "") for w in box.children)
        missing = [s for m in registry.mechanisms() if m.name == other for s in m.overview.requires]
        if other == name or not missing:                      # a section that reads nothing prepared always shows
            assert panel.section(other) is not None and "wb-section-missing" not in text
            assert "wb-error" not in getattr(panel.section(other).message, "value", "")
        else:
            assert panel.section(other) is None and "wb-section-missing" in text
            assert f"missing {', '.join(missing)}" in text and "workbench prepare --preset quick" in text


def test_an_unprepared_cache_shows_what_is_missing_and_the_devices(tmp_cache):
    panel = OverviewPanel("quick")
    assert panel.message.value == "" and "Odroid" in panel.figures["times"].layout.title.text
    needs = {m.name: m.overview.requires for m in registry.mechanisms() if m.overview}
    assert {n for n, r in needs.items() if not r} == {"partition", "hepti"}      # the cost models need nothing
    for name, box in panel.sections.items():
        if needs[name]:
            assert panel.section(name) is None
            assert "workbench prepare --preset quick" in box.children[1].value
        else:
            assert panel.section(name) is not None and panel.section(name).message.value == "" 


def test_an_unprepared_task_shows_an_inline_message_in_the_elastic_section(tmp_cache):
    section = ElasticOverview("quick")
    assert "wb-error" in section.message.value and "workbench prepare --preset quick" in section.message.value
    assert "Traceback" not in section.message.value and "grid" not in section.figures


def test_a_section_that_fails_to_build_leaves_the_page_working(prepared, monkeypatch):
    broken = registry.OverviewSection(title="Broken", panel="workbench.ui.elastic:NoSuchPanel")
    found = tuple(dataclasses.replace(m, overview=broken) if m.name == "kvcache" else m
                  for m in registry.load_registered(registry.REGISTERED))
    monkeypatch.setattr(registry, "mechanisms", lambda: found)
    panel = OverviewPanel("quick")
    assert "NoSuchPanel" in panel.sections["kvcache"].children[1].value and "wb-internal-error" in \
        panel.sections["kvcache"].children[1].value
    assert isinstance(panel.section("elastic"), ElasticOverview) and "times" in panel.figures
