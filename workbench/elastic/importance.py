"""Shard importance by ablation (WRX section 5.2).

Every shard of the full N x M model is set to the lowest bitwidth; then, one shard
at a time, that shard is raised to 32 bits and the model is evaluated on a dev
subset. A shard's importance is the accuracy it buys back (ties broken by the mean
loss). Layers below the raised shard compute exactly as in the all-low model, so
their outputs are computed once and reused: each ablation runs only from its own
layer upwards.

Results are cached by (store version, task, dev subset, bitwidths); progress is
saved after every layer, so an interrupted run resumes where it stopped.
"""
from __future__ import annotations

import json
from pathlib import Path
from dataclasses import dataclass

import numpy as np

from workbench.cache import write_json
from workbench.data import Split
from workbench.elastic.store import ShardStore
from workbench.progress import ProgressBar


@dataclass(frozen=True)
class ShardImportance:
    accuracy: np.ndarray          # (N, M): dev accuracy with shard (n, i) at high_bits, all others at low_bits
    loss: np.ndarray              # (N, M): mean cross-entropy of the same runs
    baseline_accuracy: float      # every shard at low_bits
    low_bits: int
    high_bits: int
    dev_examples: int

    def order(self) -> list[tuple[int, int]]:
        """Every shard from most to least important (:func:`importance_order`, equal accuracy: lower loss first)."""
        num_layers, num_shards = self.accuracy.shape
        return importance_order(self.accuracy, num_layers, num_shards, tie_break=self.loss)


def importance_order(importance, num_layers: int, num_shards: int, tie_break=None) -> list[tuple[int, int]]:
    """The ``(layer, shard)`` pairs of the first ``num_layers`` x ``num_shards`` shards, most important first.

    The one order of the project (the planner's upgrade pass, the Table 7 study,
    :meth:`ShardImportance.order`): ``importance`` descending; equal importance is
    broken by ``tie_break`` ascending when given (an array of the same shape, e.g. the
    ablation's loss, where lower is better), then by layer and shard ascending, so the
    order never depends on sorting details. Raises ValueError on a matrix too small or
    holding non-finite values.
    """
    keys = [np.asarray(importance, dtype=float)]
    if tie_break is not None:
        keys.append(np.asarray(tie_break, dtype=float))
    for name, matrix in zip(("importance", "tie_break"), keys):
        if matrix.ndim != 2 or matrix.shape[0] < num_layers or matrix.shape[1] < num_shards:
            raise ValueError(f"{name} must be a 2-D array with at least {num_layers} rows and {num_shards} "
                             f"columns, got shape {matrix.shape}")
        if not np.isfinite(matrix[:num_layers, :num_shards]).all():
            raise ValueError(f"{name} holds non-finite values")
    primary, secondary = keys[0], (keys[1] if len(keys) > 1 else None)
    shards = [(layer, shard) for layer in range(num_layers) for shard in range(num_shards)]
    return sorted(shards, key=lambda ls: (-primary[ls], 0.0 if secondary is None else secondary[ls], ls))


class _Runner:
    """Runs the store's model with per-shard bitwidths, reusing lower layers' outputs."""

    def __init__(self, store: ShardStore, low_bits: int, high_bits: int):
        cfg = store.cfg
        self.store, self.cfg = store, cfg
        self.low_model = store.model_with_bits(np.full((cfg.num_layers, cfg.num_heads), low_bits))
        self.resident = [self.low_model.layers[n].resident() for n in range(cfg.num_layers)]
        self.biases = [[self.low_model.layers[n].shard_biases(i) for i in range(cfg.num_heads)]
                       for n in range(cfg.num_layers)]
        self.low = [[store.shard_weights(n, i, low_bits) for i in range(cfg.num_heads)] for n in range(cfg.num_layers)]
        self.high_bits = high_bits

    def parts(self, n: int, raised: int | None = None) -> dict:
        from workbench.models.encoder import stack_shards

        shards = list(self.low[n])
        if raised is not None:
            shards[raised] = self.store.shard_weights(n, raised, self.high_bits)
        return stack_shards(shards, self.biases[n])

    def layer(self, x, bias, n, parts):
        from workbench.models.encoder import sharded_layer

        return sharded_layer(x, bias, self.resident[n], parts, self.cfg.head_dim, self.cfg.layer_norm_eps)


def _from_record(done: dict, num_layers: int, low_bits: int, high_bits: int, dev_examples: int) -> ShardImportance:
    acc = np.array([[a for a, _ in done[str(n)]] for n in range(num_layers)])
    loss = np.array([[l for _, l in done[str(n)]] for n in range(num_layers)])
    return ShardImportance(acc, loss, done["baseline"], low_bits, high_bits, dev_examples)


def measure_importance(store: ShardStore, dev: Split, max_length: int, low_bits: int | None = None,
                       high_bits: int = 32, batch_size: int = 64, resume_path: Path | None = None,
                       progress: bool = True) -> ShardImportance:
    """Run (or resume) the ablation over every shard of ``store`` on ``dev``.

    With ``resume_path``, each finished layer (and the all-low baseline) is saved there,
    so an interrupted run resumes at the next layer, and a finished one is read back
    without loading the model at all.
    """
    low_bits = min(b for b in store.bitwidths) if low_bits is None else low_bits
    N = store.cfg.num_layers
    done = json.loads(resume_path.read_text()) if resume_path is not None and resume_path.exists() else {}
    if "baseline" in done and all(str(n) in done for n in range(N)):
        return _from_record(done, N, low_bits, high_bits, len(dev))
    done = _ablate(store, dev, max_length, low_bits, high_bits, batch_size, resume_path, done, progress)
    return _from_record(done, N, low_bits, high_bits, len(dev))


def _ablate(store, dev, max_length, low_bits, high_bits, batch_size, resume_path, done, progress) -> dict:
    import torch
    import torch.nn.functional as F

    from workbench.models.tokenizer import encoder_tokenizer

    N, M = store.cfg.num_layers, store.cfg.num_heads
    with torch.no_grad():
        runner = _Runner(store, low_bits, high_bits)
        model = runner.low_model
        tok = encoder_tokenizer(max_length)
        by_length = sorted(range(len(dev)), key=lambda j: (len(dev.texts[j]), j))     # less padding per batch
        batches = []
        for s in range(0, len(dev), batch_size):
            rows = by_length[s:s + batch_size]
            ids, mask = tok([dev.texts[j] for j in rows])
            batches.append((model.embed(ids), model.attn_bias(mask), mask, torch.from_numpy(dev.labels[rows])))
        low_parts = [runner.parts(n) for n in range(N)]
        inputs = [[x for x, *_ in batches]]                 # inputs[n][b]: layer n's input in the all-low model
        for n in range(N):
            inputs.append([runner.layer(x, bias, n, low_parts[n]) for x, (_, bias, *_r) in zip(inputs[n], batches)])

        def evaluate(start: int, first_out: list) -> tuple[float, float]:
            correct, loss = 0, 0.0
            for b, (_, bias, mask, y) in enumerate(batches):
                x = first_out[b]
                for n in range(start + 1, N):
                    x = runner.layer(x, bias, n, low_parts[n])
                logits = model.classify(x, mask)
                correct += int((logits.argmax(-1) == y).sum())
                loss += float(F.cross_entropy(logits, y, reduction="sum"))
            return correct / len(dev), loss / len(dev)

        done["baseline"] = evaluate(N - 1, inputs[N])[0]
        bar = ProgressBar(total=N * M, desc="shard importance", enabled=progress)
        for n in range(N):
            if str(n) in done:
                bar.update(M)
                continue
            row = []
            for i in range(M):
                parts = runner.parts(n, raised=i)
                out = [runner.layer(x, bias, n, parts) for x, (_, bias, *_r) in zip(inputs[n], batches)]
                row.append(evaluate(n, out))
                bar.update(1)
            done[str(n)] = row
            if resume_path is not None:
                write_json(resume_path, done)               # resume point
        bar.close()
    if resume_path is not None:
        write_json(resume_path, done)
    return done


def profile_importance(store: ShardStore, dev: Split, max_length: int, **kwargs) -> np.ndarray:
    """The (N, M) importance matrix: dev accuracy with that one shard raised to 32 bits (higher = more important)."""
    return measure_importance(store, dev, max_length, **kwargs).accuracy


def ranking_agreement(a: ShardImportance, b: ShardImportance, top: float = 0.25) -> dict[str, float]:
    """How far two profiles (e.g. two dev-subset seeds) agree: rank correlations and top-shard overlap."""
    from scipy.stats import spearmanr

    if a.accuracy.shape != b.accuracy.shape:
        raise ValueError(f"profiles of different shapes: {a.accuracy.shape} vs {b.accuracy.shape}")
    k = max(1, int(round(top * a.accuracy.size)))
    top_a, top_b = set(a.order()[:k]), set(b.order()[:k])
    return {"spearman_accuracy": float(spearmanr(a.accuracy.ravel(), b.accuracy.ravel()).statistic),
            "spearman_loss": float(spearmanr(a.loss.ravel(), b.loss.ravel()).statistic),
            "top_overlap": len(top_a & top_b) / k, "top_k": k}
