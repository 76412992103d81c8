"""The ranges of the elastic slice's numbers, from what holds them: the longest run, this machine's memory,
the dev splits. The commands' options and the Python API (the planners) check values with the same
types (``workbench.argtypes``)."""
from __future__ import annotations

from workbench.argtypes import LONGEST_RUN_S, Bound, count, machine_memory_bytes, memory_holds, non_negative, positive
from workbench.data import split_size, TASKS
from workbench.models.config import EncoderConfig

RUN_BYTES = 100_000
"""What one pipeline run's result keeps (its timeline's spans and the logits), rounded up."""
SHARDS = EncoderConfig().num_layers * EncoderConfig().num_heads

target_ms = positive("ms", Bound(LONGEST_RUN_S * 1000, "an hour, the longest run a command starts; a run waits for its target"))
target_s = positive("s", Bound(LONGEST_RUN_S, "an hour, the longest run a command starts; a run waits for its target"))
preload_mb = non_negative("MB", Bound(machine_memory_bytes() // 10**6, "this machine's memory"))
runs = count(1, unit="runs", at_most=memory_holds(RUN_BYTES, "runs of 100 KB of results each"))
dev_examples = count(1, unit="examples", at_most=Bound(
    max(split_size(task, "dev") for task in TASKS), "the largest dev split; a smaller one caps it"))
orders = count(1, unit="orders", at_most=memory_holds(8 * SHARDS, f"random orders of the {SHARDS} shards"))
