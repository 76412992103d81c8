"""Self-checks of the heterogeneous partitioning (Hepti) lab: every expected answer is computed by the engine's own
partitioner (:func:`workbench.hepti.plan.hepti_partition`: the cost model of §4.3, the mode chosen from memory
and device count, P2 solved as a linear program), so it follows the engine wherever it changes; the feedback
quotes the engine's figures. Pure Python + SciPy: no torch, no worker process, nothing prepared. The shared
reading of answers and the feedback live in :mod:`workbench.labs`.

The lab's set-up: the shipped encoder's layer (all-MiniLM-L6-v2: d = 384, 12 heads, FFN 1536, 6 layers) on
T = 128 positions, over small tables of devices made from the ``rpi4`` preset (a Hepti board) with each row's
speed, free memory and link (:func:`workbench.distributed.shares.devices_from_table`).
"""
from __future__ import annotations

from workbench.devices import LayerShape
from workbench.labs import Feedback, check_choice, check_number
from workbench.models.shapes import get_shape
from workbench.hepti.plan import (MODE_TITLES, MODES, TILED_2D_FROM, Partition, hepti_partition, layer_weights,
                                       memory_bytes, ws_fixed_bytes)
from workbench.distributed.shares import DeviceRow, devices_from_table

MODEL = "encoder"
SEQ_LEN = 128
BASE = "rpi4"
FAST_MBIT = 10_000.0
"""Links of the exercises whose links are "fast": the All-Gathers cost well under a millisecond a layer."""

# name, GFLOP/s, free memory (GB), link (Mbit/s); the first is the primary
MIXED = (("A", 12.0, 4.0, FAST_MBIT), ("B", 12.0, 2.0, FAST_MBIT), ("C", 24.0, 0.024, FAST_MBIT),
         ("D", 6.0, 1.0, FAST_MBIT))
"""Exercises 1 and 2: C is the fastest board but has only 24 MB free; links fast (at 1 Gbit/s the summed
All-Reduces of Eq. 6 would outweigh D's compute and Hepti would leave D out)."""
SHORT_DEVICE = "C"
FALLEN_GB = 0.012
"""Exercise 4: C's free memory falls to 12 MB."""
TWICE = (("P", 6.0, 4.0, FAST_MBIT), ("Q", 12.0, 4.0, FAST_MBIT), ("R", 6.0, 4.0, FAST_MBIT))
"""Exercise 3: Q computes twice as fast as its peers; links fast, memory ample."""
TWICE_DEVICE = "Q"
SHARE_TOLERANCE = 0.01
CAP_TOLERANCE = 0.005
UNEQUAL = (("A", 12.0, 4.0, FAST_MBIT), ("B", 12.0, 4.0, FAST_MBIT), ("C", 6.0, 4.0, FAST_MBIT),
           ("D", 6.0, 4.0, FAST_MBIT))
"""Exercise 5: two fast and two slow boards, links fast, memory ample."""
GAIN_TOLERANCE = 0.05
BINDINGS = ("memory", "compute")


def shape() -> LayerShape:
    """One layer of the lab's encoder at T = SEQ_LEN."""
    model = get_shape(MODEL)
    return LayerShape(model.hidden, model.heads, model.ffn, SEQ_LEN)


def num_layers() -> int:
    return get_shape(MODEL).num_layers


def devices(table):
    """The devices of a table of (name, GFLOP/s, free memory GB, link Mbit/s) rows, from the ``rpi4`` preset."""
    return devices_from_table([DeviceRow(speed, memory, mbit, name) for name, speed, memory, mbit in table], base=BASE)


def partition(table, **options) -> Partition:
    """Hepti's partition of the lab's encoder over ``table`` (``options``: ``mode=``, ``fixed_shares=``)."""
    return hepti_partition(devices(table), shape(), num_layers=num_layers(), **options)


def _mb(nbytes: float) -> float:
    return nbytes / 1e6


def _ms(seconds: float) -> float:
    return 1e3 * seconds


def _share(p: Partition, name: str) -> float:
    return p.shares[[d.name for d in p.devices].index(name)]


def names(table) -> tuple[str, ...]:
    return tuple(name for name, *_ in table)


def fallen_table():
    """MIXED with C's free memory fallen to FALLEN_GB."""
    return tuple((n, s, FALLEN_GB if n == SHORT_DEVICE else m, b) for n, s, m, b in MIXED)


def memory_givens() -> dict[str, float]:
    """What exercises 1, 2 and 4 need: what a device must hold in each mode for the encoder's 6 layers at T = 128
    (the weights of every layer, and one layer's activations: a share lambda needs ``fixed + lambda x per_share``)."""
    S, L = shape(), num_layers()
    fixed = memory_bytes("1d", S, 0.0, L)
    return {"layers": L, "ws_fixed_MB": round(_mb(ws_fixed_bytes(S, L)), 2),
            "ws_per_share_MB": round(_mb(memory_bytes("ws", S, 1.0, L) - ws_fixed_bytes(S, L)), 2),
            "tiled_whole_model_MB": round(_mb(layer_weights_bytes(S, L)), 2),
            "tiled_fixed_MB": round(_mb(fixed), 2),
            "tiled_per_share_MB": round(_mb(memory_bytes("1d", S, 1.0, L) - fixed), 2),
            "tiled_2d_from_devices": TILED_2D_FROM}


def layer_weights_bytes(S: LayerShape, L: int) -> float:
    """The weights of L layers, float32 (Q, K, V, the output projection, the MLP's two matrices)."""
    return 4 * L * sum(layer_weights(S))


# ----------------------------------------------------------------------------- exercise 1: the mode


def mode_answer() -> str:
    return partition(MIXED).mode


def check_mode(answer) -> Feedback:
    """Exercise 1: the mode Hepti picks for MIXED ("ws", "1d", "2d" or "serial")."""
    p, g = partition(MIXED), memory_givens()
    short = [n for n, _, m, _ in MIXED[1:] if m * 1e9 < ws_fixed_bytes(shape(), num_layers())]
    held = ", ".join(f"{n} {1e3 * m:g} MB" for n, _, m, _ in MIXED[1:])
    return check_choice(
        "Exercise 1", answer, mode_answer(), MODES,
        why=f"WS needs every secondary to hold the output projection and the MLP of all {g['layers']} layers whole, "
            f"{g['ws_fixed_MB']:.1f} MB whatever its share; the secondaries have {held}, so "
            f"{', '.join(short) or 'none'} cannot. With {len(MIXED)} devices (< {TILED_2D_FROM}) Hepti falls back to "
            f"{MODE_TITLES[p.mode]}, where a device holds only its share of every weight ({g['tiled_whole_model_MB']:.1f} "
            f"MB for the whole model). The engine: {'; '.join(p.reasons)}.",
        hint="WS is chosen only when every secondary holds what WS needs whatever its share (run "
             "lab.memory_givens()); the tiled modes take over otherwise, 1D below 16 devices and 2D from 16.")


# ----------------------------------------------------------------------------- exercise 2: the binding constraint


def binding_kind(p: Partition) -> str:
    """"memory" when a device's share sits at its memory bound, else "compute" (the slowest device's compute, with
    the block's communication, in the costliest block)."""
    return "memory" if p.binding.startswith("memory of") else "compute"


def binding_answer() -> str:
    return binding_kind(partition(MIXED))


def check_binding(answer) -> Feedback:
    """Exercise 2: in MIXED, does a memory bound or compute set the latency ("memory" or "compute")?"""
    p, g = partition(MIXED), memory_givens()
    c_share = _share(p, SHORT_DEVICE)
    c_memory = dict((n, m) for n, _, m, _ in MIXED)[SHORT_DEVICE] * 1e9
    cap = (c_memory - g["tiled_fixed_MB"] * 1e6) / (g["tiled_per_share_MB"] * 1e6)
    speeds = ":".join(f"{s:g}" for _, s, _, _ in MIXED)
    return check_choice(
        "Exercise 2", answer, binding_answer(), BINDINGS,
        why=f"In {MODE_TITLES[p.mode]} {SHORT_DEVICE} holds only its share of every weight and of a layer's "
            f"activations, plus what it holds whatever its share (a head beyond its share, as heads are whole, the "
            f"biases and norms): {g['tiled_fixed_MB']:.2f} MB + {c_share:.3f} x {g['tiled_per_share_MB']:.1f} MB = "
            f"{_mb(memory_bytes(p.mode, shape(), c_share, num_layers())):.1f} MB of "
            f"its {_mb(c_memory):g} MB, below its bound (a share of {cap:.3f}). Short of what WS needs is not short "
            f"in the tiled mode. The All-Reduces cost the same whatever the shares, so the LP gives shares in "
            f"proportion to speed ({speeds}: {', '.join(f'{s:.3f}' for s in p.shares)}), and the engine's binding "
            f"constraint is: {p.binding}.",
        hint=f"work out {SHORT_DEVICE}'s share when shares follow speed, and what that share needs in the mode "
             "of exercise 1 (lab.memory_givens()); a memory bound binds only when the share the LP wants does not fit.")


# ----------------------------------------------------------------------------- exercise 3: twice as fast


def twice_share() -> float:
    return _share(partition(TWICE), TWICE_DEVICE)


def check_twice(answer) -> Feedback:
    """Exercise 3: the share of the device of TWICE that is twice as fast as its peers."""
    p = partition(TWICE)
    speeds = {n: s for n, s, _, _ in TWICE}
    total = sum(speeds.values())
    return check_number(
        "Exercise 3", answer, twice_share(), tolerance=SHARE_TOLERANCE, minimum=0, maximum=1, quantity="a share",
        hint="each device's time in a block is its share of the work over its speed, and the block waits for the "
             "slowest; which shares make all three finish together?",
        why_high=f"{TWICE_DEVICE} is twice as fast as each peer, not twice as fast as both together: a share beyond "
                 f"its part of the summed speed makes {TWICE_DEVICE} the one every block waits for.",
        why_low=f"with that share {TWICE_DEVICE} finishes first and waits; shares equal to the devices' part of the "
                "summed speed make all of them finish together.",
        right=f"lambda_i / f_i equal for all devices and summing to 1: lambda_{TWICE_DEVICE} = {speeds[TWICE_DEVICE]:g} / "
              f"({' + '.join(f'{s:g}' for s in speeds.values())}) = {speeds[TWICE_DEVICE] / total:.3f}; the engine "
              f"({MODE_TITLES[p.mode]}): {', '.join(f'{n} {s:.3f}' for n, s in zip(speeds, p.shares))}. With equal links "
              "WS's All-Gathers cost the same whatever the shares (device i receives 1 - lambda_i of the tensor, "
              "K - 1 tensors in all), so compute alone sets them.")


# ----------------------------------------------------------------------------- exercise 4: memory falls


def capped_share() -> float:
    return _share(partition(fallen_table()), SHORT_DEVICE)


def check_capped(answer) -> Feedback:
    """Exercise 4: C's share once its free memory has fallen to FALLEN_GB."""
    p, g = partition(fallen_table()), memory_givens()
    others = [(n, s) for n, s, _, _ in MIXED if n != SHORT_DEVICE]
    rest = 1 - capped_share()
    return check_number(
        "Exercise 4", answer, capped_share(), tolerance=CAP_TOLERANCE, minimum=0, maximum=1, quantity="a share",
        hint=f"in the tiled mode a share lambda needs {g['tiled_fixed_MB']:.2f} MB + lambda x "
             f"{g['tiled_per_share_MB']:.1f} MB (its weights and a layer's activations, lab.memory_givens()); does "
             f"the share {SHORT_DEVICE}'s speed earns still fit in "
             f"{1e3 * FALLEN_GB:g} MB?",
        why_high=f"{SHORT_DEVICE} cannot hold more than its free memory: a share lambda holds lambda of every weight "
                 f"of all {g['layers']} layers.",
        why_low=f"{SHORT_DEVICE} is still the fastest device: the LP gives it as much as its memory lets, no less.",
        right=f"({1e3 * FALLEN_GB:g} MB - {g['tiled_fixed_MB']:.2f} MB) / {g['tiled_per_share_MB']:.2f} MB = "
              f"{(FALLEN_GB * 1e3 - g['tiled_fixed_MB']) / g['tiled_per_share_MB']:.4f}, {capped_share():.4f} in whole "
              f"FFN columns: {SHORT_DEVICE}'s "
              f"share sits at its memory bound ({p.binding}). The other {rest:.3f} goes to "
              f"{', '.join(n for n, _ in others)} in proportion to their speeds "
              f"({':'.join(f'{s:g}' for _, s in others)}): "
              f"{', '.join(f'{n} {_share(p, n):.3f}' for n, _ in others)}.")


# ----------------------------------------------------------------------------- exercise 5: the gain over even shares


def gain() -> float:
    """Even shares' predicted latency over Hepti's on UNEQUAL."""
    even = partition(UNEQUAL, fixed_shares=[1 / len(UNEQUAL)] * len(UNEQUAL))
    return even.predicted_latency_s / partition(UNEQUAL).predicted_latency_s


def gain_givens() -> dict[str, float]:
    """What exercise 5 gives: the speeds, a layer's work, and the All-Gathers' time a layer (the same for both)."""
    p = partition(UNEQUAL)
    S = shape()
    work = 4 * S.hidden ** 2 * S.seq_len + 2 * S.seq_len ** 2 * S.hidden + 2 * S.hidden * S.ffn * S.seq_len
    return {"speeds_gflops": {n: s for n, s, _, _ in UNEQUAL}, "layer_gflop": round(2 * work / 1e9, 4),
            "all_gather_ms_per_layer": round(_ms(sum(b["comm_s"] for b in p.breakdown)), 3)}


def check_gain(answer) -> Feedback:
    """Exercise 5: how many times as long even shares take as Hepti's on UNEQUAL."""
    p = partition(UNEQUAL)
    even = partition(UNEQUAL, fixed_shares=[1 / len(UNEQUAL)] * len(UNEQUAL))
    g = gain_givens()
    speeds = g["speeds_gflops"]
    slow, total = min(speeds.values()), sum(speeds.values())
    compute_only = total / (len(speeds) * slow)
    return check_number(
        "Exercise 5", answer, gain(), tolerance=GAIN_TOLERANCE, minimum=0, quantity="a ratio of latencies",
        hint="under even shares every block waits for the slowest board computing a quarter of the work; under "
             "Hepti's all four finish together; run lab.gain_givens().",
        why_high="Hepti's shares make all four finish together: the work over the summed speed, not over the fastest "
                 "board's speed; compare that with the slowest board's quarter.",
        why_low=f"under even shares the {slow:g} GFLOP/s boards compute as much as the fast ones, and every block "
                "waits for them.",
        right=f"even shares: a quarter of the work at {slow:g} GFLOP/s; Hepti's "
              f"({', '.join(f'{s:.3f}' for s in p.shares)}): the work over {total:g} GFLOP/s. Compute alone gives "
              f"{total:g} / ({len(speeds)} x {slow:g}) = {compute_only:.2f}; the All-Gathers' "
              f"{g['all_gather_ms_per_layer']:.2f} ms a layer, the same in both (equal links), bring it to "
              f"{_ms(even.predicted_latency_s):.1f} / {_ms(p.predicted_latency_s):.1f} ms = {gain():.2f}.")


def answers() -> dict[str, object]:
    """The right answers, by the lab's variable names, for its tests."""
    return {"my_mode": mode_answer(), "my_binding": binding_answer(), "my_twice_share": round(twice_share(), 3),
            "my_capped_share": round(capped_share(), 4), "my_gain": round(gain(), 2)}
