"""The ranges of the numbers of every mechanism that splits a model over devices, from what holds them: the
cost models' largest cluster, this machine's cores (worker processes), the models' positions, real link speeds. The
commands' options, the Python API and the pages' controls check values with the same types."""
from __future__ import annotations

from workbench.argtypes import Bound, count, non_negative, per_core, positive

MAX_DEVICES = 64
"""The cost model's largest cluster; the runtime starts at most what this machine holds."""
MAX_POSITIONS = 8192
RANKS_PER_CORE = 4

devices = count(1, unit="devices", at_most=Bound(MAX_DEVICES, "the cost model's largest cluster"))
ranks = count(1, unit="worker processes", at_most=per_core(RANKS_PER_CORE, "worker processes, each holding the model,"))
seq_len = count(1, unit="positions", at_most=Bound(MAX_POSITIONS, "the decoder's context; the encoders allow 512"))
bandwidth_mbit = positive("Mbit/s", Bound(100_000, "100 Gbit/s, beyond any edge link"))
latency_ms = non_negative("ms", Bound(1000, "a second, beyond any link between edge devices"))
speed_gflops = positive("GFLOP/s", Bound(1e6, "a PFLOP/s, beyond any edge device"))
memory_gb = positive("GB", Bound(1e4, "10 TB, beyond any edge device"))
free_memory_gb = non_negative("GB", memory_gb.at_most)
"""A device's free memory as Hepti reads it: 0 drops a secondary."""
fall_mb = non_negative("MB", Bound(1e7, "10 TB, beyond any edge device"))
"""The free memory a device falls to mid-run."""
repeats = count(1, unit="runs", at_most=Bound(1000, "a thousand runs of one setting"))
deadline_ms = positive("ms", Bound(3_600_000, "an hour, the longest run a command starts"))
