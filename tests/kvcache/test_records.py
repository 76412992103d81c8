from workbench.kvcache.records import CallRecord, EvictionEvent, ReplayResult
from workbench.timeline import Span, Timeline


def record(index, context, switch_s):
    tl = Timeline((Span("io", "swap_in", 0.0, switch_s, "chunk 2", {"bytes": 10}),), "measured", name="load")
    return CallRecord(index=index, time_s=10.0 * index, context=context, switch_s=switch_s, io_s=switch_s,
                      recompute_s=0.0, inference_s=1.0, queue_wait_s=0.0, chunks_missing=1, chunks_loaded=1,
                      chunks_recomputed=0, bytes_read=10, memory_bytes=100, output="hi",
                      evictions=(EvictionEvent(call=index, context=1 - context, chunk=0, bits=8, last_used=0,
                                               bytes=5, bytes_needed=5, policy="lctru", action="drop",
                                               reason="lctru: 8-bit, least recently used"),),
                      chunk_map=(("8", "swapped"), ("4",)), queue=((0, 1, 8),), measured=tl)


def test_a_replay_round_trips_through_json(tmp_path):
    result = ReplayResult(method="llms", device="mi14", memory_budget_bytes=1000, contexts=2, pattern="random",
                          settings={"ratio": 0.5}, calls=(record(0, 0, 0.0), record(1, 1, 0.0), record(2, 0, 0.5)))
    back = ReplayResult.load(result.save(tmp_path / "r.json"))
    assert back == result
    assert back.calls[2].measured.spans[0].meta == {"bytes": 10}
    assert back.mean_switch_s() == 0.5                      # first calls of contexts 0 and 1 do not count
    assert back.mean_switch_s(skip_first_use=False) == 0.5 / 3
