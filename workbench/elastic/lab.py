"""The elastic pipelining lab: WRX's planner on two emulated devices, four exercises and their self-checks.

Expected answers come from the planner on the prepared task, so they hold on any cache; the feedback quotes
the engine's own figures. The lab speaks milliseconds and MB, like ``workbench elastic plan --target-ms ...
--preload-mb ...`` and the dashboard; the shared answer reading and feedback live in :mod:`workbench.labs`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.elastic.artifacts import load_importance, load_store
from workbench.elastic.costmodel import CostModel, device_cost_model
from workbench.elastic.planner import Candidate, ElasticPlan, plan_elastic
from workbench.errors import WorkbenchError
from workbench.labs import (AnswerError, Feedback, as_number, asks_for_answer, check_choice, check_number, judge,
                            shown, typed, unanswered, with_unit)
from workbench.presets import default_preset


def target_seconds(target_ms) -> float:
    """A target latency typed in ms, as seconds; an AnswerError in ms for anything but a positive number."""
    value = as_number(target_ms, "ms")
    if value <= 0:
        raise AnswerError(f"a target latency must be more than 0 ms, got {with_unit(value, 'ms')}")
    return value / 1e3


def buffer_bytes(preload_mb) -> float:
    """A preload buffer typed in MB, as bytes; an AnswerError in MB for anything but a number >= 0."""
    value = as_number(preload_mb, "MB")
    if value < 0:
        raise AnswerError(f"a preload buffer must be 0 MB or more, got {with_unit(value, 'MB')}")
    return value * 1e6


def aibs_ms(aib) -> list[float]:
    """AIBs given in seconds, in ms rounded to 0.01."""
    return [round(1e3 * float(a), 2) for a in aib]


def _count_32(plan: ElasticPlan) -> int:
    return int((plan.bits == 32).sum())


WIDTH = ("jetson-nano", 200.0)            # exercise 1: device, target ms (no buffer)
BUDGET = ("odroid-n2", 150.0, 2)          # exercise 2: device, target ms, layer whose initial AIB is asked
BUFFER = ("odroid-n2", 300.0, 0.0, 2.0)   # exercise 3: device, target ms, buffer MB before and after
NO_PLAN = ("odroid-n2", 1.0)              # exercise 4: device, buffer MB
AIB_TOLERANCE_MS = 1.0                    # exercise 2: how far an answer may be from the AIB (stated in the lab)
CHANGES = ("up", "down", "same")


@dataclass(frozen=True, eq=False)
class ElasticLab:
    """The elastic pipelining lab: shard importance and device profiles, each exercise's answer and check."""
    devices: dict[str, CostModel]     # emulated device name -> profile
    importance: np.ndarray            # (layers, shards) accuracy importance

    @classmethod
    def load(cls, preset: str | None = None, task: str = "sentiment", seq_len: int = 64) -> ElasticLab:
        """The prepared ``task`` of ``preset`` ($WORKBENCH_PRESET by default) on the lab's two devices."""
        preset = preset or default_preset()
        store = load_store(task, preset)
        names = {WIDTH[0], BUDGET[0], BUFFER[0], NO_PLAN[0]}
        return cls(devices={name: device_cost_model(name, store, seq_len) for name in sorted(names)},
                   importance=np.asarray(load_importance(task, preset).accuracy))

    def plan(self, device: str, target_ms, preload_mb=0.0) -> ElasticPlan:
        """WRX's plan on ``device`` for a target in ms and a preload buffer in MB."""
        return plan_elastic(self.devices[device], target_seconds(target_ms), self.importance,
                            buffer_bytes(preload_mb))

    def t_comp_ms(self, device: str, m: int) -> float:
        """Milliseconds to decompress and compute one layer of ``m`` shards on ``device``."""
        return 1e3 * self.devices[device].t_comp(m)

    # -- exercise 1: width on a GPU

    def width(self) -> int:
        """Exercise 1: the width m compute planning picks on the GPU."""
        return self.plan(*WIDTH).m

    def check_width(self, answer) -> Feedback:
        device, target_ms = WIDTH
        plan = self.plan(device, target_ms)
        widest = self.devices[device].num_shards
        narrowest = min(c.m for c in plan.compute.candidates)
        narrow_ms, wide_ms = self.t_comp_ms(device, narrowest), self.t_comp_ms(device, widest)
        return check_number(
            "Exercise 1", answer, plan.m, whole=True, minimum=1, maximum=widest,
            quantity=f"a layer's width (a layer has {widest} shards)",
            hint=f"Compare lab.t_comp_ms({device!r}, {narrowest}) with lab.t_comp_ms({device!r}, {widest}).",
            why_high=f"compare lab.t_comp_ms({device!r}, m) for a narrower and a wider m.",
            why_low=(f"look at what a wider layer costs on this GPU: a layer of {widest} shards computes in "
                     f"{wide_ms:.2f} ms; compare lab.t_comp_ms({device!r}, {narrowest})."),
            right=(f"a layer of {widest} shards computes only {wide_ms - narrow_ms:.2f} ms slower than one of "
                   f"{narrowest}, so {plan.n} layers x {plan.m} shards compute in "
                   f"{plan.n * self.t_comp_ms(device, plan.m):.1f} ms of the {target_ms:g} ms: width is almost free "
                   f"here, while every layer costs {narrow_ms:.1f} ms."))

    # -- exercise 2: the IO budget at the start

    def initial_aib_ms(self) -> float:
        """Exercise 2: the asked layer's AIB before any shard is allocated, in ms."""
        device, target_ms, layer = BUDGET
        return 1e3 * self.plan(device, target_ms).io.steps[0].aib[layer]

    def check_initial_aib(self, answer) -> Feedback:
        device, target_ms, layer = BUDGET
        plan = self.plan(device, target_ms)
        layer_ms = self.t_comp_ms(device, plan.m)
        slack_ms = target_ms - plan.n * layer_ms
        return check_number(
            "Exercise 2", answer, 1e3 * plan.io.steps[0].aib[layer], unit="ms", tolerance=AIB_TOLERANCE_MS,
            hint=f"Compute planning picks {plan.n} x {plan.m} here; one layer of {plan.m} shards computes in "
                 f"{layer_ms:.2f} ms.",
            why_high=(f"The slack is the {target_ms:g} ms target minus the compute of all {plan.n} layers "
                      f"({plan.n} x {layer_ms:.2f} ms), and layer {layer} adds only the {layer} layers before it."),
            why_low=(f"Besides the slack ({target_ms:g} ms minus {plan.n} x {layer_ms:.2f} ms of compute), layer "
                     f"{layer} may load while the {layer} layers before it compute ({layer} x {layer_ms:.2f} ms)."),
            right=(f"{target_ms:g} - {plan.n} x {layer_ms:.2f} + {layer} x {layer_ms:.2f} = "
                   f"{slack_ms + layer * layer_ms:.2f} ms: the slack plus the compute of the {layer} layers "
                   "before it."))

    # -- exercise 3: a bigger preload buffer

    def buffer_change(self) -> str:
        """Exercise 3: how the count of 32-bit shards moves when the buffer grows ("up", "down", "same")."""
        small, big = self._buffer_plans()
        before, after = _count_32(small), _count_32(big)
        return "up" if after > before else "down" if after < before else "same"

    def _buffer_plans(self) -> tuple[ElasticPlan, ElasticPlan]:
        device, target_ms, before_mb, after_mb = BUFFER
        return self.plan(device, target_ms, before_mb), self.plan(device, target_ms, after_mb)

    def check_buffer(self, answer) -> Feedback:
        device, target_ms, before_mb, after_mb = BUFFER
        small, big = self._buffer_plans()
        cost = self.devices[device]
        bonus_ms = 1e3 * sum(cost.t_io(bits) for _, _, bits in big.preload)
        held = sorted({bits for _, _, bits in big.preload})
        submodel = (f"the same {big.n} x {big.m} submodel" if (small.n, small.m) == (big.n, big.m) else
                    f"{small.n} x {small.m} at {before_mb:g} MB, {big.n} x {big.m} at {after_mb:g} MB")
        why = (f"With {after_mb:g} MB the buffer holds {len(big.preload)} shards at "
               f"{'/'.join(map(str, held)) or '-'} bits, whose load time ({bonus_ms:.2f} ms) joins the AIB of "
               f"their layer and every later one; on {submodel} the count of 32-bit shards goes "
               f"{_count_32(small)} -> {_count_32(big)}.")
        return check_choice("Exercise 3", answer, self.buffer_change(), CHANGES, why,
                            hint="look at what a preloaded shard's load time adds to the AIB of its layer and of "
                                 "every later one, and what IO planning does with a larger AIB.")

    # -- exercise 4: the invariant, and a target with no plan

    def no_plan_below_ms(self) -> float:
        """Exercise 4: below this target (ms) compute planning fits nothing: one layer of the narrowest width."""
        return 1e3 * self._fastest().time_s

    def _fastest(self) -> Candidate:
        device, preload_mb = NO_PLAN
        return min(self.plan(device, 1e3, preload_mb).compute.candidates, key=lambda c: c.time_s)

    def check_no_plan(self, answer) -> Feedback:
        device, preload_mb = NO_PLAN
        if answer is None:
            return unanswered("Exercise 4", "Lower target_ms in the cell above until the planner gives up.")
        fastest = self._fastest()
        answer_text = f"any target below {1e3 * fastest.time_s:.2f} ms"
        why = (f"one layer of {fastest.m} shards, the narrowest the planner considers, computes in "
               f"{1e3 * fastest.time_s:.2f} ms, so a shorter target fits no submodel.")
        if asks_for_answer(answer):
            return shown("Exercise 4", answer_text, why)
        try:
            plan = self.plan(device, answer, preload_mb)
        except (WorkbenchError, ValueError) as exc:
            return Feedback("Exercise 4", "invalid", f"{exc}.")
        if not plan.found:
            return Feedback("Exercise 4", "right", f"right, no plan at {typed(answer, 'ms')}: {plan.reason}.")
        return judge("Exercise 4", NO_PLAN, "high",
                     f"{typed(answer, 'ms')} is too high: the planner finds {plan.n} x {plan.m} (predicted {1e3 * plan.predicted_s:.1f} ms)",
                     f"the smallest submodel is one layer of the narrowest width ({fastest.m} shards); look at "
                     f"lab.t_comp_ms({device!r}, {fastest.m}).", answer_text, why)

    def explore(self, device: str, target_ms, preload_mb=0.0) -> str:
        """A plan in words with its invariants (AIBs >= 0, prediction within the target), or a one-line error."""
        try:
            plan = self.plan(device, target_ms, preload_mb)
        except (WorkbenchError, ValueError) as exc:
            return f"bad input: {exc}"
        if not plan.found:
            return plan.describe()
        limit_ms, predicted_ms = 1e3 * plan.target_s, 1e3 * plan.predicted_s
        return (f"{plan.describe()}\n"
                f"AIBs (ms): {aibs_ms(plan.io.aib)}\n"
                f"all AIBs >= 0: {bool((plan.io.aib >= -1e-9).all())} | predicted {predicted_ms:.1f} ms "
                f"<= {limit_ms:g} ms: {predicted_ms <= limit_ms + 1e-6}")

    def answers(self) -> dict[str, object]:
        """The right answer of every exercise, keyed by the notebook's variable."""
        return {"my_width": self.width(), "my_aib_ms": round(self.initial_aib_ms(), 2),
                "my_change": self.buffer_change(), "my_target_ms": round(self.no_plan_below_ms() / 2)}
