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


def test_host_profile_is_measured_and_cached(tmp_cache):
    host = devices.host_profile()
    assert host.name == "host" and host.flops_per_s > 1e8 and host.read_bytes_per_s > 1e6
    assert (tmp_cache / "profiles" / "host.json").exists()
    assert devices.host_profile() == host
    (tmp_cache / "profiles" / "host.json").write_text("{not json")
    assert devices.host_profile().name == "host"
