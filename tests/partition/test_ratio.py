"""The paper's set-up at this host's scale: the speed that pins the paper's ratio of compute to link, a device
slowed by one factor in every respect, and this host's fall of FLOP/s at fewer rows."""
import dataclasses

import pytest

from workbench.devices import get_profile
from workbench.errors import WorkbenchError
from workbench.partition import ratio
from workbench.partition.cost import SHAPES
from workbench.partition.plan import devices_like, plan_partition
from workbench.partition.runtime import limit_speeds


def _reduction(device, K=6, mbit=500.0, model="bert-large"):
    devices = devices_like(K, device, bandwidth_mbit=mbit)
    return 1 - (plan_partition("voltage", SHAPES[model], 128, devices).predicted_s
                / plan_partition("single", SHAPES[model], 128, devices).predicted_s)


def test_the_paper_speed_gives_bert_large_the_papers_reduction_and_faster_devices_gain_less():
    """At the speed found, six edge-vm devices at 500 Mbit/s cut BERT-Large's latency by the paper's 27.9 %;
    twice as fast they cut less, half as fast more (a bisection searching the wrong way fails)."""
    speed = ratio.paper_speed_gflops()
    vm = get_profile("edge-vm")
    at = lambda g: _reduction(dataclasses.replace(vm, flops_per_s=g * 1e9))   # noqa: E731
    assert at(speed) == pytest.approx(0.279, abs=1e-4)
    assert at(2 * speed) < 0.279 < at(speed / 2)
    assert 100 < speed < 300                     # far above the preset's 10: the paper's links cost more per FLOP
    with pytest.raises(WorkbenchError, match="no device speed"):
        ratio.paper_speed_gflops(reduction=0.99)


@pytest.mark.parametrize("scheme", ["voltage", "tensor_parallel", "pipeline", "single"])
@pytest.mark.parametrize("K, paper_mbit", [(2, 500.0), (6, 200.0), (6, 1000.0)])
def test_a_slowed_device_takes_the_factor_longer_at_the_scaled_bandwidth_so_every_ratio_holds(scheme, K, paper_mbit):
    """Slowed to 10 GFLOP/s, every plan takes exactly factor x the paper-speed plan's time when its link is the
    paper's bandwidth over the factor: compute, transfers, link latency and per-layer overhead all scale (a
    device whose latency or overhead was left unscaled fails)."""
    paper = ratio.paper_speed_gflops()
    slow = ratio.paper_ratio_device(10.0, paper_gflops=paper)
    fast = dataclasses.replace(get_profile("edge-vm"), flops_per_s=paper * 1e9)
    factor = ratio.ratio_factor(slow)
    assert factor == pytest.approx(paper / 10) and slow.name == "edge-vm-ratio"
    shape = SHAPES["bert-large"]
    slow_plan = plan_partition(scheme, shape, 128, devices_like(K, slow, bandwidth_mbit=paper_mbit / factor))
    fast_plan = plan_partition(scheme, shape, 128, devices_like(K, fast, bandwidth_mbit=paper_mbit))
    assert slow_plan.predicted_s == pytest.approx(factor * fast_plan.predicted_s, rel=1e-9)


def test_half_peak_is_recovered_from_efficiencies_it_made():
    """The least-squares fit returns the h that made exact efficiencies, and 0 for a host with no fall."""
    N = 128
    for h in (5.0, 17.0, 40.0):
        made = {p: (1 + h / N) / (1 + h / p) for p in (64, 43, 32, 26, 21)}
        assert ratio.half_peak_from(made, N) == pytest.approx(h, rel=1e-9)
    assert ratio.half_peak_from({64: 1.0, 21: 1.0}, N) == 0.0
    assert ratio.half_peak_from({64: 1.02, 21: 1.05}, N) == 0.0     # faster at fewer rows: no fall, not negative


@pytest.mark.alone                          # measures this host's FLOP/s: no other test beside it
def test_the_host_fit_measures_a_fall_and_a_rank_is_limited_to_its_speed_on_the_probes_rows():
    """On this host a layer's FLOP/s fall with fewer rows (the efficiencies are measured, each under 1.2); the
    CPU limit's target is the device's speed at the probe's N rows, below its peak by 1 + h/N."""
    h, efficiency = ratio.fit_half_peak("encoder", rows=(64, 21), repeats=3)
    assert set(efficiency) == {64, 21} and all(0 < e < 1.2 for e in efficiency.values()) and h >= 0
    with pytest.raises(WorkbenchError, match="rows between 1 and 127"):
        ratio.fit_half_peak("encoder", rows=(128, 0))
    device = ratio.paper_ratio_device(10.0, half_peak_tokens=16.0, paper_gflops=171.0)
    plan = plan_partition("voltage", SHAPES["encoder"], 128, devices_like(2, device))
    assert limit_speeds(plan) == [pytest.approx(10e9 / 1.125)] * 2
    with pytest.raises(WorkbenchError, match="GFLOP/s"):
        ratio.paper_ratio_device(0)
