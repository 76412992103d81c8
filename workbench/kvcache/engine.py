"""One LLM call on a chunked context: the chunks become the decoder's KV cache, the prompt and the
continuation (greedy, or sampled by ``Sampling``) run on it, and the tokens the call added go back
into chunks.

The last generated token has no K/V yet (it was never fed back): it waits in ``ctx.pending`` and
goes first into the next call, as it would in one uninterrupted conversation.

The decoder sees exactly the values the chunks hold (raw, or dequantized from their level), so a
context kept raw continues exactly as the plain decoder would; the attention the new tokens pay to
every earlier token is accumulated for information density.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from workbench.errors import WorkbenchError
from workbench.kvcache.chunks import ChunkedKV
from workbench.kvcache.protocol import GREEDY, Sampling


@dataclass(frozen=True, kw_only=True)
class CallResult:
    output_ids: list[int]         # generated token ids (the stop token included when it was produced)
    changed_chunks: list[int]     # chunks the call wrote (the old tail and the new ones)
    prompt_tokens: int


@torch.no_grad()
def run_call(model, ctx: ChunkedKV, prompt_ids: list[int], max_new_tokens: int = 16,
             stop_ids: tuple[int, ...] = (), bits: int = 8, max_context: int | None = None,
             on_token: Callable[[int], bool] | None = None, cache=None,
             sampling: Sampling = GREEDY) -> CallResult:
    """Append ``prompt_ids`` to ``ctx``, decode up to ``max_new_tokens`` (greedily unless ``sampling``
    says otherwise), store the new tokens' K/V as chunks at ``bits``. Every chunk of ``ctx`` must be in
    memory.

    ``cache``: the context already dequantized into a decoder cache (``ctx.to_cache``) with room for the
    call, when the caller built it (the service does, and books that time to the switch).

    ``on_token(id)`` is called with each generated token as soon as it is chosen (for streaming); a
    true result ends the generation there, as ``max_new_tokens`` would."""
    if not prompt_ids:
        raise WorkbenchError("the prompt is empty")
    if max_new_tokens < 0:
        raise WorkbenchError(f"max_new_tokens must be 0 or more, got {max_new_tokens}")
    limit = max_context or model.cfg.max_positions
    grown = len(ctx.tokens) + len(ctx.pending) + len(prompt_ids) + max_new_tokens
    if grown > limit:
        raise WorkbenchError(f"the context would grow to {grown} "
                             f"tokens, beyond its limit of {limit}; start a new context or delete this one")
    first = list(ctx.pending) + list(prompt_ids)
    if cache is None:
        cache = ctx.to_cache(model.cfg, extra=len(first) + max_new_tokens, new_bits=bits)
    elif cache.length != len(ctx.tokens) or cache.capacity < len(ctx.tokens) + len(first) + max_new_tokens:
        raise WorkbenchError(f"the cache holds {cache.length} of {cache.capacity} slots; the call needs the "
                             f"context's {len(ctx.tokens)} tokens and room for {len(first) + max_new_tokens} more")
    columns = torch.zeros(cache.capacity, dtype=torch.float32)
    logits = model.forward_tokens(torch.tensor(first), cache, attn_columns=columns)
    out: list[int] = []
    added = first
    generator = sampling.generator()
    for _ in range(max_new_tokens):
        nxt = sampling.pick(logits[-1], generator)
        out.append(nxt)
        stop = on_token is not None and on_token(nxt)
        if stop or nxt in stop_ids or len(out) == max_new_tokens:
            break
        logits = model.forward_tokens(torch.tensor([nxt]), cache, attn_columns=columns)
        added.append(nxt)
    changed = ctx.absorb(cache, added, columns[: cache.length].numpy(), bits=bits)
    ctx.pending = out[-1:]
    return CallResult(output_ids=out, changed_chunks=changed, prompt_tokens=len(prompt_ids))
