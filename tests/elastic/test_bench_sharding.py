import numpy as np
import pytest

from workbench.elastic import bench_sharding as sharding
from workbench.elastic.quantize import gobo_quantize
from workbench.elastic.shardblob import quantized_blob


def _blobs(bits=3, count=1000, shards=4):
    w = np.random.default_rng(0).standard_normal(shards * count).astype(np.float32)
    q = gobo_quantize(w, bits)
    return [quantized_blob(q.select(i * count, (i + 1) * count)) for i in range(shards)]


@pytest.mark.integration
def test_throughput_row_decodes_every_part_and_reports_ratios():
    row = sharding._throughput("tiny", 3, _blobs(), repeats=1)
    assert row["MB_out"] == 4 * 4000 / 1e6 and row["bits"] == 3
    assert row["q_auto/copy"] == row["q_auto"] / row["q_copy"]
    assert row["q_auto/1t"] == row["q_auto"] / row["q_1t"]
    assert row["q_auto_threads"] == 1                           # a small shard never starts a team
    loaded = sharding._throughput("tiny", 3, _blobs(), repeats=1, loaded=True)
    assert {k for k in loaded if k.startswith("l_")} == {"l_" + k[2:] for k in row if k.startswith("q_")}


def test_best_rounds_time_each_contender_its_own_number_of_times_after_a_warm_run():
    calls = {"a": 0, "b": 0}

    def count(name):
        def fn():
            calls[name] += 1
        return fn

    best = sharding._best_rounds({"a": count("a"), "b": count("b")}, {"a": 5, "b": 2})
    assert calls == {"a": 10, "b": 4} and set(best) == {"a", "b"} and min(best.values()) >= 0


@pytest.mark.integration
def test_competing_load_is_stopped_even_when_the_block_fails():
    with pytest.raises(KeyboardInterrupt):
        with sharding.competing_load(2) as workers:
            assert all(w.is_alive() for w in workers)
            raise KeyboardInterrupt
    assert not any(w.is_alive() for w in workers)


def test_summary_names_the_worst_cells():
    rows = [{"layer": "a", "bits": 2, "q_auto/copy": 0.9, "l_auto/1t": 1.0},
            {"layer": "b", "bits": 6, "q_auto/copy": 0.7, "l_auto/1t": 0.5}]
    line = sharding.summary(rows)
    assert "copy in every cell: NO (worst 0.70x, b 6-bit)" in line
    assert "1 thread in every cell: NO (worst 0.50x, b 6-bit" in line
    assert "yes" in sharding.summary([rows[0]])
