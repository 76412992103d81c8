"""Replaying a context-switching trace on the LLM context service (LLMS section 5.1), one method at a time.

Every call of a synthesized trace runs on a fresh :class:`~workbench.kvcache.service.LLMService`
configured by the method's preset (``llms``, the baselines ``vllm_sq``, ``vllm_s``, ``swapping``,
``lmk`` and the ablations) or by a configuration given with it (:func:`method_config` makes one from
the preset and the settings that apply to that method). By default calls run back to back: the
trace's Poisson times are kept in the records but not waited for. With ``idle_scale`` > 0 the service
sits idle between one call's return and the next call for the trace's gap times the scale (each
call records it as ``idle_s``), so what a service does in idle time can be studied; the whole
replay may idle at most :data:`MAX_IDLE_S`.
Each trace context belongs to an app of its own (``app-<index>``, one context each, so the per-app
limit never binds) and is created at its first call. That call records no switch (``switch_s`` 0):
nothing of the context is brought back, and the room it makes is part of creating it.

Device: ``"host"`` runs at this machine's speed; a preset of :mod:`~workbench.kvcache.costmodel`
(``mi14``, ``orin-nx``, ``jetson-tx2``) pads every load to what the preset's cost model says it
takes there: reads throttled to its bandwidth, recompute (the pipeline's, or LMK's whole-context
recompute) padded to its per-chunk cost, and writes of chunks evicted without a file (the baselines
swap out at eviction) padded to its bandwidth too, so all methods are compared on one device.

Memory budgets are relative to a trace's working set: the bytes every context would hold at 8 bits
when the trace ends (:func:`working_set_bytes`, from token counts, :func:`budget_for`), beside the
working cache the service reserves for the call it serves (:func:`working_reserve_bytes`: the replay
limits contexts to the trace's largest call, so the reserve is what that call needs). A method
whose base level cannot hold the trace's largest context alone under the budget (raw float16
chunks are 1.6 times an 8-bit chunk with its scales) would have to refuse calls; unless ``fit_budget`` is off, the
replay raises such a method's budget to the least that serves every call (:func:`min_budget_bytes`)
and records both. Raising only helps that method.

The loader is the service's own, the swapping-recompute pipeline
(:class:`~workbench.kvcache.loader.PipelineLoader`) on the device's cost model: for ``loading="pipeline"``
it plans with equation 4; for ``"swap_only"`` it reads every chunk that has a file; chunks without one
(killed) are recomputed.
"""
from __future__ import annotations

import json
import math
import tempfile
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from workbench.errors import WorkbenchError
from workbench.kvcache.chunks import CHUNK_SIZE, chunk_nbytes, working_nbytes
from workbench.kvcache.config import ServiceConfig
from workbench.kvcache.costmodel import SwapCostModel, device_cost_model, profile_host
from workbench.kvcache.lifecycle import ACTIONS
from workbench.kvcache.records import CallRecord, EvictionEvent, ReplayResult
from workbench.kvcache.statistics import ChunkState, ServiceState
from workbench.kvcache.store import DROPPED, FILE
from workbench.kvcache.traces import Trace

if TYPE_CHECKING:
    from workbench.kvcache.loader import LoadResult

DEFAULT_NEW_TOKENS = 4
MAX_IDLE_S = 300.0
"""The most seconds one replay may sit idle in all (``idle_scale``), so none can hang for hours."""
TUNABLE = ("chunk_size", "global_ratio", "policy")
"""The service settings a replay's caller may change on a method's preset (:func:`method_config`)."""


# ----------------------------------------------------------------------------- budgets

def _prompt_ids(tokenizer, prompt: str, first: bool) -> list[int]:
    """The ids a call adds for ``prompt``, as the service builds them, assuming the previous answer was cut
    short (so its turn is closed with ``<|im_end|>``, the longer of the two closings)."""
    if first:
        return tokenizer.chat(prompt)
    return tokenizer.encode(f"<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")


def context_tokens(trace: Trace, max_new_tokens: int = DEFAULT_NEW_TOKENS, tokenizer=None) -> list[int]:
    """Per trace context: the tokens it holds when the trace ends, if every call generates all
    ``max_new_tokens`` (an upper bound: an answer that stops early adds fewer). The last answer's
    final token is still pending (no K/V), so it is not counted."""
    if tokenizer is None:
        from workbench.models.decoder import decoder_tokenizer

        tokenizer = decoder_tokenizer()
    counts = [0] * trace.contexts
    for call in trace.calls:
        counts[call.context] += len(_prompt_ids(tokenizer, call.prompt, counts[call.context] == 0)) + max_new_tokens
    return [max(0, n - 1) for n in counts]


def context_bytes(tokens: int, cfg, bits: int = 8, chunk_size: int = CHUNK_SIZE) -> int:
    """Bytes of a context of ``tokens`` tokens with every chunk at ``bits`` (the last chunk may be short)."""
    def shape(n):
        return cfg.num_layers, 2, cfg.num_kv_heads, n, cfg.head_dim

    full, rest = divmod(int(tokens), chunk_size)
    return full * chunk_nbytes(shape(chunk_size), bits) + (chunk_nbytes(shape(rest), bits) if rest else 0)


def _decoder_cfg(model):
    """``model``'s shape, else the shipped decoder's, read without loading (or verifying) its weights."""
    from workbench.models.config import shipped_decoder_config

    return model.cfg if model is not None else shipped_decoder_config()


def working_set_bytes(trace: Trace, bits: int = 8, max_new_tokens: int = DEFAULT_NEW_TOKENS, model=None,
                      tokenizer=None, chunk_size: int = CHUNK_SIZE) -> int:
    """Bytes all of ``trace``'s contexts would hold at ``bits`` in ``chunk_size``-token chunks when it ends
    (:func:`context_tokens`); smaller chunks carry more scales per token."""
    cfg = _decoder_cfg(model)
    return sum(context_bytes(n, cfg, bits, chunk_size) for n in context_tokens(trace, max_new_tokens, tokenizer))


def call_tokens(trace: Trace, max_new_tokens: int = DEFAULT_NEW_TOKENS, tokenizer=None) -> int:
    """The most tokens one call of ``trace`` works on (its context with the call's prompt and answer):
    the context limit a replay gives the service, which sizes the working cache it reserves."""
    return max(context_tokens(trace, max_new_tokens, tokenizer)) + 1


def working_reserve_bytes(trace: Trace, bits: int = 8, max_new_tokens: int = DEFAULT_NEW_TOKENS, model=None,
                          tokenizer=None) -> int:
    """Bytes of the working cache the service reserves, within its budget, for ``trace``'s largest call
    (``chunks.working_nbytes`` at :func:`call_tokens`; a method's chunks at ``bits`` set its dtype)."""
    return working_nbytes(_decoder_cfg(model), call_tokens(trace, max_new_tokens, tokenizer), bits)


def budget_for(trace: Trace, fraction: float, *, max_new_tokens: int = DEFAULT_NEW_TOKENS, model=None,
               tokenizer=None, chunk_size: int = CHUNK_SIZE) -> int:
    """A memory budget in bytes (rounded): the working cache of ``trace``'s largest call
    (:func:`working_reserve_bytes`) and ``fraction`` of the trace's working set at 8 bits for chunks.

    The paper gives Llama2-7B contexts 1 to 3 GB, where one full 4K-token context takes 1 GiB at
    8 bits; the shipped decoder's contexts are a few MB, so budgets are stated against the contexts
    a trace builds. ``fraction`` = 1 holds every context at 8 bits with nothing compressed."""
    return working_reserve_bytes(trace, 8, max_new_tokens, model, tokenizer) + int(round(
        fraction * working_set_bytes(trace, 8, max_new_tokens, model, tokenizer, chunk_size)))


def min_budget_bytes(trace: Trace, bits: int, max_new_tokens: int = DEFAULT_NEW_TOKENS, model=None,
                     tokenizer=None, chunk_size: int = CHUNK_SIZE) -> int:
    """The least budget that lets a method writing ``chunk_size``-token chunks at ``bits`` serve every call
    of ``trace``: the working cache of its largest call, and the largest context at ``bits`` with room
    for the pending token of its last call (what the service's check asks for a context served alone)."""
    tokens = context_tokens(trace, max_new_tokens, tokenizer)
    return _least_budget(_decoder_cfg(model), tokens, max(tokens) + 1, bits, chunk_size)


def _least_budget(cfg, tokens: list[int], limit: int, bits: int, chunk_size: int) -> int:
    """The working cache reserved for ``limit`` tokens and the largest of contexts of ``tokens`` at ``bits``
    with room for its pending token."""
    return working_nbytes(cfg, limit, bits) + max(context_bytes(n + 1, cfg, bits, chunk_size) for n in tokens)


# ----------------------------------------------------------------------------- configuration and idle time

def tunable_settings(method: str) -> tuple[str, ...]:
    """Which of :data:`TUNABLE` change ``method``'s preset: the chunk size always; the global ratio only
    where chunks are compressed by tolerance (vLLM-SQ keeps every chunk at 8 bits and the FP16 baselines
    keep raw chunks: they have no ratio by definition); the policy only where the preset evicts by LCTRU
    (the paper defines the baselines, and the lifecycle ablation, with LRU)."""
    preset = ServiceConfig.preset(method)
    return tuple(name for name, applies in (("chunk_size", True), ("global_ratio", preset.compression == "tolerance"),
                                            ("policy", preset.policy == "lctru")) if applies)


def method_config(method: str, **settings) -> ServiceConfig:
    """``method``'s preset with those of ``settings`` (names from :data:`TUNABLE`; None keeps the preset's
    value) that apply to it (:func:`tunable_settings`); the others are ignored. The configuration checks
    its values (``WorkbenchError``)."""
    unknown = sorted(set(settings) - set(TUNABLE))
    if unknown:
        raise WorkbenchError(f"a replay's settings are {', '.join(TUNABLE)}; got {', '.join(unknown)}")
    changes = {k: v for k, v in settings.items() if v is not None and k in tunable_settings(method)}
    return replace(ServiceConfig.preset(method), **changes)


def idle_gaps(trace: Trace, idle_scale: float, replays: int = 1) -> list[float]:
    """Per call, the real seconds to sit idle before it: the trace time since the previous call times
    ``idle_scale`` (0 before the first). Refuses a scale that would idle more than :data:`MAX_IDLE_S` over
    ``replays`` replays of ``trace``."""
    if isinstance(idle_scale, bool) or not isinstance(idle_scale, (int, float)) or not math.isfinite(idle_scale) \
            or idle_scale < 0:
        raise WorkbenchError(f"idle_scale is a number of seconds per trace second, at least 0, got {idle_scale!r}")
    times = [c.time_s for c in trace.calls]
    gaps = [0.0] + [max(0.0, b - a) * idle_scale for a, b in zip(times, times[1:])]
    total = replays * sum(gaps)
    if total > MAX_IDLE_S:
        runs = f" over {replays} replays" if replays > 1 else ""
        raise WorkbenchError(f"idle scale {idle_scale:g} would idle {total:.0f} s{runs}, more than the "
                             f"{MAX_IDLE_S:.0f} s allowed; lower the scale or the trace's mean interval")
    return gaps


def _sit_idle(seconds: float, should_stop: Callable[[], bool] | None) -> None:
    """Sleep ``seconds``, ending early when ``should_stop()`` turns true (checked every 0.1 s)."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if should_stop is not None and should_stop():
            return
        time.sleep(min(left, 0.1))


# ----------------------------------------------------------------------------- loading

def cost_model(device: str | SwapCostModel, model, chunk_size: int = CHUNK_SIZE) -> SwapCostModel:
    """The cost model a replay plans and pads with for ``chunk_size``-token chunks: the host's measured
    one, a preset derived from it, or one given as is (for that chunk size)."""
    if isinstance(device, SwapCostModel):
        if device.chunk_size != chunk_size:
            raise WorkbenchError(f"the cost model given is for {device.chunk_size}-token chunks; the replay's "
                                 f"chunks hold {chunk_size}")
        return device
    return device_cost_model(device, profile_host(model, chunk_size))


# ----------------------------------------------------------------------------- the replay

POLICY_ORDER = {
    "lctru": "first in the LCTRU queue (heaviest level, then least recently used)",
    "lru": "least recently used",
    "density": "lowest information density",
}


def _reason(policy: str, granularity: str, action: str, context: int, chunk: int, bits: int, last_call: int,
            needed: int, served: int) -> str:
    whole = ", with its whole context" if granularity == "context" or action == "kill" else ""
    return (f"{policy}: {bits}-bit chunk {chunk} of context {context} (last used by call {last_call}) was "
            f"{POLICY_ORDER[policy]}{whole}; context {served} needed {needed} B; {ACTIONS[action]}")


def _chunk_state(chunk: ChunkState) -> str:
    if chunk.in_memory:
        return str(chunk.bits)
    return {FILE: "swapped", DROPPED: "killed"}[chunk.state]


def replay(trace: Trace, method: str, *, memory_budget_bytes: int, config: ServiceConfig | None = None,
           device: str | SwapCostModel = "host", model=None, swap_dir: Path | str | None = None,
           max_new_tokens: int = DEFAULT_NEW_TOKENS, idle_scale: float = 0.0,
           progress: Callable[[int, int], None] | None = None, should_stop: Callable[[], bool] | None = None,
           fit_budget: bool = True) -> ReplayResult:
    """Run every call of ``trace`` under ``method`` and record each (module docstring).

    ``method`` names the result and, unless ``config`` is given, the service preset it runs;
    ``config`` replaces that preset (e.g. ``method_config(method, chunk_size=8)``); the configuration
    used is recorded in ``settings["config"]``.
    ``swap_dir``: where the service keeps its files (a fresh temporary folder when None, removed after).
    ``idle_scale``: real seconds of idle per second of trace time between calls (:func:`idle_gaps`; 0:
    back to back). ``progress(done, total)`` is called after each call; ``should_stop()`` before each
    and while idle, and a true answer ends the replay early with the calls made so far. ``fit_budget``:
    raise the budget to :func:`min_budget_bytes` where the method needs it (recorded in ``settings``)."""
    from workbench.kvcache.loader import PipelineLoader
    from workbench.kvcache.service import LLMService
    from workbench.models.decoder import decoder_tokenizer, load_decoder

    config = ServiceConfig.preset(method) if config is None else config
    gaps = idle_gaps(trace, idle_scale)
    model = model if model is not None else load_decoder()
    tokenizer = decoder_tokenizer()
    tokens = context_tokens(trace, max_new_tokens, tokenizer)
    if config.max_context_tokens is None and max(tokens) + 1 <= model.cfg.max_positions:
        config = replace(config, max_context_tokens=max(tokens) + 1)            # call_tokens: the largest call
    costs = cost_model(device, model, config.chunk_size)
    limit = config.max_context_tokens or model.cfg.max_positions
    reserve = working_nbytes(model.cfg, limit, config.base_bits)
    needed = _least_budget(model.cfg, tokens, limit, config.base_bits, config.chunk_size)
    budget = max(int(memory_budget_bytes), needed) if fit_budget else int(memory_budget_bytes)
    loader = PipelineLoader(costs)
    settings = {"config": config.to_dict(), "device": costs.device, "device_notes": costs.notes,
                "requested_budget_bytes": int(memory_budget_bytes), "least_budget_bytes": needed,
                "budget_raised": budget > int(memory_budget_bytes), "max_new_tokens": max_new_tokens,
                "working_reserve_bytes": reserve,
                "idle_scale": float(idle_scale),
                "trace": {"calls": len(trace.calls), "contexts": trace.contexts, "pattern": trace.pattern,
                          "mean_interval_s": trace.mean_interval_s, "seed": trace.seed,
                          "sources": list(trace.sources)}}
    records: list[CallRecord] = []
    folder = tempfile.TemporaryDirectory(prefix="llms-replay-") if swap_dir is None else nullcontext(swap_dir)
    with folder as root, LLMService(model, root, budget, config=config, tokenizer=tokenizer, loader=loader) as svc:
        if svc.state().contexts:
            raise WorkbenchError(f"{root} already holds contexts of another run; a replay starts from an empty "
                                 "swap folder")
        apps, stubs, index_of, call_of_tick = {}, {}, {}, {}
        for i, call in enumerate(trace.calls):
            if gaps[i] > 0:
                _sit_idle(gaps[i], should_stop)
            if should_stop is not None and should_stop():
                break
            c = call.context
            first = c not in stubs
            if first:
                apps[c] = svc.bind(f"app-{c}")
                stubs[c] = apps[c].new_ctx()
            loader.last = None
            text, stats = apps[c].call_with_stats(stubs[c], call.prompt, max_new_tokens)
            index_of.setdefault(stats.ctx, c)
            state = svc.state()
            call_of_tick[state.context(stats.ctx).last_tick] = i
            records.append(_record(i, call, gaps[i], first, stats, text, state, svc, loader.last, index_of,
                                   call_of_tick, trace.contexts))
            if progress is not None:
                progress(i + 1, len(trace.calls))
        settings["context_ids"] = {str(c): ctx for ctx, c in index_of.items()}
    return ReplayResult(method=method, device=costs.device, memory_budget_bytes=budget, contexts=trace.contexts,
                        pattern=trace.pattern, settings=json.loads(json.dumps(settings)), calls=tuple(records))


def _record(i, call, idle_s, first, stats, text, state: ServiceState, svc, load: LoadResult | None,
            index_of: dict[str, int], call_of_tick: dict[int, int], contexts: int) -> CallRecord:
    config = svc.config
    evicted = svc.evictions[-stats.evictions:] if stats.evictions else []
    events = tuple(EvictionEvent(
        call=i, context=index_of[r.ctx], chunk=r.chunk, bits=r.bits, last_used=call_of_tick.get(r.last_used, -1),
        bytes=r.nbytes, bytes_needed=r.bytes_needed, policy=r.policy, action=r.action,
        reason=_reason(r.policy, config.granularity, r.action, index_of[r.ctx], r.chunk, r.bits,
                       call_of_tick.get(r.last_used, -1), r.bytes_needed, call.context)) for r in evicted)
    brought = {} if load is None else {**{j: "loaded" for j in load.loaded}, **{j: "recomputed" for j in load.recomputed}}
    rows: list[tuple[str, ...]] = [()] * contexts
    for ctx in state.contexts:
        c = index_of[ctx.id]
        rows[c] = tuple(brought.get(ch.index, _chunk_state(ch)) if c == call.context else _chunk_state(ch)
                        for ch in ctx.chunks)
    queue = tuple((index_of[e.ctx], e.chunk, e.bits) for e in state.queue)
    return CallRecord(
        index=i, time_s=call.time_s, idle_s=idle_s, context=call.context, switch_s=0.0 if first else stats.switch_s,
        io_s=stats.io_s, recompute_s=stats.recompute_s, inference_s=stats.inference_s,
        queue_wait_s=stats.queue_wait_s, chunks_missing=stats.chunks_missing, chunks_loaded=stats.chunks_loaded,
        chunks_recomputed=stats.chunks_recomputed, bytes_read=stats.bytes_read,
        memory_bytes=state.used_bytes, output=text, evictions=events, chunk_map=tuple(rows),
        queue=queue, predicted=None if load is None else load.predicted,
        measured=None if load is None else load.timeline, missing_bits=() if load is None else load.missing_bits)
