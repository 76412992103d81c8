"""A schedule the same for every device, and its predicted timeline: what a partitioner plans and a rank walks.

A :class:`Step` is a compute step with each device's predicted seconds, or a collective with each device's
bytes and its predicted seconds; :func:`steps_timeline` draws a list of them per device. Pure Python.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from workbench.network import Traffic
from workbench.timeline import Span, Timeline


@dataclass(frozen=True)
class Step:
    """One step of the schedule, the same for every device.

    ``kind`` "compute" (each device's predicted ``seconds``), "all_gather", "all_reduce", "send", "broadcast"
    (the terminal's input to every other device) or "gather" (every part to the terminal)
    (each device's ``traffic`` and the collective's ``seconds``, the same for all)."""
    kind: str
    layer: int | None
    label: str
    seconds: tuple[float, ...]               # per device
    traffic: tuple[Traffic, ...] = ()        # per device, collectives only
    src: int | None = None                   # a send's source and destination device
    dst: int | None = None
    latency_s: float = 0.0                   # the part of ``seconds`` that is link latency (collectives)
    part: str | None = None                  # "attention" or "ffn": the half of a tensor-parallel layer it serves


def steps_timeline(steps: Sequence[Step], names: Sequence[str], name: str = "predicted") -> Timeline:
    """A schedule drawn per device: compute spans, then each collective after the last device is ready
    (a stall until then, on the devices that take part in it), one lane per device; a collective's span only
    on the devices that move bytes. A device that takes no part in a step and its collective (dropped by the
    partitioner) is ``idle`` through both, not stalled."""
    K, spans, t = len(names), [], 0.0
    for k, step in enumerate(steps):
        if step.kind == "compute":
            longest = max(step.seconds)
            after = steps[k + 1] if k + 1 < len(steps) else None
            joins = after is not None and after.kind in ("all_gather", "all_reduce", "gather")
            for i, s in enumerate(step.seconds):
                if s > 0:
                    spans.append(Span(f"device {i}", "compute", t, t + s, step.label, device=names[i],
                                      layer=step.layer, rank=i))
                waits = joins and bool(after.traffic[i].sent or after.traffic[i].received)
                if joins and not waits and s == 0:          # dropped: no work, no bytes, no waiting
                    spans.append(Span(f"device {i}", "idle", t, t + longest + after.seconds[0],
                                      f"takes no part in {step.label}", device=names[i], layer=step.layer, rank=i))
                if waits and s < longest:
                    spans.append(Span(f"device {i}", "stall", t + s, t + longest, f"waits for {step.label}",
                                      device=names[i], layer=step.layer, rank=i))
            t += longest
            continue
        end = t + step.seconds[0]
        members = [i for i in range(K) if step.traffic[i].sent or step.traffic[i].received] \
            if step.kind != "send" else (step.src, step.dst)
        for i in members:
            nbytes = step.traffic[i].sent + step.traffic[i].received
            spans.append(Span(f"device {i}", "comm", t, end, step.label, device=names[i], layer=step.layer,
                              rank=i, nbytes=nbytes, flow=f"{step.label}" if step.kind == "send" else None,
                              meta={"sent": step.traffic[i].sent, "received": step.traffic[i].received}))
        t = end
    return Timeline(tuple(spans), "predicted", name=name)
