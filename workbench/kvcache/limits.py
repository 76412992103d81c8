"""The ranges of the LLM context service's numbers, from what holds them: the decoder's context, this
machine's memory and cores. The commands' options and the Python API check values with the same types
(``workbench.argtypes``), so both refuse a value in the same line. Torch-free: the parser reads them."""
from __future__ import annotations

from workbench.argtypes import (LONGEST_RUN_S, Bound, Number, OutOfRangeError, count, machine_memory_bytes, memory_holds,
                                per_core, positive)
from workbench.kvcache.chunks import CHUNK_SIZE, chunk_nbytes
from workbench.models.config import shipped_decoder_config

DECODER = shipped_decoder_config()
CONTEXT_TOKENS = DECODER.max_positions
"""Tokens the decoder can attend to: no context, prompt or generated text is longer."""
CHUNK_BYTES_8BIT = chunk_nbytes((DECODER.num_layers, 2, DECODER.num_kv_heads, CHUNK_SIZE, DECODER.head_dim), 8)
"""Bytes of one full default chunk at 8 bits: the least a context or a working set holds."""
BYTES_PER_CALL = 1000
"""A trace call's memory with its prompt and record (0.4 KB measured for 40-word prompts), rounded up."""
MEASURED_CHUNKS = 8
"""Chunks of the context the host's cost measurement prefills (``costmodel.measure_host``)."""
MARKOV_S_PER_CONTEXT = 1e-7
TRACE_S_PER_CALL = 2e-5
"""Seconds a Markov trace takes per call and per context of each call (measured: 20 us a call, 4.9 ms a call
over 50,000 contexts)."""

DAY_S = 86400
decoder_tokens = Bound(CONTEXT_TOKENS, "the decoder's context")
memory_mb = positive("MB", Bound(machine_memory_bytes() // 10**6, "this machine's memory"))
budget_bytes = count(1, unit="bytes", at_most=Bound(machine_memory_bytes(), "this machine's memory"))

contexts = count(1, unit="contexts", at_most=memory_holds(CHUNK_BYTES_8BIT, "contexts of one 8-bit chunk each"))
trace_calls = count(1, unit="calls", at_most=memory_holds(BYTES_PER_CALL, "calls of 1 KB each"))
mean_interval_s = positive("s", Bound(DAY_S, "a day, as on the LLMS page; the replays' idle time follows the gaps"))
new_tokens = count(1, unit="tokens", at_most=decoder_tokens)
prompt_words = count(1, unit="words", at_most=Bound(CONTEXT_TOKENS, "the decoder's context; a word is a token or more"))


def measured_chunk_size_for(context_tokens: int) -> Number:
    """Chunk sizes the host's cost measurement can use with a decoder of ``context_tokens``."""
    return count(1, unit="tokens", at_most=Bound(
        context_tokens // MEASURED_CHUNKS,
        f"the host measurement prefills {MEASURED_CHUNKS} chunks into the decoder's {context_tokens}-token context"))


measured_chunk_size = measured_chunk_size_for(CONTEXT_TOKENS)
working_set_fraction = positive("fraction of the working set", Bound(
    contexts.maximum, "a budget that half this machine's memory holds for a working set of one 8-bit chunk"))
client_processes = count(1, unit="client processes", at_most=per_core(4, "client processes"))


def check_trace_time(contexts: int, calls: int, pattern: str) -> None:
    """Refuse a trace whose drawing is estimated to take longer than the longest run a command starts (a Markov
    draw weighs every context at every call), before drawing it."""
    per_call = TRACE_S_PER_CALL + (MARKOV_S_PER_CONTEXT * contexts if pattern == "markov" else 0.0)
    if calls * per_call > LONGEST_RUN_S:
        raise OutOfRangeError(f"calls and contexts: a {pattern} trace of {calls} calls over {contexts} contexts "
                              f"would take about {calls * per_call:.0f} s to draw, more than {LONGEST_RUN_S} s; "
                              f"ask for fewer calls or contexts")
