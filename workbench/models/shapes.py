"""The sizes that set a model's cost: the shipped encoder and decoder, and the papers' shapes as random layers.

Pure Python (no torch), shared by every mechanism that splits a model's layers over devices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ModelShape:
    """The sizes that set a model's cost; the shipped models and the paper's, as random layers of their shapes."""
    name: str
    title: str
    hidden: int                     # F
    heads: int                      # H
    ffn: int                        # d_ff
    num_layers: int
    kind: Literal["encoder", "decoder"] = "encoder"
    kv_heads: int = 0               # 0: as many as heads (no grouped-query attention)
    ffn_matrices: int = 2           # 2 (BERT: in, out) or 3 (Llama: gate, up, down)
    rotary: bool = False            # keys rotated by position: Eq. (8)'s score order does not apply
    causal: bool = False
    shipped: bool = False           # the real pretrained weights (else random weights of this shape)
    max_positions: int = 512        # the longest input its position embeddings (or context) allow

    @property
    def head_dim(self) -> int:      # F_H
        return self.hidden // self.heads

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def layer_params(self) -> int:
        F, kv = self.hidden, self.num_kv_heads * self.head_dim
        return 2 * F * F + 2 * F * kv + self.ffn_matrices * F * self.ffn


SHAPES: dict[str, ModelShape] = {
    "encoder": ModelShape("encoder", "shipped encoder (all-MiniLM-L6-v2)", 384, 12, 1536, 6, shipped=True),
    "decoder": ModelShape("decoder", "shipped decoder prefill (SmolLM2-135M)", 576, 9, 1536, 30, kind="decoder",
                          kv_heads=3, ffn_matrices=3, rotary=True, causal=True, shipped=True, max_positions=8192),
    "bert-large": ModelShape("bert-large", "BERT-Large shape (random weights)", 1024, 16, 4096, 24),
    "gpt2": ModelShape("gpt2", "GPT-2 shape (random weights, causal)", 768, 12, 3072, 12, causal=True,
                       max_positions=1024),
    "vit": ModelShape("vit", "ViT-Base/16 shape (random weights; 197 patch tokens at 224 x 224)", 768, 12, 3072, 12),
}
"""Models the runtime runs: the two shipped ones and the Voltage paper's shapes."""


def get_shape(name: str) -> ModelShape:
    from workbench.errors import UnknownNameError

    if name not in SHAPES:
        raise UnknownNameError("model", name, SHAPES)
    return SHAPES[name]
