"""The tables of `workbench bench partition` made of real runs on worker processes (``bytes``, ``latency``):
one group of processes per device count and link set-up (:class:`Runs`), the replayed and the measured runs,
and the two tables with what the summary prints of them. What each table measures is in
:mod:`workbench.partition.bench`, which parses the options, makes the one-process tables (``attention``,
``cost_model``) and the run."""
from __future__ import annotations

import math
import statistics
import time

SCHEMES = ("voltage", "tensor_parallel", "torch_tp", "pipeline", "single")
PAPER_SCHEMES = ("voltage", "tensor_parallel", "single")
"""Schemes run for real on the paper's shapes (the pipeline of one request is one device plus transfers, and
PyTorch's TP would copy every layer once more: both are in the cost model table)."""
PAPER_MODELS = ("bert-large", "gpt2")
MODES = ("replay", "measured")
"""The latency runs: a replay of the prediction (compute and links padded to the cost model's schedule on
loopback; its latency is the prediction's by construction, never called measured) and measured runs (every
rank held to its device's speed by a CPU cgroup calibrated by a probe, links shaped by tc; root)."""
ERROR_TARGET_PCT = 10.0
PAPER_REDUCTION_PCT = (28, 32)
"""Voltage's latency reduction against one device at six devices and 500 Mbit/s, in the paper."""


def rows_of(N: int, K: int) -> int:
    """P = N/K rounded half up (at least one row)."""
    return max(1, math.floor(N / K + 0.5))


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
