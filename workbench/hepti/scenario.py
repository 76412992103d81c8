"""A Hepti study as its page, the notebooks and the commands set it, turned into the engine's answers.

A :class:`Scenario` is the devices (with the free memory each may fall to mid-run), the model and its sequence
length, a deadline, a mode (or Hepti's choice) and a share rule. From it come the partition of every layer as
the ranks decide it from their memory reports (:func:`schedule`, the rule :func:`~workbench.hepti.run.decide`
applies in a real run), the steps the executed split takes (:func:`scenario_steps`) and Hepti's MILP beside
the baselines' shares and each mode forced (:func:`compare`). Every function takes the partition solver as
``partition`` so that a caller may remember its answers (the page does, by their inputs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple

from workbench.devices import DeviceProfile
from workbench.distributed.shares import proportional_shares
from workbench.errors import WorkbenchError
from workbench.hepti.plan import MODE_TITLES, Partition, hepti_partition
from workbench.hepti.run import Reports, decide, layer_steps, shape_of, split_of
from workbench.models.shapes import get_shape

COMPARE = {"hepti": "Hepti's MILP", "even": "even shares", "proportional": "proportional shares"}
"""The share rules :func:`compare` sets side by side, by the names of its result (each mode forced follows)."""
FORCED = {"ws": "WS forced", "1d": "1D forced", "2d": "2D forced", "serial": "serial forced"}


class LayerDecision(NamedTuple):
    """The partition a layer runs with, and why it was decided at this layer ("first", the engine's reason for
    re-partitioning, or "" when the layer keeps the one before)."""
    partition: Partition
    changed: str


@dataclass(frozen=True)
class Scenario:
    """What the figures and a run are made from (hashable: the key of a page's memo and of its kept runs)."""
    devices: tuple[DeviceProfile, ...]
    model: str
    seq_len: int
    deadline_s: float
    mode: str | None                        # None: Hepti decides
    shares: str                             # a key of COMPARE: hepti, even or proportional
    falls: tuple[tuple[str, int, float], ...] = ()   # (device, layer, free bytes from that layer on)

    @property
    def shape(self):
        return shape_of(get_shape(self.model), self.seq_len)

    @property
    def num_layers(self) -> int:
        return get_shape(self.model).num_layers

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.devices]

    def fixed(self) -> tuple[float, ...] | None:
        """The baseline's shares (None: Hepti's MILP)."""
        K = len(self.devices)
        return {"hepti": None, "even": (1.0 / K,) * K,
                "proportional": proportional_shares(self.devices)}[self.shares]

    def memory_falls(self) -> dict[str, tuple[int, float]]:
        return {name: (layer, nbytes) for name, layer, nbytes in self.falls}


PartitionFn = Callable[..., Partition]


def solve(devices, shape, deadline_s: float, num_layers: int, mode: str | None = None,
          fixed: tuple[float, ...] | None = None) -> Partition:
    """:func:`hepti_partition` with the arguments in the order the functions here pass them."""
    return hepti_partition(devices, shape, deadline_s, num_layers=num_layers, mode=mode, fixed_shares=fixed)


def run_mode(s: Scenario, partition: PartitionFn = solve) -> str | None:
    """The mode a run is given: the one forced, or with baseline shares Hepti's own (as ``run_hepti`` does)."""
    if s.mode is not None or s.shares == "hepti":
        return s.mode
    return partition(s.devices, s.shape, s.deadline_s, s.num_layers).mode


def schedule(s: Scenario, quote_best: bool = True, partition: PartitionFn = solve) -> list[LayerDecision]:
    """The partition of every layer as the ranks decide it from their reports (:func:`decide` on each layer's
    free memory; the measured speeds of a real run are the devices' own here). ``quote_best=False``: a deadline
    no partition meets raises :class:`~workbench.hepti.plan.DeadlineMissed` at once, before the best reachable
    latency is known."""
    shape, L, K = s.shape, s.num_layers, len(s.devices)
    mode, fixed = run_mode(s, partition), s.fixed()
    reports = Reports(s.devices, s.memory_falls())
    split, current, out = None, None, []
    for layer in range(L):
        now = [replace(d, memory_bytes=reports.free_bytes(i, layer)) for i, d in enumerate(s.devices)]
        new, why, decided = decide(split, None, now, shape, L, layer, s.deadline_s, list(range(K)), mode, False,
                                   fixed, quote_best=quote_best)
        if new is not None:
            split, current = new, decided
        out.append(LayerDecision(current, why))
    return out


def scenario_steps(s: Scenario, layers: list[LayerDecision]) -> list:
    """Every layer's steps with its own partition, as the split executes them."""
    shape, K = s.shape, len(s.devices)
    return [step for n, ld in enumerate(layers)
            for step in layer_steps(split_of(ld.partition, list(range(K)), shape), n, shape, s.devices)]


def compare(s: Scenario, partition: PartitionFn = solve) -> dict[str, Partition | str]:
    """Hepti's MILP, even and proportional shares (in the mode Hepti picks or the one forced) and each mode
    forced with Hepti's shares, at the first layer's memory and without a deadline (a figure draws it); a
    refusal is kept as the engine's reason. Keys: :data:`COMPARE`'s names, then :data:`FORCED`'s."""
    shape, L, devices, K = s.shape, s.num_layers, s.devices, len(s.devices)
    out: dict[str, Partition | str] = {}

    def attempt(label, make):
        try:
            out[label] = make()
        except WorkbenchError as exc:
            out[label] = str(exc)

    attempt(COMPARE["hepti"], lambda: partition(devices, shape, math.inf, L, s.mode))
    base_mode = lambda: s.mode or partition(devices, shape, math.inf, L).mode      # noqa: E731
    attempt(COMPARE["even"], lambda: partition(devices, shape, math.inf, L, base_mode(), (1.0 / K,) * K))
    attempt(COMPARE["proportional"], lambda: partition(devices, shape, math.inf, L, base_mode(),
                                                       proportional_shares(devices)))
    for mode in MODE_TITLES:
        attempt(FORCED[mode], lambda mode=mode: partition(devices, shape, math.inf, L, mode))
    return out
