"""The elastic pipelining lab: units, each exercise's answer and margin, and the lab notebook run with right
and wrong answers."""
import re
from dataclasses import replace
from pathlib import Path

import nbformat
import numpy as np
import pytest

from tests import nbrun
from workbench.elastic import lab as elastic_lab
from workbench.elastic.lab import ElasticLab
from workbench.elastic.planner import plan_elastic
from workbench import labs
from workbench.labs import AnswerError

LAB = Path(__file__).resolve().parents[2] / "notebooks" / "labs" / "elastic_lab.ipynb"


@pytest.fixture(autouse=True)
def fresh_tries():
    labs.forget_tries()
    yield
    labs.forget_tries()


@pytest.mark.parametrize("target, message", [(0, "more than 0 ms, got 0 ms"), (-5, "more than 0 ms, got -5 ms"),
                                             ("abc", "'abc' is not a number of ms"), (float("nan"), "number of ms")])
def test_targets_are_positive_ms(target, message):
    with pytest.raises(AnswerError, match=message):
        elastic_lab.target_seconds(target)


def test_units_ms_and_mb():
    assert elastic_lab.target_seconds("200 ms") == elastic_lab.target_seconds(200) == 0.2
    assert elastic_lab.buffer_bytes(2) == 2e6 and elastic_lab.buffer_bytes(0) == 0
    with pytest.raises(AnswerError, match="0 MB or more, got -1 MB"):
        elastic_lab.buffer_bytes(-1)
    assert elastic_lab.aibs_ms([0.0123456, 0.1]) == [12.35, 100.0]


# ----------------------------------------------------------------------------- the exercises on the quick cache


@pytest.fixture(scope="module")
def lab(prepared):
    return ElasticLab.load("quick")


def test_answers_agree_with_the_planner_in_seconds(lab):
    jetson, odroid = lab.devices["jetson-nano"], lab.devices["odroid-n2"]
    answers = lab.answers()
    assert answers["my_width"] == plan_elastic(jetson, 0.2, lab.importance, 0).m
    plan = plan_elastic(odroid, 0.15, lab.importance, 0)
    assert answers["my_aib_ms"] == pytest.approx(1e3 * (0.15 - (plan.n - 2) * odroid.t_comp(plan.m)), abs=0.01)
    small, big = (plan_elastic(odroid, 0.3, lab.importance, b) for b in (0, 2e6))
    assert answers["my_change"] == "up" and (big.bits == 32).sum() > (small.bits == 32).sum()
    assert not plan_elastic(odroid, answers["my_target_ms"] / 1e3, lab.importance, 1e6).found


def test_every_answer_has_a_clear_margin(lab):
    jetson, odroid = lab.devices["jetson-nano"], lab.devices["odroid-n2"]
    width = lab.plan("jetson-nano", 200)
    assert width.m == jetson.num_shards and width.n * 1e3 * jetson.t_comp(3) < 200 - 20
    aib = lab.plan("odroid-n2", 150)
    assert 1e3 * odroid.t_comp(aib.m) > 10 * 1.0, "one layer's compute must dwarf the 1 ms tolerance"
    small, big = lab._buffer_plans()
    assert (small.n, small.m) == (big.n, big.m) == (odroid.num_layers, odroid.num_shards)
    assert elastic_lab._count_32(big) - elastic_lab._count_32(small) >= 2
    assert lab.answers()["my_target_ms"] < 0.75 * lab.no_plan_below_ms()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("io_scale", [0.9, 1.1])
def test_answers_do_not_hinge_on_the_prepared_cache(lab, seed, io_scale):
    """Another cache brings other importance and slightly other shard sizes; the answers stay."""
    other = replace(lab, importance=np.random.default_rng(seed).random(lab.importance.shape),
                    devices={name: replace(cost, io_s={b: io_scale * t for b, t in cost.io_s.items()})
                             for name, cost in lab.devices.items()})
    assert other.answers() == lab.answers()
    small, big = other._buffer_plans()
    assert (small.n, small.m) == (big.n, big.m) and elastic_lab._count_32(big) - elastic_lab._count_32(small) >= 2


def test_right_answers_in_any_form(lab):
    answers = lab.answers()
    for check, variants in ((lab.check_width, [answers["my_width"], str(answers["my_width"]), 12.0]),
                            (lab.check_initial_aib, [answers["my_aib_ms"], f" {answers['my_aib_ms']:.1f} ms "]),
                            (lab.check_buffer, ["Up", " UP ", "up"]),
                            (lab.check_no_plan, [answers["my_target_ms"], "20 ms", 1])):
        for answer in variants:
            assert check(answer).right, (check.__name__, answer, check(answer))
        assert check(None).status == "unanswered"


def test_wrong_numbers_say_which_way_and_why_with_the_engines_figures(lab):
    t_comp_12 = f"{lab.t_comp_ms('jetson-nano', 12):.2f} ms"
    low, impossible = lab.check_width(3), lab.check_width(13)
    assert low.status == "low" and "too low" in low.text and t_comp_12 in low.text
    assert impossible.status == "impossible" and "a layer has 12 shards" in impossible.text
    plan = lab.plan("odroid-n2", 150)
    layer_ms = f"{lab.t_comp_ms('odroid-n2', plan.m):.2f} ms"
    slack_only = lab.check_initial_aib(150 - plan.n * lab.t_comp_ms("odroid-n2", plan.m))
    assert slack_only.status == "low" and "layers before it compute" in slack_only.text and layer_ms in slack_only.text
    whole_target = lab.check_initial_aib("150")
    assert whole_target.status == "high" and f"compute of all {plan.n} layers" in whole_target.text


def test_a_wrong_change_gets_a_hint_then_the_buffers_reason(lab):
    first = lab.check_buffer("Down")
    assert first.status == "wrong" and "not 'Down'" in first.text and "Hint:" in first.text
    assert not re.search(r"goes \d+ -> \d+", first.text)
    for _ in range(labs.TRIES - 1):
        feedback = lab.check_buffer("same")
    assert feedback.status == "wrong" and "the answer: 'up'" in feedback.text
    assert "3 shards at 32 bits" in feedback.text and "same 6 x 12 submodel" in feedback.text
    assert re.search(r"goes \d+ -> \d+", feedback.text)


def test_a_target_with_a_plan_is_too_high(lab):
    told = f"one layer of 3 shards, the narrowest the planner considers, computes in {lab.no_plan_below_ms():.2f} ms"
    first = lab.check_no_plan(200)
    assert first.status == "high" and "too high" in first.text and told not in first.text
    assert "lab.t_comp_ms('odroid-n2', 3)" in first.text
    for _ in range(labs.TRIES - 1):
        feedback = lab.check_no_plan("200 ms")
    assert feedback.text.startswith("200 ms is too high") and told in feedback.text
    assert lab.check_no_plan("answer").status == "shown"


def test_the_aib_tolerance_is_stated_in_the_question_and_used_in_the_check(lab):
    stated = labs.within(elastic_lab.AIB_TOLERANCE_MS, "ms")
    question = nbformat.read(LAB, as_version=4).cells[5].source
    assert "Exercise 2" in question and f"({stated})" in question
    aib = lab.initial_aib_ms()
    assert lab.check_initial_aib(aib + 0.9 * elastic_lab.AIB_TOLERANCE_MS).right
    off = lab.check_initial_aib(aib + 1.1 * elastic_lab.AIB_TOLERANCE_MS)
    assert not off.right and f"({stated})" in off.text


@pytest.mark.parametrize("answer", [0, -5, "abc", float("inf"), [20]])
def test_bad_targets_get_one_line_not_a_traceback(lab, answer):
    feedback = lab.check_no_plan(answer)
    assert feedback.status == "invalid" and "ms" in feedback.text and "\n" not in feedback.text
    line = lab.explore("odroid-n2", answer, 1)
    assert line.startswith("bad input: ") and "\n" not in line


def test_explore_shows_the_invariants(lab):
    shown = lab.explore("odroid-n2", 120, 1)
    assert "AIBs (ms):" in shown and "all AIBs >= 0: True" in shown and "<= 120 ms: True" in shown
    assert lab.explore("odroid-n2", 10, 0).endswith("alone computes in 24.0 ms)")
    assert lab.explore("odroid-n2", 120, -1) == "bad input: a preload buffer must be 0 MB or more, got -1 MB"


# ----------------------------------------------------------------------------- the lab notebook


def _run_lab(values: dict, monkeypatch) -> nbformat.NotebookNode:
    """The lab executed with ``values`` (a notebook line's left side -> the new right side) in place of its own."""
    monkeypatch.setenv("WORKBENCH_PRESET", "quick")
    nb = nbformat.read(LAB, as_version=4)
    for left, right in values.items():
        hits = [c for c in nb.cells if c.cell_type == "code" and re.search(rf"^{re.escape(left)} = ", c.source, re.M)]
        assert len(hits) == 1, f"the lab has no single line {left} = ..."
        hits[0].source = re.sub(rf"^{re.escape(left)} = [^#\n]*", f"{left} = {right}  ", hits[0].source, flags=re.M)
    return nbrun.execute(LAB, nb)


def _feedback(nb) -> list[tuple[str, str]]:
    """(status, html) of every self-check box the lab showed, in order."""
    return [(nbrun.box_status(box), box) for box in nbrun.check_boxes(nb)]


def _printed(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                   if o.output_type == "stream")


@pytest.mark.notebooks
def test_lab_with_the_right_answers(prepared, monkeypatch):
    answers = ElasticLab.load("quick").answers()
    nb = _run_lab({"my_width": repr(str(answers["my_width"])), "my_aib_ms": repr(answers["my_aib_ms"]),
                   "my_change": repr(answers["my_change"].title()), "my_target_ms": repr(answers["my_target_ms"])},
                  monkeypatch)
    feedback = _feedback(nb)
    assert [status for status, _ in feedback] == ["right"] * 4, feedback
    assert "no submodel fits" in feedback[3][1]
    assert "all AIBs >= 0: True" in _printed(nb)


@pytest.mark.notebooks
def test_lab_with_wrong_answers_and_a_zero_target(prepared, monkeypatch):
    answers = ElasticLab.load("quick").answers()
    nb = _run_lab({"my_width": "3", "my_aib_ms": repr(answers["my_aib_ms"] + 50), "my_change": "'same'",
                   "my_target_ms": "200", "target_ms, preload_mb": "0, 1"}, monkeypatch)
    feedback = _feedback(nb)
    assert [status for status, _ in feedback] == ["low", "high", "wrong", "high"], feedback
    assert "too low" in feedback[0][1] and "too high" in feedback[1][1] and "not &#x27;same&#x27;" in feedback[2][1]
    assert "too high" in feedback[3][1]
    assert "bad input: a target latency must be more than 0 ms, got 0 ms" in _printed(nb)
