"""Self-checks of the position-wise partitioning (Voltage) lab: every expected answer is computed by the engine's own
cost model and planner (:mod:`workbench.partition.cost`, :mod:`workbench.partition.plan`), so it follows the
device presets wherever they change; the feedback quotes the engine's figures. Pure Python: no torch, nothing
prepared. The shared reading of answers and the feedback live in :mod:`workbench.labs`.

The lab's set-up is ``workbench partition plan``'s default: the shipped encoder
(all-MiniLM-L6-v2: F = 384, 12 heads of F_H = 32, 6 layers) on N = 128 positions, over copies of the
``edge-vm`` preset (the Voltage paper's 1-vCPU VM, its link at 500 Mbit/s unless an exercise says otherwise).
"""
from __future__ import annotations

from workbench.labs import Feedback, check_choice, check_number, with_unit
from workbench.partition.cost import (DTYPE_BYTES, ORDERS, ModelShape, attention_flops, attention_order, get_shape,
                                      order_threshold)
from workbench.partition.plan import DeviceRow, PartitionPlan, devices_from_table, devices_like, plan_partition

MODEL = "encoder"
SEQ_LEN = 128
ORDER_POINT = (128, 32, 384, 32)            # exercise 1: N, P, F, F_H (the encoder split over 4 devices)
BYTES_DEVICES = 4                           # exercises 2 and 3: devices the encoder is split over
LATENCY = (4, 200.0)                        # exercise 4: devices, link Mbit/s
LATENCY_TOLERANCE_MS = 1.0
BREAK_EVEN_DEVICES = 4                      # exercise 5
BREAK_EVEN_TOLERANCE_MBIT = 5.0
UNEVEN = (("A", 20.0), ("B", 10.0), ("C", 10.0), ("D", 5.0))     # exercise 6: device, GFLOP/s
UNEVEN_SHARES = (0.56, 0.18, 0.14, 0.12)
UNEVEN_MEMORY_GB, UNEVEN_BANDWIDTH_MBIT = 4.0, 500.0


def shape() -> ModelShape:
    return get_shape(MODEL)


def plan(scheme: str, devices: int = BYTES_DEVICES, bandwidth_mbit: float | None = None,
         shares="even") -> PartitionPlan:
    """The engine's plan of ``scheme`` for the lab's encoder at N = 128 over ``devices`` edge VMs."""
    return plan_partition(scheme, shape(), SEQ_LEN, devices_like(devices, bandwidth_mbit=bandwidth_mbit),
                          shares=shares)


def _ms(seconds: float) -> float:
    return 1e3 * seconds


# ----------------------------------------------------------------------------- exercise 1: Theorem 2


def order_answer() -> str:
    return attention_order(*ORDER_POINT)


def check_order(answer) -> Feedback:
    """Exercise 1: the order Theorem 2 picks at ORDER_POINT ("qk_first" or "x_first")."""
    N, P, F, F_H = ORDER_POINT
    threshold, gap = order_threshold(F, F_H), 1 / P - 1 / N
    qk, x = attention_flops("qk_first", N, P, F, F_H), attention_flops("x_first", N, P, F, F_H)
    compare = "above" if gap > threshold else "not above"
    return check_choice(
        "Exercise 1", answer, order_answer(), ORDERS,
        why=f"1/P - 1/N = 1/{P} - 1/{N} = {gap:.4f} is {compare} (F - F_H)/(F F_H) = {F - F_H}/({F} x {F_H}) = "
            f"{threshold:.4f}, so one head costs Gamma {qk:,.0f} in Eq. (3)'s order against {x:,.0f} in Eq. (8)'s: "
            f"{'x_first' if x < qk else 'qk_first'} is cheaper by {max(qk, x) / min(qk, x):.2f}x.",
        hint="Theorem 2 multiplies x in last (Eq. 8) only when 1/P - 1/N exceeds (F - F_H)/(F F_H); work out "
             "both sides.")


# ----------------------------------------------------------------------------- exercises 2 and 3: bytes


def bytes_sent(scheme: str, devices: int = BYTES_DEVICES) -> int:
    """Bytes the first device sends in one layer of ``scheme`` (the runtime counts the same)."""
    return plan(scheme, devices).traffic()[0][0].sent


def check_voltage_bytes(answer) -> Feedback:
    """Exercise 2: bytes one device sends per layer under Voltage (one All-Gather)."""
    K, F = BYTES_DEVICES, shape().hidden
    P = SEQ_LEN // K
    return check_number(
        "Exercise 2", answer, bytes_sent("voltage"), whole=True, minimum=0, quantity="a count of bytes",
        hint=f"the {SEQ_LEN} positions are split evenly over {K} devices; each row is {F} float32 numbers.",
        why_high=f"a device sends only the rows it computed ({SEQ_LEN} / {K} of them), not the whole "
                 "activation, and each of them once to each other device.",
        why_low=f"the All-Gather hands a device's rows to every one of the {K - 1} others, and a float32 takes "
                f"{DTYPE_BYTES} bytes.",
        right=f"(K-1) x N/K x F x {DTYPE_BYTES} = {K - 1} x {P} x {F} x {DTYPE_BYTES} = {bytes_sent('voltage'):,} "
              f"bytes: its {P} rows, once to each of the {K - 1} others, in the layer's one All-Gather.")


def check_tp_bytes(answer) -> Feedback:
    """Exercise 3: bytes one device sends per layer under tensor parallelism (two ring All-Reduces)."""
    K, F = BYTES_DEVICES, shape().hidden
    tp, voltage = bytes_sent("tensor_parallel"), bytes_sent("voltage")
    return check_number(
        "Exercise 3", answer, tp, whole=True, minimum=0, quantity="a count of bytes",
        hint="a ring All-Reduce of a tensor cuts it into K chunks and takes K-1 reduce-scatter steps and K-1 "
             "all-gather steps, a device sending one chunk per step; a layer has two All-Reduces.",
        why_high=f"each of the 2(K-1) steps of one All-Reduce sends one chunk of N x F / K, not the whole "
                 f"{SEQ_LEN} x {F} activation.",
        why_low="tensor parallelism All-Reduces the whole N x F activation (not a device's rows), twice per "
                "layer: after the attention's output projection and after the FFN.",
        right=f"2 All-Reduces x 2(K-1) steps x N x F / K x {DTYPE_BYTES} = 2 x {2 * (K - 1)} x {SEQ_LEN} x {F} / {K} "
              f"x {DTYPE_BYTES} = {tp:,} bytes: {tp / voltage:g}x Voltage's {voltage:,}. Voltage sends each row "
              "once; tensor parallelism reduces and then re-gathers the whole activation twice.")


# ----------------------------------------------------------------------------- exercise 4: predicted latency


def latency_plan() -> PartitionPlan:
    devices, mbit = LATENCY
    return plan("voltage", devices, mbit)


def _first_compute(p: PartitionPlan):
    return next(step for step in p.steps if step.kind == "compute")


def latency_givens() -> dict[str, float]:
    """What exercise 4 gives: a layer's compute on each device, the link, the layer count, and the bytes of
    Algorithm 2's three transfers on the terminal's link: the input it broadcasts, an All-Gather, the last
    layer's rows it receives."""
    p = latency_plan()
    by_kind = {step.kind: step for step in p.steps if step.kind != "compute"}
    return {"layers": p.shape.num_layers, "compute_ms_per_layer": round(_ms(_first_compute(p).seconds[0]), 3),
            "bandwidth_mbit": LATENCY[1], "link_latency_ms": _ms(p.latency_s),
            "input_bytes_sent_by_terminal": by_kind["broadcast"].traffic[0].sent,
            "bytes_sent_per_layer": p.traffic()[0][0].sent, "bytes_received_per_layer": p.traffic()[0][0].received,
            "last_layer_bytes_received_by_terminal": by_kind["gather"].traffic[0].received}


def predicted_ms() -> float:
    return _ms(latency_plan().predicted_s)


def check_latency(answer) -> Feedback:
    """Exercise 4: Voltage's predicted latency over LATENCY's devices and bandwidth, in ms (Algorithm 2: the
    input broadcast, an All-Gather after every layer but the last, the last rows to the terminal)."""
    p, g = latency_plan(), latency_givens()
    by_kind = {step.kind: _ms(step.seconds[0]) for step in p.steps if step.kind != "compute"}
    wire = max(g["bytes_sent_per_layer"], g["bytes_received_per_layer"])
    rate = LATENCY[1] * 1e6 / 8
    return check_number(
        "Exercise 4", answer, predicted_ms(), unit="ms", tolerance=LATENCY_TOLERANCE_MS, minimum=0,
        quantity="a latency",
        hint="the input goes out first; a layer is the devices' compute (side by side) and then one All-Gather, "
             "but the last layer sends its rows to the terminal only; run lab.latency_givens().",
        why_high="the devices compute their rows at the same time, so a layer's compute counts once; a link is "
                 "full duplex, so what a device sends and what it receives travel together (the larger one counts).",
        why_low=f"every transfer is one link latency plus its bytes over the link's {with_unit(LATENCY[1], 'Mbit/s')} "
                f"({rate:,.0f} bytes/s): the input's broadcast, {g['layers'] - 1} All-Gathers and the last rows "
                f"to the terminal.",
        right=f"{by_kind['broadcast']:.2f} ms input ({g['input_bytes_sent_by_terminal']:,} bytes) + "
              f"{g['layers'] - 1} x ({g['compute_ms_per_layer']:.2f} ms compute + {g['link_latency_ms']:g} ms latency "
              f"+ {wire:,} bytes / {rate:,.0f} bytes/s) + {g['compute_ms_per_layer']:.2f} ms + "
              f"{by_kind['gather']:.2f} ms for the last rows ({g['last_layer_bytes_received_by_terminal']:,} bytes) "
              f"= {predicted_ms():.2f} ms.")


# ----------------------------------------------------------------------------- exercise 5: the break-even


def _tp_minus_single_s(mbit: float) -> float:
    K = BREAK_EVEN_DEVICES
    return plan("tensor_parallel", K, mbit).predicted_s - plan("single", K, mbit).predicted_s


def break_even_mbit(low: float = 1.0, high: float = 100_000.0) -> float:
    """The link bandwidth (Mbit/s) below which tensor parallelism over BREAK_EVEN_DEVICES is slower than one
    device, found on the engine's plans by bisection (to 0.001 Mbit/s)."""
    if _tp_minus_single_s(high) >= 0:
        raise ValueError(f"tensor parallelism is slower than one device even at {high:g} Mbit/s")
    while high - low > 1e-3:
        mid = (low + high) / 2
        low, high = (mid, high) if _tp_minus_single_s(mid) > 0 else (low, mid)
    return (low + high) / 2


def break_even_givens() -> dict[str, float]:
    """What exercise 5 gives: one device's layer, a device's tensor-parallel compute per layer, the latencies."""
    K = BREAK_EVEN_DEVICES
    tp, single = plan("tensor_parallel", K), plan("single", K)
    layer = [s for s in tp.steps if s.layer == 0]
    return {"devices": K, "single_ms_per_layer": round(_ms(single.steps[0].seconds[0]), 3),
            "tp_compute_ms_per_layer": round(_ms(sum(s.seconds[0] for s in layer if s.kind == "compute")), 3),
            "all_reduces_per_layer": sum(s.kind == "all_reduce" for s in layer),
            "latency_ms_per_all_reduce": _ms(next(s.latency_s for s in layer if s.kind == "all_reduce")),
            "bytes_sent_per_layer": tp.traffic()[0][0].sent}


def check_break_even(answer) -> Feedback:
    """Exercise 5: the bandwidth (Mbit/s) below which tensor parallelism is slower than one device."""
    g = break_even_givens()
    answer_mbit = break_even_mbit()
    spare_ms = g["single_ms_per_layer"] - g["tp_compute_ms_per_layer"] - \
        g["all_reduces_per_layer"] * g["latency_ms_per_all_reduce"]
    return check_number(
        "Exercise 5", answer, answer_mbit, unit="Mbit/s", tolerance=BREAK_EVEN_TOLERANCE_MBIT, minimum=0,
        quantity="a bandwidth",
        hint="per layer, tensor parallelism saves compute (one device's layer minus a device's part) and spends "
             "its All-Reduces' latencies plus their bytes over the link; run lab.break_even_givens().",
        why_high="at that bandwidth tensor parallelism is already faster than one device; the break-even is where "
                 "a layer's bytes over the link take exactly the compute the split saves, less the All-Reduces' "
                 "latencies.",
        why_low="subtract the All-Reduces' latencies from the compute the split saves before dividing the bytes "
                "by it, and count both All-Reduces of a layer.",
        right=f"{g['single_ms_per_layer']:.2f} ms - {g['tp_compute_ms_per_layer']:.2f} ms - "
              f"{g['all_reduces_per_layer']} x {g['latency_ms_per_all_reduce']:g} ms = {spare_ms:.2f} ms per layer "
              f"is left for {g['bytes_sent_per_layer']:,} bytes: {g['bytes_sent_per_layer']:,} x 8 / {spare_ms:.2f} ms "
              f"= {answer_mbit:.1f} Mbit/s. Below it, tensor parallelism over {g['devices']} devices is slower "
              "than one device; Voltage, sending a quarter of the bytes, is not.")


# ----------------------------------------------------------------------------- exercise 6: the bottleneck


def uneven_plan() -> PartitionPlan:
    rows = [DeviceRow(speed, UNEVEN_MEMORY_GB, UNEVEN_BANDWIDTH_MBIT, name) for name, speed in UNEVEN]
    return plan_partition("voltage", shape(), SEQ_LEN, devices_from_table(rows), shares=UNEVEN_SHARES)


def uneven_rows() -> dict[str, int]:
    """Positions each device of exercise 6 computes per layer (its share of N, rounded at the boundaries)."""
    p = uneven_plan()
    return {name: end - start for (name, _), (start, end) in
            zip(UNEVEN, (p.positions(0, i) for i in range(p.K)))}


def uneven_ms() -> dict[str, float]:
    """Each device's predicted compute per layer in exercise 6, ms."""
    return {name: round(_ms(s), 3) for (name, _), s in zip(UNEVEN, _first_compute(uneven_plan()).seconds)}


def bottleneck() -> str:
    times = uneven_ms()
    return max(times, key=times.get)


def check_bottleneck(answer) -> Feedback:
    """Exercise 6: which device of UNEVEN, given UNEVEN_SHARES, finishes a layer last."""
    p, rows, times = uneven_plan(), uneven_rows(), uneven_ms()
    names = tuple(name for name, _ in UNEVEN)
    eq = {"qk_first": "Eq. 3", "x_first": "Eq. 8"}
    each = ", ".join(f"{n} {rows[n]} rows at {s:g} GFLOP/s in {times[n]:.2f} ms ({eq[o]})"
                     for (n, s), o in zip(UNEVEN, p.orders[0]))
    naive = max(names, key=lambda n: rows[n] / dict(UNEVEN)[n])
    return check_choice(
        "Exercise 6", answer, bottleneck(), names,
        why=f"per layer: {each}. Rows over speed points at {naive}, but a part's work is not proportional to its "
            "rows: a small part pays more per row. In Eq. (3) every device computes K and V of all N positions "
            "whatever its P; Eq. (8), cheaper for a small P, costs 2NF per row and head instead. Every All-Gather "
            f"waits for {bottleneck()}.",
        hint="rows over speed is not the whole story: look at what each device's order (Theorem 2 at its own P) "
             "costs per row; lab.uneven_rows() gives each device's P.")


def answers() -> dict[str, object]:
    """The right answers, by the lab's variable names, for its tests."""
    return {"my_order": order_answer(), "my_voltage_bytes": bytes_sent("voltage"),
            "my_tp_bytes": bytes_sent("tensor_parallel"), "my_latency_ms": round(predicted_ms(), 2),
            "my_break_even_mbit": round(break_even_mbit(), 1), "my_bottleneck": bottleneck()}
