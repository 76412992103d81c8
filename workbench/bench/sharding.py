"""`workbench bench sharding`: what the shard store costs and keeps, and how fast shards decompress.

Tables:
- ``storage``: per bitwidth, bytes per shard and the ratio to fp32, relative Frobenius
  quantization error, outlier fraction, and whole-model dev accuracy of the prepared
  task model with every shard at that bitwidth (32 = the unquantized model).
- ``decompress``: GB/s of float32 output when decompressing one whole layer (all M
  shards) for a BERT-base-sized layer (synthetic Gaussian weights with heavy tails,
  quantized by GOBO) and for the shipped model's layer 0 (its real store blobs):
  the Cython kernel on 1 and 2 threads, the NumPy reference, and a plain copy of the
  same number of output bytes (the memory ceiling); best of ``--repeats`` runs.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

BERT_BASE = {"d": 768, "d_ff": 3072, "M": 12}


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _layer_blobs_bert(bits: int, rng: np.random.Generator):
    """One synthetic BERT-base layer quantized at ``bits``: M (packed, centroids, pos, val, count) parts."""
    from workbench.elastic.quantize import gobo_quantize

    d, f, m = BERT_BASE["d"], BERT_BASE["d_ff"], BERT_BASE["M"]
    per_shard = 4 * d * (d // m) + 2 * d * (f // m)
    weights = (rng.standard_t(6, size=per_shard * m) * 0.04).astype(np.float32)
    q = gobo_quantize(weights, bits)
    parts = []
    for i in range(m):
        s = q.select(i * per_shard, (i + 1) * per_shard)
        parts.append((s.packed(), s.centroids, s.outlier_pos, s.outlier_val, per_shard))
    return parts


def _layer_blobs_store(store, bits: int):
    from workbench.bitpack import packed_nbytes

    parts = []
    n = store.shard_params
    for i in range(store.cfg.num_heads):
        raw = np.frombuffer(store.read_blob(0, i, bits), np.uint8)
        p, c = packed_nbytes(n, bits), 4 * (1 << bits)
        k = (raw.size - p - c) // 8
        parts.append((raw[:p], raw[p:p + c].view(np.float32), raw[p + c:p + c + 4 * k].view(np.int32).astype(np.int64),
                      raw[p + c + 4 * k:].view(np.float32), n))
    return parts


def _throughput(label: str, bits: int, parts, repeats: int) -> dict:
    from workbench.bitpack import decompress, decompress_reference

    total = sum(p[-1] for p in parts)
    out = np.empty(total, np.float32)
    src = np.ones(total, np.float32)
    offsets = np.cumsum([0] + [p[-1] for p in parts])

    def cython(threads):
        def run():
            for (packed, cen, pos, val, n), o in zip(parts, offsets):
                decompress(packed, bits, cen, pos, val, out[o:o + n], num_threads=threads)
        return run

    def reference():
        for (packed, cen, pos, val, n), o in zip(parts, offsets):
            out[o:o + n] = decompress_reference(packed, bits, cen, pos, val, n)

    gbs = lambda fn, r: total * 4 / _best(fn, r) / 1e9
    c1, c2 = gbs(cython(1), repeats), gbs(cython(2), repeats)
    ref = gbs(reference, max(2, repeats // 3))
    copy = gbs(lambda: np.copyto(out, src), repeats)
    return {"layer": label, "bits": bits, "MB_out": total * 4 / 1e6, "cython_1t_GBps": c1, "cython_2t_GBps": c2,
            "numpy_GBps": ref, "copy_GBps": copy, "2t_vs_numpy": c2 / ref, "2t_vs_copy": c2 / copy}


def storage_rows(task: str, preset: str, eval_size: int | None, progress: bool) -> list[dict]:
    from workbench.data import load_task, task_spec
    from workbench.train.evaluate import evaluate
    from workbench.elastic.quantize import gobo_quantize, outlier_mask, relative_error
    from workbench.elastic.artifacts import prepare_store
    from workbench.elastic.store import FP32, _shard_flat

    store = prepare_store(task, preset, progress=progress)
    cfg = store.cfg
    dev = load_task(task).dev
    dev = dev if eval_size is None else dev.sample(min(eval_size, len(dev)), 0)
    fp32_model = store.model_with_bits(np.full((cfg.num_layers, cfg.num_heads), FP32))
    layers = [np.concatenate([_shard_flat(fp32_model.layers[n].shard(i)) for i in range(cfg.num_heads)])
              for n in range(cfg.num_layers)]
    masks = [outlier_mask(w) for w in layers]
    fp32_bytes = store.shard_nbytes(FP32)
    rows = []
    for bits in store.bitwidths:
        nbytes = np.mean([store.entry(n, i, bits).nbytes for n in range(cfg.num_layers) for i in range(cfg.num_heads)])
        if bits == FP32:
            err = 0.0
        else:
            err = float(np.mean([relative_error(w, gobo_quantize(w, bits, outliers=mk).dequantize())
                                 for w, mk in zip(layers, masks)]))
        model = store.model_with_bits(np.full((cfg.num_layers, cfg.num_heads), bits))
        acc = evaluate(model, dev, task_spec(task).max_length)
        rows.append({"task": task, "bits": bits, "shard_KB": nbytes / 1e3, "fp32_over_k": fp32_bytes / nbytes,
                     "rel_error": err, "outliers_pct": 100 * store.outlier_fraction(), "dev_acc": acc,
                     "dev_examples": len(dev)})
        if progress:
            print(f"  {bits:>2}-bit: dev accuracy {100 * acc:.1f}%", flush=True)
    return rows


def run(args: list[str]) -> dict[str, list[dict]]:
    from workbench.bitpack import default_threads
    from workbench.elastic.artifacts import prepare_store
    from workbench.presets import add_preset_argument

    parser = argparse.ArgumentParser(prog="workbench bench sharding")
    parser.add_argument("--task", default="sentiment")
    add_preset_argument(parser)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--eval-size", type=int, help="dev examples for the accuracy column (default: the whole split)")
    parser.add_argument("--skip-accuracy", action="store_true")
    opts = parser.parse_args(args)
    print(f"cores available: {default_threads()}")
    tables = {}
    if not opts.skip_accuracy:
        tables["storage"] = storage_rows(opts.task, opts.preset, opts.eval_size, progress=True)
    store = prepare_store(opts.task, opts.preset, progress=True)
    rng = np.random.default_rng(0)
    rows = []
    for bits in (2, 3, 4, 5, 6):
        rows.append(_throughput("bert-base", bits, _layer_blobs_bert(bits, rng), opts.repeats))
        rows.append(_throughput(f"{opts.task}-minilm", bits, _layer_blobs_store(store, bits), opts.repeats))
    tables["decompress"] = rows
    return tables
