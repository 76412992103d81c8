import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

from workbench.errors import WorkbenchError
from workbench.kvcache.costmodel import SwapCostModel, model_chunk_bytes
from workbench.kvcache.records import CHUNK_STATES, ReplayResult
from workbench.kvcache.replay import (budget_for, call_tokens, context_bytes, context_tokens, idle_gaps,
                                      method_config, min_budget_bytes, replay, tunable_settings,
                                      working_reserve_bytes, working_set_bytes)
from workbench.kvcache.service import ServiceConfig
from workbench.kvcache.traces import Trace, TraceCall
from workbench.models.config import DecoderConfig
from workbench.models.decoder import decoder_tokenizer, load_decoder

pytestmark = pytest.mark.xdist_group("kvcache-replay")     # one worker makes the module's shared fixture, once

ORDER = (0, 1, 2, 0, 1, 0)
PROMPTS = ("Name three colors of the rainbow and say which one you like best.",
           "Summarize: the city council voted to build a new bridge over the river next year.",
           "Is this review positive? The film was long, slow and far too loud.")
LEVEL_STATES = {"32", "16", "8", "4", "2"}


def tiny_trace() -> Trace:
    calls = tuple(TraceCall(time_s=10.0 * i, context=c, prompt=PROMPTS[c] if i < 3 else f"And then? ({i})")
                  for i, c in enumerate(ORDER))
    return Trace(calls=calls, contexts=3, pattern="random", mean_interval_s=10.0, seed=0,
                 sources=("review", "headline", "summary"))


@pytest.fixture(scope="module")
def model():
    return load_decoder()


@pytest.fixture(scope="module")
def costs(model):
    """Recompute 10 ms a chunk, an 8-bit chunk read in 11.5 ms: the pipeline plans some of each; no padding."""
    return SwapCostModel(device="host", source="measured", num_layers=model.cfg.num_layers, chunk_size=16,
                         chunk_bytes=model_chunk_bytes(model.cfg), recompute_fixed_s=0.0, recompute_per_chunk_s=0.01,
                         io_fixed_s=0.0, read_bytes_per_s=2e7)


@pytest.fixture(scope="module")
def replays(model, costs, tmp_path_factory):
    trace = tiny_trace()
    budget = budget_for(trace, 0.2, max_new_tokens=2, model=model)
    out = {}
    for method in ("llms", "vllm_sq", "lmk"):
        folder = tmp_path_factory.mktemp(method)
        out[method] = (replay(trace, method, memory_budget_bytes=budget, device=costs, model=model, swap_dir=folder,
                              max_new_tokens=2), folder)
    return out


def test_every_call_is_recorded_with_a_consistent_chunk_map(replays):
    for method, (result, folder) in replays.items():
        assert [c.index for c in result.calls] == list(range(len(ORDER)))
        assert [c.context for c in result.calls] == list(ORDER)
        assert sum(len(c.evictions) for c in result.calls) > 0, method            # the budget forces evictions
        seen = set()
        for call in result.calls:
            assert len(call.chunk_map) == 3
            assert all(s in CHUNK_STATES for row in call.chunk_map for s in row)
            served = call.chunk_map[call.context]
            assert served and all(s in LEVEL_STATES | {"loaded", "recomputed"} for s in served), (method, call)
            for other, row in enumerate(call.chunk_map):
                if other != call.context:
                    assert "loaded" not in row and "recomputed" not in row
            assert all(e.context != call.context and e.call == call.index for e in call.evictions)
            assert all(e.reason.startswith(e.policy) and f"context {e.context}" in e.reason for e in call.evictions)
            if call.context not in seen:
                assert call.switch_s == 0.0 and call.chunks_missing == 0
            seen.add(call.context)
            brought = sum(s in ("loaded", "recomputed") for s in served)
            assert brought == call.chunks_missing == call.chunks_loaded + call.chunks_recomputed
            assert (call.measured is not None) == (call.chunks_missing > 0)
        killed = any("killed" in row for c in result.calls for row in c.chunk_map)
        assert killed == (method == "lmk")
        ids = result.settings["context_ids"]
        for c, row in enumerate(result.calls[-1].chunk_map):
            for j, state in enumerate(row):
                exists = (folder / ids[str(c)] / f"{j}.bin").exists()
                if state == "swapped":
                    assert exists, (method, c, j)
                if state == "killed":
                    assert not exists


def test_a_replay_round_trips_through_json(replays, tmp_path):
    result = replays["llms"][0]
    assert ReplayResult.load(result.save(tmp_path / "llms.json")) == result


def test_a_replay_refuses_a_swap_folder_that_holds_contexts(replays, model, costs):
    with pytest.raises(WorkbenchError, match="already holds contexts of another run"):
        replay(tiny_trace(), "llms", memory_budget_bytes=1 << 30, device=costs, model=model,
               swap_dir=replays["llms"][1])


def test_lmk_recomputes_whole_contexts_vllm_sq_keeps_8_bits_llms_goes_lower(replays):
    lmk = replays["lmk"][0]
    returns = [c for c in lmk.calls if c.chunks_missing]
    assert returns
    for call in returns:
        before = lmk.calls[call.index - 1].chunk_map[call.context]
        assert set(before) == {"killed"} and call.chunks_recomputed == call.chunks_missing == len(before)
        assert call.chunks_loaded == 0 and call.bytes_read == 0
    sq = replays["vllm_sq"][0]
    assert {s for c in sq.calls for row in c.chunk_map for s in row} <= {"8", "swapped", "loaded"}
    assert any(c.chunks_loaded for c in sq.calls)
    llms = replays["llms"][0]
    assert {s for c in llms.calls for row in c.chunk_map for s in row} & {"4", "2"}


def test_the_pipeline_recomputes_some_chunks_when_recompute_is_cheap(replays):
    llms = replays["llms"][0]
    planned = [c for c in llms.calls if c.predicted is not None]
    assert planned and all(c.measured.source == "measured" and c.predicted.source == "predicted" for c in planned)
    assert sum(c.chunks_recomputed for c in llms.calls) > 0


class CountingTokenizer:
    """A tokenizer stub: a first call's prompt is 10 ids, every later one 5."""

    def chat(self, prompt):
        return [1] * 10

    def encode(self, text):
        return [1] * 5


def test_budgets_are_fractions_of_the_working_set_at_8_bits():
    cfg = DecoderConfig()
    stub = SimpleNamespace(cfg=cfg)
    trace = Trace(calls=tuple(TraceCall(time_s=float(i), context=c, prompt="x") for i, c in enumerate((0, 0, 1))),
                  contexts=2, pattern="random", mean_interval_s=1.0, seed=0, sources=("review", "review"))
    tok = CountingTokenizer()
    assert context_tokens(trace, 4, tok) == [10 + 4 + 5 + 4 - 1, 10 + 4 - 1]       # 22 and 13 tokens
    per_token_8 = 30 * 2 * 3 * 64                                                   # codes, one byte each

    def scales(tokens):                          # float16 min and step per key channel and per value token
        return 2 * 2 * 30 * 3 * (64 + tokens)

    full, six, thirteen = (n * per_token_8 + scales(n) for n in (16, 6, 13))
    assert full == 213120 and context_bytes(22, cfg) == full + six
    ws = full + six + thirteen
    assert working_set_bytes(trace, 8, 4, stub, tok) == ws
    assert call_tokens(trace, 4, tok) == 23                                         # the last call's pending token too
    reserve = 23 * 2 * 30 * 3 * 64 * 2                                              # its working cache, float16
    assert working_reserve_bytes(trace, 8, 4, stub, tok) == reserve
    assert budget_for(trace, 0.3, max_new_tokens=4, model=stub, tokenizer=tok) == reserve + round(0.3 * ws)
    assert min_budget_bytes(trace, 32, 4, stub, tok) == 2 * 4 * 23 * 30 * 2 * 3 * 64  # chunks and cache, float32


# ----------------------------------------------------------------------------- a configuration of one's own

@pytest.fixture(scope="module")
def costs8(model):
    """The ``costs`` line for 8-token chunks (half the tokens: half the recompute, about half the bytes)."""
    return SwapCostModel(device="host", source="measured", num_layers=model.cfg.num_layers, chunk_size=8,
                         chunk_bytes=model_chunk_bytes(model.cfg, 8), recompute_fixed_s=0.0,
                         recompute_per_chunk_s=0.005, io_fixed_s=0.0, read_bytes_per_s=2e7)


@pytest.fixture(scope="module")
def configured(model, costs8, tmp_path_factory):
    """LLMS on the tiny trace with 8-token chunks, every chunk kept at 8 bits (ratio 1) and LRU eviction."""
    trace = tiny_trace()
    config = method_config("llms", chunk_size=8, global_ratio=1.0, policy="lru")
    budget = budget_for(trace, 0.2, max_new_tokens=2, model=model, chunk_size=8)
    return replay(trace, "llms", config=config, memory_budget_bytes=budget, device=costs8, model=model,
                  swap_dir=tmp_path_factory.mktemp("configured"), max_new_tokens=2), config


def test_a_replay_runs_and_records_the_configuration_it_is_given(configured, model):
    result, config = configured
    recorded = result.settings["config"]
    limit = call_tokens(tiny_trace(), 2)                  # a replay limits contexts to its largest call
    assert ServiceConfig(**{**recorded, "levels": tuple(recorded["levels"])}) == replace(config, max_context_tokens=limit)
    assert result.settings["working_reserve_bytes"] == working_reserve_bytes(tiny_trace(), 8, 2, model)
    assert (config.chunk_size, config.global_ratio, config.policy) == (8, 1.0, "lru")
    tokenizer = decoder_tokenizer()
    assert result.settings["least_budget_bytes"] == min_budget_bytes(tiny_trace(), 8, 2, model, tokenizer, 8)
    most = context_tokens(tiny_trace(), 2, tokenizer)
    calls = [ORDER.count(c) for c in range(3)]
    for c, row in enumerate(result.calls[-1].chunk_map):
        fewest = most[c] - 4 * calls[c]                 # an answer may stop early, a turn close 2 tokens shorter
        assert -(-fewest // 8) <= len(row) <= -(-most[c] // 8), (c, len(row), most[c])
    events = [e for c in result.calls for e in c.evictions]
    assert events and {e.policy for e in events} == {"lru"}
    levels = {s for c in result.calls for row in c.chunk_map for s in row} & LEVEL_STATES
    assert levels == {"8"}                               # ratio 1: nothing lowered to 4 or 2 bits


def test_method_config_changes_only_what_applies_to_a_method():
    assert method_config("vllm_sq", chunk_size=8, global_ratio=0.25, policy="density") == \
        replace(ServiceConfig.preset("vllm_sq"), chunk_size=8)
    assert method_config("llms", policy="density", global_ratio=None) == replace(ServiceConfig(), policy="density")
    assert tunable_settings("llms") == ("chunk_size", "global_ratio", "policy")
    assert tunable_settings("lmk") == ("chunk_size",)
    with pytest.raises(WorkbenchError, match="chunk_size is a whole number from 1 to 8192 tokens, got 9000"):
        method_config("lmk", chunk_size=9000)
    with pytest.raises(WorkbenchError, match="got levels"):
        method_config("llms", levels=(8, 2))


def test_a_cost_model_for_other_chunks_is_refused(model, costs):
    with pytest.raises(WorkbenchError, match="for 16-token chunks; the replay's chunks hold 8"):
        replay(tiny_trace(), "llms", config=method_config("llms", chunk_size=8), memory_budget_bytes=1 << 30,
               device=costs, model=model)


# ----------------------------------------------------------------------------- idle time between calls

def test_idle_time_is_the_trace_gap_scaled_and_really_spent(model, costs):
    """Each call records the trace gap before it times the scale, and at least that much real time passes
    between the previous call's end (``progress``) and the call (the last ``should_stop`` before it)."""
    ended, asked = [], []

    def progress(done, _total):
        ended.append(time.monotonic())

    def should_stop():
        asked.append((len(ended), time.monotonic()))
        return False

    result = replay(tiny_trace(), "vllm_sq", memory_budget_bytes=1 << 30, device=costs, model=model,
                    max_new_tokens=1, idle_scale=0.03, progress=progress, should_stop=should_stop)
    assert [c.idle_s for c in result.calls] == pytest.approx([0.0] + [0.3] * (len(ORDER) - 1))
    assert result.settings["idle_scale"] == 0.03
    for i in range(1, len(ORDER)):
        started = max(t for done, t in asked if done == i)
        assert started - ended[i - 1] >= 0.3 - 1e-3, i


def test_idle_ends_when_the_replay_is_stopped(model, costs, monkeypatch):
    """A stop asked for while idle ends the replay without sitting out the gap (a fake clock: no real wait)."""
    import workbench.kvcache.replay as replay_module

    now = [0.0]
    monkeypatch.setattr(replay_module, "time", SimpleNamespace(
        monotonic=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)))
    done = []
    result = replay(tiny_trace(), "vllm_sq", memory_budget_bytes=1 << 30, device=costs, model=model,
                    max_new_tokens=1, idle_scale=5.0, progress=lambda d, _t: done.append(d),
                    should_stop=lambda: bool(done))
    assert len(result.calls) == 1 and now[0] < 1.0


def test_idle_beyond_the_limit_or_below_zero_is_refused_before_anything_runs():
    trace = tiny_trace()                               # 50 s of trace time between its first and last call
    assert idle_gaps(trace, 0.0) == [0.0] * len(ORDER)
    assert sum(idle_gaps(trace, 1.0, replays=5)) == pytest.approx(50.0)
    with pytest.raises(WorkbenchError, match=r"^idle scale 7 would idle 350 s, more than the 300 s allowed"):
        replay(trace, "llms", memory_budget_bytes=1 << 30, idle_scale=7.0)      # no model given: none loaded
    with pytest.raises(WorkbenchError, match=r"would idle 325 s over 5 replays"):
        idle_gaps(trace, 1.3, replays=5)
    for scale in (-0.1, float("nan")):
        with pytest.raises(WorkbenchError, match="at least 0"):
            idle_gaps(trace, scale)
