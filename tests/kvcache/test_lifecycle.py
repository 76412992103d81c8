import pytest

from workbench.errors import UnknownNameError
from workbench.kvcache.lifecycle import DROP, KILL, EvictionRecord, LCTRUQueue, QueueEntry

SIZE = {8: 100, 4: 50, 2: 25}
# (context, chunk, bits, last use, density): levels, recency and density all disagree on the order.
ENTRIES = [("A", 0, 8, 1, 0.5), ("A", 1, 4, 1, 0.1), ("B", 0, 2, 3, 0.05), ("B", 1, 8, 3, 0.9), ("C", 0, 4, 2, 0.3)]


def queue(policy: str, granularity: str = "chunk") -> LCTRUQueue:
    q = LCTRUQueue(policy, granularity)
    for ctx, chunk, bits, last, density in ENTRIES:
        q.put(QueueEntry(ctx=ctx, chunk=chunk, bits=bits, nbytes=SIZE[bits], last_used=last, density=density))
    return q


def names(entries) -> list[str]:
    return [f"{e.ctx}{e.chunk}" for e in entries]


@pytest.mark.parametrize("policy, order, leaving", [
    ("lctru", ["A0", "B1", "A1", "C0", "B0"], 2),   # 8-bit sub-queue (oldest first), then 4-bit, then 2-bit
    ("lru", ["A0", "A1", "C0", "B0", "B1"], 2),     # oldest first; ties by context and chunk
    ("density", ["B0", "A1", "C0", "A0", "B1"], 3),     # least information density first
])
def test_each_policy_orders_the_hand_built_queue_and_frees_just_enough(policy, order, leaving):
    q = queue(policy)
    assert names(q.order()) == order
    assert names(q.victims(120)) == order[:leaving] and names(q.order()) == order[leaving:]


def test_lctru_sub_queues_go_from_heavy_to_light_each_least_recent_first():
    assert {bits: names(es) for bits, es in queue("lctru").sub_queues().items()} == \
        {8: ["A0", "B1"], 4: ["A1", "C0"], 2: ["B0"]}
    assert list(queue("lctru").sub_queues()) == [8, 4, 2]


def test_the_served_context_is_locked_out_of_the_queue():
    q = queue("lctru")
    q.lock("A")
    assert names(q.victims(10_000)) == ["B1", "C0", "B0"]
    assert len(q) == 2 and q.order() == []
    q.unlock("A")
    assert names(q.order()) == ["A0", "A1"]


def test_whole_contexts_leave_together_at_context_granularity_and_when_killing():
    assert names(queue("lru", "context").victims(1)) == ["A0", "A1"]
    assert names(queue("lctru").victims(1, whole_contexts=True)) == ["A0", "A1"]
    assert names(queue("density", "context").victims(1)) == ["B0", "B1"]


def test_records_name_policy_level_last_use_bytes_and_whether_anything_was_written():
    drop = EvictionRecord(policy="lctru", ctx="A", chunk=0, bits=8, last_used=1, nbytes=100, bytes_needed=120,
                          action=DROP, served_ctx="C")
    assert all(part in drop.reason for part in ("lctru", "8-bit", "tick 1", "100 B", "free 120 B", "no write"))
    kill = EvictionRecord(policy="lru", ctx="A", chunk=0, bits=32, last_used=1, nbytes=100, bytes_needed=1,
                          action=KILL, served_ctx="C")
    assert "recomputed from the tokens" in kill.reason and kill.to_dict()["action"] == "kill"


def test_unknown_policy_and_granularity_are_named():
    with pytest.raises(UnknownNameError, match="lctru, lru"):
        LCTRUQueue("fifo")
    with pytest.raises(Exception, match="'chunk' or 'context'"):
        LCTRUQueue("lru", "token")
