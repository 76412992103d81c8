"""The models a split run executes (Voltage, tensor parallelism, Hepti): the shipped encoder and decoder, or
random layers of the paper's shapes.

:class:`PartitionModel` gives the runtime one interface over both architectures: embed the input,
compute rows of a layer (Voltage), one device's tensor-parallel partial sums and how a block ends,
the logits, and the whole model in one process (the reference every scheme must equal). Random
shapes draw their weights from a seed, so every rank builds the same model without reading a file.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import torch

from workbench.models import slices as L
from workbench.models.shapes import ModelShape, get_shape

NUM_CLASSES = 4
"""The encoder's classification head: freshly drawn from the seed (exactness holds for any weights)."""


class PartitionModel:
    def __init__(self, shape: ModelShape | str, seed: int = 0):
        self.shape = get_shape(shape) if isinstance(shape, str) else shape
        self.seed = seed
        torch.manual_seed(seed)
        if self.shape.kind == "decoder":
            from workbench.models.decoder import load_decoder

            self.net = load_decoder()
        elif self.shape.shipped:
            from workbench.models.encoder import load_pretrained_encoder

            self.net = load_pretrained_encoder(NUM_CLASSES).eval()
        else:
            from workbench.models.encoder import Encoder, EncoderConfig

            cfg = EncoderConfig(hidden=self.shape.hidden, num_heads=self.shape.heads, ffn=self.shape.ffn,
                                num_layers=self.shape.num_layers)
            self.net = Encoder(cfg, NUM_CLASSES).eval()
        self.layers = self.net.layers

    @property
    def vocab_size(self) -> int:
        return self.net.cfg.vocab_size

    def token_ids(self, seq_len: int, seed: int) -> torch.Tensor:
        """``seq_len`` token ids drawn from ``seed`` (the same on every rank)."""
        return token_ids(self.vocab_size, seq_len, seed)

    @torch.no_grad()
    def inputs(self, ids: torch.Tensor) -> dict:
        """What every rank starts from: the embedded input ``x`` and the masks or positions its layers need."""
        N = ids.shape[0]
        if self.shape.kind == "decoder":
            return {"x": self.net.embed(ids), "positions": torch.arange(N)}
        bias = L.causal_bias(0, N, N) if self.shape.causal else None
        return {"x": self.net.embed(ids[None]), "mask": torch.ones(1, N), "bias": bias}

    def rows(self, layer: int, x: torch.Tensor, start: int, end: int, orders: str | Sequence[str],
             inputs: dict) -> torch.Tensor:
        """Rows start:end of layer ``layer``'s output (Algorithm 1)."""
        if self.shape.kind == "decoder":
            return L.partitioned_decoder_layer(self.layers[layer], x, start, end, inputs["positions"])
        if isinstance(orders, str) and orders not in ("auto", "qk_first", "x_first"):
            orders = "auto"
        return L.partitioned_layer(self.layers[layer], x, start, end, orders, causal=self.shape.causal)

    def tp_attention(self, layer: int, x: torch.Tensor, heads: Sequence[int], inputs: dict) -> torch.Tensor:
        return L.tensor_parallel_attention(self.layers[layer], x, list(heads), inputs.get("bias"))

    def tp_ffn(self, layer: int, h: torch.Tensor, columns: slice) -> torch.Tensor:
        return L.tensor_parallel_ffn(self.layers[layer], h, columns)

    def finish_attention(self, layer: int, x: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        return L.finish_attention(self.layers[layer], x, projected)

    def finish_ffn(self, layer: int, h: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        return L.finish_ffn(self.layers[layer], h, projected)

    @torch.no_grad()
    def logits(self, x: torch.Tensor, inputs: dict) -> torch.Tensor:
        """The encoder's class logits (mean pooling, head), or the decoder's next-token logits at the last position."""
        if self.shape.kind == "decoder":
            return self.net.logits(x[-1:])[0]
        return self.net.classify(x, inputs["mask"])[0]

    @torch.no_grad()
    def reference(self, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Final hidden states and logits of the whole model in this process, through the models' own forward."""
        x = inputs["x"]
        if self.shape.kind == "decoder":
            positions = inputs["positions"]
            for layer in self.layers:
                k, v = layer.project_kv(x, positions)
                x = layer(x, positions, k, v, positions)
        else:
            for layer in self.layers:
                x = layer(x, inputs.get("bias"))
        return x, self.logits(x, inputs)


def token_ids(vocab_size: int, seq_len: int, seed: int) -> torch.Tensor:
    """``seq_len`` token ids drawn from ``seed`` out of a vocabulary's ids from 1000 (past the special tokens)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1000, vocab_size, (seq_len,), generator=g)


@lru_cache(maxsize=4)
def cached_model(name: str, seed: int = 0) -> PartitionModel:
    """One model per (name, seed) per process: a worker keeps its weights between runs."""
    return PartitionModel(name, seed)
