"""Figures of the LLM context service on replay records built by hand (no model, no replay)."""
from dataclasses import replace

import pytest

from workbench.kvcache.records import CallRecord, EvictionEvent, ReplayResult
from workbench.timeline import Span, Timeline
from workbench.viz.kvcache import (chunk_map_figure, events_figure, latency_figure, live_chunk_map_figure,
                                   live_queue_figure, load_gantt_figure, queue_figure)
from workbench.viz.kvcache import ACTION_LABELS, STATE_COLORS, STATE_LABELS, format_ms, method_label
from tests.viz.test_elastic import unexplained

BUDGET = 2_000_000


def eviction(call, context, chunk, bits, last_used, served, action="drop", policy="lctru"):
    reason = (f"{policy}: chunk {chunk} of context {context} ({bits}-bit, last used at tick {last_used}, "
              f"230000 B) to free 100000 B for context {served}; {action}")
    return EvictionEvent(call=call, context=context, chunk=chunk, bits=bits, last_used=last_used, bytes=230_000,
                         bytes_needed=100_000, policy=policy, action=action, reason=reason)


def load_timelines(loaded, recomputed, scale):
    """A predicted and a measured load: the IO lane reads layer by layer while the compute lane recomputes."""
    spans = []
    for layer in range(2):
        if loaded:
            spans.append(Span("io", "swap_in", layer * scale, (layer + 1) * scale, f"layer {layer}"))
        if recomputed:
            spans.append(Span("compute", "recompute", layer * scale, (layer + 0.8) * scale, f"layer {layer}"))
    predicted = Timeline(tuple(spans), "predicted")
    measured = Timeline(tuple(Span(s.lane, s.kind, s.start * 1.1, s.end * 1.2, s.label) for s in spans), "measured")
    return predicted, measured


def call(index, time_s, context, switch_s, chunk_map, queue, evictions=(), loaded=0, recomputed=0):
    predicted, measured = load_timelines(loaded, recomputed, switch_s / 2) if loaded + recomputed else (None, None)
    return CallRecord(index=index, time_s=time_s, context=context, switch_s=switch_s, io_s=switch_s if loaded else 0,
                      recompute_s=switch_s if recomputed else 0, inference_s=0.2, queue_wait_s=0.0,
                      chunks_missing=loaded + recomputed, chunks_loaded=loaded, chunks_recomputed=recomputed,
                      bytes_read=230_000 * loaded, memory_bytes=1_500_000, output="ok", evictions=tuple(evictions),
                      chunk_map=tuple(tuple(r) for r in chunk_map), queue=tuple(queue), predicted=predicted,
                      measured=measured)


def replay_result(method="llms", scale=1.0, action="drop", policy="lctru"):
    """Five calls over three contexts: two first uses, then returns that swap in, recompute, evict."""
    ev = lambda *a: eviction(*a, action=action, policy=policy)
    calls = (
        call(0, 60.0, 0, 0.0, [["8", "8", "8"]], [(0, 0, 8), (0, 1, 8), (0, 2, 8)]),
        call(1, 300.0, 1, 0.0, [["8", "4", "2"], ["8", "8"]], [(0, 0, 8), (1, 0, 8), (1, 1, 8), (0, 1, 4), (0, 2, 2)]),
        call(2, 700.0, 2, 0.0, [["swapped", "4", "2"], ["8", "8"], ["8", "8", "8"]],
             [(1, 0, 8), (1, 1, 8), (2, 0, 8), (2, 1, 8), (2, 2, 8), (0, 1, 4), (0, 2, 2)], [ev(2, 0, 0, 8, 0, 2)]),
        call(3, 900.0, 0, 0.004 * scale, [["loaded", "4", "2"], ["swapped", "8"], ["8", "8", "8"]],
             [(1, 1, 8), (2, 0, 8), (2, 1, 8), (2, 2, 8), (0, 0, 8), (0, 1, 4), (0, 2, 2)],
             [ev(3, 1, 0, 8, 1, 0)], loaded=1),
        call(4, 1300.0, 1, 0.006 * scale, [["8", "4", "2"], ["recomputed", "8"], ["swapped", "8", "8"]],
             [(2, 1, 8), (2, 2, 8), (0, 0, 8), (1, 0, 8), (1, 1, 8), (0, 1, 4), (0, 2, 2)],
             [ev(4, 2, 0, 8, 2, 1), ev(4, 1, 1, 8, 1, 1)], recomputed=1),
    )
    return ReplayResult(method=method, device="orin-nx", memory_budget_bytes=BUDGET, contexts=3, pattern="markov",
                        settings={"policy": policy}, calls=calls)


def sample_replays() -> dict:
    """LLMS and two baselines on the same five calls (the baselines slower, LMK killing)."""
    return {"llms": replay_result(), "vllm_sq": replay_result("vllm_sq", 3.0, "swap_out", "lru"),
            "lmk": replay_result("lmk", 20.0, "kill", "lru")}


def cells(trace):
    """(context, chunk) of each cell a horizontal-bar trace draws."""
    return sorted((int(y), int(round(b + 0.5))) for y, b in zip(trace.y, trace.base))


def test_chunk_map_colours_every_cell_by_its_state_and_outlines_the_served_context():
    result = replay_result()
    fig = chunk_map_figure(result, 4)
    record = result.calls[4]
    bars = [t for t in fig.data if t.type == "bar"]
    expected = {}
    for c, row in enumerate(record.chunk_map):
        for k, state in enumerate(row):
            expected.setdefault(state, []).append((c, k))
    assert {t.name: cells(t) for t in bars} == {STATE_LABELS[s]: sorted(v) for s, v in expected.items()}
    assert {t.name: t.marker.color for t in bars} == {STATE_LABELS[s]: STATE_COLORS[s] for s in expected}
    assert len({t.name for t in bars}) == len(bars) == len(expected)          # one legend entry per state shown
    recomputed = next(t for t in bars if t.name == STATE_LABELS["recomputed"])
    assert list(recomputed.hovertext) == ["context 1, chunk 0: recomputed by this call"]
    served = fig.data[-1]
    assert served.name == "served by call 4: context 1"
    assert {y for y in served.y if y is not None} == {0.5, 1.5} and max(x for x in served.x if x is not None) == 2.5
    assert list(fig.layout.yaxis.ticktext) == ["context 0", "context 1", "context 2"]
    early = list(chunk_map_figure(result, 0).layout.yaxis.ticktext)
    assert early == ["context 0", "context 1 (no KV yet)", "context 2 (no KV yet)"]
    assert "call 4" in fig.layout.title.text and "1 recomputed" in fig.layout.title.text


def test_queue_figure_keeps_the_recorded_order_grouped_by_level():
    result = replay_result()
    record = result.calls[3]
    fig = queue_figure(result, 3)
    placed = sorted((b + 0.5, t.name, text) for t in fig.data for b, text in zip(t.base, t.text))
    assert [p for p, _, _ in placed] == list(range(1, len(record.queue) + 1))
    assert [text for _, _, text in placed] == [f"{c}/{k}" for c, k, _ in record.queue]
    assert [name for _, name, _ in placed] == [f"{b}-bit chunks" for _, _, b in record.queue]
    assert list(fig.layout.yaxis.ticktext) == ["8-bit", "4-bit", "2-bit"]    # heaviest sub-queue on top
    eight = fig.data[0]
    assert eight.hovertext[0].startswith("#1 to leave: context 1, chunk 1 (8-bit)")
    assert "least recently used first (context 1 last used by call 1)" in eight.hovertext[0]
    four = fig.data[1]
    assert "the 5 chunks of heavier levels go before it" in four.hovertext[0]
    lru = queue_figure(replay_result("vllm_sq", policy="lru"), 3)
    assert "heavier levels" not in lru.data[0].hovertext[0] and "least recently used" in lru.data[0].hovertext[0]
    whole = queue_figure(replay_result("lmk", policy="lru"), 3)
    assert whole.data[0].hovertext[0].endswith("whole contexts leave together")


def test_events_hover_is_the_recorded_reason():
    result = replay_result()
    fig = events_figure(result, 3)
    drops = next(t for t in fig.data if t.name.startswith(ACTION_LABELS["drop"]))
    reasons = [e.reason for c in result.calls for e in c.evictions]
    assert list(drops.hovertext) == reasons and drops.name.endswith(f": {len(reasons)}")
    assert list(drops.x) == pytest.approx([c.time_s / 60 for c in result.calls for _ in c.evictions])
    assert [round(y) for y in drops.y] == [e.context for c in result.calls for e in c.evictions]
    calls = next(t for t in fig.data if t.name.startswith("call"))
    assert list(calls.y) == [c.context for c in result.calls]
    assert fig.layout.shapes[0].x0 == pytest.approx(900.0 / 60) and fig.layout.shapes[0].name.startswith("call 3")
    kills = events_figure(replay_result("lmk", action="kill"))
    assert [t.name for t in kills.data][0].startswith(ACTION_LABELS["kill"]) and not kills.layout.shapes


def test_latency_lines_are_the_switch_times_in_ms_with_the_mean_in_the_legend():
    results = sample_replays()
    fig = latency_figure(results)
    assert fig.layout.yaxis.type == "log" and "ms" in fig.layout.yaxis.title.text
    lines = {t.name: t for t in fig.data if t.mode == "lines+markers"}
    for method, result in results.items():
        name = f"{method_label(method)}: mean {format_ms(result.mean_switch_s())}"
        assert list(lines[name].y) == [pytest.approx(c.switch_s * 1e3) if c.switch_s else None for c in result.calls]
    assert "LLMS: mean 5.00 ms" in lines                  # calls 3 and 4 (4 and 6 ms): first uses not counted
    floor = fig.data[-1]
    assert list(floor.x) == [0, 1, 2] and "nothing to bring back under LLMS, vLLM-SQ, LMK" in floor.hovertext[0]


def test_load_gantt_overlays_the_measured_load_on_the_prediction():
    result = replay_result()
    fig = load_gantt_figure(result, 4)
    assert [t.name for t in fig.data] == ["recompute (predicted)", "recompute (measured)"]
    assert list(fig.data[0].x) == pytest.approx([s.duration * 1e3 for s in result.calls[4].predicted.spans])
    assert "1 recomputed" in fig.layout.title.text
    swap = load_gantt_figure(result, 3)
    assert [t.name for t in swap.data] == ["swap_in (predicted)", "swap_in (measured)"]
    first = load_gantt_figure(result, 1)
    assert not first.data and "the first call of context 1 builds its KV" in first.layout.annotations[0].text
    again = replace(result, calls=(*result.calls, replace(result.calls[4], index=5, predicted=None, measured=None,
                                                           chunks_missing=0, chunks_recomputed=0)))
    nothing = load_gantt_figure(again, 5)
    assert not nothing.data and "every chunk of context 1 was in memory" in nothing.layout.annotations[0].text
    assert "its 6.00 ms switch went to making room (2 chunk(s) evicted)" in nothing.layout.annotations[0].text


def sample_snapshot() -> dict:
    """A service's snapshot (``LLMService.snapshot``'s shape) with two apps: a served context with chunks at
    8, 4 and 2 bits, and one swapped out in part and dropped in part."""
    def chunk(i, bits, state):
        return {"index": i, "bits": bits, "state": state, "bytes": 1000 * bits, "last_tick": 3, "density": 0.1}

    contexts = [{"id": "aaaaaaaa11", "app": "uid0:notes", "tokens": 40, "calls": 2, "last_used": 0.0, "last_tick": 3,
                 "served": True, "bytes_in_memory": 14000,
                 "chunks": [chunk(0, 8, "memory+file"), chunk(1, 4, "memory"), chunk(2, 2, "memory")]},
                {"id": "bbbbbbbb22", "app": "key:mail", "tokens": 30, "calls": 1, "last_used": 0.0, "last_tick": 1,
                 "served": False, "bytes_in_memory": 8000,
                 "chunks": [chunk(0, 8, "file"), chunk(1, 8, "memory+file"), chunk(2, 4, "dropped")]}]
    order = [{"ctx": "bbbbbbbb22", "chunk": 1, "bits": 8, "nbytes": 8000, "last_used": 1, "density": 0.1}]
    return {"contexts": contexts, "memory": {"used_bytes": 22000, "by_level": {"8": 16000, "4": 4000, "2": 2000}},
            "chunk_budget_bytes": 50000, "queue": {"policy": "lctru", "order": order},
            "last_call": {"app": "uid0:notes", "ctx": "aaaaaaaa11", "switch_s": 0.0123, "tick": 3},
            "metrics": {}, "waiting_calls": 0, "swap_dir": "/tmp/swap"}


def test_the_live_chunk_map_draws_each_chunk_in_its_state_and_each_context_by_app():
    """Catches: a swapped or dropped chunk drawn as in memory, contexts of one app mixed with another's, the
    budget or the last call misquoted."""
    snap = sample_snapshot()
    fig = live_chunk_map_figure(snap)
    assert list(fig.layout.yaxis.ticktext) == ["key:mail · bbbbbb", "uid0:notes · aaaaaa (being served)"]
    cells = {(int(y), round(b + 0.5)): t.name for t in fig.data for y, b in zip(t.y, t.base)}
    assert cells == {(0, 0): STATE_LABELS["swapped"], (0, 1): STATE_LABELS["8"], (0, 2): STATE_LABELS["killed"],
                     (1, 0): STATE_LABELS["8"], (1, 1): STATE_LABELS["4"], (1, 2): STATE_LABELS["2"]}
    assert "2 contexts; 0.02 of 0.05 MB of KV in memory; last call: uid0:notes on aaaaaa, switch 12.3 ms" in \
        fig.layout.title.text
    queue = live_queue_figure(snap)
    assert [list(t.text) for t in queue.data] == [["bbbb/1"]] and "(LCTRU)" in queue.layout.title.text
    empty = {**snap, "contexts": [], "queue": {"policy": "lru", "order": []}}
    assert "no context yet" in live_chunk_map_figure(empty).layout.annotations[0].text
    assert "nothing is in the queue" in live_queue_figure(empty).layout.annotations[0].text


def kvcache_figures() -> dict:
    """Each builder of this module in the states the page shows (for the every-mark rule)."""
    results = sample_replays()
    llms, lmk = results["llms"], results["lmk"]
    snap = sample_snapshot()
    return {
        "live_chunk_map_figure": [live_chunk_map_figure(snap)],
        "live_queue_figure": [live_queue_figure(snap)],
        "chunk_map_figure": [chunk_map_figure(llms, i) for i in range(5)],
        "queue_figure": [queue_figure(llms, 3), queue_figure(results["vllm_sq"], 4), queue_figure(lmk, 0)],
        "events_figure": [events_figure(llms, 2), events_figure(lmk), events_figure(results["vllm_sq"], 4)],
        "latency_figure": [latency_figure(results), latency_figure({})],
        "load_gantt_figure": [load_gantt_figure(llms, i) for i in (1, 3, 4)],
    }


def test_every_mark_is_explained():
    problems = [f"{name}: {p}" for name, figs in kvcache_figures().items() for fig in figs for p in unexplained(fig)]
    assert problems == []
