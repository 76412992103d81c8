"""`workbench bench partition`: Voltage against tensor parallelism, the layer pipeline and one device (paper §VI).

Every number is measured on this machine or computed by the engine (the cost model, the plans); none is typed
in. Tables:

- ``bytes``: the bytes each device sends and receives per layer, counted by the runtime's collectives on real
  worker processes (the shipped encoder, N = 128, K = 2, 4, 6), for Voltage and for tensor parallelism (ours,
  and PyTorch's where the heads divide), beside the cost model's (``PartitionPlan.traffic``); and Voltage's
  input broadcast by the terminal and its last layer's rows sent to the terminal (Algorithm 2). Evenly split a
  device sends (K-1)NF/K elements for Voltage and 4(K-1)NF/K for tensor parallelism: the paper's 1:4.
- ``attention`` (Figure 6): one layer's partitioned self-attention (F = 1024; H x F_H = 16 x 64, 8 x 128,
  4 x 256) computing P = N/K of N rows (rounded) in one process on one thread, batch 1: Theorem 2's order
  ("auto"), the naive order (every head Eq. 3) and the whole attention (P = N); medians of repeats run
  interleaved, beside the cost model's ratios of Gamma; and the whole layer at P = N, partitioned
  (``partitioned_layer``, which reads the weights through views) against the model's own layer.
- ``latency`` (Figures 7 and 8): end-to-end latency of every scheme on real worker processes, against K at
  ``--bandwidth-mbit`` and against the bandwidth at ``--bandwidth-k``, in two modes (``mode`` column): ``replay``,
  compute and links padded to the device profile on the plan's schedule (a replay of the prediction: it shows
  the padding holds, never called measured), and ``measured``, every rank held to its device's speed by a CPU
  cgroup calibrated by a probe of one layer (:mod:`workbench.distributed.cpulimit`) and its link shaped by
  ``tc`` in network namespaces, the links' latency added in the application (root only); the median of
  ``--repeats`` runs after an unpadded warm-up, the cost model's prediction and the error; whether the counted
  bytes equal the cost model's. Measured runs default to the paper's set-up at this host's scale
  (:mod:`workbench.partition.ratio`: BERT-Large on devices of 10 GFLOP/s whose links keep the paper's ratio
  of compute to link; ``bandwidth_mbit`` is then the paper's, ``link_mbit`` the run's). The paper's shapes (BERT-Large, GPT-2, random weights) replay at a few points
  (``--paper-ks``).
- ``cost_model``: the cost model alone over the same grid for the shipped encoder and the paper's shapes.

A replay holds while the ranks' real compute fits inside the device's predicted time. Measured runs say how far
the cost model is from ranks that really compute at the device's speed; the summary names every point outside
the target. ``--quick`` (the tests) makes every table in about a minute.
The real runs and their two tables (``bytes``, ``latency``) are made in :mod:`workbench.partition.bench_runs`.
"""
from __future__ import annotations

import statistics
import time

from workbench.argtypes import Bound, Parser, count
from workbench.bench import add_quick_argument, parse_with_quick
from workbench.devices import profile_names
from workbench.distributed import limits
from workbench.partition.bench_runs import (MODES, PAPER_MODELS, SCHEMES, Runs, _ms, bytes_table, measured_runs,
                                            print_bytes, print_latency, replay_runs, rows_of)
from workbench.partition.plan import DEFAULT_DEVICE

TABLES = ("bytes", "attention", "latency", "cost_model")
SET_UPS = ("paper-ratio", "preset")
ATTENTION_HIDDEN, ATTENTION_FFN = 1024, 4096
ATTENTION_LAYERS = ((16, 64), (8, 128), (4, 256))
"""(H, F_H) of Figure 6's synthetic layers, F = H x F_H = 1024."""
COST_MODEL_KS = tuple(range(1, 7))
PAPER_BEST_ATTENTION = 3.4
"""Figure 6: the naive order over Theorem 2's, at best (F_H = 256)."""

QUICK = {"ks": [2, 4], "bytes_ks": [2, 4], "bandwidths": [200, 500], "bandwidth_k": 4, "repeats": 2,
         "measured_ks": [2], "measured_bandwidths": [], "measured_model": "encoder", "paper_ks": [],
         "attention_ns": [100],
         "attention_repeats": 3}
"""--quick: two device counts, one bandwidth besides the default, two repeats, measured runs (CPU limits,
shaped links) at K = 2 only, no real runs of the paper's shapes (their cost model only), N = 100 only in the
attention table (three repeats: enough to make the table, not to rank orders by time; the tests count products)."""

ATTENTION_KS = count(1, unit="devices", at_most=Bound(64, "the cost model's largest cluster"))


def parser() -> Parser:
    p = Parser(prog="workbench bench partition",
               description="Voltage against tensor parallelism, the layer pipeline and one device: bytes counted, "
                           "partitioned attention, end-to-end latency on real processes beside the cost model")
    p.add_argument("--seq-len", type=limits.seq_len, default=128, help="positions N of the end-to-end runs")
    p.add_argument("--device", choices=profile_names(host=False), default=DEFAULT_DEVICE,
                   help="the device profile every device copies (its compute and link are what runs are padded to)")
    p.add_argument("--ks", nargs="+", type=limits.ranks, default=[1, 2, 3, 4, 5, 6],
                   help="device counts of the latency sweep (worker processes on this machine)")
    p.add_argument("--bandwidth-mbit", type=limits.bandwidth_mbit, default=500.0,
                   help="link bandwidth of the device-count sweep and of the byte counts, Mbit/s")
    p.add_argument("--bandwidths", nargs="+", type=limits.bandwidth_mbit, default=[200, 400, 500, 600, 800, 1000],
                   help="link bandwidths of the bandwidth sweep, Mbit/s")
    p.add_argument("--bandwidth-k", type=limits.ranks, default=6, help="device count of the bandwidth sweep")
    p.add_argument("--bytes-ks", nargs="+", type=limits.ranks, default=[2, 4, 6],
                   help="device counts whose bytes per device per layer are counted (2 or more)")
    p.add_argument("--repeats", type=limits.repeats, default=5, help="runs per point of the encoder (the median is kept)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                   help="replay: padded to the prediction (not a measurement); measured: ranks under CPU limits "
                        "calibrated to the device, links shaped by tc (root)")
    p.add_argument("--measured-ks", nargs="*", type=limits.ranks, default=[1, 2, 3, 4, 5, 6],
                   help="device counts measured under limits at --bandwidth-mbit")
    p.add_argument("--measured-bandwidths", nargs="*", type=limits.bandwidth_mbit, default=None,
                   help="bandwidths measured under limits at --bandwidth-k (default: --bandwidths)")
    p.add_argument("--measured-set-up", choices=SET_UPS, default="paper-ratio",
                   help="paper-ratio: devices at --measured-gflops whose links keep the paper's ratio of compute to "
                        "link (bandwidths are then the paper's Mbit/s, scaled down for the run); preset: --device "
                        "as it is")
    p.add_argument("--measured-gflops", type=limits.speed_gflops, default=10.0,
                   help="each emulated device's speed at the paper's ratio (six at 10 fit two cores)")
    p.add_argument("--measured-model", choices=("encoder", *PAPER_MODELS), default="bert-large",
                   help="the model of the measured runs (a paper's shape has random weights)")
    p.add_argument("--paper-models", nargs="*", choices=PAPER_MODELS, default=list(PAPER_MODELS),
                   help="the paper's shapes run for real (random weights)")
    p.add_argument("--paper-ks", nargs="*", type=limits.ranks, default=[2, 4],
                   help="device counts at which the paper's shapes run for real (each rank holds the whole model)")
    p.add_argument("--paper-repeats", type=limits.repeats, default=2, help="runs per point of the paper's shapes")
    p.add_argument("--attention-ns", nargs="+", type=limits.seq_len, default=[100, 200, 300],
                   help="sequence lengths N of the partitioned attention table")
    p.add_argument("--attention-max-k", type=ATTENTION_KS, default=8,
                   help="the attention table's P = N/K for K = 1 up to this")
    p.add_argument("--attention-repeats", type=limits.repeats, default=9,
                   help="timed repeats of each attention variant (interleaved; the median is kept)")
    p.add_argument("--tables", nargs="+", choices=TABLES, default=list(TABLES), help="tables to make")
    add_quick_argument(p, QUICK)
    return p


def options(args: list[str]):
    p = parser()
    opts = parse_with_quick(p, args, QUICK)
    opts.bandwidths = [float(b) for b in opts.bandwidths]
    opts.measured_bandwidths = [float(b) for b in (opts.bandwidths if opts.measured_bandwidths is None
                                                   else opts.measured_bandwidths)]
    if any(k < 2 for k in opts.bytes_ks):
        p.error(f"--bytes-ks: a device count of 2 or more (one device sends nothing), got {opts.bytes_ks}")
    longest = max([*opts.ks, *opts.bytes_ks, opts.bandwidth_k, *opts.paper_ks, *(opts.measured_ks or [1])])
    if opts.seq_len < longest:
        p.error(f"--seq-len {opts.seq_len} is shorter than the {longest} devices it would be split over")
    return opts


# ----------------------------------------------------------------------------- tables

def attention_table(opts) -> list[dict]:
    """Figure 6 on this host: medians of interleaved repeats of every variant of one (layer, N)."""
    import torch

    from workbench.models.config import EncoderConfig
    from workbench.models.encoder import EncoderLayer
    from workbench.partition.cost import attention_flops
    from workbench.models.slices import head_orders, partitioned_attention, partitioned_layer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    try:
        for H, F_H in ATTENTION_LAYERS:
            torch.manual_seed(0)
            layer = EncoderLayer(EncoderConfig(hidden=ATTENTION_HIDDEN, num_heads=H, ffn=ATTENTION_FFN)).eval()
            F = layer.cfg.hidden
            for N in opts.attention_ns:
                x = torch.randn(1, N, F, generator=torch.Generator().manual_seed(N))
                ks = [K for K in range(1, opts.attention_max_k + 1) if K <= N]
                variants = {"full": (N, ("qk_first",) * H)}
                for K in ks:
                    P = rows_of(N, K)
                    variants[("ours", K)] = (P, head_orders(layer, N, P, "auto"))
                    variants[("naive", K)] = (P, head_orders(layer, N, P, "qk_first"))
                times = {name: [] for name in (*variants, "layer", "partitioned_layer")}
                with torch.no_grad():
                    for repeat in range(opts.attention_repeats + 1):            # the first pass warms up
                        for name, (P, orders) in variants.items():
                            start = time.perf_counter()
                            partitioned_attention(layer, x, 0, P, orders)
                            if repeat:
                                times[name].append(time.perf_counter() - start)
                        for name, call in (("layer", lambda: layer(x)),
                                           ("partitioned_layer", lambda: partitioned_layer(layer, x, 0, N))):
                            start = time.perf_counter()
                            call()
                            if repeat:
                                times[name].append(time.perf_counter() - start)
                median = {name: statistics.median(t) for name, t in times.items()}
                gamma = lambda P, orders: sum(attention_flops(o, N, P, F, F_H) for o in orders)
                full_gamma = gamma(N, variants["full"][1])
                for K in ks:
                    P, ours = variants[("ours", K)]
                    naive = variants[("naive", K)][1]
                    rows.append({"H": H, "F_H": F_H, "N": N, "K": K, "P": P, "order": ours[0],
                                 "full_ms": _ms(median["full"]), "ours_ms": _ms(median[("ours", K)]),
                                 "naive_ms": _ms(median[("naive", K)]),
                                 "speedup_ours": median["full"] / median[("ours", K)],
                                 "speedup_naive": median["full"] / median[("naive", K)],
                                 "naive_over_ours": median[("naive", K)] / median[("ours", K)],
                                 "model_speedup_ours": full_gamma / gamma(P, ours),
                                 "model_naive_over_ours": gamma(P, naive) / gamma(P, ours),
                                 "layer_ms": _ms(median["layer"]), "partitioned_layer_ms": _ms(median["partitioned_layer"]),
                                 "repeats": opts.attention_repeats})
                print(f"  attention H={H} F_H={F_H} N={N}: full {_ms(median['full']):.1f} ms; " + ", ".join(
                    f"K={r['K']} {r['speedup_ours']:.2f}x/{r['speedup_naive']:.2f}x" for r in rows[-len(ks):])
                    + " (speed-up of Theorem 2's order / the naive one); the whole layer at P = N: "
                    f"{_ms(median['partitioned_layer']):.1f} ms partitioned, {_ms(median['layer']):.1f} ms unpartitioned "
                    f"({100 * (median['partitioned_layer'] / median['layer'] - 1):+.1f} %)", flush=True)
    finally:
        torch.set_num_threads(threads)
    return rows


def print_attention(rows: list[dict]) -> None:
    for F_H in sorted({r["F_H"] for r in rows}):
        part = [r for r in rows if r["F_H"] == F_H]
        best = max(part, key=lambda r: r["naive_over_ours"])
        top = max(part, key=lambda r: r["speedup_ours"])
        x_first = sum(r["order"] == "x_first" for r in part)
        print(f"F_H={F_H}: naive / Theorem 2's order at best {best['naive_over_ours']:.2f}x (N={best['N']}, K={best['K']}; "
              f"cost model {best['model_naive_over_ours']:.2f}x); best speed-up over the whole attention "
              f"{top['speedup_ours']:.2f}x (N={top['N']}, K={top['K']}; cost model {top['model_speedup_ours']:.2f}x); "
              f"Eq. (8) chosen in {x_first} of {len(part)} cells; the paper: up to {PAPER_BEST_ATTENTION}x at F_H=256",
              flush=True)


def cost_model_table(opts) -> list[dict]:
    from workbench.errors import WorkbenchError
    from workbench.partition.cost import SHAPES
    from workbench.partition.plan import devices_like, plan_partition

    grid = [(K, opts.bandwidth_mbit) for K in sorted({*COST_MODEL_KS, *opts.ks})]
    grid += [(opts.bandwidth_k, b) for b in opts.bandwidths if (opts.bandwidth_k, b) not in grid]
    rows = []
    for model in ("encoder", *PAPER_MODELS):
        for K, bandwidth in grid:
            devices = devices_like(K, opts.device, bandwidth_mbit=bandwidth)
            single = plan_partition("single", SHAPES[model], opts.seq_len, devices).predicted_s
            for scheme in SCHEMES:
                try:
                    plan = plan_partition(scheme, SHAPES[model], opts.seq_len, devices)
                except WorkbenchError:
                    continue
                rows.append({"model": model, "K": K, "bandwidth_mbit": bandwidth, "scheme": scheme,
                             "predicted_ms": _ms(plan.predicted_s), "compute_ms": _ms(max(plan.compute_s())),
                             "comm_ms": _ms(plan.comm_s()),
                             "sent_kB_per_device_layer": sum(t.sent for t in plan.total_traffic())
                             / K / plan.shape.num_layers / 1e3,
                             "reduction_vs_single_pct": round(100 * (1 - plan.predicted_s / single), 6) + 0.0})
    return rows


# ----------------------------------------------------------------------------- the run

def run(args: list[str]) -> dict[str, list[dict]]:
    from workbench.prediction import host_load

    opts = options(args)
    t0 = time.perf_counter()
    load = host_load()
    print(f"$ workbench bench partition {' '.join(args)}".rstrip())
    print(f"host: {load.cores} cores, load {load.load_1min:.2f}; devices: {opts.device}; N = {opts.seq_len}; "
          f"{opts.repeats} repeats per point (medians)", flush=True)
    tables: dict[str, list[dict]] = {}
    runs = Runs(opts)
    problem = None
    if "bytes" in opts.tables or "latency" in opts.tables:
        replay_runs(runs)
        if "latency" in opts.tables and "measured" in opts.modes:
            from workbench.partition.runtime import limits_problem

            problem = limits_problem()
            if problem is None:
                measured_runs(runs)
            else:
                print(f"measured: skipped, the devices cannot be emulated here ({problem})", flush=True)
    if "attention" in opts.tables:
        tables["attention"] = attention_table(opts)
    cost_rows = cost_model_table(opts)
    print(f"\n== summary ({time.perf_counter() - t0:.0f} s)\n$ workbench bench partition {' '.join(args)}".rstrip())
    if "bytes" in opts.tables:
        tables["bytes"] = bytes_table(runs)
        print_bytes(tables["bytes"])
    if "attention" in opts.tables:
        print_attention(tables["attention"])
    if "latency" in opts.tables:
        tables["latency"] = list(runs.rows.values())
        print_latency(runs, cost_rows, problem)
    if runs.failures:
        print(f"{len(runs.failures)} runs failed: " + "; ".join(runs.failures))
    if "cost_model" in opts.tables:
        tables["cost_model"] = cost_rows
    return tables
