"""This machine measured (:mod:`workbench.hostprofile`): the fit to real layer times, the cached profile."""
import json

import numpy as np
import pytest

from tests.test_devices import _assert_monotone
from workbench import hostprofile
from workbench.devices import DISTILBERT, DeviceProfile
from workbench.errors import WorkbenchError
from workbench.hostprofile import cached_measurement, fit_compute


def test_host_profile_is_measured_with_its_batch_curve_and_cached(tmp_cache):
    host = hostprofile.host_profile()
    assert host.name == "host" and host.flops_per_s > 1e8 and host.read_bytes_per_s > 1e6
    assert "batch 1 to 8" in host.source and host.half_peak_tokens >= 0
    _assert_monotone(host)
    path = tmp_cache / "profiles" / "host.json"
    assert path.exists()
    assert hostprofile.host_profile() == host
    path.write_text("{not json")
    again = hostprofile.host_profile()                       # measured again, and saved
    assert again.name == "host"
    saved = json.loads(path.read_text())
    assert DeviceProfile.from_dict(saved) == again
    del saved["half_peak_tokens"]                        # a profile saved before the batch curve: measured again
    with pytest.raises(WorkbenchError, match=r"fields \['half_peak_tokens'\] differ"):
        DeviceProfile.from_dict(saved)


def test_the_host_fit_recovers_known_figures_and_stays_monotone_on_noise():
    shape, rng = DISTILBERT, np.random.default_rng(0)
    truth = DeviceProfile("t", "t", "cpu", 40e9, 2e-3, 1e9, 1e9, half_peak_tokens=256)
    shards = [truth.layer_compute_s(m, shape) for m in range(1, 13)]
    batches = {b: truth.layer_compute_s(12, shape, b) for b in (1, 2, 4, 8)}
    overhead, flops, half_peak = fit_compute(shards, batches, shape)
    assert (overhead, flops, half_peak) == pytest.approx((2e-3, 40e9, 256), rel=1e-6)
    for trial in range(20):                                       # noisy, even decreasing measurements
        noisy = {b: t * rng.uniform(0.5, 1.5) for b, t in batches.items()}
        fitted = fit_compute([t * rng.uniform(0.9, 1.1) for t in shards], noisy, shape)
        _assert_monotone(DeviceProfile("host", "h", "cpu", fitted[1], fitted[0], 1e9, 1e9, half_peak_tokens=fitted[2]))
    slower = {b: batches[1] * b * 1.5 for b in batches}           # no gain from batching: linear in the batch
    assert fit_compute(shards, slower, shape)[2] == 0.0


def test_a_cached_measurement_is_made_once_and_again_when_damaged_or_asked(tmp_path, capsys):
    path, calls = tmp_path / "m.json", []

    def measure():
        calls.append(1)
        return {"value": len(calls)}

    def load(raw):
        if set(raw) != {"value"}:
            raise WorkbenchError("another version")
        return raw

    get = lambda **kw: cached_measurement(path, measure, load, dict, **kw)
    assert get() == {"value": 1} and get() == {"value": 1} and len(calls) == 1
    path.write_text("{not json")
    assert get() == {"value": 2} and f"{path} is damaged; measuring the host again" in capsys.readouterr().out
    path.write_text(json.dumps({"other": 1}))
    assert get() == {"value": 3}
    assert get(remeasure=True) == {"value": 4} and get() == {"value": 4}
