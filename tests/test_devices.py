import time

import pytest

from workbench import devices
from workbench.devices import DISTILBERT, get_profile, pad_until
from workbench.errors import UnknownNameError


def test_odroid_preset_reproduces_the_paper_figures():
    odroid = get_profile("odroid-n2")
    assert odroid.layer_compute_s(12, DISTILBERT) == pytest.approx(0.095)
    assert 12 * odroid.shard_read_s(32, DISTILBERT) == pytest.approx(0.339)
    assert odroid.layer_compute_s(3, DISTILBERT) == pytest.approx(0.040)


def test_jetson_is_nearly_flat_in_shards():
    jetson = get_profile("jetson-nano")
    ratio = jetson.layer_compute_s(12, DISTILBERT) / jetson.layer_compute_s(3, DISTILBERT)
    assert ratio == pytest.approx(1.007, abs=1e-6)
    assert 0.050 < jetson.layer_compute_s(12, DISTILBERT) <= 0.0572


def test_shard_read_time_scales_with_bits():
    p = get_profile("odroid-n2")
    assert p.shard_read_s(2, DISTILBERT) * 16 == pytest.approx(p.shard_read_s(32, DISTILBERT))


def test_bad_inputs_are_named():
    with pytest.raises(UnknownNameError, match="unknown device profile 'pixel'; known device profiles: .*odroid-n2"):
        get_profile("pixel")
    with pytest.raises(ValueError, match="0..12 shards"):
        get_profile("odroid-n2").layer_compute_s(13)
    with pytest.raises(ValueError, match="has no network"):
        get_profile("odroid-n2").send_s(100)


def test_pad_until_never_returns_before_the_deadline(monkeypatch):
    real_sleep, asked = time.sleep, []

    def early_sleep(seconds):                         # a sleep that wakes up early, as the OS may
        asked.append(seconds)
        real_sleep(seconds / 4)

    monkeypatch.setattr(time, "sleep", early_sleep)
    deadline = time.perf_counter() + 0.02
    pad_until(deadline)
    assert time.perf_counter() >= deadline and len(asked) > 1
    asked.clear()
    pad_until(time.perf_counter() - 1.0)              # work already past its deadline: no sleep at all
    assert asked == []


# Devices, links and clusters (issue 23, point 3)

import ast
import json
from pathlib import Path

import numpy as np

from workbench.devices import (CLUSTERS, MINILM, PRESETS, Cluster, DeviceProfile, Link, emulated_name, get_cluster,
                               member, profile_names)
from workbench.errors import WorkbenchError

REPO = Path(__file__).resolve().parent.parent


def test_a_clusters_transfer_time_is_latency_plus_bytes_over_bandwidth_on_each_link_both_ways():
    cluster = Cluster([member("rpi4", "a"), member("rpi3", "b"), member("edge-vm", "c")],
                      {("a", "b"): Link(1e6, 0.01), ("c", "b"): Link(4e6, 0.0)})
    assert cluster.transfer_s("a", "b", 500_000) == cluster.transfer_s("b", "a", 500_000) == pytest.approx(0.51)
    assert cluster.transfer_s("b", "c", 2e6) == cluster.transfer_s("c", "b", 2e6) == pytest.approx(0.5)
    assert cluster.transfer_s("a", "a", 1e9) == 0.0
    for name, preset in CLUSTERS.items():
        assert preset.links, name
        for (a, b), link in preset.links.items():
            for src, dst in ((a, b), (b, a)):
                for nbytes in (0, 1, 3_145_728):
                    expected = link.latency_s + nbytes / link.bandwidth_bytes_per_s
                    assert preset.transfer_s(src, dst, nbytes) == pytest.approx(expected, rel=1e-12), (name, src, dst)


def test_a_pair_without_a_link_is_an_error_naming_both_devices():
    hepti = get_cluster("hepti")
    assert hepti.neighbours("rpi4-a") == ["jetson-nano-cpu"]
    with pytest.raises(WorkbenchError, match="no link between 'rpi4-a' and 'rpi3' in cluster hepti"):
        hepti.transfer_s("rpi4-a", "rpi3", 100)
    with pytest.raises(WorkbenchError, match="no link between 'rpi3' and 'rpi4-a'"):
        hepti.link("rpi3", "rpi4-a")
    with pytest.raises(UnknownNameError, match="unknown device of cluster hepti 'pixel'; .*rpi4-a"):
        hepti.transfer_s("rpi4-a", "pixel", 100)


def test_link_and_cluster_figures_are_checked_in_one_line():
    for args, message in [((0, 0.001), "link bandwidth must be > 0 bytes/s, got 0"),
                          ((1e6, -1.0), "link latency must be >= 0 s, got -1.0"),
                          ((float("nan"), 0.0), "link bandwidth must be > 0 bytes/s, got nan")]:
        with pytest.raises(WorkbenchError, match=message):
            Link(*args)
    with pytest.raises(WorkbenchError, match="bytes to transfer must be >= 0, got -5"):
        Link(1e6, 0.0).transfer_s(-5)
    a, b = member("rpi4", "a"), member("rpi3", "b")
    with pytest.raises(WorkbenchError, match="device 'a' appears twice"):
        Cluster([a, a], {})
    with pytest.raises(UnknownNameError, match="'z'"):
        Cluster([a, b], {("a", "z"): Link(1e6, 0.0)})
    with pytest.raises(WorkbenchError, match="link 'b'-'a' is given twice with different figures"):
        Cluster([a, b], {("a", "b"): Link(1e6, 0.0), ("b", "a"): Link(2e6, 0.0)})
    with pytest.raises(WorkbenchError, match="device 'x': flops_per_s must be > 0, got 0"):
        DeviceProfile("x", "x", "cpu", 0, 0.0, 1.0, 1.0)
    with pytest.raises(WorkbenchError, match="device 'x': price_per_s must be >= 0, got -1"):
        DeviceProfile("x", "x", "cpu", 1e9, 0.0, 1.0, 1.0, price_per_s=-1)


def test_the_paper_clusters_hold_their_set_ups_with_sources():
    voltage = get_cluster("voltage")
    assert len(voltage.devices) == 6 and len(voltage.links) == 15
    assert {d.memory_bytes for d in voltage.devices} == {7.6e9} and all("1-vCPU" in d.title for d in voltage.devices)
    assert {link.bandwidth_bytes_per_s for link in voltage.links.values()} == {500e6 / 8}
    hepti = get_cluster("hepti")
    assert len({d.clock_hz for d in hepti.devices}) > 1 and len({d.memory_bytes for d in hepti.devices}) > 1
    names = hepti.names
    assert set(map(frozenset, hepti.links)) == {frozenset(pair) for pair in zip(names, names[1:])}
    mixed, v100 = get_cluster("e3-mixed"), get_cluster("e3-v100")
    assert v100.counts() == {"v100": 16} and mixed.counts() == {"v100": 6, "p100": 8, "k80": 15}
    assert v100.price_per_s == pytest.approx(0.013) and mixed.price_per_s == pytest.approx(0.013)
    assert mixed.link("v100-s0g0", "v100-s0g1").bandwidth_bytes_per_s > 5e9                  # PCIe within a server
    assert mixed.link("v100-s0g0", "k80-s7g0").bandwidth_bytes_per_s == 10e9 / 8             # Ethernet between
    for gpu in ("a6000", "v100", "p100", "k80"):
        assert PRESETS[gpu].price_per_s > 0 and "estimate, not measured" in PRESETS[gpu].source
    for cluster in CLUSTERS.values():
        assert cluster.source and all(link.source for link in cluster.links.values())
        assert all(d.source for d in cluster.devices)
    with pytest.raises(UnknownNameError, match="unknown cluster 'lan'"):
        get_cluster("lan")


def _assert_monotone(profile: DeviceProfile) -> None:
    for shape in (DISTILBERT, MINILM):
        for m in (1, 12):
            times = [profile.layer_compute_s(m, shape, batch=b) for b in range(1, 65)]
            assert times[0] == profile.layer_compute_s(m, shape), profile.name
            assert all(later >= earlier for earlier, later in zip(times, times[1:])), (profile.name, shape, m)
            per_input = [t / b for b, t in enumerate(times, 1)]
            assert all(later <= earlier * (1 + 1e-12) for earlier, later in zip(per_input, per_input[1:])), profile.name


def test_batch_cost_is_monotone_for_every_preset_and_batching_helps_the_gpus():
    for profile in PRESETS.values():
        _assert_monotone(profile)
    for cluster in CLUSTERS.values():
        for device in cluster.devices:
            _assert_monotone(device)
    for gpu in ("a6000", "v100", "p100", "k80"):
        p = PRESETS[gpu]
        assert p.layer_compute_s(12, batch=32) / 32 < p.layer_compute_s(12) / 2     # saturating: batching helps
    odroid = PRESETS["odroid-n2"]
    extra = odroid.layer_compute_s(12) - odroid.layer_overhead_s
    assert odroid.layer_compute_s(12, batch=4) == pytest.approx(odroid.layer_overhead_s + 4 * extra)
    assert odroid.layer_compute_s(12, batch=0) == 0.0
    with pytest.raises(ValueError, match="batch must be >= 0, got batch=-1"):
        odroid.layer_compute_s(12, batch=-1)


def test_an_emulated_device_is_named_one_way():
    from workbench.kvcache.costmodel import SwapCostModel, device_label

    assert emulated_name("odroid-n2") == "odroid-n2 emulated on this host"
    costs = SwapCostModel(device="orin-nx", source="emulated", num_layers=1, chunk_size=16, chunk_bytes={8: 1},
                          recompute_fixed_s=0.0, recompute_per_chunk_s=1.0, io_fixed_s=0.0, read_bytes_per_s=1e9)
    assert device_label(costs) == emulated_name("orin-nx")


def _registry_lists() -> list[list[str]]:
    papers = sorted({p.paper for p in PRESETS.values()})
    return [profile_names(paper, host) for paper in (None, *papers) for host in (True, False)]


def _device_choices(parser, found: list, where: str = "workbench") -> None:
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                _device_choices(sub, found, f"{where} {name}")
        elif action.choices is not None and action.dest in ("device", "devices"):
            found.append((where, action.dest, list(action.choices), action.default))


def test_every_device_list_of_a_command_comes_from_the_registry():
    from workbench.bench import bench_parser, benchmarks
    from workbench.cli import build_parser

    found: list = []
    _device_choices(build_parser(), found)
    for name in benchmarks():
        _device_choices(bench_parser(name), found, f"workbench bench {name}")
    assert {"workbench info", "workbench bench llms", "workbench bench elastic"} <= {w for w, *_ in found}
    assert len(found) >= 6
    for where, dest, choices, default in found:
        assert choices in _registry_lists(), (where, dest, choices)
        defaults = default if isinstance(default, list) else [default]
        assert default is None or set(defaults) <= set(choices), (where, dest, default)


def test_every_device_dropdown_of_a_page_comes_from_the_registry():
    from tests.conftest import PRESET
    from tests.viz.test_kvcache import sample_replays
    from workbench.ui.elastic import ElasticPanel
    from workbench.ui.kvcache import KVCachePanel
    from workbench.ui.overview import OverviewPanel

    panels = {"overview": OverviewPanel(PRESET), "elastic": ElasticPanel(PRESET),
              "kvcache": KVCachePanel(PRESET, provider=sample_replays)}
    options = {name: list(panel.device.options) for name, panel in panels.items()}
    assert options == {"overview": profile_names(), "elastic": profile_names("wrx"), "kvcache": profile_names("llms")}


def _device_literals(source: str, known: set[str]) -> list[tuple[int, list[str]]]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in known]
            if len(names) >= 2:
                out.append((node.lineno, names))
    return out


def test_no_module_or_notebook_writes_out_a_list_of_device_names():
    known = set(PRESETS)
    written = {}
    for path in sorted((REPO / "workbench").rglob("*.py")):
        if path.name != "devices.py" and (hits := _device_literals(path.read_text(), known)):
            written[str(path.relative_to(REPO))] = hits
    for path in sorted((REPO / "notebooks").rglob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
        if hits := _device_literals(code, known):
            written[str(path.relative_to(REPO))] = hits
    assert written == {}
