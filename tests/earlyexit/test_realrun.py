"""A real run end to end: the trained model, a plan for CPU replicas, Ray Serve, the simulator, the check."""
import pytest

from workbench.earlyexit.realrun import real_run
from workbench.errors import WorkbenchError

pytestmark = pytest.mark.alone         # serves to deadlines on Ray: run with no other test beside it


@pytest.mark.integration
def test_a_real_run_serves_the_trained_model_and_equals_it_in_one_process(prepared, ray_cluster):
    rec = prepared["exit_ramps"]["sentiment"].record
    import numpy as np

    threshold = float(np.quantile(rec.entropies[:-1], 0.5))      # ramps of the quick preset are barely trained
    run = real_run(preset="quick", replicas=3, slo_s=2.0, batch_size=4, easy=0.5, threshold=threshold,
                   pattern="uniform", rate=40.0, requests=24, seed=1)
    assert run.equal and run.mismatches == 0 and run.max_logit_diff < 1e-4
    served = run.served
    assert len(served.requests) == 24
    assert len(set(served.exit_layers.tolist())) >= 2                  # some leave early, some run on
    assert [tuple(s) for s in served.splits] == [tuple(s) for s in run.plan.splits]
    assert sum(run.plan.replicas) <= 3
    # nothing dropped at this rate: every request entered the first split; the later splits served the
    # survivors, re-formed into batches
    assert served.dropped == 0
    assert sum(b * n for b, n in served.batch_counts[0].items()) == 24
    for i, (start, _) in enumerate(run.plan.splits[1:], 1):
        assert sum(b * n for b, n in served.batch_counts[i].items()) == int((served.exit_layers >= start).sum())
    assert len(run.simulated.requests) == 24
    kept = served.served
    simulated_exits = np.array([r.exit_layer for r in run.simulated.requests])
    assert simulated_exits[kept].tolist() == served.exit_layers[kept].tolist()
    # out of sample: calibrated on another run (other requests at half the rate), then predicted
    v = run.validation
    assert "a calibration run of 12 other requests at 20/s" in v.note
    summary = run.summary()
    assert summary["equal_to_one_process"] and set(summary["errors"]) == {"goodput", "p50", "p95"}
    # what is printed agrees with itself: the errors are those of the two lines above them
    sv, sm, err = summary["served"], summary["simulated"], summary["errors"]
    assert err["goodput"] == pytest.approx((sm["goodput"] - sv["goodput"]) / sv["goodput"])
    assert err["p95"] == pytest.approx((sm["p95_latency_ms"] - sv["p95_latency_ms"]) / sv["p95_latency_ms"])
    lines = run.lines()
    assert f"goodput {sm['goodput']:.1f}/s" in lines[1] and f"p95 {sm['p95_latency_ms']:.1f} ms" in lines[1]
    assert f"goodput {100 * err['goodput']:+.1f}%" in lines[2] and "out of sample" in lines[2]
    assert any("outputs equal the model run in one process" in line for line in lines)


@pytest.mark.parametrize("kwargs, message", [
    ({"pattern": "zipf"}, "unknown arrival pattern"), ({"requests": 0}, "1..10000"), ({"rate": -1.0}, "> 0"),
    ({"replicas": 0}, "no GPUs"), ({"slo_s": -1.0}, "SLO"), ({"address": "nowhere"}, "not HOST:PORT"),
    ({"address": "127.0.0.1:1"}, "no Ray cluster answers")])
def test_bad_input_is_refused_before_ray_is_touched(kwargs, message):
    with pytest.raises(WorkbenchError, match=message):
        real_run(preset="quick", **kwargs)


@pytest.mark.integration
def test_a_drifting_run_replans_in_place_and_still_equals_the_model(prepared, ray_cluster):
    """The trained model, the mix drifting halfway, a re-plan from the first window on: one redeploy in place
    (the same plan again is no re-plan), and every served request still answers as the model in one process."""
    from types import SimpleNamespace

    import numpy as np

    from workbench.earlyexit.realrun import drift_run

    rec = prepared["exit_ramps"]["sentiment"].record
    threshold = float(np.quantile(rec.entropies[:-1], 0.5))
    other = SimpleNamespace(splits=[(0, 3), (3, 6)], replicas=[2, 1], batch_sizes=[4, 4], gpu_types=["host", "host"])
    seen = []

    def replan(forecast):
        seen.append(forecast)
        return other

    run = drift_run(preset="quick", replicas=3, slo_s=3.0, batch_size=4, easy=0.9, drift_to=0.1,
                    threshold=threshold, rate=12.0, requests=48, window_s=1.0, replan=replan)
    served = run.served
    assert run.equal and run.mismatches == 0 and served.served.sum() >= 40
    assert len(seen) == len(served.windows) >= 2
    assert len(served.replans) == 1 and served.replans[0].new["splits"] == [[0, 3], [3, 6]]
    assert served.replans[0].old["splits"] == [list(s) for s in run.plan.splits]
    assert any("re-plan at" in line for line in run.lines())
