"""Held-out perplexity of the decoder reading its own compressed KV cache (LLMS Figure 6b / 12): the prefix
of each window in chunks raw, at static 8, 4 or 2 bits, or at the levels the service assigns by tolerance
(fed in several calls, as a conversation), the rest of the window scored through it. ``workbench bench llms``'s
``perplexity`` table is made from :func:`kv_perplexity`."""
from __future__ import annotations

import math

import numpy as np

PPL_SETTINGS = ("plain", 32, 8, 4, 2, "tolerance", "shuffled")
"""What the prefix is read as: the plain decoder, raw chunks (32), static bits, the service's tolerance levels
and those levels shuffled over the chunks."""


def perplexity_windows(ids: list[int], prefix: int, target: int, limit: int | None = None) -> list[list[int]]:
    """Consecutive windows of ``prefix + target + 1`` tokens (at most ``limit``)."""
    step = prefix + target + 1
    windows = [ids[s:s + step] for s in range(0, len(ids) - step + 1, step)]
    return windows[:limit]


CONVERSATION_CALLS = 4
"""Calls the perplexity table's tolerance setting feeds a window's prefix in, as a conversation would."""


def service_conversation(model, ids: list[int], calls: int, global_ratio: float = 0.5):
    """``ids`` fed in ``calls`` equal calls the way the service keeps a context: each call runs on the
    chunks' values, its tokens go into 8-bit chunks, and after it every full chunk's level is assigned
    anew over the whole context from its 8-bit base (``ChunkedKV.relevel``). Returns the context and
    those bases (index -> 8-bit chunk)."""
    from workbench.kvcache.chunks import LEVELS, ChunkedKV
    from workbench.kvcache.density import assign_levels
    from workbench.kvcache.engine import run_call

    cfg = model.cfg
    kv = ChunkedKV.for_decoder(cfg)
    bases = {}
    size = -(-len(ids) // calls)
    for start in range(0, len(ids), size):
        run_call(model, kv, ids[start:start + size], max_new_tokens=0, bits=LEVELS[0])
        full = kv.full_chunks()
        bases.update((i, kv.chunks[i]) for i in full if i not in bases and kv.chunks[i].bits == LEVELS[0])
        density = kv.chunk_density(cfg.num_layers * cfg.num_heads)
        kv.relevel(dict(zip(full, assign_levels(density[full], LEVELS, global_ratio))), bases.get)
    return kv, bases


def kv_perplexity(model, windows: list[list[int]], prefix: int, settings=PPL_SETTINGS, global_ratio: float = 0.5,
                  seed: int = 0):
    """Held-out perplexity of the decoder reading its own, compressed, KV cache; per setting
    ``(perplexity, mean KV bytes of a window's prefix)``.

    Protocol, per window of ``prefix + target + 1`` tokens: the first ``prefix`` tokens are prefilled
    in one pass (attention recorded for information density) and their K/V taken into 16-token
    chunks (``ChunkedKV.absorb``): raw (32), or at 8 bits and then every chunk to 4 or 2 bits (static).
    ``"tolerance"`` is the service's own assignment: the prefix arrives in :data:`CONVERSATION_CALLS`
    calls and after each the levels are assigned anew over the whole context from the 8-bit bases
    (:func:`service_conversation`; the open last chunk stays at 8 bits, as in the service). The next ``target`` tokens are then fed on a cache holding exactly the
    chunks' values, and each predicts its successor: the scored tokens are window[prefix + 1:], every
    one read through the compressed prefix (their own K/V stay exact, like a call's new tokens).
    ``"plain"`` scores the same tokens with the plain decoder over the whole window in one pass;
    ``"shuffled"`` places the tolerance-aware levels on the chunks at random (``seed``).
    """
    import torch
    import torch.nn.functional as F

    from workbench.kvcache.chunks import ChunkedKV, recompress
    from workbench.models.decoder import KVCache

    cfg = model.cfg
    nll = {s: 0.0 for s in settings}
    kv_bytes = {s: 0 for s in settings}
    scored = 0
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for window in windows:
            head, tail = window[:prefix], window[prefix:]
            targets = torch.tensor(tail[1:])
            cache = KVCache.empty(cfg, prefix)
            columns = torch.zeros(prefix)
            model.forward_tokens(torch.tensor(head), cache, attn_columns=columns)
            for s in settings:
                if s == "plain":
                    logits = model.forward_tokens(torch.tensor(window[:-1]), KVCache.empty(cfg, len(window) - 1))
                    logits = logits[prefix:]
                    kv_bytes[s] += 4 * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * prefix
                else:
                    if s in ("tolerance", "shuffled"):
                        kv, bases = service_conversation(model, head, CONVERSATION_CALLS, global_ratio)
                        if s == "shuffled":
                            full = kv.full_chunks()
                            levels = rng.permutation([kv.chunks[i].bits for i in full])
                            kv.relevel(dict(zip(full, levels)), bases.get)
                    else:
                        kv = ChunkedKV.for_decoder(cfg)
                        kv.absorb(cache, head, columns.numpy(), bits=32 if s == 32 else 8)
                        kv.chunks = [recompress(c, int(s)) if s != 32 else c for c in kv.chunks]
                    kv_bytes[s] += kv.nbytes()
                    logits = model.forward_tokens(torch.tensor(tail[:-1]), kv.to_cache(cfg, extra=len(tail) - 1))
                nll[s] += float(F.cross_entropy(logits, targets, reduction="sum"))
            scored += len(targets)
    return {s: (math.exp(nll[s] / scored), kv_bytes[s] / len(windows)) for s in settings}
