"""Tokenizers for the shipped models, built with the `tokenizers` library from packaged files."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import torch
from tokenizers import Tokenizer


@dataclass(frozen=True)
class EncodedText:
    """One user text ready for the encoder, and how much of it the model reads."""
    ids: torch.Tensor          # (1, T) int64
    mask: torch.Tensor         # (1, T) int64
    kept: int                  # tokens the model reads (special tokens included)
    given: int                 # tokens of the whole text

    @property
    def truncated(self) -> bool:
        return self.kept < self.given

    def note(self) -> str:
        """One line for the user when the text was cut, else ''."""
        if not self.truncated:
            return ""
        return (f"note: the text was cut to its first {self.kept} of {self.given:,} tokens "
                f"(the model reads at most {self.kept})")


class EncoderTokenizer:
    """WordPiece tokenizer of the encoder; batches are padded to their longest member."""

    def __init__(self, path: Path, max_length: int = 128):
        self.tok = Tokenizer.from_file(str(path))
        self.tok.no_padding()
        self.tok.enable_truncation(max_length)
        self.whole = Tokenizer.from_file(str(path))        # untruncated, to count what a user gave
        self.whole.no_truncation()
        self.whole.no_padding()
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

    def encode_text(self, text: str, pad_to: int | None = None) -> EncodedText:
        """A user's text: refused when empty or whitespace-only, and its truncation counted."""
        from workbench.errors import WorkbenchError

        if not isinstance(text, str) or not text.strip():
            raise WorkbenchError("the text is empty; give a sentence to classify")
        ids, mask = self([text], pad_to=pad_to)
        kept = int(mask.sum())
        return EncodedText(ids, mask, kept=kept, given=max(len(self.whole.encode(text).ids), kept))


@lru_cache(maxsize=4)
def encoder_tokenizer(max_length: int = 128) -> EncoderTokenizer:
    from workbench.assets import minilm_dir

    return EncoderTokenizer(minilm_dir() / "tokenizer.json", max_length)
