"""A BERT-style encoder whose layers run any subset of their shards.

A *shard* (WRX, Table 1) is one vertical slice of a layer: attention head i
(its Q, K, V output columns and its rows of the output projection O) plus the
FFN neurons i*d_ff/M .. (i+1)*d_ff/M (rows of FFN1, columns of FFN2). LayerNorms
and all biases but FFN1's stay resident at full precision; FFN1's bias follows
its neurons. A layer that runs shards S computes exactly what the full layer
computes with every other head and neuron removed (no rescaling, as DynaBERT).

Weights use torch's Linear layout ``[out_features, in_features]``: head i's Q
weights are rows ``i*dh:(i+1)*dh`` of ``query.weight``; its O weights are the
columns ``i*dh:(i+1)*dh`` of ``attn_out.weight``.

The functional core, :func:`sharded_layer`, takes the selected shards' weights
already stacked, so the same code runs the trainable module, a subset of its
shards, and shards decompressed from disk by the elastic pipeline.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from workbench.models.config import SHARD_KEYS, EncoderConfig  # noqa: F401  (re-exported: public here)


def sharded_layer(x: torch.Tensor, attn_bias: torch.Tensor | None, resident: dict, parts: dict,
                  head_dim: int, eps: float) -> torch.Tensor:
    """One post-LN transformer layer from stacked shard weights.

    x: (B, T, d); attn_bias: (B, 1, 1, T) additive mask or None.
    resident: ``ln1_w, ln1_b, ln2_w, ln2_b, o_b, ffn2_b`` (full precision, always in memory).
    parts: ``q, k, v`` (m*dh, d), ``q_b, k_b, v_b`` (m*dh,), ``o`` (d, m*dh),
    ``ffn1`` (m*f, d), ``ffn1_b`` (m*f,), ``ffn2`` (d, m*f) for the m selected shards.
    """
    B, T, _ = x.shape
    m = parts["q"].shape[0] // head_dim
    q = F.linear(x, parts["q"], parts["q_b"]).view(B, T, m, head_dim).transpose(1, 2)  # (B, m, T, dh)
    k = F.linear(x, parts["k"], parts["k_b"]).view(B, T, m, head_dim).transpose(1, 2)
    v = F.linear(x, parts["v"], parts["v_b"]).view(B, T, m, head_dim).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)                             # (B, m, T, T)
    if attn_bias is not None:
        scores = scores + attn_bias
    ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, m * head_dim)
    h = F.layer_norm(x + F.linear(ctx, parts["o"], resident["o_b"]), (x.shape[-1],),
                     resident["ln1_w"], resident["ln1_b"], eps)
    inner = F.gelu(F.linear(h, parts["ffn1"], parts["ffn1_b"]))                        # (B, T, m*f)
    return F.layer_norm(h + F.linear(inner, parts["ffn2"], resident["ffn2_b"]), (x.shape[-1],),
                        resident["ln2_w"], resident["ln2_b"], eps)


def stack_shards(shards: Sequence[dict], biases: Sequence[dict]) -> dict:
    """Stack per-shard weights (:data:`SHARD_KEYS`) and their bias slices into layer parts."""
    cat0 = lambda key, src: torch.cat([s[key] for s in src], 0)
    return {"q": cat0("q", shards), "k": cat0("k", shards), "v": cat0("v", shards),
            "o": torch.cat([s["o"] for s in shards], 1),
            "ffn1": cat0("ffn1", shards), "ffn2": torch.cat([s["ffn2"] for s in shards], 1),
            "q_b": cat0("q_b", biases), "k_b": cat0("k_b", biases), "v_b": cat0("v_b", biases),
            "ffn1_b": cat0("ffn1_b", biases)}


class EncoderLayer(nn.Module):
    """Trainable layer holding full weights; runs a width prefix or any shard subset."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        d, f = cfg.hidden, cfg.ffn
        self.cfg = cfg
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.attn_out = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.ffn1, self.ffn2 = nn.Linear(d, f), nn.Linear(f, d)
        self.ln2 = nn.LayerNorm(d, eps=cfg.layer_norm_eps)

    def resident(self) -> dict:
        return {"ln1_w": self.ln1.weight, "ln1_b": self.ln1.bias, "ln2_w": self.ln2.weight,
                "ln2_b": self.ln2.bias, "o_b": self.attn_out.bias, "ffn2_b": self.ffn2.bias}

    def _rows(self, shards: Sequence[int] | None) -> tuple:
        """Index objects for head rows and FFN rows: slices for a prefix, tensors otherwise."""
        dh, fs, M = self.cfg.head_dim, self.cfg.ffn_per_shard, self.cfg.num_heads
        if shards is None:
            return slice(None), slice(None)
        shards = list(shards)
        if shards == list(range(len(shards))):
            return slice(0, len(shards) * dh), slice(0, len(shards) * fs)
        if not shards or min(shards) < 0 or max(shards) >= M or len(set(shards)) != len(shards):
            raise ValueError(f"shards must be distinct indexes in 0..{M - 1}, got {shards}")
        idx = torch.tensor(shards)
        heads = (idx[:, None] * dh + torch.arange(dh)).reshape(-1)
        neurons = (idx[:, None] * fs + torch.arange(fs)).reshape(-1)
        return heads, neurons

    def parts(self, shards: Sequence[int] | None = None) -> dict:
        hr, fr = self._rows(shards)
        return {"q": self.query.weight[hr], "k": self.key.weight[hr], "v": self.value.weight[hr],
                "q_b": self.query.bias[hr], "k_b": self.key.bias[hr], "v_b": self.value.bias[hr],
                "o": self.attn_out.weight[:, hr], "ffn1": self.ffn1.weight[fr],
                "ffn1_b": self.ffn1.bias[fr], "ffn2": self.ffn2.weight[:, fr]}

    def shard(self, i: int) -> dict:
        """Shard i's weight matrices (:data:`SHARD_KEYS`), detached views of the full weights."""
        p = self.parts([i])
        return {k: p[k].detach() for k in SHARD_KEYS}

    def shard_biases(self, i: int) -> dict:
        p = self.parts([i])
        return {k: p[k].detach() for k in ("q_b", "k_b", "v_b", "ffn1_b")}

    def forward(self, x, attn_bias=None, shards: Sequence[int] | None = None):
        return sharded_layer(x, attn_bias, self.resident(), self.parts(shards),
                             self.cfg.head_dim, self.cfg.layer_norm_eps)


class Encoder(nn.Module):
    """Embeddings + N layers + mean pooling + classification head.

    ``forward(ids, mask, depth=n, width=m)`` runs the n x m submodel: the first n
    layers with shards 0..m-1 (the most important ones once the elastic
    fine-tuning has reordered them). ``shards`` gives an explicit subset instead.
    """

    def __init__(self, cfg: EncoderConfig, num_classes: int = 0):
        super().__init__()
        d = cfg.hidden
        self.cfg = cfg
        self.word = nn.Embedding(cfg.vocab_size, d)
        self.position = nn.Embedding(cfg.max_positions, d)
        self.token_type = nn.Embedding(cfg.type_vocab_size, d)
        self.ln_emb = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_layers))
        self.head = nn.Linear(d, num_classes) if num_classes else None

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.ln_emb(self.word(ids) + self.position(positions)[None] + self.token_type.weight[0])

    @staticmethod
    def attn_bias(mask: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
        """(B, T) 1/0 mask -> (B, 1, 1, T) additive bias."""
        return ((1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min)

    def hidden_states(self, ids, mask, depth: int | None = None, width: int | None = None,
                      shards: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
        depth = self.cfg.num_layers if depth is None else depth
        if not 1 <= depth <= self.cfg.num_layers:
            raise ValueError(f"depth must be in 1..{self.cfg.num_layers}, got {depth}")
        if width is not None and not 1 <= width <= self.cfg.num_heads:
            raise ValueError(f"width must be in 1..{self.cfg.num_heads}, got {width}")
        x, bias = self.embed(ids), self.attn_bias(mask)
        for n in range(depth):
            layer_shards = shards[n] if shards is not None else (range(width) if width else None)
            x = self.layers[n](x, bias, layer_shards)
        return x

    @staticmethod
    def pool(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean over real tokens: (B, T, d) -> (B, d)."""
        w = mask.to(x.dtype).unsqueeze(-1)
        return (x * w).sum(1) / w.sum(1).clamp_min(1.0)

    def classify(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.head is None:
            raise ValueError("this encoder has no classification head")
        return self.head(self.pool(x, mask))

    def forward(self, ids, mask, depth=None, width=None, shards=None):
        return self.classify(self.hidden_states(ids, mask, depth, width, shards), mask)


_HF_LAYER_KEYS = {
    "query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
    "attn_out": "attention.output.dense", "ln1": "attention.output.LayerNorm",
    "ffn1": "intermediate.dense", "ffn2": "output.dense", "ln2": "output.LayerNorm",
}


def hf_state_to_encoder(state: dict, cfg: EncoderConfig) -> dict:
    """Map a Hugging Face BertModel state dict onto :class:`Encoder` names."""
    prefix = "bert." if any(k.startswith("bert.") for k in state) else ""
    out = {
        "word.weight": state[f"{prefix}embeddings.word_embeddings.weight"],
        "position.weight": state[f"{prefix}embeddings.position_embeddings.weight"],
        "token_type.weight": state[f"{prefix}embeddings.token_type_embeddings.weight"],
        "ln_emb.weight": state[f"{prefix}embeddings.LayerNorm.weight"],
        "ln_emb.bias": state[f"{prefix}embeddings.LayerNorm.bias"],
    }
    for n in range(cfg.num_layers):
        for ours, theirs in _HF_LAYER_KEYS.items():
            for p in ("weight", "bias"):
                out[f"layers.{n}.{ours}.{p}"] = state[f"{prefix}encoder.layer.{n}.{theirs}.{p}"]
    return out


def load_pretrained_encoder(num_classes: int = 0) -> Encoder:
    """The shipped all-MiniLM-L6-v2 weights in an :class:`Encoder` (head freshly initialised)."""
    from safetensors.torch import load_file

    from workbench.assets import minilm_dir

    root = minilm_dir()
    cfg = EncoderConfig.from_hf_json(root / "config.json")
    model = Encoder(cfg, num_classes)
    missing, unexpected = model.load_state_dict(hf_state_to_encoder(load_file(root / "model.safetensors"), cfg),
                                                strict=False)
    assert not unexpected and all(k.startswith("head.") for k in missing), (missing, unexpected)
    return model
