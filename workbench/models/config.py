"""The encoder's and the decoder's shapes, kept apart from torch so that planning and the dashboards' first figures
need no torch import (what a shard store's manifest and the planner read)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SHARD_KEYS = ("q", "k", "v", "o", "ffn1", "ffn2")
"""Per-shard weight matrices, in the order the shard store keeps them."""


@dataclass(frozen=True)
class EncoderConfig:
    """The shape of an encoder (MiniLM by default): sizes per layer and the number of layers and heads."""
    vocab_size: int = 30522
    hidden: int = 384            # d
    num_layers: int = 6          # N
    num_heads: int = 12          # M: one shard per head
    ffn: int = 1536              # d_ff
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def ffn_per_shard(self) -> int:
        return self.ffn // self.num_heads

    @property
    def shard_params(self) -> int:
        """Weights in one shard: 4 attention blocks of d x d/M plus 2 FFN blocks of d x d_ff/M."""
        return 4 * self.hidden * self.head_dim + 2 * self.hidden * self.ffn_per_shard

    @classmethod
    def from_hf_json(cls, path: Path) -> "EncoderConfig":
        raw = json.loads(Path(path).read_text())
        return cls(vocab_size=raw["vocab_size"], hidden=raw["hidden_size"],
                   num_layers=raw["num_hidden_layers"], num_heads=raw["num_attention_heads"],
                   ffn=raw["intermediate_size"], max_positions=raw["max_position_embeddings"],
                   type_vocab_size=raw["type_vocab_size"], layer_norm_eps=raw["layer_norm_eps"])


@dataclass(frozen=True)
class DecoderConfig:
    """The shape of the decoder (SmolLM2-135M by default), as its converted config.json records it."""
    vocab_size: int = 49152
    hidden: int = 576
    num_layers: int = 30
    num_heads: int = 9
    num_kv_heads: int = 3
    ffn: int = 1536
    rope_theta: float = 100000.0
    rms_eps: float = 1e-5
    max_positions: int = 8192
    bos_id: int = 1
    eos_id: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads


def shipped_decoder_config() -> DecoderConfig:
    """The shipped decoder's shape without torch or its weights: its converted config.json where the cache
    has it, else the defaults above (SmolLM2-135M's own); commands read their bounds from it."""
    from workbench.assets import converted_decoder_path

    try:
        return DecoderConfig(**json.loads((converted_decoder_path(create=False) / "config.json").read_text()))
    except (OSError, ValueError, TypeError):
        return DecoderConfig()
