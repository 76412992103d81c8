"""Self-checks of the LLM context service lab: each expected answer is computed by the engine's own
functions, so it holds on any machine and cache (the lab needs no prepared artifacts but the decoder's
shape and, for exercise 3, the host's measured swap costs)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.kvcache.chunks import LEVELS, chunk_nbytes
from workbench.kvcache.density import assign_levels
from workbench.kvcache.lifecycle import LCTRUQueue, QueueEntry
from workbench.labs import Feedback, check_choice, check_number, with_unit

CHUNK_SHAPE = (30, 2, 3, 16, 64)            # SmolLM2-135M: layers, K and V, KV heads, tokens, head dim
DENSITIES = (0.30, 0.015, 0.06, 0.25, 0.01, 0.02, 0.10, 0.025)
"""Exercise 2: eight chunks of one context, as information density ranks them."""
QUEUE = (("A", 0, 8, 5), ("A", 1, 2, 1), ("B", 0, 4, 2), ("B", 1, 8, 3), ("C", 0, 4, 4))
"""Exercise 4: (context, chunk, bits, last use) of the chunks in memory."""
MORE_OR_FEWER = ("more", "fewer", "same")


def chunk_bytes(bits: int) -> int:
    return chunk_nbytes(CHUNK_SHAPE, bits)


def check_chunk_bytes(answer) -> Feedback:
    """Exercise 1: bytes of one full chunk at 4 bits."""
    values = int(np.prod(CHUNK_SHAPE))
    payload = values * 4 // 8
    layers, _, heads, tokens, features = CHUNK_SHAPE
    keys, tokens_v = layers * heads * features, layers * heads * tokens
    return check_number(
        "Exercise 1", answer, chunk_bytes(4), whole=True, minimum=1, quantity="a chunk's size in bytes",
        right=f"{values:,} values at 4 bits take {payload:,} bytes of codes (two share a byte), plus {keys:,} key "
              f"channels and {tokens_v:,} value tokens x 2 numbers (minimum, step) x 2 bytes.",
        why_high="at 4 bits two codes share one byte; count the bytes of the codes first, then add what each "
                 "key channel and each value token keeps.",
        why_low="besides the 4-bit codes, each key channel (layer, head, feature) and each value token (layer, "
                "head, token) keeps a float16 minimum and step.",
        hint="a chunk is 30 layers x (K, V) x 3 heads x 16 tokens x 64 features.")


def shown_densities() -> str:
    """The densities of exercise 2 as the question and every feedback print them."""
    return ", ".join(f"{d:g}" for d in DENSITIES)


def levels_answer() -> np.ndarray:
    return assign_levels(np.array(DENSITIES), LEVELS, 0.5)


def check_eight_bit_count(answer) -> Feedback:
    """Exercise 2: how many of the eight chunks keep 8 bits at a 50 % global ratio."""
    levels = levels_answer()
    n8 = int((levels == 8).sum())
    shown = ", ".join(f"{with_unit(d)}->{b}" for d, b in zip(DENSITIES, levels))
    return check_number(
        "Exercise 2", answer, n8, whole=True, minimum=0, maximum=len(DENSITIES),
        quantity=f"the number of 8-bit chunks among {len(DENSITIES)}",
        right=f"the levels are {shown}: the mean is exactly 4 bits, and each 8-bit chunk saves more noise "
              f"(d^2 x (1/225 - 1/65025)) than its two 2-bit partners add (d^2 x (1/9 - 1/225)).",
        why_high="each 8-bit chunk needs two 2-bit chunks to keep the mean at 4 bits; look at whether the "
                 "noise the sparsest chunks add at 2 bits (d^2 / 9) stays below what the 8-bit one saves.",
        why_low="look at the densest chunks: moving one from 4 to 8 bits saves d^2 x (1/225 - 1/65025); compare "
                "that with what two of the sparsest chunks add going from 4 to 2 bits, d^2 x (1/9 - 1/225).",
        hint="one 8-bit chunk is paid for by two 2-bit ones (8 + 2 + 2 averages 4); do it while the dense "
             "chunk's d^2 / 225 beats the two sparsest chunks' d^2 / 9.")


@dataclass(frozen=True)
class PipelineAnswer:
    tx2: int            # chunks recomputed on jetson-tx2
    mi14: int           # on mi14
    ratio_tx2: float
    ratio_mi14: float


def pipeline_answer(model=None, chunks: int = 64) -> PipelineAnswer:
    """How many of ``chunks`` missing 8-bit chunks each preset recomputes rather than reads."""
    from workbench.kvcache.costmodel import device_cost_model, profile_host
    from workbench.kvcache.planner import plan_swap_recompute
    from workbench.models.decoder import load_decoder

    host = profile_host(model or load_decoder())
    missing = [(i, 8, chunk_bytes(8)) for i in range(chunks)]
    tx2, mi14 = device_cost_model("jetson-tx2", host), device_cost_model("mi14", host)
    return PipelineAnswer(tx2=len(plan_swap_recompute(tx2, missing).recompute),
                          mi14=len(plan_swap_recompute(mi14, missing).recompute),
                          ratio_tx2=tx2.recompute_to_load_ratio(8), ratio_mi14=mi14.recompute_to_load_ratio(8))


def check_pipeline(answer, known: PipelineAnswer | None = None) -> Feedback:
    """Exercise 3: does the planner recompute more, fewer or the same chunks on the TX2 as on the MI14?"""
    a = known or pipeline_answer()
    expected = "more" if a.tx2 > a.mi14 else "fewer" if a.tx2 < a.mi14 else "same"
    return check_choice(
        "Exercise 3", answer, expected, MORE_OR_FEWER,
        why=f"recomputing a chunk costs {a.ratio_tx2:.1f} reads on the TX2 but {a.ratio_mi14:.1f} on the MI14, so "
            f"the balance of equation 4 is struck with {a.tx2} of 64 chunks recomputed there and {a.mi14} here.",
        hint="compare how many reads one recompute is worth on each device.")


def eviction_order(policy: str) -> list[str]:
    """The QUEUE's chunks in the order ``policy`` evicts them, as 'A1', 'B0', ..."""
    queue = LCTRUQueue(policy)
    for ctx, chunk, bits, last in QUEUE:
        queue.put(QueueEntry(ctx=ctx, chunk=chunk, bits=bits, nbytes=chunk_bytes(bits), last_used=last))
    return [f"{e.ctx}{e.chunk}" for e in queue.order()]


def check_first_out(answer) -> Feedback:
    """Exercise 4: which chunk does LCTRU evict first?"""
    lctru, lru = eviction_order("lctru"), eviction_order("lru")
    return check_choice(
        "Exercise 4", answer, lctru[0], tuple(lru),
        why=f"LCTRU empties the heaviest sub-queue first (8-bit: A0 used at 5, B1 at 3), least recently used "
            f"first, so its order is {' '.join(lctru)}; plain LRU would start with {lru[0]} ({' '.join(lru)}).",
        hint="sub-queues by level, heaviest first; inside one, least recently used first.")


def answers(model=None) -> dict[str, object]:
    """The right answers, for the lab's tests."""
    a = pipeline_answer(model)
    return {"my_bytes": chunk_bytes(4), "my_eight_bit": int((levels_answer() == 8).sum()),
            "my_pipeline": "more" if a.tx2 > a.mi14 else "fewer" if a.tx2 < a.mi14 else "same",
            "my_first_out": eviction_order("lctru")[0]}
