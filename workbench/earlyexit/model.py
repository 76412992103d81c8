"""An early-exit encoder (DeeBERT style): the shipped encoder with an exit ramp after every layer.

A ramp is pooling over the real tokens, a pooler (linear + tanh), dropout and a linear classifier. DeeBERT's
pooler reads the first token; ours means over the real tokens, because the shipped encoder (all-MiniLM-L6-v2)
was trained as a mean-pooling sentence encoder and its first token carries no summary. A
sample leaves at the first *enabled* ramp whose prediction has entropy below the threshold; the last
ramp is the model's own classifier and takes everyone left. Disabling ramps (E3 §3.4) skips the ramps
inside a split that nothing should leave by: those samples ride on to the split's end.

The model is cut into splits for serving: :meth:`EarlyExitModel.run_split` runs layers ``start..end-1``
on a batch of hidden states and returns who left where with which label, and the survivors. Running
the whole model through one split, or through any cut into splits, gives the same exits: that is what
:meth:`EarlyExitModel.forward` does in one process and what the served pipeline must reproduce.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch
from torch import nn

from workbench.earlyexit.record import DEFAULT_THRESHOLD, check_threshold
from workbench.errors import WorkbenchError
from workbench.models.encoder import Encoder, EncoderConfig

class ExitRamp(nn.Module):
    """Mean pooling over real tokens, pooler (linear + tanh), dropout, linear classifier."""

    def __init__(self, hidden: int, num_classes: int, dropout: float = 0.1):
        super().__init__()
        self.pooler = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pooled = torch.tanh(self.pooler(Encoder.pool(x, mask)))
        return self.classifier(self.dropout(pooled))


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of the softmax of each row."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


@dataclass(frozen=True)
class SplitOutput:
    """What one split did to a batch: the rows that left (their index in the batch, layer, label, logits)
    and the survivors' hidden states and masks, in batch order."""
    exited: np.ndarray            # (e,) row indices into the input batch
    exit_layers: np.ndarray       # (e,) the layer whose ramp each left by
    labels: np.ndarray            # (e,) predicted class
    logits: torch.Tensor          # (e, classes)
    survivors: np.ndarray         # (s,) row indices into the input batch
    hidden: torch.Tensor          # (s, T, d)
    mask: torch.Tensor            # (s, T)
    layer_rows: tuple[int, ...]   # rows each layer of the split ran on (the shrinking batch)


@dataclass(frozen=True)
class ExitOutput:
    """The whole model on a batch: per row, the layer it left by, its label and logits."""
    exit_layers: np.ndarray
    labels: np.ndarray
    logits: torch.Tensor


class EarlyExitModel(nn.Module):
    """The encoder's embeddings and layers, and one :class:`ExitRamp` per layer (the last is the classifier).

    ``threshold`` and ``disabled`` (ramp indices, never the last) set who exits where; both may be changed
    between calls. ``forward`` and :meth:`run_split` are inference only (no grad, ramps in eval mode)."""

    def __init__(self, cfg: EncoderConfig, num_classes: int, threshold: float = DEFAULT_THRESHOLD,
                 disabled: Iterable[int] = ()):
        super().__init__()
        self.cfg = cfg
        self.num_classes = num_classes
        self.encoder = Encoder(cfg, num_classes=0)
        self.ramps = nn.ModuleList(ExitRamp(cfg.hidden, num_classes) for _ in range(cfg.num_layers))
        self.threshold = check_threshold(threshold)
        self.disabled = self.check_disabled(disabled)

    @property
    def num_layers(self) -> int:
        return self.cfg.num_layers

    def check_disabled(self, disabled: Iterable[int]) -> frozenset[int]:
        ramps = frozenset(int(k) for k in disabled)
        bad = sorted(k for k in ramps if not 0 <= k < self.num_layers - 1)
        if bad:
            raise WorkbenchError(f"ramps {bad} cannot be disabled: ramps 0..{self.num_layers - 2} can "
                                 f"(the last one, {self.num_layers - 1}, is the model's classifier)")
        return ramps

    def configure(self, threshold: float | None = None, disabled: Iterable[int] | None = None) -> EarlyExitModel:
        """Set the threshold and/or the disabled ramps; returns the model."""
        if threshold is not None:
            self.threshold = check_threshold(threshold)
        if disabled is not None:
            self.disabled = self.check_disabled(disabled)
        return self

    def embed(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.encoder.embed(ids)

    @torch.no_grad()
    def run_split(self, hidden: torch.Tensor, mask: torch.Tensor, start: int, end: int) -> SplitOutput:
        """Layers ``start..end-1`` on ``hidden`` (B, T, d): rows leave at enabled ramps whose entropy is
        below the threshold, or at the last layer of the model; the rest come back as survivors."""
        if not 0 <= start < end <= self.num_layers:
            raise WorkbenchError(f"a split is layers start..end-1 with 0 <= start < end <= {self.num_layers}; "
                                 f"got ({start}, {end})")
        self.eval()
        alive = np.arange(hidden.shape[0])
        x, m = hidden, mask
        exited, layers, labels, logits, rows = [], [], [], [], []
        for k in range(start, end):
            if len(alive) == 0:
                rows.append(0)
                continue
            rows.append(len(alive))
            x = self.encoder.layers[k](x, Encoder.attn_bias(m))
            last = k == self.num_layers - 1
            if not last and (k in self.disabled or self.threshold == 0):
                continue
            out = self.ramps[k](x, m)
            leave = torch.ones(len(alive), dtype=torch.bool) if last else entropy(out) < self.threshold
            if bool(leave.any()):
                sel = leave.numpy()
                exited.append(alive[sel])
                layers.append(np.full(int(sel.sum()), k))
                labels.append(out[leave].argmax(-1).numpy())
                logits.append(out[leave])
                keep = ~leave
                alive, x, m = alive[keep.numpy()], x[keep], m[keep]
        width = self.num_classes
        cat = (lambda parts, dtype: np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype))
        return SplitOutput(exited=cat(exited, np.int64), exit_layers=cat(layers, np.int64),
                           labels=cat(labels, np.int64),
                           logits=torch.cat(logits) if logits else torch.zeros(0, width),
                           survivors=alive, hidden=x, mask=m, layer_rows=tuple(rows))

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, mask: torch.Tensor,
                splits: Sequence[tuple[int, int]] | None = None) -> ExitOutput:
        """Every row through the model (cut into ``splits`` if given: the result is the same)."""
        splits = splits or [(0, self.num_layers)]
        n = ids.shape[0]
        exit_layers = np.full(n, -1, dtype=np.int64)
        labels = np.full(n, -1, dtype=np.int64)
        logits = torch.zeros(n, self.num_classes)
        rows = np.arange(n)
        x, m = self.embed(ids, mask), mask
        for start, end in splits:
            out = self.run_split(x, m, start, end)
            done = rows[out.exited]
            exit_layers[done], labels[done] = out.exit_layers, out.labels
            logits[torch.as_tensor(done)] = out.logits
            rows, x, m = rows[out.survivors], out.hidden, out.mask
        return ExitOutput(exit_layers=exit_layers, labels=labels, logits=logits)

    @torch.no_grad()
    def ramp_entropies(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Every ramp on every row, nobody leaving: (entropy (L, B), predicted label (L, B)).

        Exits for any threshold and any disabled set follow from these without running the model again
        (:func:`exits_from_entropies`)."""
        self.eval()
        x, bias = self.embed(ids, mask), Encoder.attn_bias(mask)
        ents, preds = [], []
        for k in range(self.num_layers):
            x = self.encoder.layers[k](x, bias)
            out = self.ramps[k](x, mask)
            ents.append(entropy(out).numpy())
            preds.append(out.argmax(-1).numpy())
        return np.stack(ents), np.stack(preds)


def untrained_model(num_classes: int = 2, seed: int = 0, threshold: float = DEFAULT_THRESHOLD) -> EarlyExitModel:
    """The shipped pretrained encoder with ramps drawn from ``seed`` (for tests of exactness, which hold for
    any weights; trained ramps come from :func:`workbench.earlyexit.artifacts.prepare_model`)."""
    from workbench.models.encoder import load_pretrained_encoder

    encoder = load_pretrained_encoder(0)
    torch.manual_seed(seed)
    model = EarlyExitModel(encoder.cfg, num_classes, threshold=threshold)
    model.encoder.load_state_dict(encoder.state_dict())
    model.requires_grad_(False)
    return model.eval()
