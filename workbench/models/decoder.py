"""A Llama-architecture decoder (SmolLM2-135M-Instruct) with an engine-owned KV cache.

The shipped GGUF (Q4_1) is converted once into float32 safetensors in the cache:
tensors are dequantised with the `gguf` package and Q/K rows are un-permuted from
llama.cpp's interleaved rotary layout back to the rotate-half layout.

The KV cache is a plain :class:`KVCache` of preallocated tensors the engine owns
(``k``/``v``: (layers, kv_heads, capacity, head_dim) per sequence), so the KV-cache
service can chunk, compress, swap and recompute it without touching the model.
Every token carries its absolute position, so attention over a cache whose
chunks were recomputed or reordered stays exact.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from workbench.cache import atomic_path, record, verify
from workbench.errors import CorruptArtifactError
from workbench.models.config import DecoderConfig


@dataclass
class KVCache:
    """Keys/values of one sequence: k, v (layers, kv_heads, capacity, head_dim); ``length`` used slots.

    ``positions`` (capacity,) holds each slot's absolute token position.
    """
    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor
    length: int = 0

    @classmethod
    def empty(cls, cfg: DecoderConfig, capacity: int, dtype=torch.float32) -> "KVCache":
        shape = (cfg.num_layers, cfg.num_kv_heads, capacity, cfg.head_dim)
        return cls(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype),
                   torch.zeros(capacity, dtype=torch.long))

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def nbytes(self) -> int:
        return 2 * self.k[:, :, : self.length].numel() * self.k.element_size()


ATTENTION_ROW_BLOCK = 256
"""Rows of explicit attention (kept for information density) computed at once: a long prompt's scores
take heads x 256 x context floats at a time, not heads x prompt x context."""


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half rotary embedding of x (..., T, dh) at absolute ``positions`` (T,)."""
    dh = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh))
    ang = positions.to(torch.float32)[:, None] * inv[None]          # (T, dh/2)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    half = dh // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos.to(x.dtype) + rot * sin.to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        d, dh = cfg.hidden, cfg.head_dim
        self.cfg = cfg
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.q = nn.Linear(d, cfg.num_heads * dh, bias=False)
        self.k = nn.Linear(d, cfg.num_kv_heads * dh, bias=False)
        self.v = nn.Linear(d, cfg.num_kv_heads * dh, bias=False)
        self.o = nn.Linear(cfg.num_heads * dh, d, bias=False)
        self.ffn_norm = nn.Parameter(torch.ones(d))
        self.gate = nn.Linear(d, cfg.ffn, bias=False)
        self.up = nn.Linear(d, cfg.ffn, bias=False)
        self.down = nn.Linear(cfg.ffn, d, bias=False)

    def project_kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (rotated) and values of x (T, d) at ``positions``: each (kv_heads, T, dh)."""
        cfg, T = self.cfg, x.shape[0]
        h = rms_norm(x, self.attn_norm, cfg.rms_eps)
        k = self.k(h).view(T, cfg.num_kv_heads, cfg.head_dim).transpose(0, 1)
        v = self.v(h).view(T, cfg.num_kv_heads, cfg.head_dim).transpose(0, 1)
        return rotary(k, positions, cfg.rope_theta), v

    def forward(self, x, positions, k_ctx, v_ctx, ctx_positions, attn_columns: torch.Tensor | None = None):
        """x (T, d) new tokens at ``positions``; k_ctx/v_ctx (kv_heads, S, dh) include them.

        Causal by absolute position: token t attends to every cached slot whose
        position is <= t's position. With ``attn_columns`` (S,), the attention
        probabilities are computed explicitly and their column sums over heads and
        the new rows are added to it (what the KV-cache service's information
        density needs).
        """
        cfg, T = self.cfg, x.shape[0]
        h = rms_norm(x, self.attn_norm, cfg.rms_eps)
        q = rotary(self.q(h).view(T, cfg.num_heads, cfg.head_dim).transpose(0, 1), positions, cfg.rope_theta)
        group = cfg.num_heads // cfg.num_kv_heads
        k = k_ctx.to(q.dtype).repeat_interleave(group, 0)                   # (H, S, dh), float32 from any cache
        v = v_ctx.to(q.dtype).repeat_interleave(group, 0)
        allowed = ctx_positions[None, :] <= positions[:, None]             # (T, S)
        if attn_columns is None:
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[None])
        else:
            attn = torch.empty_like(q)
            for start in range(0, T, ATTENTION_ROW_BLOCK):              # (H, rows, S) at a time, not (H, T, S)
                rows = slice(start, start + ATTENTION_ROW_BLOCK)
                scores = (q[:, rows] @ k.transpose(1, 2)) / cfg.head_dim ** 0.5
                probs = scores.masked_fill(~allowed[None, rows], float("-inf")).softmax(-1)
                attn_columns += probs.sum((0, 1))
                attn[:, rows] = probs @ v
        x = x + self.o(attn.transpose(0, 1).reshape(T, -1))
        h = rms_norm(x, self.ffn_norm, cfg.rms_eps)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Decoder(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.norm, self.cfg.rms_eps) @ self.embed.weight.T   # tied embeddings

    @torch.no_grad()
    def forward_tokens(self, ids: torch.Tensor, cache: KVCache, positions: torch.Tensor | None = None,
                       attn_columns: torch.Tensor | None = None) -> torch.Tensor:
        """Append tokens ``ids`` (T,) to ``cache`` and return their logits (T, vocab).

        ``attn_columns`` (cache length after the call,), if given, accumulates the attention
        the new tokens pay to every cached slot, summed over layers, heads and new tokens."""
        T, start = ids.shape[0], cache.length
        if start + T > cache.capacity:
            raise ValueError(f"KV cache holds {cache.capacity} tokens; {start} used, {T} more requested")
        if positions is None:
            first = int(cache.positions[start - 1]) + 1 if start else 0
            positions = torch.arange(first, first + T)
        cache.positions[start:start + T] = positions
        ctx_pos = cache.positions[: start + T]
        x = self.embed(ids)
        for n, layer in enumerate(self.layers):
            k, v = layer.project_kv(x, positions)
            cache.k[n, :, start:start + T] = k
            cache.v[n, :, start:start + T] = v
            x = layer(x, positions, cache.k[n, :, : start + T], cache.v[n, :, : start + T], ctx_pos,
                      None if attn_columns is None else attn_columns[: start + T])
        cache.length = start + T
        return self.logits(x)

    @torch.no_grad()
    def generate(self, ids: list[int], max_new_tokens: int = 16, cache: KVCache | None = None,
                 stop_ids: tuple[int, ...] = ()) -> tuple[list[int], KVCache]:
        """Greedy decoding; returns the new token ids and the cache (prompt + output)."""
        cache = cache or KVCache.empty(self.cfg, len(ids) + max_new_tokens)
        logits = self.forward_tokens(torch.tensor(ids), cache)
        out: list[int] = []
        for _ in range(max_new_tokens):
            nxt = int(logits[-1].argmax())
            out.append(nxt)
            if nxt in stop_ids or len(out) == max_new_tokens:
                break
            logits = self.forward_tokens(torch.tensor([nxt]), cache)
        return out, cache

    @torch.no_grad()
    def perplexity(self, ids: list[int], window: int = 512) -> float:
        """Token-level perplexity of ``ids`` in non-overlapping windows."""
        nll, count = 0.0, 0
        for s in range(0, len(ids) - 1, window):
            chunk = torch.tensor(ids[s:s + window + 1])
            if len(chunk) < 2:
                break
            logits = self.forward_tokens(chunk[:-1], KVCache.empty(self.cfg, len(chunk) - 1))
            nll += float(F.cross_entropy(logits, chunk[1:], reduction="sum"))
            count += len(chunk) - 1
        return float(np.exp(nll / count))


# ----------------------------------------------------------------------------- GGUF -> safetensors

_GGUF_LAYER_NAMES = {
    "attn_norm.weight": "attn_norm", "attn_q.weight": "q.weight", "attn_k.weight": "k.weight",
    "attn_v.weight": "v.weight", "attn_output.weight": "o.weight", "ffn_norm.weight": "ffn_norm",
    "ffn_gate.weight": "gate.weight", "ffn_up.weight": "up.weight", "ffn_down.weight": "down.weight",
}


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's interleaving of rotary pairs in Q/K rows."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_gguf(path: Path, reader=None) -> tuple[DecoderConfig, dict[str, np.ndarray], dict]:
    """Dequantise every tensor of a Llama GGUF into float32 arrays named for :class:`Decoder` (``reader``: the
    file already opened with ``gguf.GGUFReader``, whose opening parses the whole vocabulary, seconds)."""
    import gguf

    if reader is None:
        reader = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in reader.fields.items()
            if not k.startswith("tokenizer.ggml.") or k.endswith("_id") or k.endswith(".pre") or k.endswith(".model")}
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path} holds a {arch!r} model, expected 'llama'")
    cfg = DecoderConfig(
        vocab_size=int(meta["llama.vocab_size"]), hidden=int(meta["llama.embedding_length"]),
        num_layers=int(meta["llama.block_count"]), num_heads=int(meta["llama.attention.head_count"]),
        num_kv_heads=int(meta["llama.attention.head_count_kv"]), ffn=int(meta["llama.feed_forward_length"]),
        rope_theta=float(meta["llama.rope.freq_base"]), rms_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
        max_positions=int(meta["llama.context_length"]), bos_id=int(meta["tokenizer.ggml.bos_token_id"]),
        eos_id=int(meta["tokenizer.ggml.eos_token_id"]))
    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(tuple(reversed(t.shape.tolist())))
        if t.name == "token_embd.weight":
            out["embed.weight"] = w
        elif t.name == "output_norm.weight":
            out["norm"] = w
        elif t.name == "output.weight":
            out["lm_head.weight"] = w
        else:
            _, layer, rest = t.name.split(".", 2)
            if rest == "attn_q.weight":
                w = _unpermute(w, cfg.num_heads)
            elif rest == "attn_k.weight":
                w = _unpermute(w, cfg.num_kv_heads)
            out[f"layers.{layer}.{_GGUF_LAYER_NAMES[rest]}"] = w
    return cfg, out, meta


def _tokenizer_json_from_gguf(reader) -> str:
    """A `tokenizers` JSON for the byte-level BPE vocabulary of the GGUF ``reader`` (a ``gguf.GGUFReader``)
    holds (SmolLM2 splits digits singly)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    merges = [tuple(m.split(" ", 1)) for m in reader.fields["tokenizer.ggml.merges"].contents()]
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    special = [t for t, ty in zip(tokens, types) if ty == 3]   # CONTROL tokens: <|im_start|> ...
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tok.to_str()


def converted_decoder_dir() -> Path:
    """Convert the shipped GGUF once; verify the cached copy on every call, rebuild if corrupted."""
    from workbench.assets import SMOLLM2, smollm2_gguf

    src = smollm2_gguf()
    from workbench.assets import converted_decoder_path

    target = converted_decoder_path()
    manifest = target / "manifest.json"
    if manifest.exists():
        try:
            verify(manifest)
            return target
        except CorruptArtifactError as exc:
            print(f"workbench: converted decoder is damaged ({exc}); converting again")
    import gguf
    from safetensors.numpy import save_file

    target.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(str(src))                  # one read of the file for the weights and the vocabulary
    cfg, tensors, _ = read_gguf(src, reader)
    with atomic_path(target / "model.safetensors") as tmp:
        save_file(tensors, str(tmp))
    with atomic_path(target / "config.json") as tmp:
        tmp.write_text(json.dumps(cfg.__dict__, indent=2))
    with atomic_path(target / "tokenizer.json") as tmp:
        tmp.write_text(_tokenizer_json_from_gguf(reader))
    record([target / "model.safetensors", target / "config.json", target / "tokenizer.json"], manifest,
           {"source": src.name, "package": f"{SMOLLM2.package}=={SMOLLM2.version}"})
    return target


@lru_cache(maxsize=1)
def load_decoder() -> Decoder:
    """SmolLM2-135M-Instruct in float32 from the converted cache (converting on first use)."""
    from safetensors.torch import load_file

    root = converted_decoder_dir()
    cfg = DecoderConfig(**json.loads((root / "config.json").read_text()))
    model = Decoder(cfg)
    state = load_file(root / "model.safetensors")
    state.pop("lm_head.weight", None)
    model.load_state_dict(state, strict=True)
    return model.eval()


DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@dataclass
class DecoderTokenizer:
    """Byte-level BPE tokenizer of the decoder, with the chat format SmolLM2-Instruct expects."""
    path: Path
    _tok: object = field(init=False, repr=False)

    def __post_init__(self):
        from tokenizers import Tokenizer
        self._tok = Tokenizer.from_file(str(self.path))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def chat(self, user: str, system: str = DEFAULT_SYSTEM) -> list[int]:
        text = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                f"<|im_start|>assistant\n")
        return self.encode(text)

    @property
    def im_end_id(self) -> int:
        return self._tok.token_to_id("<|im_end|>")


@lru_cache(maxsize=1)
def decoder_tokenizer() -> DecoderTokenizer:
    return DecoderTokenizer(converted_decoder_dir() / "tokenizer.json")
