"""Tokenizers for the shipped models, built with the `tokenizers` library from packaged files."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Sequence

import torch
from tokenizers import Tokenizer


class EncoderTokenizer:
    """WordPiece tokenizer of the encoder; batches are padded to their longest member."""

    def __init__(self, path: Path, max_length: int = 128):
        self.tok = Tokenizer.from_file(str(path))
        self.tok.no_padding()
        self.tok.enable_truncation(max_length)
        self.max_length = max_length
        self.pad_id = self.tok.token_to_id("[PAD]") or 0

    def __call__(self, texts: Sequence[str], pad_to: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Texts -> (ids, mask), both (B, T) int64; T = longest text, or ``pad_to``."""
        encs = self.tok.encode_batch(list(texts))
        width = pad_to or max(len(e.ids) for e in encs)
        ids = torch.full((len(encs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(encs), width), dtype=torch.long)
        for row, enc in enumerate(encs):
            n = min(len(enc.ids), width)
            ids[row, :n] = torch.tensor(enc.ids[:n])
            mask[row, :n] = 1
        return ids, mask

    def lengths(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in self.tok.encode_batch(list(texts))]


@lru_cache(maxsize=4)
def encoder_tokenizer(max_length: int = 128) -> EncoderTokenizer:
    from workbench.assets import minilm_dir

    return EncoderTokenizer(minilm_dir() / "tokenizer.json", max_length)
