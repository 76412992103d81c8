"""`workbench bench host`: this machine's encoder-layer times per shard count and its cold read speed."""
from __future__ import annotations


def parser():
    from workbench.argtypes import Parser

    return Parser(prog="workbench bench host", description=__doc__.splitlines()[0].split(": ", 1)[1])


def run(args: list[str]) -> list[dict]:
    from workbench.devices import DISTILBERT, MINILM
    from workbench.hostprofile import measure_layer_times, measure_read_bandwidth

    parser().parse_args(args)
    rows = []
    for label, shape in (("minilm", MINILM), ("distilbert", DISTILBERT)):
        for m, t in enumerate(measure_layer_times(shape, repeats=7), start=1):
            rows.append({"layer": label, "shards": m, "seq_len": shape.seq_len, "compute_ms": t * 1e3,
                         "GFLOP_per_s": m * shape.shard_flops() / t / 1e9})
    bw = measure_read_bandwidth(64)
    print(f"cold read bandwidth (64 MiB file, page cache dropped with posix_fadvise): {bw / 1e6:.0f} MB/s")
    return rows
