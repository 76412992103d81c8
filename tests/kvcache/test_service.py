import json
from dataclasses import replace
import threading
import time
import urllib.request

import numpy as np
import pytest

from workbench.errors import UnknownNameError, WorkbenchError
from workbench.kvcache.costmodel import SwapCostModel, model_chunk_bytes
from workbench.kvcache.lifecycle import DROP, KILL, SWAP_OUT, MemoryBudgetError
from workbench.kvcache.loader import PipelineLoader
from workbench.kvcache.service import (PRESETS, _digest, ContextLimitError, CtxStub, FairLock, LLMService, ServiceConfig,
                                       StubError, SwapStoreError)
from workbench.models.decoder import decoder_tokenizer, load_decoder

NEW = 4
SYSTEM = "Be brief."
A_PROMPTS = ("Name a color.", "And another?")
B_PROMPT = "Say hi."
LIMIT = 256
"""The context limit of the services whose budgets hold one context but not two: their working-cache reserve
(``RESERVE``) stays small, so a budget is that reserve and the bytes chunks may take beside it."""
RESERVE = LIMIT * 2 * 30 * 3 * 64 * 2                     # K and V of 30 layers, 3 heads of 64, float16
LLMS_ROOM, VLLM_SQ_ROOM = 520_000, 630_000
"""Bytes for chunks beside the reserve that hold one context of these tests with room for its call, not two:
A and B after one call each hold about 239 and 227 KB under LLMS (8-bit chunks, full ones at 4 bits), 331
and 319 KB at vLLM-SQ's 8 bits."""


def limited(config: ServiceConfig | None = None) -> ServiceConfig:
    return replace(config or ServiceConfig(), max_context_tokens=LIMIT)


@pytest.fixture(scope="module")
def model():
    return load_decoder()


def test_another_apps_stub_is_refused_and_stubs_are_secrets_kept_hashed(tmp_path, model):
    svc = LLMService(model, tmp_path)
    a, b = svc.bind("notes"), svc.bind("mail")
    stub, other = a.new_ctx(SYSTEM), a.new_ctx()
    assert len(stub.token) >= 40 and stub.token != other.token
    with pytest.raises(StubError, match="belongs to another app"):
        b.call(stub, "hello", NEW)
    with pytest.raises(StubError, match="belongs to another app"):
        b.delete(stub)
    with pytest.raises(StubError, match="unknown context stub"):
        a.call(CtxStub(stub.token[:-1] + "x"), "hello", NEW)
    svc.close()
    assert stub.token.encode() not in b"".join(p.read_bytes() for p in tmp_path.glob("index.sqlite3*"))
    svc = LLMService(model, tmp_path)                      # stubs outlive the service
    a, b = svc.bind("notes"), svc.bind("mail")
    with pytest.raises(StubError, match="belongs to another app"):
        b.call(stub, "hello", NEW)
    a.delete(stub)
    with pytest.raises(StubError, match="unknown context stub"):
        a.delete(stub)
    svc.close()


def test_an_app_holds_at_most_its_limit_of_contexts(tmp_path, model):
    with LLMService(model, tmp_path, max_contexts_per_app=2) as svc:
        a, b = svc.bind("a"), svc.bind("b")
        first = a.new_ctx()
        a.new_ctx()
        with pytest.raises(ContextLimitError, match="app 'a' holds 2 contexts.*delete one"):
            a.new_ctx()
        b.new_ctx()                                        # the limit is per app
        a.delete(first)
        a.new_ctx()


def test_a_context_larger_than_the_whole_budget_is_refused_and_left_as_it_was(tmp_path, model):
    with LLMService(model, tmp_path, memory_budget_bytes=RESERVE + 100_000, config=limited()) as svc:
        a = svc.bind("a")
        stub = a.new_ctx(SYSTEM)
        with pytest.raises(MemoryBudgetError, match=f"more than the 100000 bytes the memory budget of {RESERVE + 100_000} "
                                                    f"leaves beside the call's working cache \\({RESERVE} bytes\\); a "
                                                    f"served context is never evicted"):
            a.call(stub, A_PROMPTS[0], NEW)
        [ctx] = svc.snapshot()["contexts"]
        assert ctx["tokens"] == 0 and ctx["calls"] == 0 and svc.evictions == []


def test_configurations_and_presets_are_checked():
    with pytest.raises(UnknownNameError, match="unknown compression 'int3'"):
        ServiceConfig(compression="int3")
    with pytest.raises(WorkbenchError, match="outside what levels"):
        ServiceConfig(global_ratio=0.1)
    assert ServiceConfig.preset("lmk").eviction == "kill" and PRESETS["vllm_s"].base_bits == 16
    assert not PRESETS["llms_without_lifecycle"].aot_swap_out and PRESETS["llms_without_lifecycle"].policy == "lru"


def test_the_fair_lock_serves_callers_in_arrival_order():
    lock, order = FairLock(), []
    lock.acquire()

    def caller(i):
        lock.acquire()
        order.append(i)
        lock.release()

    threads = []
    for i in range(4):
        threads.append(threading.Thread(target=caller, args=(i,)))
        threads[-1].start()
        while lock.waiting < i + 1:
            time.sleep(0.001)
    lock.release()
    for t in threads:
        t.join()
    assert order == [0, 1, 2, 3] and lock.waiting == 0


# ------------------------------------------------------------------ switching between two contexts

RUNS = {
    # name: (config, budget). A budget that holds one context with room for its call, not two.
    "llms": (limited(), RESERVE + LLMS_ROOM),
    "vllm_sq": (limited(PRESETS["vllm_sq"]), RESERVE + VLLM_SQ_ROOM),         # 8-bit, LRU, written only at eviction
    "kill": (limited(ServiceConfig(compression="none", eviction="kill")), RESERVE + 1_050_000),   # float16 chunks
}


def switching(tmp_path, model, config, budget):
    """A's first call, B's first call (evicting A), A's second call (evicting B, bringing A back); A's
    chunks as held after its first call, and as read back from its files after B's call."""
    svc = LLMService(model, tmp_path, memory_budget_bytes=budget, config=config)
    app = svc.bind("a")
    a, b = app.new_ctx(SYSTEM), app.new_ctx(SYSTEM)
    calls, statements = [], []
    svc.store._db.set_trace_callback(statements.append)
    for stub, prompt in [(a, A_PROMPTS[0]), (b, B_PROMPT), (a, A_PROMPTS[1])]:
        before = len(svc.evictions)
        statements.clear()
        text, stats = app.call_with_stats(stub, prompt, NEW)
        ctx = svc._contexts[stats.ctx]
        calls.append({"text": text, "stats": stats, "evicted": svc.evictions[before:], "snapshot": svc.snapshot(),
                      "held": [c.to_array() if c is not None else None for c in ctx.kv.chunks],
                      "lax_commits": statements.count("PRAGMA synchronous=NORMAL")})
        if len(calls) == 2:
            a_rows = svc._contexts[calls[0]["stats"].ctx].chunks
            calls[0]["from_files"] = {r.idx: svc.store.read(r).to_array() for r in a_rows if r.state == "file"}
    return svc, calls


@pytest.fixture(scope="module")
def runs(tmp_path_factory, model):
    out = {name: switching(tmp_path_factory.mktemp(name), model, config, budget)
           for name, (config, budget) in RUNS.items()}
    yield out
    for name in RUNS:
        out[name][0].close()


@pytest.mark.parametrize("name, action", [("llms", DROP), ("vllm_sq", SWAP_OUT), ("kill", KILL)])
def test_switching_evicts_only_other_contexts_and_records_why(runs, name, action):
    svc, calls = runs[name]
    first, b_call, a_again = calls
    assert first["evicted"] == [] and b_call["evicted"] and a_again["evicted"]
    # evictions that write nothing (drops, kills) do not wait for the disk; swap-outs do
    assert [c["lax_commits"] for c in calls] == ([0, 0, 0] if action == SWAP_OUT else [0, 1, 1])
    a_id, b_id = first["stats"].ctx, b_call["stats"].ctx
    assert {r.ctx for r in b_call["evicted"]} == {a_id} and {r.ctx for r in a_again["evicted"]} == {b_id}
    for call in calls:
        assert all(r.served_ctx == call["stats"].ctx != r.ctx for r in call["evicted"])
        assert all(r.action == action and r.policy == svc.config.policy for r in call["evicted"])
        assert call["stats"].evictions == len(call["evicted"])
    assert b_call["evicted"][0].bytes_needed > 0
    assert sum(r.nbytes for r in b_call["evicted"]) >= b_call["evicted"][0].bytes_needed
    written_at_eviction = svc.metrics.registry.get_sample_value("llms_swap_outs_total", {"when": "eviction"})
    if action == DROP:                                           # files were written ahead of time: no writes now
        assert written_at_eviction == 0 and a_again["stats"].chunks_loaded == len(b_call["evicted"])
    if action == SWAP_OUT:
        assert written_at_eviction == len(b_call["evicted"]) + len(a_again["evicted"])
    if action == KILL:                                           # the whole context goes, and is recomputed
        assert len(b_call["evicted"]) == len(first["snapshot"]["contexts"][0]["chunks"])
        assert a_again["stats"].chunks_recomputed == len(b_call["evicted"]) and a_again["stats"].chunks_loaded == 0

def test_policies_pick_different_first_victims(runs):
    lctru = runs["llms"][1][1]["evicted"][0]
    lru = runs["vllm_sq"][1][1]["evicted"][0]
    assert (lctru.chunk, lctru.bits) == (1, 8)                   # the 8-bit open chunk, not the compressed one
    assert lru.chunk == 0                                        # least recently used: same tick, earlier chunk


@pytest.mark.parametrize("name", ["llms", "vllm_sq"])
def test_an_evicted_context_comes_back_from_its_files_exactly_as_it_was_held(runs, name):
    svc, calls = runs[name]
    from_files = calls[0]["from_files"]
    assert sorted(from_files) == sorted(r.chunk for r in calls[1]["evicted"])
    for i, data in from_files.items():
        assert np.array_equal(data, calls[0]["held"][i])
    assert calls[2]["stats"].chunks_loaded == len(from_files) and calls[2]["stats"].chunks_recomputed == 0
    assert calls[2]["stats"].bytes_read > 0 and calls[2]["stats"].switch_s >= calls[2]["stats"].load_s > 0
    assert svc.store.verify() == []


def test_tolerance_compresses_full_chunks_and_baselines_keep_one_level(runs):
    levels = [[ch["bits"] for ch in call["snapshot"]["contexts"][0]["chunks"]] for call in runs["llms"][1]]
    after_first, after_second = levels[0], levels[2]
    assert after_first[-1] == 8 and after_second[-1] == 8                # the open last chunk stays 8-bit
    assert after_first[:-1] == [4]                                       # one full chunk, ratio 0.5: 4 bits
    assert sum(after_second[:-1]) == 4 * len(after_second[:-1])          # the ratio met exactly, both ways
    assert {ch["bits"] for ctx in runs["vllm_sq"][1][2]["snapshot"]["contexts"] for ch in ctx["chunks"]} == {8}
    assert {ch["bits"] for ctx in runs["kill"][1][2]["snapshot"]["contexts"] for ch in ctx["chunks"]} == {16}


def test_later_turns_follow_the_chat_format(runs):
    svc = runs["llms"][0]
    tok = decoder_tokenizer()
    ctx = next(c for c in svc._contexts.values() if c.row.calls == 2)
    text = tok._tok.decode(ctx.kv.tokens, skip_special_tokens=False)
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{A_PROMPTS[0]}<|im_end|>\n"
                           f"<|im_start|>assistant\n")
    assert f"<|im_end|>\n<|im_start|>user\n{A_PROMPTS[1]}<|im_end|>\n<|im_start|>assistant\n" in text


def test_snapshot_lists_contexts_chunks_and_the_queue_in_eviction_order(runs):
    svc = runs["llms"][0]
    snap = json.loads(json.dumps(svc.snapshot()))
    states = {ch["state"] for ctx in snap["contexts"] for ch in ctx["chunks"]}
    assert states <= {"memory+file", "file"} and "file" in states
    order = [(e["ctx"], e["chunk"]) for e in snap["queue"]["order"]]
    assert order == [(e.ctx, e.chunk) for e in svc.queue.order()] and order
    keys = [(-e["bits"], e["last_used"]) for e in snap["queue"]["order"]]
    assert keys == sorted(keys)
    in_memory = sum(ch["bytes"] for ctx in snap["contexts"] for ch in ctx["chunks"] if ch["state"] == "memory+file")
    assert snap["memory"]["used_bytes"] == in_memory == sum(snap["memory"]["by_level"].values())
    assert in_memory <= snap["chunk_budget_bytes"] == snap["memory_budget_bytes"] - RESERVE
    assert snap["working_reserve_bytes"] == RESERVE and snap["last_call"]["ctx"] == runs["llms"][1][2]["stats"].ctx


def test_the_typed_state_is_what_the_snapshot_shows(runs):
    """``state()`` (what replays read) and the JSON snapshot (what dashboards read) are one view."""
    svc, _ = runs["llms"]
    state, snap = svc.state(), svc.snapshot()
    assert [c.to_dict() for c in state.contexts] == snap["contexts"]
    assert [(e.ctx, e.chunk, e.bits) for e in state.queue] == [(e["ctx"], e["chunk"], e["bits"])
                                                                for e in snap["queue"]["order"]]
    assert state.used_bytes == snap["memory"]["used_bytes"] == svc.budget.used_bytes() > 0
    assert {int(k): v for k, v in snap["memory"]["by_level"].items()} == state.by_level() == svc.memory_by_level()


def test_the_working_cache_of_a_call_counts_against_the_budget(tmp_path, model, monkeypatch):
    """Chunks in memory and the cache a call works in never exceed the budget together: the cache is at most
    the reserve for the context limit, and chunks get only what the reserve leaves. A budget that cannot
    hold the reserve is refused when the service is made, naming both."""
    from workbench.kvcache.chunks import ChunkedKV

    peaks = []
    to_cache = ChunkedKV.to_cache

    def measured(kv, *args, **kwargs):
        cache = to_cache(kv, *args, **kwargs)
        working = 2 * cache.k.numel() * cache.k.element_size()
        peaks.append((svc.budget.used_bytes() + working, working))
        return cache

    monkeypatch.setattr(ChunkedKV, "to_cache", measured)
    config, budget = RUNS["llms"]
    svc = LLMService(model, tmp_path / "a", memory_budget_bytes=budget, config=config)
    app = svc.bind("a")
    stubs = [app.new_ctx(SYSTEM) for _ in range(3)]
    for stub, prompt in zip(stubs + stubs[:1], A_PROMPTS + (B_PROMPT, "Say bye.")):
        app.call(stub, prompt, NEW)
    assert len(peaks) == 4 and svc.evictions                   # chunks made room; the cache fit beside them
    assert all(total <= budget and 0 < working <= RESERVE for total, working in peaks)
    svc.close()
    with pytest.raises(MemoryBudgetError, match=rf"memory_budget_bytes must exceed the working cache of a call at "
                                                rf"the context limit \({RESERVE} bytes for {LIMIT} tokens\), got "
                                                rf"{RESERVE}; raise the budget or lower max_context_tokens"):
        LLMService(model, tmp_path / "b", memory_budget_bytes=RESERVE, config=config)
    assert not (tmp_path / "b").exists()


@pytest.mark.integration
def test_metrics_count_swaps_recomputes_evictions_and_memory_per_level(runs):
    svc, calls = runs["llms"]
    text = svc.metrics_text()
    evicted = sum(len(c["evicted"]) for c in calls)
    loaded = sum(c["stats"].chunks_loaded for c in calls)
    assert f'llms_evictions_total{{action="drop",policy="lctru"}} {float(evicted)}' in text
    assert f"llms_swap_ins_total {float(loaded)}" in text and "llms_calls_total 3.0" in text
    assert 'llms_swap_outs_total{when="ahead_of_time"}' in text and 'llms_memory_bytes{bits="4"}' in text
    assert "llms_recompute_share_of_switch 0.0" in text and "llms_queue_wait_seconds_count 3.0" in text
    kill = runs["kill"][0].metrics_text()
    assert "llms_recomputed_chunks_total 0.0" not in kill and "llms_recompute_share_of_switch 0.0" not in kill
    server, _ = svc.start_metrics_server(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10) as reply:
            served = reply.read().decode()
    finally:
        server.shutdown()
    assert "llms_calls_total 3.0" in served and server.server_address[0] == "127.0.0.1"


# ------------------------------------------------------------------ the service's own loader is the pipeline

def test_the_default_loader_is_the_pipeline_planned_on_the_host_or_a_preset(tmp_path, model):
    svc = LLMService(model, tmp_path / "host")
    assert isinstance(svc.loader, PipelineLoader) and svc.loader.device == "host"
    orin = LLMService(model, tmp_path / "orin", device="orin-nx")
    costs = orin.loader.costs_for(model)
    assert (costs.device, costs.source) == ("orin-nx", "emulated")
    with pytest.raises(UnknownNameError, match="nano"):
        LLMService(model, tmp_path / "bad", device="nano")
    with pytest.raises(WorkbenchError, match="either a loader or a device"):
        LLMService(model, tmp_path / "both", loader=PipelineLoader(), device="mi14")
    svc.close()
    orin.close()


def test_the_services_pipeline_recomputes_what_equation_4_says_to(tmp_path, model):
    """Reads made dear (1 kB/s): equation 4 recomputes every evicted chunk of A, though all have files."""
    dear_reads = SwapCostModel(device="host", source="measured", num_layers=model.cfg.num_layers, chunk_size=16,
                               chunk_bytes=model_chunk_bytes(model.cfg), recompute_fixed_s=0.0,
                               recompute_per_chunk_s=0.01, io_fixed_s=0.0, read_bytes_per_s=1e3)
    loader = PipelineLoader(dear_reads)
    svc = LLMService(model, tmp_path, memory_budget_bytes=RUNS["llms"][1], config=RUNS["llms"][0], loader=loader)
    app = svc.bind("a")
    a, b = app.new_ctx(SYSTEM), app.new_ctx(SYSTEM)
    app.call(a, A_PROMPTS[0], max_new_tokens=NEW)
    before = len(svc.evictions)
    app.call(b, B_PROMPT, max_new_tokens=NEW)
    evicted = sorted(r.chunk for r in svc.evictions[before:])
    text, stats = app.call_with_stats(a, A_PROMPTS[1], max_new_tokens=NEW)
    assert evicted and stats.chunks_recomputed == len(evicted) and stats.chunks_loaded == 0 and stats.bytes_read == 0
    assert loader.last.recomputed == tuple(evicted) and stats.loader == "pipeline on host" and text
    kinds = {s.kind for s in loader.last.timeline.spans}
    assert "recompute" in kinds and "swap_in" not in kinds
    svc.close()


def test_on_an_emulated_device_writes_at_eviction_take_the_devices_time(tmp_path, model):
    """vLLM-SQ writes evicted chunks when it evicts them: on an emulated device that write is padded to the
    device's bandwidth (reads' line), inside the switch; on the host nothing is padded."""
    slow = SwapCostModel(device="orin-nx", source="emulated", num_layers=model.cfg.num_layers, chunk_size=16,
                         chunk_bytes=model_chunk_bytes(model.cfg), recompute_fixed_s=1.0, recompute_per_chunk_s=1.0,
                         io_fixed_s=0.0, read_bytes_per_s=2e6)
    assert PipelineLoader(replace(slow, source="measured")).write_seconds(10**6, 4) == 0.0
    assert PipelineLoader(slow).write_seconds(10**6, 4) == pytest.approx(0.5)
    svc = LLMService(model, tmp_path, memory_budget_bytes=RUNS["vllm_sq"][1], config=RUNS["vllm_sq"][0],
                     loader=PipelineLoader(slow))
    app = svc.bind("a")
    a, b = app.new_ctx(SYSTEM), app.new_ctx(SYSTEM)
    app.call(a, A_PROMPTS[0], max_new_tokens=NEW)
    before = len(svc.evictions)
    _, stats = app.call_with_stats(b, B_PROMPT, max_new_tokens=NEW)
    evicted = svc.evictions[before:]
    assert evicted and all(r.action == SWAP_OUT for r in evicted)
    written = sum(svc.store.chunk_path(r.ctx, r.chunk).stat().st_size for r in evicted)
    assert stats.reclaim_s >= slow.t_io(written, len(evicted)) > 0.1
    svc.close()


def test_empty_and_over_long_prompts_are_refused_and_leave_the_context_as_it_was(tmp_path, model):
    config = ServiceConfig(max_context_tokens=64)
    with LLMService(model, tmp_path, config=config) as svc:
        app = svc.bind("a")
        stub, other = app.new_ctx(SYSTEM), app.new_ctx(SYSTEM)
        app.call(stub, A_PROMPTS[0], max_new_tokens=NEW)
        before = json.dumps(svc.snapshot()["contexts"], sort_keys=True)
        for prompt in ("", "   \n"):
            with pytest.raises(WorkbenchError, match="the prompt is empty"):
                app.call(stub, prompt, max_new_tokens=NEW)
        with pytest.raises(WorkbenchError, match=r"would grow to \d+ tokens, beyond its limit of 64; start a new "
                                                  r"context or delete this one"):
            app.call(stub, "tell me everything " * 20, max_new_tokens=NEW)
        assert json.dumps(svc.snapshot()["contexts"], sort_keys=True) == before
        assert app.call(other, B_PROMPT, max_new_tokens=NEW)              # the other context is served as usual
        assert app.call(stub, A_PROMPTS[1], max_new_tokens=NEW)



@pytest.mark.parametrize("name, budget, fail_at", [("llms", RESERVE + LLMS_ROOM, 1), ("vllm_sq", RESERVE + 810_000, 2)])
def test_a_full_disk_undoes_the_call_or_eviction_and_every_context_continues_as_without_it(
        tmp_path, model, monkeypatch, name, budget, fail_at):
    """LLMS writes chunks as a call returns, vLLM-SQ when it evicts: a full disk at that write is refused with
    one line, and afterwards both contexts continue exactly as on a service whose disk never filled."""
    from workbench.kvcache import store

    config = RUNS[name][0]                                # budgets: one grown context fits, two do not
    real_write = store.write_chunk_crc
    full = {"on": False}

    def write_chunk(path, data):
        if full["on"]:
            raise OSError(28, "No space left on device", str(path))
        return real_write(path, data)

    monkeypatch.setattr(store, "write_chunk_crc", write_chunk)

    def session(folder, fail_at: int | None):
        svc = LLMService(model, tmp_path / folder, memory_budget_bytes=budget, config=config)
        app = svc.bind("a")
        a, b = app.new_ctx(SYSTEM), app.new_ctx(SYSTEM)
        steps = [(a, A_PROMPTS[0]), (b, B_PROMPT), (a, A_PROMPTS[1]), (b, "Say bye.")]
        out = []
        for n, (stub, prompt) in enumerate(steps):
            if n == fail_at:
                full["on"] = True
                with pytest.raises(SwapStoreError, match=r"No space left on device.*(undone|nothing was evicted)"):
                    app.call(stub, prompt, max_new_tokens=NEW)
                full["on"] = False
                assert svc.store.verify() == []
            out.append(app.call(stub, prompt, max_new_tokens=NEW))
        assert {r.ctx for r in svc.evictions} == {svc._stubs[_digest(s.token)] for s in (a, b)}
        svc.close()
        return out

    # LLMS writes at the end of every call (B's first here); vLLM-SQ writes B's chunks as A's second call evicts them
    assert session("failed", fail_at) == session("clean", None)


# ------------------------------------------------------------------ nothing lost, nothing wrong served

@pytest.mark.parametrize("kwargs, problem", [
    (dict(levels=(8, 6, 2)), r"levels are distinct bit widths from \(8, 4, 2\).*got \(8, 6, 2\)"),
    (dict(levels=(4, 2), global_ratio=0.4), r"starting at the 8-bit base.*got \(4, 2\)"),
    (dict(levels=(8, 2, 4)), r"in descending order.*got \(8, 2, 4\)"),
    (dict(levels=(8, 8)), r"distinct.*got \(8, 8\)"),
    (dict(global_ratio=float("nan")), r"global_ratio is a number from 0.25 to 1, got nan"),
    (dict(chunk_size=0), r"chunk_size is a whole number from 1 to 8192 tokens, got 0"),
    (dict(chunk_size=100_000_000), r"chunk_size is a whole number from 1 to 8192 tokens, got 100000000"),
    (dict(chunk_size=16.5), r"chunk_size is a whole number.*got 16.5"),
    (dict(max_context_tokens=0), r"max_context_tokens is a whole number of at least 1 tokens, got 0"),
])
def test_a_configuration_the_call_path_cannot_honour_is_refused_when_made(kwargs, problem):
    with pytest.raises(WorkbenchError, match=problem):
        ServiceConfig(**kwargs)


def test_a_context_limit_beyond_the_decoders_is_refused_before_any_context_exists(tmp_path, model):
    with pytest.raises(WorkbenchError, match=r"max_context_tokens is at most 8192 tokens \(the decoder's "
                                              r"context\), got 9000"):
        LLMService(model, tmp_path, config=ServiceConfig(max_context_tokens=9000))
    with pytest.raises(WorkbenchError, match=r"memory_budget_bytes: must be at least 1 bytes, got 0"):
        LLMService(model, tmp_path, memory_budget_bytes=0)
    with pytest.raises(WorkbenchError, match=r"memory_budget_bytes: must be at most \d+ bytes \(this machine's "
                                              r"memory\), got 1e\+18"):
        LLMService(model, tmp_path, memory_budget_bytes=10**18)
    with pytest.raises(WorkbenchError, match=r"max_contexts_per_app: must be at most \d+ contexts"):
        LLMService(model, tmp_path, max_contexts_per_app=10**15)
    assert not list(tmp_path.iterdir())                     # refused before the swap folder is made


def _conversation(model, folder, steps, *, config=None, budget=LLMS_ROOM, during=None):
    """Run ``steps`` (context index, prompt) on a fresh service, calling ``during(n, svc, app, stubs)``
    before step n when given (it may raise the expected error itself and return True to run the step
    again); the service is closed and reopened half way, so what the index holds is what continues."""
    out = []
    config, budget = limited(config), RESERVE + budget
    svc = LLMService(model, folder, memory_budget_bytes=budget, config=config)
    app = svc.bind("a")
    stubs = [app.new_ctx(SYSTEM), app.new_ctx(SYSTEM)]
    for n, (which, prompt) in enumerate(steps):
        if during is not None:
            during(n, svc, app, stubs)
        if n == len(steps) // 2:
            svc.close()
            svc = LLMService(model, folder, memory_budget_bytes=budget, config=config)
            app = svc.bind("a")
        out.append(app.call(stubs[which], prompt, max_new_tokens=NEW))
    return svc, out


STEPS = [(0, A_PROMPTS[0]), (1, B_PROMPT), (0, A_PROMPTS[1]), (1, "Say bye.")]


def test_any_failure_after_inference_undoes_the_call_and_a_restart_continues_as_without_it(
        tmp_path, model, monkeypatch):
    """Not only a store error: any exception between inference and the index commit (here the level
    assignment) leaves the context as it was, in memory and in the index alike."""
    from workbench.kvcache import compression, service as service_module

    real_assign = compression.assign_levels

    def during(n, svc, app, stubs):
        if n != 2:
            return
        held = lambda: [(c["id"], c["tokens"], c["calls"], [ch["bits"] for ch in c["chunks"]])
                        for c in svc.snapshot()["contexts"]]        # the switch before inference stays done
        before = held()

        def broken(*args, **kwargs):
            raise ValueError("levels went wrong")

        monkeypatch.setattr(compression, "assign_levels", broken)
        with pytest.raises(service_module.CallFailedError,
                           match=r"failed \(ValueError: levels went wrong\); it was undone and the context is as it was"):
            app.call(stubs[0], A_PROMPTS[1], max_new_tokens=NEW)
        monkeypatch.setattr(compression, "assign_levels", real_assign)
        assert held() == before
        assert svc.store.verify() == []

    failed, failed_out = _conversation(model, tmp_path / "failed", STEPS, during=during)
    clean, clean_out = _conversation(model, tmp_path / "clean", STEPS)
    assert failed_out == clean_out
    tokens = lambda svc: sorted(len(c.kv.tokens) for c in svc._contexts.values())
    assert tokens(failed) == tokens(clean)
    failed.close(), clean.close()


def test_a_rename_that_fails_after_the_index_commit_keeps_the_call(tmp_path, model, monkeypatch):
    """The index commit is the commit point: once it holds the call, a failed rename neither undoes the
    call in memory (which a restart would bring back) nor raises; the chunk is served from its .next."""
    from workbench.kvcache import store as store_module

    real_move = store_module._move_into_place
    state = {"failing": False, "failed": 0}

    def move(src, dst):
        if state["failing"]:
            state["failed"] += 1
            raise OSError(5, "Input/output error", str(dst))
        real_move(src, dst)

    monkeypatch.setattr(store_module, "_move_into_place", move)

    def during(n, svc, app, stubs):
        state["failing"] = n == 1

    config = PRESETS["vllm_sq"]                         # B's chunks written at A's eviction, read back exactly
    failed, failed_out = _conversation(model, tmp_path / "failed", STEPS, config=config, budget=VLLM_SQ_ROOM,
                                       during=during)
    clean, clean_out = _conversation(model, tmp_path / "clean", STEPS, config=config, budget=VLLM_SQ_ROOM)
    assert state["failed"] > 0 and failed_out == clean_out
    assert failed.store.verify() == [] and not list((tmp_path / "failed").glob("*/*.next"))
    failed.close(), clean.close()


@pytest.mark.parametrize("damage", ["scrambled", "truncated", "missing"])
def test_a_damaged_swap_file_is_caught_by_its_check_dropped_and_recomputed(tmp_path, model, damage):
    """vLLM-SQ keeps every chunk at 8 bits and recomputing is exact, so a context whose file was damaged
    continues exactly as an undamaged one, with the damage counted."""
    config = PRESETS["vllm_sq"]

    def during(n, svc, app, stubs):
        if n != 2:
            return
        a_id = svc._stubs[_digest(stubs[0].token)]
        rows = [r for r in svc._contexts[a_id].chunks if r.state == "file"]
        path = svc.store.current_path(a_id, rows[0].idx)
        size = path.stat().st_size
        if damage == "scrambled":                       # right size, wrong bytes
            path.write_bytes(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
        elif damage == "truncated":
            path.write_bytes(path.read_bytes()[: size // 2])
        else:
            path.unlink()

    damaged = LLMService(model, tmp_path / "damaged", memory_budget_bytes=RESERVE + VLLM_SQ_ROOM, config=limited(config))
    app = damaged.bind("a")
    stubs = [app.new_ctx(SYSTEM), app.new_ctx(SYSTEM)]
    out, stats = [], []
    for n, (which, prompt) in enumerate(STEPS):
        during(n, damaged, app, stubs)
        text, s = app.call_with_stats(stubs[which], prompt, max_new_tokens=NEW)
        out.append(text), stats.append(s)
    clean, clean_out = _conversation(model, tmp_path / "clean", STEPS, config=config, budget=VLLM_SQ_ROOM)
    assert out == clean_out
    assert damaged.metrics.registry.get_sample_value("llms_damaged_chunk_files_total") == 1
    assert stats[2].chunks_recomputed == 1 and stats[2].chunks_loaded == stats[2].chunks_missing - 1
    assert stats[2].chunks_restored == 0 and len(stats[2].recovered) == 1
    assert stats[2].recovered[0].endswith("recomputed from its tokens (no intact base)")
    assert damaged.store.verify() == []
    damaged.close(), clean.close()


def test_a_damaged_chunk_with_an_intact_base_is_restored_bit_for_bit(tmp_path, model):
    """LLMS keeps a compressed chunk's 8-bit base: a chunk file scrambled at its size is caught by its CRC and
    made again from the base, equal to what was stored bit for bit (not recomputed, which differs at 4 bits),
    its file written again; the reply's stats say which chunk came back how, and the output is unchanged."""
    from workbench.kvcache.swapfile import read_chunk

    budget, config = LLMS_ROOM, limited(PRESETS["llms"])
    svc = LLMService(model, tmp_path / "damaged", memory_budget_bytes=RESERVE + budget, config=config)
    app = svc.bind("a")
    stubs = [app.new_ctx(SYSTEM), app.new_ctx(SYSTEM)]
    for which, prompt in STEPS[:2]:
        app.call(stubs[which], prompt, max_new_tokens=NEW)
    svc.close()                                         # reopened, every chunk is in its file only
    svc = LLMService(model, tmp_path / "damaged", memory_budget_bytes=RESERVE + budget, config=config)
    app = svc.bind("a")
    a_id = svc._stubs[_digest(stubs[0].token)]
    row = next(r for r in svc._contexts[a_id].chunks if r.state == "file" and r.base_crc32 is not None)
    assert row.bits < 8
    path = svc.store.current_path(a_id, row.idx)
    stored = read_chunk(path, row.bits, tuple(row.shape))
    path.write_bytes(np.random.default_rng(0).integers(0, 256, path.stat().st_size, dtype=np.uint8).tobytes())
    restored = {}
    real = svc._restore_from_base

    def spy(ctx, damaged):
        back = real(ctx, damaged)
        restored.update({i: ctx.kv.chunks[i] for i in back})
        return back

    svc._restore_from_base = spy
    text, stats = app.call_with_stats(stubs[0], STEPS[2][1], max_new_tokens=NEW)
    got = restored[row.idx]
    assert (got.bits, tuple(got.shape)) == (stored.bits, tuple(stored.shape))
    for part in ("payload", "low", "step"):
        assert np.array_equal(getattr(got, part), getattr(stored, part)), part
    assert stats.chunks_restored == 1 and stats.chunks_recomputed == 0
    assert stats.recovered == (f"chunk {row.idx}: {stats.recovered[0].split(': ', 1)[1]}",)
    assert stats.recovered[0].endswith("restored from its intact 8-bit base (exact)") and "CRC" in stats.recovered[0]
    assert svc.metrics.registry.get_sample_value("llms_damaged_chunk_files_total") == 1
    assert svc.store.verify() == []
    clean, clean_out = _conversation(model, tmp_path / "clean", STEPS[:3], config=PRESETS["llms"], budget=budget)
    assert text == clean_out[2]
    svc.close(), clean.close()


@pytest.mark.parametrize("when", ["before its turn", "at its turn"])
def test_a_caller_whose_wait_fails_gives_its_turn_back(when):
    lock = FairLock()
    lock.acquire()
    real_wait = lock._cond.wait

    def wait(timeout=None):
        if threading.current_thread().name != "doomed":
            return real_wait(timeout)
        if when == "at its turn":
            real_wait(timeout)
        raise KeyboardInterrupt

    lock._cond.wait = wait
    failed, served = [], []

    def doomed():
        try:
            lock.acquire()
        except KeyboardInterrupt:
            failed.append(True)

    def later():
        lock.acquire()
        served.append(True)
        lock.release()

    first = threading.Thread(target=doomed, name="doomed")
    first.start()
    while lock._next < 2:
        time.sleep(0.001)
    second = threading.Thread(target=later, daemon=True)
    second.start()
    while lock._next < 3:
        time.sleep(0.001)
    lock.release()
    first.join(5)
    second.join(5)
    assert failed == [True] and served == [True] and lock.waiting == 0


def test_levels_are_assigned_over_the_whole_context_from_each_chunks_8_bit_base(tmp_path, model):
    """After every call of a conversation the full chunks hold exactly ``assign_levels`` of the context's
    density (so the 0.5 ratio is met, not drifting below it as levels that only go down would), and each
    chunk's codes are its 8-bit base's, lowered once (never 4 -> 2 from 4-bit values)."""
    from workbench.kvcache.chunks import recompress
    from workbench.kvcache.density import assign_levels

    seen = set()
    config = ServiceConfig(levels=(8, 2))          # a third of the chunks at 8 bits: the densest must get them
    with LLMService(model, tmp_path, config=config) as svc:
        app = svc.bind("a")
        stub = app.new_ctx(SYSTEM)
        for prompt in ("Name a color.", "And a fruit?", "And an animal?", "A country?", "A city?", "A river?"):
            app.call(stub, prompt, max_new_tokens=8)
            [ctx] = svc._contexts.values()
            kv = ctx.kv
            full = [i for i in range(kv.num_chunks) if kv.span(i)[1] - kv.span(i)[0] == kv.chunk_size]
            bits = [kv.chunks[i].bits for i in full]
            assert bits == assign_levels(ctx.density[full], (8, 2), 0.5).tolist()
            assert abs(sum(bits) - 4 * len(full)) < 6                         # the ratio, within one chunk
            for i in full:
                base = svc.store.read_base(ctx.chunks[i])
                assert base is not None and base.bits == 8
                assert np.array_equal(kv.chunks[i].payload, recompress(base, kv.chunks[i].bits).payload)
                seen.add((i, kv.chunks[i].bits))
        assert svc.store.verify() == []
    assert len(full) >= 6 and {b for _, b in seen} == {8, 2}


def test_the_switch_ends_with_the_context_dequantized_and_says_what_each_part_took(runs):
    """Switching latency as the paper measures it: evicting others, loading the missing chunks and
    dequantizing the context into the decoder's cache, all before inference; the metrics show the split."""
    svc, calls = runs["llms"]
    for call in calls:
        s = call["stats"]
        assert s.dequantize_s > 0 and s.switch_s == pytest.approx(s.reclaim_s + s.load_s + s.dequantize_s, abs=1e-6)
    text = svc.metrics_text()
    total = sum(c["stats"].dequantize_s for c in calls)
    value = svc.metrics.registry.get_sample_value("llms_switch_part_seconds_total", {"part": "dequantize"})
    assert value == pytest.approx(total) and 'llms_switch_part_seconds_total{part="load"}' in text


def test_a_retried_call_id_is_answered_from_the_index_even_after_a_restart(tmp_path, model):
    """A client whose reply was lost (the service killed just after the commit, say) retries with the same
    call_id: the turn is not appended twice, and the answer is the committed one."""
    with LLMService(model, tmp_path) as svc:
        app = svc.bind("a")
        stub = app.new_ctx(SYSTEM)
        first, stats = app.call_with_stats(stub, A_PROMPTS[0], NEW, call_id="call-1")
    with LLMService(model, tmp_path) as svc:
        app = svc.bind("a")
        again, repeated = app.call_with_stats(stub, A_PROMPTS[0], NEW, call_id="call-1")
        [ctx] = svc._contexts.values()
        assert (again, repeated.output_tokens, repeated.context_tokens) == (first, stats.output_tokens, stats.context_tokens)
        assert ctx.row.calls == 1 and len(ctx.kv.tokens) == stats.context_tokens
        with pytest.raises(WorkbenchError, match="call_id 'call-1' was given to another call on this context"):
            app.call_with_stats(stub, "Something else.", NEW, call_id="call-1")
        app.call_with_stats(stub, A_PROMPTS[1], NEW, call_id="call-2")
        assert ctx.row.calls == 2
