import json

import numpy as np
import pytest
import torch

from workbench.data import load_task
from workbench.elastic.baselines import plan_method
from workbench.elastic.evaluate import AccuracyCache
from workbench.elastic.artifacts import load_importance
from workbench.elastic.pipeline import ElasticEngine, PreloadBuffer, run_pipeline
from workbench.elastic.planner import empty_plan, plan_elastic
from workbench.elastic.costmodel import device_cost_model
from workbench.elastic.artifacts import prepare_store
from workbench.errors import WorkbenchError
from workbench.models.tokenizer import encoder_tokenizer
from tests.conftest import PRESET

SEQ = 64


@pytest.fixture(scope="module")
def store():
    return prepare_store("sentiment", PRESET, progress=False)


@pytest.fixture(scope="module")
def importance(prepared):
    return load_importance("sentiment", PRESET).accuracy


@pytest.fixture(scope="module")
def odroid(store):
    return device_cost_model("odroid-n2", store, SEQ)


def batch(texts):
    return encoder_tokenizer(SEQ)(list(texts), pad_to=SEQ)


def test_pipeline_logits_equal_the_batch_evaluation_of_the_same_weights(store, importance, odroid):
    plan = plan_elastic(odroid, 0.15, importance, 1e6)
    assert len(np.unique(plan.bits)) > 1                       # a mixed-bitwidth submodel
    dev = load_task("sentiment").dev.subset(12)
    result = run_pipeline(plan, store, *batch(dev.texts))
    full = np.full((6, 12), 2)
    full[:plan.n, :plan.m] = plan.bits
    ids, mask = batch(dev.texts)
    with torch.no_grad():
        expected = store.model_with_bits(full)(ids, mask, depth=plan.n, width=plan.m)
    assert torch.allclose(result.logits, expected, atol=1e-5)
    acc = AccuracyCache(store, dev, SEQ)(plan.n, plan.m, plan.bits)
    assert acc == float((result.logits.argmax(-1).numpy() == dev.labels).mean())


def test_measured_timeline_has_every_lane_and_exports(store, importance, odroid, tmp_path):
    plan = plan_elastic(odroid, 0.2, importance, 0)
    result = run_pipeline(plan, store, *batch(["a quietly moving film"]), emulate=odroid)
    tl = result.timeline
    assert tl.source == "measured" and result.latency_s >= tl.end * 0.999
    for kind in ("io", "decompress", "compute"):
        assert len(tl.of_kind(kind)) == plan.n, kind
    assert len(result.loaded) == plan.n * plan.m
    trace = json.loads(tl.save_chrome_trace(tmp_path / "run.json").read_text())
    assert {e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"} >= {"io", "decompress", "compute"}
    processes = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"]
    assert processes == ["odroid-n2 emulated on this host (measured)"]      # not "host": the run was padded
    host_run = run_pipeline(plan, store, *batch(["a quietly moving film"]), emulate=None)
    assert {s.device for s in host_run.timeline.spans} == {"host"} and host_run.emulated == ""


def test_a_run_checks_itself_against_its_prediction(store, importance, odroid):
    plan = plan_elastic(odroid, 0.2, importance, 0)
    ElasticEngine.runs_in_process = 0
    engine = ElasticEngine(store, PreloadBuffer(0))
    first, second = (engine.run(plan, *batch(["a quietly moving film"]), emulate=odroid) for _ in range(2))
    assert first.first_in_process and not second.first_in_process and first.emulated == "odroid-n2"
    check = second.check(plan)
    assert check.predicted_s == plan.predicted_s and check.measured_s == second.latency_s
    assert check.missed == (abs(second.latency_s / plan.predicted_s - 1) > 0.2)
    assert "first run" in " ".join(first.check(plan).causes) and "first run" not in " ".join(check.causes)


def test_buffer_evicts_top_layers_first_and_feeds_the_next_plan(store, importance, odroid):
    first = plan_elastic(odroid, 0.2, importance, 0)
    engine = ElasticEngine(store, PreloadBuffer(1.5e6))
    ids, mask = batch(["the plot is thin"])
    result = engine.run(first, ids, mask)
    assert engine.buffer.nbytes <= 1.5e6 and result.evicted
    kept_layers = {k for k, _, _ in engine.buffer.entries()}
    assert max(kept_layers) <= min(k for k, _, _ in result.evicted)
    second = plan_elastic(odroid, 0.2, importance, 0, cached=engine.buffer.entries())
    assert second.preloaded.sum() == len([e for e in engine.buffer.entries() if e[0] < second.n and e[1] < second.m])
    free = ~second.preloaded
    assert second.bits[free].mean() >= first.bits[free[:first.n, :first.m]].mean()
    again = engine.run(second, ids, mask)
    assert len(again.loaded) == int(free.sum())


def test_whole_model_in_memory_reads_nothing(store, importance, odroid):
    plan = plan_method("PreloadModel-6", odroid, 0.2, importance, 0)
    result = run_pipeline(plan, store, *batch(["fine"]))
    assert result.loaded == () and not result.timeline.of_kind("io")


def test_missing_layer_file_is_named_and_empty_plans_refused(store, importance, odroid, tmp_path):
    import shutil

    from workbench.elastic.store import ShardStore

    shutil.copytree(store.root, tmp_path / "copy")
    copy = ShardStore.open(tmp_path / "copy")
    plan = plan_elastic(odroid, 0.2, importance, 0)
    engine = ElasticEngine(copy)
    copy.layer_path(1).unlink()
    with pytest.raises(FileNotFoundError, match="layer-01.bin"):
        engine.run(plan, *batch(["x"]))
    with pytest.raises(WorkbenchError, match="cannot run an empty plan: nothing fits"):
        engine.run(empty_plan("Ours", 0.1, "nothing fits"), *batch(["x"]))
    with pytest.raises(WorkbenchError, match="capacity must be >= 0 bytes"):
        PreloadBuffer(-1)


def test_public_names_as_design_md_gives_them(store, importance, odroid):
    import workbench.elastic as elastic

    compute = elastic.plan_compute(odroid, 0.2, odroid.num_layers, odroid.num_shards)
    n, m = compute.n, compute.m
    assert compute.found and n * odroid.t_comp(m) <= 0.2
    assert [(c.n, c.m) for c in compute.candidates if c.chosen] == [(n, m)]
    io = elastic.plan_io(odroid, 0.2, n, m, importance, [(0, 0, 6)])
    assert io.bits.shape == (n, m) and io.bits[0, 0] == 6 and (io.aib >= -1e-12).all()
    assert io.steps[0].kind == "init" and np.allclose(io.steps[-1].aib, io.aib)
    plan = elastic.plan(odroid, 0.2, importance, 1e6)
    assert (plan.n, plan.m) == (n, m)
    result = elastic.run_pipeline(plan, store, *batch(["fine"]))
    assert result.logits.shape == (1, 2) and result.timeline.source == "measured"
    with pytest.raises(TypeError):                          # a RunResult is read by name, not unpacked
        logits, timeline = result
    with pytest.raises(WorkbenchError, match=r"takes \(plan, store, ids, mask\)"):
        elastic.run_pipeline(store, plan, *batch(["fine"]))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        elastic.nope
    exported = {name: getattr(elastic, name) for name in elastic.__all__}    # each resolves in its module
    assert exported["plan"] is exported["plan_elastic"] and type(compute) is exported["ComputePlan"]


def test_run_repeatedly_warms_up_then_cycles_the_inputs():
    from types import SimpleNamespace

    from workbench.elastic.pipeline import run_repeatedly

    seen = []

    class CountingEngine:
        def run(self, plan, ids, mask, emulate=None, keep_loaded=True):
            seen.append((ids, keep_loaded))
            return SimpleNamespace(latency_s=float(len(seen)))

    reported = []
    results = run_repeatedly(CountingEngine(), None, [("a", None), ("b", None), ("c", None)], 3, warmup=1,
                             on_run=lambda r, result: reported.append((r, result.latency_s)))
    assert seen == [("a", False), ("b", False), ("c", False), ("a", False)]
    assert [r.latency_s for r in results] == [2.0, 3.0, 4.0] and reported == [(0, 2.0), (1, 3.0), (2, 4.0)]
    assert len(run_repeatedly(CountingEngine(), None, [("a", None)], 5, should_stop=lambda: len(seen) >= 6)) == 2
    with pytest.raises(WorkbenchError, match="runs must be >= 1"):
        run_repeatedly(CountingEngine(), None, [("a", None)], 0)
