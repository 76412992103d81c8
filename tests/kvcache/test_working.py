"""The working cache kept between calls: one buffer, mirroring exactly what the chunks hold."""
from dataclasses import replace

import numpy as np
import pytest

from workbench.kvcache.service import LLMService, ServiceConfig
from workbench.kvcache.working import WorkingCache
from workbench.models.decoder import load_decoder

STEPS = [(0, "Name a color."), (0, "And another?"), (1, "Say hi."), (1, "Count to three."), (0, "Why?"),
         (0, "Thanks."), (2, "Name a fruit.")]
"""Context and prompt per call: repeats (reused), switches (rebuilt), a third context (a longer buffer)."""


@pytest.fixture(scope="module")
def model():
    return load_decoder()


def _session(model, folder, config, reuse: bool, after_call=None):
    svc = LLMService(model, folder, memory_budget_bytes=60_000_000, config=config)
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


def test_a_call_on_the_context_just_served_reuses_the_buffer_and_answers_as_a_rebuild_would(tmp_path, model):
    """Reuse only on a repeat with nothing served between; the replies equal those of a service that rebuilds
    the cache every call (catches a stale buffer reused after another context's call)."""
    config = replace(ServiceConfig.preset("llms"), max_context_tokens=512)
    kept = _session(model, tmp_path / "kept", config, True)
    rebuilt = _session(model, tmp_path / "rebuilt", config, False)
    assert [r for _, r in kept] == [False, True, False, True, False, True, False]
    assert [t for t, _ in kept] == [t for t, _ in rebuilt]
    assert not any(r for _, r in rebuilt)


def test_switches_write_into_one_buffer_grown_only_when_a_call_needs_more(tmp_path, model):
    """No allocation per switch: the buffer is made once for these calls and its memory stays the same."""
    config = replace(ServiceConfig.preset("llms"), max_context_tokens=512)
    pointers = []
    out = _session(model, tmp_path, config, True,
                   lambda svc, stats: pointers.append((svc.working.allocations, svc.working.cache.k.data_ptr())))
    assert len(out) == len(STEPS)
    assert {a for a, _ in pointers} == {1} and len({p for _, p in pointers}) == 1


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
    reserve = 256 * 2 * 30 * 3 * 64 * 2
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
