"""Layer profiles: measured on this host with one thread, estimated for E3's GPUs, interpolated, cached."""
from __future__ import annotations

import pytest

from workbench.earlyexit import profiles as lp
from workbench.earlyexit.optimizer import optimize_splits
from workbench.earlyexit.profiles import LayerProfile, gpu_profile, latency_by_type
from workbench.errors import WorkbenchError

approx = pytest.approx
SIZES = (1, 2, 4, 8, 16, 32, 64)


def made_up(device="host") -> LayerProfile:
    """Two layers: layer k takes (k + 1) ms per sample plus 1 ms; a ramp 0.1 ms per sample; embedding 0.5 ms."""
    layers = tuple(tuple(1e-3 + (k + 1) * 1e-3 * b for b in SIZES) for k in range(2))
    ramps = tuple(tuple(1e-4 * b for b in SIZES) for _ in range(2))
    return LayerProfile(SIZES, layers, ramps, tuple(5e-4 for _ in SIZES), device, 64, 1, True, "made up")


def test_the_adapter_is_exact_at_measured_sizes_and_linear_between():
    p = made_up()
    assert p.latency(1, 8) == approx(1e-3 + 2e-3 * 8 + 1e-4 * 8)
    assert p.latency(0, 4, "any") == approx(1e-3 + 4e-3 + 4e-4 + 5e-4)      # layer 0 carries the embedding
    assert p.latency(0, 4, embed=False) == approx(1e-3 + 4e-3 + 4e-4)
    assert p.latency(0, 4, ramp=False, embed=False) == approx(1e-3 + 4e-3)
    assert p.latency(1, 4, ramp=False) == p.latency(1, 4)                   # the last ramp is the classifier
    # 5 lies between 4 and 8: a linear mix of the two tabulated values
    layer_only = p.adapter(ramps=False, embed=False)
    assert layer_only(0, 5, "host") == approx((3 * layer_only(0, 4, "host") + layer_only(0, 8, "host")) / 4)
    assert layer_only(0, 48, "host") == approx((p.layer_time(0, 32) + p.layer_time(0, 64)) / 2)
    some = p.adapter(ramps=[1])
    assert some(0, 2, "host") == approx(p.latency(0, 2, ramp=False))
    assert p.batch_seconds(2) == approx(p.latency(0, 2) + p.latency(1, 2))


@pytest.mark.parametrize("bad", [0, 65, 10 ** 9, -1, 2.5, True, "8"])
def test_bad_batch_sizes_name_the_allowed_range(bad):
    with pytest.raises(WorkbenchError, match=r"1\.\.64"):
        made_up().latency(0, bad)


def test_bad_layers_and_tables_are_refused():
    with pytest.raises(WorkbenchError, match="layers 0..1"):
        made_up().latency(2, 1)
    with pytest.raises(WorkbenchError, match="increasing"):
        LayerProfile((2, 1), ((1.0, 1.0),), ((0.0, 0.0),), (0.0, 0.0), "x", 8, 1, True, "")
    with pytest.raises(WorkbenchError, match="one time per batch size"):
        LayerProfile((1, 2), ((1.0,),), ((0.0, 0.0),), (0.0, 0.0), "x", 8, 1, True, "")
    with pytest.raises(WorkbenchError, match="1..64"):
        lp.measure_layer_profile(16, (0, 1))


def test_profiles_by_gpu_type_feed_the_optimizer():
    both = latency_by_type({"host": made_up(), "other": made_up("other")})
    assert both(1, 8, "other") == approx(made_up().latency(1, 8))
    with pytest.raises(WorkbenchError, match="no layer profile for GPU type 'nope'"):
        both(0, 1, "nope")
    plan = optimize_splits(both, [0.5, 0.0], {"host": 2, "other": 1}, slo_s=1.0, batch_size=8)
    assert plan and plan.splits[-1][1] == 2


def test_gpu_profiles_read_the_published_batch_curves():
    from workbench.earlyexit import gpu_curves

    for gpu in ("v100", "p100", "k80", "a6000"):
        p = gpu_profile(gpu, "bert-base")
        assert not p.measured and "published BERT-base batch curve" in p.source and p.device == gpu
        for b in (1, 3, 16, 64):                 # BERT-base itself: the curve per layer, at every whole batch
            assert p.layer_time(0, b) == approx(gpu_curves.batch_latency_s(gpu, b) / 12)
        assert p.ramp_time(0, 8) == approx(lp.RAMP_OVERHEAD_SHARE * p.layer_time(0, 1))
        assert 0 < p.ramp_time(0, 8) < p.layer_time(0, 8)
        flatter, steeper = gpu_profile(gpu, saturation="flatter"), gpu_profile(gpu, saturation="steeper")
        assert flatter.layer_time(0, 1) == approx(p.layer_time(0, 1)) == approx(steeper.layer_time(0, 1))
        assert flatter.layer_time(0, 32) < p.layer_time(0, 32) < steeper.layer_time(0, 32)
    # a smaller model reads the curve at its work-equivalent batch, never below batch 1
    small = gpu_profile("v100", "encoder")
    assert small.layer_time(0, 1) == approx(small.layer_time(0, 4)) == approx(p.layer_time(0, 1) * 0 +
                                                                             gpu_profile("v100").layer_time(0, 1))
    assert small.layer_time(0, 64) < gpu_profile("v100").layer_time(0, 64)
    large = gpu_profile("v100", "bert-large")
    assert large.num_layers == 24 and large.layer_time(0, 8) > gpu_profile("v100").layer_time(0, 8)
    assert gpu_profile("v100", "encoder", seq_len=32).seq_len == 32
    with pytest.raises(WorkbenchError, match="unknown GPU preset 'host'"):
        gpu_profile("host")
    with pytest.raises(WorkbenchError, match="unknown model shape"):
        gpu_profile("v100", "gpt-5")
    with pytest.raises(WorkbenchError, match="saturation is one of published, flatter, steeper"):
        gpu_profile("v100", saturation="wild")
    with pytest.raises(WorkbenchError, match="1..1024"):
        gpu_profile("v100").latency(0, 1025)


def test_a_host_measurement_is_one_thread_and_grows_with_the_batch():
    import torch

    threads = torch.get_num_threads()
    p = lp.measure_layer_profile(seq_len=32, batch_sizes=(1, 8), repeats=3)
    assert torch.get_num_threads() == threads                   # put back
    assert p.measured and p.threads == 1 and p.device == "host" and p.seq_len == 32 and p.num_layers == 6
    assert "measured" in p.source and "one thread" in p.source
    one, eight = p.batch_seconds(1), p.batch_seconds(8)
    assert eight > 1.5 * one > 0                                # 8x the work: clearly more time (medians)
    assert all(p.ramp_time(k, 8) < p.layer_time(k, 8) for k in range(6))


def test_the_host_profile_is_cached_and_remeasured_on_request(tmp_cache, monkeypatch):
    calls = []

    def fake(seq_len, batch_sizes, repeats):
        calls.append((seq_len, tuple(batch_sizes), repeats))
        return made_up()

    monkeypatch.setattr(lp, "measure_layer_profile", fake)
    first = lp.host_layer_profile(batch_sizes=SIZES, repeats=2)
    again = lp.host_layer_profile(batch_sizes=SIZES, repeats=2)
    assert first == again == made_up() and calls == [(64, SIZES, 2)]      # the sentiment task's 64 tokens
    path = lp.layer_profile_path(64, SIZES, 2)
    assert path.exists() and str(path).startswith(str(tmp_cache))
    assert lp.layer_profile_path(32, SIZES, 2) != path                   # another key per sequence length
    lp.host_layer_profile(batch_sizes=SIZES, repeats=2, remeasure=True)
    assert len(calls) == 2
    assert LayerProfile.from_dict(made_up().to_dict()) == made_up()
    path.write_text("{not json")
    assert lp.host_layer_profile(batch_sizes=SIZES, repeats=2) == made_up() and len(calls) == 3
