"""Published BERT inference latency against batch size on E3's GPU types, and how to read it between points.

Why this module exists: a GPU runs a small batch almost as fast as a larger one (kernel launches, the host and
weight reads dominate until the matrix units fill up), so an early-exit model whose batches shrink layer by
layer saves much less time per layer than the fraction of samples it drops. A latency model built from FLOP/s
alone misses that. The curves here are what benchmarks printed, per GPU, per model and per precision.

What a curve is (:class:`BatchCurve`): seconds for one forward pass of a whole BERT model over a batch of
sequences of ``seq_len`` tokens (all curves here are at 128 tokens), at the published batch sizes, with the
source, the framework and what was timed. Throughput tables become seconds per batch as ``batch /
throughput``; millisecond tables are divided by 1000. Nothing else is done to a published figure.

Measured curves (source abbreviations as in :data:`SOURCES`):

=====  ==========  =========  ===================================================  =======================
GPU    model       precision  seconds per batch at batch 1 / 8 / 32 / 64 / 128     source
=====  ==========  =========  ===================================================  =======================
v100   bert-base   fp32       0.00676 / 0.01880 / 0.06560 / 0.13051 / 0.25407      ft21 (TorchScript)
v100   bert-base   fp16       0.00674 / 0.00667 / 0.01841 / 0.03414 / 0.06603      ft21 (TorchScript)
v100   bert-large  fp32       batch 1 / 2 / 4 / 8: 1/76.75, 2/100.82, 4/117.59,    dle-tf (TensorFlow)
                              8/130.42 (sequences/s)
v100   bert-large  fp16       1/98.63, 2/172.59, 4/272.86, 8/385.64                dle-tf (TensorFlow)
t4     bert-base   fp32       0.00924 / 0.05229 / 0.19219 / 0.38427 / 0.86286      ft21 (TorchScript)
t4     bert-base   fp16       0.01239 / 0.01380 / 0.05328 / 0.10410 / 0.21579      ft21 (TorchScript)
a10    bert-base   fp32       0.00398 / 0.02030 / 0.08018 (batch 1 / 8 / 32)       ft5 (TorchScript)
a10    bert-base   fp16       0.00438 / 0.00578 / 0.02159                          ft5 (TorchScript)
a100   bert-base   tf32       0.00489 / 0.00496 / 0.01349                          ft5 (TorchScript)
a100   bert-base   fp16       0.00447 / 0.00435 / 0.00957                          ft5 (TorchScript)
=====  ==========  =========  ===================================================  =======================

The FasterTransformer tables (ft21, ft5) time the 12-layer BERT-base encoder stack (hidden 768, 12 heads of
64) as HuggingFace's PyTorch code under TorchScript, without the embedding lookup and without a pooler or
classifier; the DeepLearningExamples TensorFlow table (dle-tf) times the whole SQuAD-fine-tuned model. The
V100 and T4 of ft21 and ft5 ran at fixed application clocks (V100 at 1380 MHz, T4 at 1590 MHz, A10 at 1695
MHz, A100 at 1410 MHz, as those pages state). TorchScript is the curve used rather than the same tables' eager
"PyTorch" column: at small batches eager PyTorch was bound by the host's Python (on the V100, fp32, 17.26 ms
at batch 1 against 18.60 ms at batch 8; 12.25 ms at batch 1 even for 32 tokens), a property of that 2020
host and PyTorch 1.5 rather than of the GPU. That eager curve is kept in :data:`ALTERNATES` for comparison; it
is flatter still at small batches than the TorchScript one.

No published BERT batch curve was found for the P100, the K80 or the RTX A6000. Their curves are *derived*:
a measured curve's published seconds times one stated factor, so the derived curve has the measured curve's
shape (``derived_from`` names the measured curve, ``scale`` the factor):

- ``p100`` and ``k80`` (fp32 only; neither has tensor cores, the K80 has no fast fp16) from the V100's fp32
  curves, scaled by the ratio of peak fp32 FLOP/s, cores x 2 x clock: the V100 at the 1380 MHz it was measured
  at (5120 cores, 14.13 TFLOP/s) over the P100 PCIe (3584 cores at its 1303 MHz boost, 9.34 TFLOP/s; x 1.513)
  and over one GK210 of a K80 (2496 cores at its 875 MHz boost, 4.37 TFLOP/s; x 3.235). Both are Pascal- and
  Kepler-era fp32 GPUs like the V100's fp32 path (no tensor cores in fp32), where a BERT layer's GEMMs are
  bound by fp32 arithmetic: on the V100 the measured batch-32 pass runs at about 77% of that peak. A K80 held
  below its boost clock (its base is 562 MHz) is up to 1.56 x slower than this curve.
- ``a6000`` (fp32 and fp16) from the A10's curves, the same GA102 chip, scaled by SMs x clock: 72 SMs at the
  1695 MHz the A10 was measured at over the A6000's 84 SMs at its 1800 MHz boost (x 1 / 1.239; its memory
  bandwidth ratio, 768 / 600 GB/s = 1.28, agrees within 3%). Not from the V100: across architectures FLOP/s
  ratios mislead (the A10 has 2.2 x the V100's fp32 peak yet ran batch 32 in fp32 13% slower).
- ``bert-large`` on the P100 and K80 from the V100's TensorFlow bert-large curve, with the same factors. No
  bert-large curve exists for the A10 or the A6000.

The derived curves carry the measured GPU's fixed cost at batch 1 scaled by the same factor, so the launch
floor of a slower GPU is taken as proportionally slower; a slower GPU is more compute-bound at small batches
than that, so its true curve is likely nearer to linear in the batch. The saturation band below does not
cover this.

Reading a curve (:func:`batch_latency_s`): exact at published batches; between two published batches,
straight in log(seconds) against log(batch); beyond the last published batch, linear in the batch with the
last segment's seconds per added sample (the last point's seconds per sample if that segment does not rise).
Where a published figure is below the one at a smaller batch (timing noise: the V100's fp16 6.74 ms at batch
1 against 6.67 ms at 8), the curve uses the running maximum, so latency never falls as the batch grows.
Per layer (:func:`layer_latency_s`) is the whole model's seconds over its layer count: the FasterTransformer
figures hold the encoder layers only; the TensorFlow figures also hold the embedding and the QA head, spread
over the layers by this division (a few percent of the whole).

The saturation band (:func:`saturation_band`): the uncertainty of how fast latency rises above batch 1. The
band keeps the curve's batch-1 time and scales the rise above it by ``1 -/+``:data:`BAND_FRACTION`. The
fraction is the largest disagreement on that rise between the V100 fp32 BERT-base curve used here and every
other published V100 fp32 BERT-base curve at 128 tokens that is not host-bound (:data:`BAND_SOURCES`: the
FasterTransformer v5 TorchScript table, TensorFlow-XLA in both FasterTransformer releases, and
DeepLearningExamples' TensorFlow table), compared at the batch sizes they share: 12.1%, at batch 8
(TensorFlow-XLA rises 13.50 ms from batch 1 to 8, TorchScript 12.04 ms). The fp16 curves agree about as well
(at batch 32 and above the V100 fp16 sources lie within 12% of each other), so the same fraction is used for
every curve. At batch 1 the band has no width: the level at batch 1 depends on the host and the framework
(TorchScript 6.76 ms, eager PyTorch 17.26 ms, TensorFlow-XLA 5.23 ms on the same V100) and is not what the
band describes.

Engine code: numpy only, no UI, nothing of the other mechanisms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real
from types import MappingProxyType
from typing import Iterable, Mapping

import numpy as np

from workbench.errors import UnknownNameError, WorkbenchError

MAX_BATCH = 1024
"""The largest batch :func:`batch_latency_s` answers for (the largest a GPU layer profile tabulates)."""
SEQ_LEN = 128
"""The sequence length every curve here was measured at."""
MODEL_LAYERS = {"bert-base": 12, "bert-large": 24}
PRECISIONS = ("fp32", "tf32", "fp16")
DEFAULT_PRECISION = "fp32"

SOURCES = {
    "ft21": "NVIDIA/DeepLearningExamples, FasterTransformer/v2.1/README.md at commit "
            "4972eb1f91de926935f558efc9ddc3215c12fd31, section 'Encoder performance on V100 and PyTorch' / "
            "'... on T4 and PyTorch' (12-layer BERT-base encoder, <batch, 128> rows), and 'Encoder performance "
            "on V100 and TensorFlow' for the TensorFlow-XLA column; V100 (DGX-1, 1380 MHz), T4 (1590 MHz)",
    "ft5": "NVIDIA/FasterTransformer, docs/bert_guide.md at commit 4c014fba0f1bad9b5078eb1b29d163b87749a470, "
           "sections 'BERT performance on V100 / A10 / A100 and PyTorch' (TorchScript column) and '... on V100 "
           "and TensorFlow' (TF column); 12-layer BERT-base encoder, seq_len 128; V100 at 1380 MHz, A10 at "
           "1695 MHz, A100 at 1410 MHz",
    "dle-tf": "NVIDIA/DeepLearningExamples, TensorFlow/LanguageModeling/BERT/README.md at commit "
              "002bcd8c45a0ae4bdf2f01918ab22e0752ffa3e6, 'Inference performance: NVIDIA DGX-1 (1x V100 16GB)', "
              "SQuAD v1.1 fine-tuning inference, TensorFlow 20.06-py3 NGC container, Throughput-Average "
              "(sentences/s) averaged over 1024 iterations",
}
"""Where the numbers come from; each curve's ``source`` quotes one of these with the table it read."""


def _frozen(mapping: Mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class BatchCurve:
    """Seconds for one forward pass of a whole ``model`` over a batch of ``seq_len``-token sequences on ``gpu``.

    ``points`` maps each published batch size to seconds per batch. A measured curve also keeps the figures
    exactly as printed in ``published`` (``unit`` says which: ``"ms"`` per batch or ``"sequences/s"``); a
    derived curve has ``derived_from`` (the key of the measured curve it scales), ``scale`` (the factor on
    that curve's seconds) and no published figures of its own."""
    gpu: str
    model: str
    seq_len: int
    precision: str
    framework: str
    points: Mapping[int, float]
    source: str
    note: str = ""
    published: Mapping[int, float] = field(default_factory=dict)
    unit: str = ""
    derived_from: tuple[str, str, str] | None = None
    scale: float = 1.0

    def __post_init__(self):
        if self.model not in MODEL_LAYERS:
            raise WorkbenchError(f"a BERT batch curve's model is one of {', '.join(MODEL_LAYERS)}, got {self.model!r}")
        if self.precision not in PRECISIONS:
            raise WorkbenchError(f"a BERT batch curve's precision is one of {', '.join(PRECISIONS)}, "
                                 f"got {self.precision!r}")
        batches = sorted(self.points)
        if not batches or batches[0] != 1 or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                                 for b in batches):
            raise WorkbenchError(f"a BERT batch curve needs whole batch sizes starting at 1, got {batches}")
        seconds = [float(self.points[b]) for b in batches]
        if not all(math.isfinite(s) and s > 0 for s in seconds):
            raise WorkbenchError(f"a BERT batch curve's times are seconds > 0, got {seconds}")
        if not math.isfinite(self.scale) or self.scale <= 0:
            raise WorkbenchError(f"a derived curve's scale is a number > 0, got {self.scale!r}")
        object.__setattr__(self, "points", _frozen(zip(batches, seconds)))
        object.__setattr__(self, "published", _frozen(self.published))

    @property
    def key(self) -> tuple[str, str, str]:
        return self.gpu, self.model, self.precision

    @property
    def measured(self) -> bool:
        return self.derived_from is None

    @property
    def batches(self) -> tuple[int, ...]:
        return tuple(self.points)

    @property
    def num_layers(self) -> int:
        return MODEL_LAYERS[self.model]

    def monotone_seconds(self) -> np.ndarray:
        """The published seconds with the running maximum applied (latency never falls as the batch grows)."""
        return np.maximum.accumulate(np.array(list(self.points.values()), dtype=float))

    def seconds(self, batch: float) -> float:
        """Seconds for a batch of ``batch`` sequences (see the module's notes on reading a curve)."""
        b = _batch(batch)
        xs = np.array(self.batches, dtype=float)
        ys = self.monotone_seconds()
        if b >= xs[-1]:
            if len(xs) == 1:
                return float(ys[-1] * b / xs[-1])
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            if slope <= 0:
                slope = ys[-1] / xs[-1]
            return float(ys[-1] + slope * (b - xs[-1]))
        return float(np.exp(np.interp(math.log(b), np.log(xs), np.log(ys))))


def _batch(batch) -> float:
    if isinstance(batch, bool) or not isinstance(batch, Real) or not math.isfinite(float(batch)) \
            or not 1 <= float(batch) <= MAX_BATCH:
        raise WorkbenchError(f"batch {batch!r} is outside the range of the BERT batch curves: a number of "
                             f"sequences from 1 to {MAX_BATCH}; give a batch in 1..{MAX_BATCH}")
    return float(batch)


def _from_ms(gpu, model, precision, framework, ms: Mapping[int, float], source, note="") -> BatchCurve:
    return BatchCurve(gpu, model, SEQ_LEN, precision, framework, {b: v / 1e3 for b, v in ms.items()},
                      source, note, published=ms, unit="ms")


def _from_throughput(gpu, model, precision, framework, per_s: Mapping[int, float], source, note="") -> BatchCurve:
    return BatchCurve(gpu, model, SEQ_LEN, precision, framework, {b: b / v for b, v in per_s.items()},
                      source, note, published=per_s, unit="sequences/s")


def _derive(base: BatchCurve, gpu: str, scale: float, reason: str) -> BatchCurve:
    return BatchCurve(gpu, base.model, base.seq_len, base.precision, f"derived from {base.framework}",
                      {b: s * scale for b, s in base.points.items()},
                      f"derived, not measured: the {base.gpu} curve ({base.source}) x {scale:.4g}", reason,
                      derived_from=base.key, scale=scale)


_TS = "PyTorch, TorchScript of HuggingFace's BERT encoder (FasterTransformer benchmark)"
_TS_NOTE = "the 12-layer encoder stack only: no embedding, pooler or classifier; random weights"
_EAGER = "PyTorch eager, HuggingFace's BERT encoder (FasterTransformer benchmark)"
_XLA = "TensorFlow with XLA (FasterTransformer benchmark)"
_TF = "TensorFlow 1.x, NGC 20.06 container (SQuAD fine-tuned BERT)"
_TF_NOTE = "the whole fine-tuned model with its QA head; throughput averaged over 1024 iterations"

V100_FP32 = _from_ms("v100", "bert-base", "fp32", _TS, {1: 6.76, 8: 18.80, 32: 65.60, 64: 130.51, 128: 254.07},
                     SOURCES["ft21"] + "; V100 FP32 table, TorchScript (ms) column", _TS_NOTE)
V100_FP16 = _from_ms("v100", "bert-base", "fp16", _TS, {1: 6.74, 8: 6.67, 32: 18.41, 64: 34.14, 128: 66.03},
                     SOURCES["ft21"] + "; V100 FP16 table, TorchScript (ms) column",
                     _TS_NOTE + "; batch 8 printed below batch 1 (timing noise), read as equal")
V100_LARGE_FP32 = _from_throughput("v100", "bert-large", "fp32", _TF, {1: 76.75, 2: 100.82, 4: 117.59, 8: 130.42},
                                   SOURCES["dle-tf"] + "; rows 'large, 128, fp32'", _TF_NOTE)
V100_LARGE_FP16 = _from_throughput("v100", "bert-large", "fp16", _TF, {1: 98.63, 2: 172.59, 4: 272.86, 8: 385.64},
                                   SOURCES["dle-tf"] + "; rows 'large, 128, fp16'", _TF_NOTE)
T4_FP32 = _from_ms("t4", "bert-base", "fp32", _TS, {1: 9.24, 8: 52.29, 32: 192.19, 64: 384.27, 128: 862.86},
                   SOURCES["ft21"] + "; T4 FP32 table, TorchScript (ms) column",
                   _TS_NOTE + "; per-sample time rises again at batch 128")
T4_FP16 = _from_ms("t4", "bert-base", "fp16", _TS, {1: 12.39, 8: 13.80, 32: 53.28, 64: 104.10, 128: 215.79},
                   SOURCES["ft21"] + "; T4 FP16 table, TorchScript (ms) column", _TS_NOTE)
A10_FP32 = _from_ms("a10", "bert-base", "fp32", _TS, {1: 3.98, 8: 20.30, 32: 80.18},
                    SOURCES["ft5"] + "; A10 Performance on FP32, TorchScript Latency (ms)", _TS_NOTE)
A10_FP16 = _from_ms("a10", "bert-base", "fp16", _TS, {1: 4.38, 8: 5.78, 32: 21.59},
                    SOURCES["ft5"] + "; A10 Performance on FP16, TorchScript Latency (ms)", _TS_NOTE)
A100_TF32 = _from_ms("a100", "bert-base", "tf32", _TS, {1: 4.89, 8: 4.96, 32: 13.49},
                     SOURCES["ft5"] + "; A100 Performance on TF32, TorchScript Latency (ms)",
                     _TS_NOTE + "; the page gives no plain-fp32 PyTorch table for the A100")
A100_FP16 = _from_ms("a100", "bert-base", "fp16", _TS, {1: 4.47, 8: 4.35, 32: 9.57},
                     SOURCES["ft5"] + "; A100 Performance on FP16, TorchScript Latency (ms)",
                     _TS_NOTE + "; batch 8 printed below batch 1 (timing noise), read as equal")

V100_FP32_PEAK = 5120 * 2 * 1.380e9
"""The V100's fp32 FLOP/s at the 1380 MHz it was measured at (5120 CUDA cores, one FMA = 2 FLOPs a clock)."""
P100_FP32_PEAK = 3584 * 2 * 1.303e9
"""The P100 PCIe's fp32 FLOP/s at its 1303 MHz boost clock."""
K80_FP32_PEAK = 2496 * 2 * 0.875e9
"""One GK210 of a K80 (the preset is one of the board's two GPUs) at its 875 MHz boost clock."""
A10_SM_CLOCK = 72 * 1.695e9
"""The A10's SMs x the clock it was measured at (both it and the A6000 are GA102 chips)."""
A6000_SM_CLOCK = 84 * 1.800e9
"""The RTX A6000's SMs x its boost clock."""

_PASCAL_KEPLER = ("no published BERT batch curve found for the {gpu}; the V100's fp32 curve scaled by the fp32 "
                  "peak ratio {ratio:.3f} (cores x 2 x clock), which keeps the V100's shape and its batch-1 floor "
                  "scaled alike")
P100_FP32 = _derive(V100_FP32, "p100", V100_FP32_PEAK / P100_FP32_PEAK,
                    _PASCAL_KEPLER.format(gpu="P100", ratio=V100_FP32_PEAK / P100_FP32_PEAK))
K80_FP32 = _derive(V100_FP32, "k80", V100_FP32_PEAK / K80_FP32_PEAK,
                   _PASCAL_KEPLER.format(gpu="K80", ratio=V100_FP32_PEAK / K80_FP32_PEAK)
                   + "; at its 562 MHz base clock a K80 is up to 1.56 x slower still")
P100_LARGE_FP32 = _derive(V100_LARGE_FP32, "p100", V100_FP32_PEAK / P100_FP32_PEAK,
                          _PASCAL_KEPLER.format(gpu="P100", ratio=V100_FP32_PEAK / P100_FP32_PEAK))
K80_LARGE_FP32 = _derive(V100_LARGE_FP32, "k80", V100_FP32_PEAK / K80_FP32_PEAK,
                         _PASCAL_KEPLER.format(gpu="K80", ratio=V100_FP32_PEAK / K80_FP32_PEAK))
_GA102 = ("no published BERT batch curve found for the RTX A6000; the A10's curve (the same GA102 chip) scaled "
          "by SMs x clock, 72 x 1695 MHz / (84 x 1800 MHz) = {ratio:.3f}")
A6000_FP32 = _derive(A10_FP32, "a6000", A10_SM_CLOCK / A6000_SM_CLOCK, _GA102.format(ratio=A10_SM_CLOCK / A6000_SM_CLOCK))
A6000_FP16 = _derive(A10_FP16, "a6000", A10_SM_CLOCK / A6000_SM_CLOCK, _GA102.format(ratio=A10_SM_CLOCK / A6000_SM_CLOCK))

CURVES: dict[tuple[str, str, str], BatchCurve] = {c.key: c for c in (
    V100_FP32, V100_FP16, V100_LARGE_FP32, V100_LARGE_FP16, T4_FP32, T4_FP16, A10_FP32, A10_FP16, A100_TF32,
    A100_FP16, P100_FP32, K80_FP32, P100_LARGE_FP32, K80_LARGE_FP32, A6000_FP32, A6000_FP16)}
"""The curve :func:`batch_latency_s` reads, per ``(gpu, model, precision)``: one measured curve where a source
has one, else one derived curve (``derived_from`` set)."""

ALTERNATES: tuple[BatchCurve, ...] = (
    _from_ms("v100", "bert-base", "fp32", _TS, {1: 7.84, 8: 20.86, 32: 70.65},
             SOURCES["ft5"] + "; V100 Performance on FP32, TorchScript Latency (ms)", _TS_NOTE),
    _from_ms("v100", "bert-base", "fp32", _XLA, {1: 5.23, 8: 18.73, 32: 66.11, 64: 133.61, 128: 253.90},
             SOURCES["ft21"] + "; V100 FP32 TensorFlow table, TF (ms) column", "the 12-layer encoder stack only"),
    _from_ms("v100", "bert-base", "fp32", _XLA, {1: 3.97, 8: 16.98, 32: 62.98},
             SOURCES["ft5"] + "; V100 TensorFlow Performance on FP32, TF Latency (ms)", "the 12-layer encoder stack only"),
    _from_throughput("v100", "bert-base", "fp32", _TF, {1: 174.48, 2: 263.67, 4: 349.34, 8: 422.88},
                     SOURCES["dle-tf"] + "; rows 'base, 128, fp32'", _TF_NOTE),
    _from_ms("v100", "bert-base", "fp32", _EAGER, {1: 17.26, 8: 18.60, 32: 66.40, 64: 130.69, 128: 257.29},
             SOURCES["ft21"] + "; V100 FP32 table, PyTorch (ms) column",
             "host-bound at small batches (17.26 ms at batch 1 but 12.25 ms for 32 tokens); not in the band"),
    _from_ms("v100", "bert-base", "fp16", _TS, {1: 6.99, 8: 6.83, 32: 20.20},
             SOURCES["ft5"] + "; V100 Performance on FP16, TorchScript Latency (ms)", _TS_NOTE),
    _from_ms("v100", "bert-base", "fp16", _XLA, {1: 3.59, 8: 7.16, 32: 20.62, 64: 36.25, 128: 68.84},
             SOURCES["ft21"] + "; V100 FP16 TensorFlow table, TF (ms) column", "the 12-layer encoder stack only"),
    _from_throughput("v100", "bert-base", "fp16", _TF, {1: 206.82, 2: 376.75, 4: 635.0, 8: 962.83},
                     SOURCES["dle-tf"] + "; rows 'base, 128, fp16'", _TF_NOTE),
    _from_ms("t4", "bert-base", "fp32", _TS, {1: 11.45, 8: 53.91, 32: 203.04},
             SOURCES["ft5"] + "; T4 Performance on FP32, TorchScript Latency (ms)", _TS_NOTE),
    _from_ms("t4", "bert-base", "fp16", _TS, {1: 10.51, 8: 13.41, 32: 54.28},
             SOURCES["ft5"] + "; T4 Performance on FP16, TorchScript Latency (ms)", _TS_NOTE),
)
"""Other published curves for a GPU that :data:`CURVES` already covers: cross-checks and the band's basis."""

BAND_SOURCES: tuple[BatchCurve, ...] = tuple(c for c in ALTERNATES if c.key == V100_FP32.key
                                             and c.framework != _EAGER)
"""The V100 fp32 BERT-base curves, other than the one used, that :data:`BAND_FRACTION` compares with."""


def rise_disagreement(reference: BatchCurve, others: Iterable[BatchCurve]) -> float:
    """The largest ``|rise_other / rise_reference - 1|`` over the batches above 1 that two curves share, where
    a curve's rise at batch b is its seconds at b less its seconds at batch 1."""
    worst = 0.0
    base = reference.points[1]
    for other in others:
        for b in set(reference.points) & set(other.points) - {1}:
            worst = max(worst, abs((other.points[b] - other.points[1]) / (reference.points[b] - base) - 1))
    return worst


BAND_FRACTION = rise_disagreement(V100_FP32, BAND_SOURCES)
"""How far the rise above batch 1 may be off, as a fraction: the sources' largest disagreement (about 0.121)."""


def curve(gpu: str, model: str = "bert-base", precision: str = DEFAULT_PRECISION) -> BatchCurve:
    """The curve of :data:`CURVES` for ``gpu``, ``model`` and ``precision``; a :class:`WorkbenchError` names
    the known ones otherwise."""
    if model not in MODEL_LAYERS:
        raise UnknownNameError("model", model, MODEL_LAYERS)
    gpus = {g for g, m, _ in CURVES if m == model}
    if gpu not in gpus:
        raise UnknownNameError(f"GPU with a {model} curve", gpu, gpus)
    if (gpu, model, precision) not in CURVES:
        have = [p for g, m, p in CURVES if g == gpu and m == model]
        raise WorkbenchError(f"no {precision!r} curve of {model} on the {gpu}; its precisions: {', '.join(have)}")
    return CURVES[gpu, model, precision]


def batch_latency_s(gpu: str, batch: float, model: str = "bert-base", precision: str = DEFAULT_PRECISION) -> float:
    """Seconds for one forward pass of the whole ``model`` over ``batch`` sequences of 128 tokens on ``gpu``
    (1 <= batch <= :data:`MAX_BATCH`): published figures, log-log between them, linear beyond the last."""
    return curve(gpu, model, precision).seconds(batch)


def layer_latency_s(gpu: str, batch: float, model: str = "bert-base", precision: str = DEFAULT_PRECISION) -> float:
    """Seconds per encoder layer: :func:`batch_latency_s` over the model's layer count (12 or 24)."""
    c = curve(gpu, model, precision)
    return c.seconds(batch) / c.num_layers


def saturation_band(gpu: str, batch: float, model: str = "bert-base",
                    precision: str = DEFAULT_PRECISION) -> tuple[float, float]:
    """``(low_s, high_s)`` around :func:`batch_latency_s`: the batch-1 time plus the curve's rise above it
    times ``1 - BAND_FRACTION`` and ``1 + BAND_FRACTION``. No width at batch 1."""
    c = curve(gpu, model, precision)
    t1, t = c.seconds(1), c.seconds(batch)
    rise = t - t1
    return t1 + rise * (1 - BAND_FRACTION), t1 + rise * (1 + BAND_FRACTION)


def gpus(model: str = "bert-base", precision: str = DEFAULT_PRECISION) -> list[str]:
    """The GPU types with a curve of ``model`` at ``precision``."""
    return sorted(g for g, m, p in CURVES if m == model and p == precision)
