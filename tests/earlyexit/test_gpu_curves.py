"""Published BERT batch curves per GPU: the printed figures come back exactly, the reading between and beyond
them, the derived curves and the saturation band."""
from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from workbench.earlyexit import gpu_curves as gc
from workbench.errors import WorkbenchError

approx = pytest.approx
E3_GPUS = ("v100", "p100", "k80", "a6000")


@pytest.mark.parametrize("gpu, batch, model, precision, seconds", [
    ("v100", 1, "bert-base", "fp32", 6.76e-3),          # FasterTransformer v2.1, TorchScript, <1, 128>
    ("v100", 32, "bert-base", "fp32", 65.60e-3),
    ("v100", 128, "bert-base", "fp32", 254.07e-3),
    ("v100", 64, "bert-base", "fp16", 34.14e-3),
    ("t4", 64, "bert-base", "fp32", 384.27e-3),
    ("a10", 8, "bert-base", "fp32", 20.30e-3),          # FasterTransformer v5 bert_guide
    ("a100", 32, "bert-base", "tf32", 13.49e-3),
    ("v100", 4, "bert-large", "fp32", 4 / 117.59),      # DeepLearningExamples TF: 117.59 sentences/s at batch 4
    ("v100", 8, "bert-large", "fp16", 8 / 385.64),
])
def test_published_figures_come_back_exactly(gpu, batch, model, precision, seconds):
    assert gc.batch_latency_s(gpu, batch, model, precision) == approx(seconds, rel=1e-12)


def test_measured_curves_keep_the_figures_as_printed():
    assert dict(gc.V100_FP32.published) == {1: 6.76, 8: 18.80, 32: 65.60, 64: 130.51, 128: 254.07}
    assert gc.V100_FP32.unit == "ms"
    assert gc.V100_LARGE_FP32.unit == "sequences/s" and gc.V100_LARGE_FP32.published[2] == 100.82
    for c in (*gc.CURVES.values(), *gc.ALTERNATES):
        if c.measured:
            for b, v in c.published.items():
                expected = v / 1e3 if c.unit == "ms" else b / v
                assert c.points[b] == approx(expected, rel=1e-12)


def test_a_figure_printed_below_a_smaller_batch_reads_as_the_running_maximum():
    # the V100's fp16 table prints 6.67 ms at batch 8 under 6.74 ms at batch 1
    assert gc.V100_FP16.points[8] == approx(6.67e-3)
    assert gc.batch_latency_s("v100", 8, precision="fp16") == approx(6.74e-3)
    assert gc.batch_latency_s("v100", 4, precision="fp16") == approx(6.74e-3)


SAMPLE = sorted({*range(1, 200), 255, 256, 300, 511, 512, 700, 1000, 1024, 1.5, 2.5, 7.9, 100.5})


@pytest.mark.parametrize("key", sorted(gc.CURVES))
def test_latency_never_falls_as_the_batch_grows(key):
    times = [gc.CURVES[key].seconds(b) for b in SAMPLE]
    assert all(b >= a for a, b in zip(times, times[1:]))
    assert all(t > 0 and math.isfinite(t) for t in times)


def test_between_published_batches_the_reading_is_straight_in_log_log():
    t1, t8 = 6.76e-3, 18.80e-3
    assert gc.batch_latency_s("v100", 2) == approx(t1 * (t8 / t1) ** (1 / 3))
    assert gc.batch_latency_s("v100", 4) == approx(t1 * (t8 / t1) ** (2 / 3))
    t32, t64 = 65.60e-3, 130.51e-3
    assert gc.batch_latency_s("v100", 48) == approx(math.exp(math.log(t32) + math.log(1.5) / math.log(2)
                                                             * math.log(t64 / t32)))


def test_beyond_the_last_published_batch_the_reading_is_linear_with_the_last_segment_slope():
    slope = (254.07e-3 - 130.51e-3) / 64
    assert gc.batch_latency_s("v100", 256) == approx(254.07e-3 + 128 * slope)
    assert gc.batch_latency_s("v100", 1024) == approx(254.07e-3 + 896 * slope)
    # a curve that ends at batch 8 (DeepLearningExamples' TensorFlow table)
    s4, s8 = 4 / 117.59, 8 / 130.42
    assert gc.batch_latency_s("v100", 32, "bert-large") == approx(s8 + 24 * (s8 - s4) / 4)


def test_a_last_segment_that_does_not_rise_extrapolates_with_the_last_per_sample_time():
    flat = gc.BatchCurve("x", "bert-base", 128, "fp16", "made up", {1: 5e-3, 8: 4e-3}, "made up")
    assert flat.seconds(8) == approx(5e-3)                       # running maximum
    assert flat.seconds(16) == approx(5e-3 + 8 * 5e-3 / 8)


@pytest.mark.parametrize("key", sorted(k for k, c in gc.CURVES.items() if c.measured))
def test_per_sample_time_does_not_rise_through_batch_64_on_any_measured_curve(key):
    c = gc.CURVES[key]
    per_sample = [c.points[b] / b for b in c.batches if b <= 64]
    assert all(b <= a for a, b in zip(per_sample, per_sample[1:]))


def test_the_figures_are_not_smoothed_where_per_sample_time_rises_again():
    # the T4 tables print a slower per-sample time at batch 128 than at 64, in fp32 and fp16
    for c in (gc.T4_FP32, gc.T4_FP16):
        assert c.points[128] / 128 > c.points[64] / 64


def test_small_batches_on_the_v100_cost_far_less_than_their_share():
    # the property a FLOP/s model missed: halving a batch of 8 saves far less than half its time
    for precision in ("fp32", "fp16"):
        t4, t8 = gc.batch_latency_s("v100", 4, precision=precision), gc.batch_latency_s("v100", 8, precision=precision)
        assert t4 > 0.65 * t8
    assert gc.batch_latency_s("v100", 8, precision="fp16") < 1.01 * gc.batch_latency_s("v100", 1, precision="fp16")


def test_every_e3_gpu_has_a_bert_base_fp32_curve():
    assert set(E3_GPUS) <= set(gc.gpus("bert-base", "fp32"))
    assert gc.gpus("bert-base", "fp16") == ["a10", "a100", "a6000", "t4", "v100"]


@pytest.mark.parametrize("key", sorted(k for k, c in gc.CURVES.items() if not c.measured))
def test_derived_curves_scale_an_existing_measured_curve(key):
    c = gc.CURVES[key]
    base = gc.CURVES[c.derived_from]
    assert base.measured and base.model == c.model and base.precision == c.precision
    assert c.gpu != base.gpu and c.seq_len == base.seq_len
    assert c.batches == base.batches
    for b in c.batches:
        assert c.points[b] == approx(base.points[b] * c.scale, rel=1e-12)
    assert not c.published and "derived" in c.source and c.note


def test_the_derivation_factors_are_the_stated_spec_ratios():
    v100 = 5120 * 2 * 1.38e9
    assert gc.P100_FP32.scale == approx(v100 / (3584 * 2 * 1.303e9))       # 1.513
    assert gc.K80_FP32.scale == approx(v100 / (2496 * 2 * 0.875e9))        # 3.235
    assert gc.A6000_FP32.scale == approx(72 * 1695 / (84 * 1800))          # 1 / 1.239
    assert gc.P100_FP32.derived_from == ("v100", "bert-base", "fp32")
    assert gc.K80_LARGE_FP32.derived_from == ("v100", "bert-large", "fp32")
    assert gc.A6000_FP16.derived_from == ("a10", "bert-base", "fp16")
    assert {c.gpu for c in gc.CURVES.values() if not c.measured} == {"p100", "k80", "a6000"}


def test_every_curve_cites_a_source_and_sits_at_128_tokens():
    for c in (*gc.CURVES.values(), *gc.ALTERNATES):
        assert c.seq_len == gc.SEQ_LEN == 128
        assert "commit" in c.source
        assert c.framework


def test_alternates_are_other_sources_for_gpus_the_curves_cover():
    for c in gc.ALTERNATES:
        assert c.key in gc.CURVES and c.measured and c.source != gc.CURVES[c.key].source


def test_band_fraction_is_the_largest_disagreement_on_the_rise_between_v100_sources():
    # TensorFlow-XLA (FasterTransformer v2.1) rises 18.73 - 5.23 ms to batch 8; the TorchScript curve 18.80 - 6.76
    assert gc.BAND_FRACTION == approx((18.73 - 5.23) / (18.80 - 6.76) - 1)
    assert 0.12 < gc.BAND_FRACTION < 0.125
    assert len(gc.BAND_SOURCES) == 4
    assert all(c.key == ("v100", "bert-base", "fp32") for c in gc.BAND_SOURCES)
    assert not any("eager" in c.framework for c in gc.BAND_SOURCES)


def test_rise_disagreement_compares_shared_batches_only():
    ref = gc.BatchCurve("x", "bert-base", 128, "fp32", "made up", {1: 1.0, 8: 3.0, 32: 9.0}, "made up")
    other = gc.BatchCurve("x", "bert-base", 128, "fp32", "made up", {1: 2.0, 8: 4.5, 64: 100.0}, "made up")
    assert gc.rise_disagreement(ref, [other]) == approx(0.25)        # (4.5 - 2) / (3 - 1) - 1 at batch 8
    assert gc.rise_disagreement(ref, []) == 0.0


@pytest.mark.parametrize("gpu", E3_GPUS)
def test_the_band_scales_the_rise_above_batch_one(gpu):
    t1 = gc.batch_latency_s(gpu, 1)
    assert gc.saturation_band(gpu, 1) == approx((t1, t1))
    for b in (2, 8, 32, 100, 1024):
        t = gc.batch_latency_s(gpu, b)
        low, high = gc.saturation_band(gpu, b)
        assert low < t < high
        assert high - t == approx(gc.BAND_FRACTION * (t - t1))
        assert t - low == approx(gc.BAND_FRACTION * (t - t1))


def test_per_layer_time_is_the_whole_model_over_its_layers():
    assert gc.layer_latency_s("v100", 32) == approx(65.60e-3 / 12)
    assert gc.layer_latency_s("k80", 4, "bert-large") == approx(gc.batch_latency_s("k80", 4, "bert-large") / 24)


@pytest.mark.parametrize("batch", [0, 0.5, -3, 1025, 1e9, float("nan"), float("inf"), True, "8", None])
def test_a_batch_outside_1_to_1024_is_refused_naming_the_range(batch):
    with pytest.raises(WorkbenchError, match=r"1\.\.1024"):
        gc.batch_latency_s("v100", batch)


def test_unknown_names_are_refused_naming_the_known_ones():
    with pytest.raises(WorkbenchError, match="a6000.*k80.*p100.*v100"):
        gc.batch_latency_s("h100", 8)
    with pytest.raises(WorkbenchError, match="bert-base, bert-large"):
        gc.batch_latency_s("v100", 8, model="gpt2")
    with pytest.raises(WorkbenchError, match="its precisions: fp32"):
        gc.batch_latency_s("k80", 8, precision="fp16")
    with pytest.raises(WorkbenchError, match="tf32, fp16"):
        gc.batch_latency_s("a100", 8)
    with pytest.raises(WorkbenchError, match="k80.*p100.*v100"):
        gc.batch_latency_s("a6000", 8, model="bert-large")


def test_a_malformed_curve_is_refused():
    with pytest.raises(WorkbenchError, match="starting at 1"):
        gc.BatchCurve("x", "bert-base", 128, "fp32", "f", {2: 1.0, 8: 2.0}, "s")
    with pytest.raises(WorkbenchError, match="seconds > 0"):
        gc.BatchCurve("x", "bert-base", 128, "fp32", "f", {1: 0.0}, "s")
    with pytest.raises(WorkbenchError, match="precision"):
        gc.BatchCurve("x", "bert-base", 128, "int8", "f", {1: 1.0}, "s")


def test_the_module_is_engine_code():
    tree = ast.parse(Path(gc.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    workbench = {m for m in imported if m.startswith("workbench")}
    assert workbench == {"workbench.errors"}
    assert {m.split(".")[0] for m in imported} <= {"__future__", "math", "dataclasses", "numbers", "types",
                                                   "typing", "numpy", "workbench"}
