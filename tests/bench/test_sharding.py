import numpy as np

from workbench.bench import sharding
from workbench.elastic.quantize import gobo_quantize


def test_throughput_row_decodes_every_part_and_reports_ratios():
    rng = np.random.default_rng(0)
    w = rng.standard_normal(4 * 1000).astype(np.float32)
    q = gobo_quantize(w, 3)
    parts = [(s.packed(), s.centroids, s.outlier_pos, s.outlier_val, 1000)
             for s in (q.select(i * 1000, (i + 1) * 1000) for i in range(4))]
    row = sharding._throughput("tiny", 3, parts, repeats=1)
    assert row["MB_out"] == 4 * 4000 / 1e6 and row["bits"] == 3
    assert row["2t_vs_numpy"] == row["cython_2t_GBps"] / row["numpy_GBps"]
    assert row["2t_vs_copy"] == row["cython_2t_GBps"] / row["copy_GBps"]
