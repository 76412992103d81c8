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
"""
from __future__ import annotations

import math
import statistics
import time

from workbench.argtypes import Bound, Parser, count
from workbench.bench import add_quick_argument, parse_with_quick
from workbench.devices import profile_names
from workbench.distributed import limits
from workbench.partition.plan import DEFAULT_DEVICE

TABLES = ("bytes", "attention", "latency", "cost_model")
SCHEMES = ("voltage", "tensor_parallel", "torch_tp", "pipeline", "single")
PAPER_SCHEMES = ("voltage", "tensor_parallel", "single")
"""Schemes run for real on the paper's shapes (the pipeline of one request is one device plus transfers, and
PyTorch's TP would copy every layer once more: both are in the cost model table)."""
PAPER_MODELS = ("bert-large", "gpt2")
SET_UPS = ("paper-ratio", "preset")
MODES = ("replay", "measured")
"""The latency runs: a replay of the prediction (compute and links padded to the cost model's schedule on
loopback; its latency is the prediction's by construction, never called measured) and measured runs (every
rank held to its device's speed by a CPU cgroup calibrated by a probe, links shaped by tc; root)."""
ATTENTION_HIDDEN, ATTENTION_FFN = 1024, 4096
ATTENTION_LAYERS = ((16, 64), (8, 128), (4, 256))
"""(H, F_H) of Figure 6's synthetic layers, F = H x F_H = 1024."""
COST_MODEL_KS = tuple(range(1, 7))
ERROR_TARGET_PCT = 10.0
PAPER_REDUCTION_PCT = (28, 32)
"""Voltage's latency reduction against one device at six devices and 500 Mbit/s, in the paper."""
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


# ----------------------------------------------------------------------------- real runs

def _ms(seconds: float) -> float:
    return 1e3 * seconds


def _error_pct(measured: float, predicted: float) -> float:
    return 100.0 * (measured - predicted) / predicted if predicted > 0 else math.inf


class Runs:
    """Every real run of the bench: one group of worker processes per device count and link set-up, reused
    across schemes, bandwidths and models; each point measured once (its median) and its last result kept."""

    def __init__(self, opts):
        self.opts = opts
        self.rows: dict[tuple, dict] = {}          # (model, mode, K, bandwidth, scheme) -> latency row
        self.last: dict[tuple, object] = {}        # the same key -> the RunResult of its last repeat
        self.failures: list[str] = []
        from workbench.partition.cost import SHAPES

        encoder = SHAPES["encoder"]
        self.probe_layer = (encoder.hidden, encoder.heads, encoder.ffn, opts.seq_len)

    def measure(self, runtime, warm: set, model: str, mode: str, K: int, bandwidth: float, scheme: str,
                repeats: int, device=None, link_mbit: float | None = None) -> dict | None:
        """One point's runs and row. ``bandwidth`` names the point (the paper's Mbit/s at its ratio);
        ``device`` (default ``--device``) and ``link_mbit`` (default ``bandwidth``) are what runs."""
        from workbench.errors import WorkbenchError
        from workbench.partition.cost import SHAPES
        from workbench.partition.plan import devices_like, plan_partition
        from workbench.partition.runtime import RunFailed

        key = (model, mode, K, bandwidth, scheme)
        if key in self.rows:
            return self.rows[key]
        try:
            plan = plan_partition(scheme, SHAPES[model], self.opts.seq_len,
                                  devices_like(K, device or self.opts.device, bandwidth_mbit=link_mbit or bandwidth))
        except WorkbenchError:                   # torch_tp where K does not divide the heads and the FFN
            return None
        try:
            if (model, scheme) not in warm:      # builds PyTorch's TP layers, warms the kernels; not timed
                runtime.run(plan, emulate=False)
                warm.add((model, scheme))
            results = [runtime.run(plan, emulate=mode == "replay") for _ in range(repeats)]
        except RunFailed as exc:
            warm.clear()                         # the group was stopped; the next run starts a fresh one
            self.failures.append(f"{model} {scheme} K={K} {bandwidth:g} Mbit/s ({mode}): {exc}")
            print(f"  FAILED {self.failures[-1]}", flush=True)
            return None
        measured = [r.latency_s for r in results]
        median = statistics.median(measured)
        layers = plan.shape.num_layers
        row = {"model": model, "mode": mode, "links": "shaped" if runtime.shaped else "emulated", "K": K,
               "bandwidth_mbit": bandwidth, "link_mbit": link_mbit or bandwidth, "device": plan.devices[0].preset,
               "device_gflops": plan.devices[0].flops_per_s / 1e9,
               "half_peak_tokens": plan.devices[0].half_peak_tokens, "scheme": scheme, "repeats": repeats,
               "latency_ms": _ms(median), "min_ms": _ms(min(measured)),
               "max_ms": _ms(max(measured)), "predicted_ms": _ms(plan.predicted_s),
               "error_pct": _error_pct(median, plan.predicted_s),
               "counted_bytes_equal_model": all(r.traffic() == plan.traffic()
                                                and r.total_traffic() == plan.total_traffic() for r in results),
               "sent_kB_per_device_layer": sum(t.sent for t in results[-1].total_traffic()) / K / layers / 1e3,
               "wire_over_counted": max(results[-1].wire_over_counted(), default=math.nan)}
        self.rows[key], self.last[key] = row, results[-1]
        note = results[-1].check().note()
        said = "replayed" if mode == "replay" else "measured"
        link = f" ({link_mbit:.3g} here)" if link_mbit and link_mbit != bandwidth else ""
        print(f"  {mode:8s} {model:10s} K={K} {bandwidth:6g} Mbit/s{link} {scheme:16s} {said} {row['latency_ms']:8.1f} ms "
              f"(median of {repeats}), predicted {row['predicted_ms']:8.1f} ms, error {row['error_pct']:+6.1f} %"
              + (f"  [{note}]" if note else ""), flush=True)
        return row


def _group(runs: Runs, K: int, shaped: list[float] | None = None, cpu: list[float] | None = None,
           layer: tuple | None = None):
    from workbench.partition.runtime import PartitionRuntime

    t0 = time.perf_counter()
    layer = layer or runs.probe_layer
    runtime = PartitionRuntime(K, shaped=shaped, cpu=cpu, probe_layer=layer).start()
    held = (", each rank held to its device by a CPU limit: " + "; ".join(c.describe() for c in runtime.calibrations)
            if cpu else "")
    print(f"{K} worker processes started ({'shaped' if shaped else 'emulated'} links{held}) in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    return runtime


def replay_runs(runs: Runs) -> None:
    """Each device count's group started once: its sweep points, the bandwidth sweep, the paper's shapes."""
    opts = runs.opts
    latency = "latency" in opts.tables and "replay" in opts.modes
    counting = "bytes" in opts.tables
    ks = set(opts.bytes_ks if counting else [])
    if latency:
        ks |= {*opts.ks, opts.bandwidth_k, *(opts.paper_ks if opts.paper_models else [])}
    for K in sorted(ks):
        runtime, warm = _group(runs, K), set()
        try:
            if latency and K in opts.ks:
                for scheme in SCHEMES:
                    runs.measure(runtime, warm, "encoder", "replay", K, opts.bandwidth_mbit, scheme, opts.repeats)
            if counting and K in opts.bytes_ks:                 # measured above when K is in the sweep too
                for scheme in ("voltage", "tensor_parallel", "torch_tp"):
                    runs.measure(runtime, warm, "encoder", "replay", K, opts.bandwidth_mbit, scheme, opts.repeats)
            if latency and K == opts.bandwidth_k:
                for bandwidth in opts.bandwidths:
                    for scheme in SCHEMES:
                        runs.measure(runtime, warm, "encoder", "replay", K, bandwidth, scheme, opts.repeats)
            if latency and K in opts.paper_ks:
                for model in opts.paper_models:
                    for scheme in PAPER_SCHEMES:
                        runs.measure(runtime, warm, model, "replay", K, opts.bandwidth_mbit, scheme,
                                     opts.paper_repeats)
        finally:
            runtime.close()


def measured_set_up(opts) -> tuple:
    """(device, factor): the device every measured rank emulates and how much slower than the paper's its
    link is (1 for ``--measured-set-up preset``). At the paper's ratio the device is
    :func:`~workbench.partition.ratio.paper_ratio_device` at ``--measured-gflops``, with this host's fall of
    FLOP/s at fewer rows fitted for the measured model."""
    from workbench.devices import get_profile
    from workbench.partition import ratio

    if opts.measured_set_up == "preset":
        return get_profile(opts.device), 1.0
    paper = ratio.paper_speed_gflops(base=opts.device)
    h, efficiency = ratio.fit_half_peak(opts.measured_model, opts.seq_len,
                                        rows=sorted({rows_of(opts.seq_len, K) for K in range(2, 7)}))
    device = ratio.paper_ratio_device(opts.measured_gflops, half_peak_tokens=h, paper_gflops=paper, base=opts.device)
    factor = ratio.ratio_factor(device, opts.device)
    print(f"measured set-up, the paper's ratio: {opts.device} devices at {paper:.1f} GFLOP/s and "
          f"{ratio.PAPER_MBIT:g} Mbit/s give BERT-Large (N={ratio.PAPER_N}) the paper's "
          f"{100 * ratio.PAPER_REDUCTION:.1f} % at K={ratio.PAPER_K} (cost model); emulated at "
          f"{opts.measured_gflops:g} GFLOP/s, each device {factor:.1f}x slower in compute, link, latency and "
          f"overhead, so a paper bandwidth of b Mbit/s is b/{factor:.1f} here", flush=True)
    print(f"this host's FLOP/s on {opts.measured_model}'s layer at P of N={opts.seq_len} rows, against P=N: "
          + ", ".join(f"P={p} {e:.2f}" for p, e in efficiency.items())
          + f"; fitted half_peak_tokens {h:.1f} (the cost model's fall at fewer rows)", flush=True)
    return device, factor


def measured_runs(runs: Runs) -> None:
    """One group per (K, bandwidth), every rank under a CPU limit calibrated to the device and its link shaped
    (tc in the group's namespaces)."""
    opts = runs.opts
    points = [(K, opts.bandwidth_mbit) for K in opts.measured_ks]
    points += [(opts.bandwidth_k, b) for b in opts.measured_bandwidths if (opts.bandwidth_k, b) not in points]
    from workbench.errors import WorkbenchError
    from workbench.partition.cost import SHAPES
    from workbench.partition.runtime import limit_speed

    device, factor = measured_set_up(opts)
    model = opts.measured_model
    shape = SHAPES[model]
    layer = (shape.hidden, shape.heads, shape.ffn, opts.seq_len)
    speed = limit_speed(device, opts.seq_len)
    for K, bandwidth in points:
        link = bandwidth / factor
        try:
            runtime, warm = _group(runs, K, [link * 1e6 / 8] * K, [speed] * K, layer), set()
        except WorkbenchError as exc:            # the shaped network, the limits or the ranks did not come up
            runs.failures.append(f"measured K={K} {bandwidth:g} Mbit/s: {exc}")
            print(f"  FAILED {runs.failures[-1]}", flush=True)
            continue
        try:
            for scheme in SCHEMES:             # Figures 4 and 5's (PyTorch's TP where K divides the heads)
                runs.measure(runtime, warm, model, "measured", K, bandwidth, scheme,
                             opts.repeats if model == "encoder" else opts.paper_repeats, device, link)
        finally:
            runtime.close()


# ----------------------------------------------------------------------------- tables

def bytes_table(runs: Runs) -> list[dict]:
    """Per device count and device: layer 0's bytes counted for Voltage, ours and PyTorch's TP, and the model's."""
    opts, rows = runs.opts, []
    for K in opts.bytes_ks:
        got = {s: runs.last.get(("encoder", "replay", K, opts.bandwidth_mbit, s))
               for s in ("voltage", "tensor_parallel", "torch_tp")}
        if got["voltage"] is None or got["tensor_parallel"] is None:
            continue
        counted = {s: r.traffic() for s, r in got.items() if r is not None}
        model = {s: r.plan.traffic() for s, r in got.items() if r is not None}
        equal = all(counted[s] == model[s] for s in counted)
        # every layer alike: Voltage's All-Gathers (its last layer goes to the terminal only), both TPs' layers
        same = all(all(layer == table[0] for layer in (table[:-1] if s == "voltage" else table))
                   for s, table in counted.items())
        by_kind = got["voltage"].sent_by_kind()
        for d in range(K):
            v, tp = counted["voltage"][0][d], counted["tensor_parallel"][0][d]
            torch_tp = counted["torch_tp"][0][d].sent if "torch_tp" in counted else ""
            rows.append({"model": "encoder", "N": opts.seq_len, "K": K, "device": d,
                         "even_split": opts.seq_len % K == 0,
                         "voltage_sent_B": v.sent, "voltage_received_B": v.received,
                         "tp_sent_B": tp.sent, "tp_received_B": tp.received, "torch_tp_sent_B": torch_tp,
                         "tp_over_voltage": tp.sent / v.sent,
                         "model_voltage_sent_B": model["voltage"][0][d].sent,
                         "model_tp_sent_B": model["tensor_parallel"][0][d].sent,
                         "voltage_input_sent_B": by_kind.get("broadcast", [0] * K)[d],
                         "voltage_last_layer_sent_B": by_kind.get("gather", [0] * K)[d],
                         "counted_equal_model": equal, "same_every_layer": same})
    return rows


def print_bytes(rows: list[dict]) -> None:
    from workbench.partition.cost import SHAPES, comm_bytes

    F = SHAPES["encoder"].hidden
    for K in sorted({r["K"] for r in rows}):
        part = [r for r in rows if r["K"] == K]
        v, tp = sum(r["voltage_sent_B"] for r in part), sum(r["tp_sent_B"] for r in part)
        ratios = [r["tp_over_voltage"] for r in part]
        spread = "" if max(ratios) == min(ratios) else f" (per device {min(ratios):.3f} to {max(ratios):.3f})"
        N = part[0]["N"]
        print(f"K={K}: per device per layer Voltage sends {v / K / 1e3:.1f} kB, tensor parallel {tp / K / 1e3:.1f} kB "
              f"(counted); Voltage:TP = 1:{tp / v:.3f}{spread}, the paper derives 1:4; cost model (K-1)NF/K = "
              f"{comm_bytes('voltage', N, F, K) / 1e3:.1f} kB and {comm_bytes('tensor_parallel', N, F, K) / 1e3:.1f} kB; "
              f"counted equals the cost model in every layer and device: "
              f"{'yes' if all(r['counted_equal_model'] for r in part) else 'NO'}", flush=True)


def rows_of(N: int, K: int) -> int:
    """P = N/K rounded half up (at least one row)."""
    return max(1, math.floor(N / K + 0.5))


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


def _reduction(rows: dict, model: str, link: str, K: int, bandwidth: float, scheme: str, column: str):
    point, single = rows.get((model, link, K, bandwidth, scheme)), rows.get((model, link, K, bandwidth, "single"))
    if point is None or single is None:
        return None
    return 100 * (1 - point[column] / single[column])


def print_latency(runs: Runs, cost_rows: list[dict], problem: str | None) -> None:
    opts, rows = runs.opts, runs.rows
    K, bw = opts.bandwidth_k, opts.bandwidth_mbit
    for mode in MODES:
        mine = [r for r in rows.values() if r["mode"] == mode]
        if not mine:
            continue
        worst = max(mine, key=lambda r: abs(r["error_pct"]))
        within = [r for r in mine if abs(r["error_pct"]) <= ERROR_TARGET_PCT]
        misses = [f"{r['model']} {r['scheme']} K={r['K']} {r['bandwidth_mbit']:g} Mbit/s {r['error_pct']:+.0f} %"
                  for r in mine if abs(r["error_pct"]) > ERROR_TARGET_PCT]
        what = ("replayed (padded to the prediction: its agreement shows the padding holds, not the model)"
                if mode == "replay" else f"measured under CPU limits and shaped links (target within "
                                         f"{ERROR_TARGET_PCT:g} %)")
        print(f"{mode}: {len(within)} of {len(mine)} points within {ERROR_TARGET_PCT:g} % of the cost model, "
              f"{what}; worst {worst['error_pct']:+.1f} % ({worst['model']} {worst['scheme']} K={worst['K']} "
              f"{worst['bandwidth_mbit']:g} Mbit/s)" + (f"; outside: {'; '.join(misses)}" if misses else ""))
        print(f"{mode}: bytes counted equal the cost model's in every run: "
              f"{'yes' if all(r['counted_bytes_equal_model'] for r in mine) else 'NO'}")
        wire = [r["wire_over_counted"] for r in mine if not math.isnan(r["wire_over_counted"])]
        if wire:
            print(f"{mode}: bytes read off each rank's veth over the bytes it counted sending: "
                  f"{min(wire):.3f}-{max(wire):.3f} (TCP/IP framing, acknowledgements, gloo's messages)")
        model = "encoder" if mode == "replay" else opts.measured_model
        if mode == "measured":
            for scheme in SCHEMES:
                line = [f"K={r['K']} {r['bandwidth_mbit']:g} Mbit/s {r['latency_ms']:.0f} ms ({r['error_pct']:+.0f} %)"
                        for r in sorted(mine, key=lambda r: (r["K"], r["bandwidth_mbit"])) if r["scheme"] == scheme]
                if line:
                    print(f"measured {model} {scheme}, against the cost model: {'; '.join(line)}")
        for scheme in ("voltage", "tensor_parallel"):
            got = _reduction(rows, model, mode, K, bw, scheme, "latency_ms")
            predicted = _reduction(rows, model, mode, K, bw, scheme, "predicted_ms")
            if got is not None:
                print(f"{mode}, {model} N={opts.seq_len}, K={K}, {bw:g} Mbit/s: {scheme} reduces the latency "
                      f"of one device by {got:.1f} % {'measured' if mode == 'measured' else 'replayed'} "
                      f"({predicted:.1f} % predicted)"
                      + (f"; the paper: {PAPER_REDUCTION_PCT[0]}-{PAPER_REDUCTION_PCT[1]} % for Voltage"
                         if scheme == "voltage" else ""))
    if "measured" in opts.modes and problem:
        print(f"measured: not run, the devices cannot be emulated here ({problem})")
    for model in PAPER_MODELS:
        for paper_k in opts.paper_ks:
            for scheme in ("voltage", "tensor_parallel"):
                got = _reduction(rows, model, "replay", paper_k, bw, scheme, "latency_ms")
                if got is not None:
                    predicted = _reduction(rows, model, "replay", paper_k, bw, scheme, "predicted_ms")
                    print(f"{model}, K={paper_k}, {bw:g} Mbit/s, replay: {scheme} reduces one device's latency by "
                          f"{got:.1f} % replayed ({predicted:.1f} % predicted)")
    for model in PAPER_MODELS:
        got = {r["scheme"]: r for r in cost_rows if r["model"] == model and r["K"] == 6 and r["bandwidth_mbit"] == bw}
        if "voltage" in got:
            print(f"{model}, K=6, {bw:g} Mbit/s, cost model on {opts.device} as it is: Voltage "
                  f"{got['voltage']['reduction_vs_single_pct']:.1f} % "
                  f"below one device, tensor parallel {got['tensor_parallel']['reduction_vs_single_pct']:.1f} %")


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
