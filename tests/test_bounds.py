"""The Python API refuses the values the commands refuse, in the same one line (a WorkbenchError naming the
value and its range), before any work: not a NumPy or torch error from deep inside."""
import os
from types import SimpleNamespace

import numpy as np
import pytest

from workbench import argtypes
from workbench.errors import WorkbenchError
from workbench.kvcache import limits
from workbench.kvcache.traces import synthesize_trace

TEXTS = {"review": ["a fine film"], "headline": ["Markets rise"], "summary": ["Markets rise. Shares too."]}


@pytest.mark.parametrize("kwargs,said", [
    ({"contexts": 99999999999}, "contexts: must be at most"),
    ({"calls": 1000000000}, "calls: must be at most"),
    ({"seed": -1}, "seed: must be at least 0, got -1"),
    ({"seed": 2**32}, "seed: must be at most 4294967295"),
    ({"mean_interval_s": 1e30}, "mean_interval_s: must be at most 86400 s"),
    ({"mean_interval_s": float("nan")}, "mean_interval_s: expected a finite number"),
    ({"contexts": 2.5}, "contexts: expected a whole number of contexts, got 2.5"),
    ({"contexts": 50000, "calls": 10**7, "pattern": "markov"}, "more than 3600 s"),
])
def test_a_trace_out_of_range_is_refused_before_drawing(kwargs, said):
    args = {"contexts": 3, "calls": 4, "pattern": "random", **kwargs}
    with pytest.raises(WorkbenchError, match=said) as refused:
        synthesize_trace(texts=TEXTS, **args)
    assert isinstance(refused.value, argtypes.OutOfRangeError) and "\n" not in str(refused.value)


def test_the_command_and_the_api_say_the_same_range():
    """One type checks both: the option's error and the API's error carry the same words."""
    with pytest.raises(argtypes.OutOfRangeError) as api:
        synthesize_trace(10**12, 4, texts=TEXTS)
    with pytest.raises(Exception) as cli:
        limits.contexts(str(10**12))
    assert str(api.value) == f"contexts: {cli.value}"


def test_the_host_measurement_refuses_a_chunk_its_context_cannot_hold(monkeypatch):
    """Refused before the decoder runs: a model whose forward pass would be called fails the test."""
    from workbench.kvcache import costmodel

    model = SimpleNamespace(cfg=SimpleNamespace(max_positions=8192))
    with pytest.raises(argtypes.OutOfRangeError, match=r"chunk_size: must be at most 1024 tokens .*got 100000000"):
        costmodel.profile_host(model, 100_000_000)
    with pytest.raises(argtypes.OutOfRangeError, match="chunk_size: must be at least 1 tokens, got 0"):
        costmodel.measure_host(model, 0)


@pytest.mark.parametrize("target_s,preload,said", [
    (1e30, 0.0, "target latency: must be at most 3600 s"),
    (0.2, 1e30, r"preload buffer \(MB\): must be at most"),
])
def test_the_elastic_planner_refuses_what_the_command_refuses(target_s, preload, said):
    from workbench.elastic.planner import PlanningError, plan_elastic

    with pytest.raises(PlanningError, match=said) as refused:
        plan_elastic(object(), target_s, np.ones((6, 12)), preload)
    assert "\n" not in str(refused.value)


def test_bounds_come_from_the_machine_and_the_decoder():
    assert limits.new_tokens.maximum == 8192                            # SmolLM2-135M's context
    assert limits.measured_chunk_size.maximum == 1024                   # 8 chunks prefilled into it
    assert limits.client_processes.maximum == 4 * len(os.sched_getaffinity(0))
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert limits.memory_mb.maximum == pages // 10**6
