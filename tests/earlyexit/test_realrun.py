"""A real run end to end: the trained model, a plan for CPU replicas, Ray Serve, the simulator, the check."""
import pytest

from workbench.earlyexit.realrun import real_run
from workbench.errors import WorkbenchError


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
    # every request entered the first split; the later splits served the survivors, re-formed into batches
    assert sum(b * n for b, n in served.batch_counts[0].items()) == 24
    for i, (start, _) in enumerate(run.plan.splits[1:], 1):
        assert sum(b * n for b, n in served.batch_counts[i].items()) == int((served.exit_layers >= start).sum())
    assert len(run.simulated.requests) == 24
    assert [r.exit_layer for r in run.simulated.requests] == served.exit_layers.tolist()
    summary = run.summary()
    assert summary["equal_to_one_process"] and set(summary["errors"]) == {"goodput", "p50", "p95"}
    assert any("outputs equal the model run in one process" in line for line in run.lines())


@pytest.mark.parametrize("kwargs, message", [
    ({"pattern": "zipf"}, "unknown arrival pattern"), ({"requests": 0}, "1..10000"), ({"rate": -1.0}, "> 0"),
    ({"replicas": 0}, "no GPUs"), ({"slo_s": -1.0}, "SLO")])
def test_bad_input_is_refused_before_ray_is_touched(kwargs, message):
    with pytest.raises(WorkbenchError, match=message):
        real_run(preset="quick", **kwargs)
