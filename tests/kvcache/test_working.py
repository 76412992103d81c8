"""The working caches kept between calls: each mirrors exactly what its context's chunks hold, and they take
only the reserve and the room the chunks leave."""
from dataclasses import replace

import numpy as np
import pytest

from workbench.kvcache.service import LLMService, ServiceConfig
from workbench.kvcache.working import WorkingCache
from workbench.models.decoder import load_decoder

STEPS = [(0, "Name a color."), (0, "And another?"), (1, "Say hi."), (1, "Count to three."), (0, "Why?"),
         (0, "Thanks."), (2, "Name a fruit.")]
"""Context and prompt per call: repeats, switches back to a context served before, a third context."""

ONE_BUFFER = 256 * 2 * 30 * 3 * 64 * 2
"""Bytes of one 256-slot float16 buffer of the test decoder (30 layers, 3 KV heads of 64): the reserve at a
limit of 256 tokens."""


@pytest.fixture(scope="module")
def model():
    return load_decoder()


def _session(model, folder, config, reuse: bool, after_call=None, budget: int = 60_000_000):
    svc = LLMService(model, folder, memory_budget_bytes=budget, config=config)
    if not reuse:
        svc.working.holds = lambda ctx_id, tick: False
    app = svc.bind("a")
    stubs = [app.new_ctx("Be brief.") for _ in range(3)]
    out = []
    for c, prompt in STEPS:
        text, stats = app.call_with_stats(stubs[c], prompt, 4)
        out.append((text, stats.cache_reused))
        if after_call is not None:
            after_call(svc, stats)
    svc.close()
    return out


@pytest.mark.parametrize("preset", ["llms", "vllm_sq", "vllm_s"])
def test_after_every_call_the_buffer_holds_bit_for_bit_what_rebuilding_from_the_chunks_gives(tmp_path, model,
                                                                                                preset):
    """Catches a call's changes not written back: its new tokens left unquantized, the re-encoded tail or the
    chunks compression moved to another level left at their old values."""
    config = replace(ServiceConfig.preset(preset), max_context_tokens=512)
    checked = []

    def compare(svc, stats):
        kv = svc._contexts[stats.ctx].kv
        n = len(kv.tokens)
        fresh = kv.to_cache(model.cfg, extra=0, new_bits=config.base_bits)
        held = svc.working.cache
        assert held.length == n
        for mine, theirs in ((held.k, fresh.k), (held.v, fresh.v)):
            assert np.array_equal(mine[:, :, :n].numpy().view(np.uint16), theirs[:, :, :n].numpy().view(np.uint16))
        assert held.positions[:n].tolist() == list(range(n))
        checked.append(n)

    _session(model, tmp_path, config, True, compare)
    assert len(checked) == len(STEPS)


@pytest.mark.parametrize("budget, reused, buffers", [
    (60_000_000, [False, True, False, True, True, True, False], [1, 1, 2, 2, 2, 2, 3]),
    (ONE_BUFFER + 1_000_000, [False, True, False, True, False, True, False], [1] * 7)])
def test_a_kept_buffer_is_reused_only_while_it_mirrors_its_context_and_answers_as_a_rebuild_would(
        tmp_path, model, budget, reused, buffers):
    """With room for a buffer per context, the switch back to context 0 runs on its kept buffer; with room
    for one buffer (a 256-token limit's reserve and 1 MB for chunks), only a repeat with nothing served
    between does. The replies equal those of a service that rebuilds every call (catches a stale buffer
    reused after its context changed, or a buffer kept past the room). No allocation per switch: a buffer
    is made for a context's first call at most (with room for one, one buffer at one address for every
    call), and after every call the chunks in memory and the buffers together fit the budget."""
    config = replace(ServiceConfig.preset("llms"), max_context_tokens=256)
    seen = []

    def record(svc, stats):
        used = svc.budget.used_bytes() + svc.working.nbytes()
        seen.append((svc.working.allocations, len(svc.working.buffers), svc.working.cache.k.data_ptr(), used))

    kept = _session(model, tmp_path / "kept", config, True, record, budget=budget)
    rebuilt = _session(model, tmp_path / "rebuilt", config, False, budget=budget)
    assert [r for _, r in kept] == reused
    assert [t for t, _ in kept] == [t for t, _ in rebuilt]
    assert not any(r for _, r in rebuilt)
    assert [a for a, *_ in seen] == [n for _, n, *_ in seen] == buffers
    assert all(used <= budget for *_, used in seen)
    if buffers[-1] == 1:
        assert len({p for _, _, p, _ in seen}) == 1


def test_the_buffer_grows_in_steps_up_to_the_limit_and_refuses_a_cache_of_the_wrong_shape(model):
    from workbench.errors import WorkbenchError
    from workbench.kvcache.chunks import ChunkedKV, encode_chunk

    working = WorkingCache(model.cfg, limit=300)
    kv = ChunkedKV.for_decoder(model.cfg)
    rng = np.random.default_rng(0)
    kv.tokens = list(range(20))
    kv.chunks = [encode_chunk(rng.standard_normal((30, 2, 3, n, 64)).astype(np.float32), 8) for n in (16, 4)]
    cache, reused = working.for_call(kv, "c", 1, 10, 8)
    assert not reused and cache.capacity == 256 and working.allocations == 1
    cache, _ = working.for_call(kv, "c", 1, 270, 8)
    assert cache.capacity == 300 and working.allocations == 2       # 290 slots: the next step, held to the limit
    working.keep("c", 2)
    assert working.for_call(kv, "c", 2, 10, 8)[1] and not working.for_call(kv, "c", 2, 10, 8)[1]
    with pytest.raises(WorkbenchError, match=r"the cache given holds 300 torch.float16 slots; this call needs 320"):
        kv.to_cache(model.cfg, extra=300, into=cache)


@pytest.mark.parametrize("preset, room", [("llms", 1_000_000), ("vllm_sq", 1_400_000)])
def test_the_pipeline_writes_the_chunks_in_memory_while_the_rest_is_read_and_the_call_runs_on_a_rebuild(
        tmp_path, model, preset, room):
    """Under a budget (``room`` beside the working cache) of about two contexts, switches bring part of a
    context back. LLMS's pipeline writes the chunks still in memory into the buffer while its IO thread
    reads the rest (a "decompress" span that starts before the last read ends); the baselines read, then
    rebuild. Either way the cache each call
    runs on is bit for bit a fresh rebuild from the chunks. Catches a fill that skips chunks the load
    replaced, or leaves the loaded ones unwritten."""
    config = replace(ServiceConfig.preset(preset), max_context_tokens=256)
    reserve = ONE_BUFFER
    svc = LLMService(model, tmp_path, memory_budget_bytes=reserve + room, config=config)
    real, runs = svc.working.for_call, []

    def for_call(kv, *args):
        cache, reused = real(kv, *args)
        n = len(kv.tokens)
        fresh = kv.to_cache(model.cfg, extra=0, new_bits=config.base_bits)
        same = all(np.array_equal(mine[:, :, :n].numpy().view(np.uint16), theirs[:, :, :n].numpy().view(np.uint16))
                   for mine, theirs in ((cache.k, fresh.k), (cache.v, fresh.v)))
        last = svc.loader.last
        spans = () if last is None else last.timeline.spans
        runs.append((same, [s for s in spans if s.kind == "decompress"], [s for s in spans if s.kind == "swap_in"],
                     len(kv.chunks)))
        svc.loader.last = None
        return cache, reused

    svc.working.for_call = for_call
    app = svc.bind("a")
    stubs = [app.new_ctx("Be brief.") for _ in range(3)]
    for c, prompt in STEPS + [(1, "Why?"), (2, "Name a tree."), (0, "Once more.")]:
        stats = app.call_with_stats(stubs[c], prompt, 4)[1]
        partial = 0 < stats.chunks_loaded < len(svc._contexts[stats.ctx].kv.chunks) and not stats.chunks_recomputed
        runs[-1] += (partial,)
    svc.close()
    assert all(same for same, *_ in runs)
    partial = [(fills, reads) for _, fills, reads, _, was_partial in runs if was_partial]
    assert len(partial) >= 2
    if preset == "llms":
        assert all(len(fills) == 1 and fills[0].start < max(r.end for r in reads) for fills, reads in partial)
    else:
        assert all(fills == [] for fills, _ in partial)


def test_a_kept_buffer_is_forgotten_once_its_contexts_chunks_left_memory(tmp_path, model):
    """LMK kills whole contexts under a budget with room for about two contexts' chunks, while a 768-token
    limit's reserve keeps three 256-slot buffers: a killed context comes back recomputed, so the buffer kept
    for it no longer mirrors its chunks. Every call runs on a cache bit for bit a fresh rebuild (catches
    a kept buffer reused after its context's chunks were dropped)."""
    config = replace(ServiceConfig.preset("lmk"), max_context_tokens=768)
    svc = LLMService(model, tmp_path, memory_budget_bytes=3 * ONE_BUFFER + 2_500_000, config=config)
    real, runs = svc.working.for_call, []

    def for_call(kv, *args):
        cache, reused = real(kv, *args)
        n = len(kv.tokens)
        fresh = kv.to_cache(model.cfg, extra=0, new_bits=config.base_bits)
        runs.append((all(np.array_equal(mine[:, :, :n].numpy().view(np.uint16), theirs[:, :, :n].numpy().view(np.uint16))
                         for mine, theirs in ((cache.k, fresh.k), (cache.v, fresh.v))), reused))
        return cache, reused

    svc.working.for_call = for_call
    app = svc.bind("a")
    stubs = [app.new_ctx("Be brief.") for _ in range(3)]
    killed_while_kept = []
    for c, prompt in STEPS + [(1, "Why?"), (2, "Name a tree."), (0, "Once more."), (1, "Again.")]:
        kept = [b.mirrors[0] for b in svc.working.buffers if b.mirrors is not None]
        stats = app.call_with_stats(stubs[c], prompt, 4)[1]
        killed_while_kept.append(stats.chunks_recomputed > 0 and stats.ctx in kept)
    svc.close()
    assert all(same for same, _ in runs)
    assert any(reused for _, reused in runs) and any(killed_while_kept)


def test_smaller_chunks_leave_room_for_more_kept_buffers_and_buffers_give_way_to_chunks(tmp_path, model):
    """The same budget (3.5 buffers of a 128-token limit) and calls for LLMS and vLLM-SQ: LLMS's compressed
    chunks leave room for more kept buffers, so more of its switches rebuild nothing; for both, after
    every call the chunks in memory and the buffers fit the budget as the contexts grow (catches buffers
    kept past the room the chunks leave, or a budget that counts buffers as free)."""
    one = 128 * 2 * 30 * 3 * 64 * 2
    prompts = ["Name a color.", "Tell me about the sea in two long sentences please.", "Say hi.",
               "Count to ten slowly.", "Why is the sky blue?", "Thanks, and more?"]
    reused = {}
    for preset in ("llms", "vllm_sq"):
        config = replace(ServiceConfig.preset(preset), max_context_tokens=128)
        svc = LLMService(model, tmp_path / preset, memory_budget_bytes=int(3.5 * one), config=config)
        app = svc.bind("a")
        stubs = [app.new_ctx("Be brief.") for _ in range(3)]
        reused[preset] = 0
        for i, c in enumerate([0, 1, 2, 0, 1, 2, 0, 0, 2]):
            stats = app.call_with_stats(stubs[c], prompts[i % len(prompts)], 4)[1]
            reused[preset] += stats.cache_reused
            assert svc.budget.used_bytes() + svc.working.nbytes() <= svc.memory_budget_bytes
        assert svc.snapshot()["working_bytes"] == svc.working.nbytes() > 0
        svc.close()
    assert reused["llms"] > reused["vllm_sq"] > 0
