"""The E3 lab's self-checks: the expected answers are the engine's (the split optimizer, checked by brute force),
worked out again here by hand, and wrong answers are told why (a hint first, the answer after a few tries)."""
import re
from pathlib import Path

import nbformat
import pytest

from tests import nbrun
from workbench import labs
from workbench.earlyexit import lab

LAB = Path(__file__).resolve().parents[2] / "notebooks" / "labs" / "earlyexit_lab.ipynb"
RIGHT = {"my_merged_batches": 1.0, "my_stage_ms": 7.0, "my_goodput": 2133, "my_cut": 1, "my_tight_plan": "unsplit",
         "my_tightest_slo_ms": 20.0}


@pytest.fixture(autouse=True)
def fresh_tries():
    labs.forget_tries()
    yield
    labs.forget_tries()


def by_hand(batches) -> float:
    return sum(lab.FIXED_MS + lab.PER_SAMPLE_MS * b for b in batches)


def test_exercise_one_is_the_survivors_merged_into_full_batches():
    p = lab.merge_plan()
    assert p.splits == [(0, 3), (3, 6)] and p.replicas == [2, 1] and p.batch_sizes == [8, 8]
    assert p.input_batches == 2 and lab.merged_batches() == 2 * lab.PROFILE[2] == 1
    assert lab.check_merged_batches(" 1 ").right and lab.check_merged_batches(1.0).right
    no_exits = lab.check_merged_batches(2)
    assert no_exits.status == "high" and "never reach split 2" in no_exits.text
    assert "the answer:" not in no_exits.text                       # the answer waits for the third try
    low = lab.check_merged_batches(0.5)
    assert low.status == "low" and "after ramp 2" in low.text
    told = lab.check_merged_batches(0.5)
    assert "the answer: 1" in told.text and "2 x 8 = 16 samples enter split 1" in told.text
    assert lab.check_merged_batches(3).status == "impossible" and lab.check_merged_batches(None).status == "unanswered"


def test_exercise_two_adds_the_layers_at_their_shrinking_batches():
    p = lab.merge_plan()
    assert lab.replica_batches(p, 1) == [8, 4, 4]
    assert lab.stage_ms() == pytest.approx(by_hand([8, 4, 4])) == pytest.approx(7.0)
    assert lab.check_stage_time("7 ms").right and lab.check_stage_time(7.04).right
    no_exits = lab.check_stage_time(by_hand([8, 8, 8]))
    assert no_exits.status == "high" and "smaller batches" in no_exits.text
    assert lab.check_stage_time(by_hand([8, 4, 4]) - 3 * lab.FIXED_MS).status == "low"
    assert "(within 0.05 ms)" in lab.check_stage_time(8).text
    assert lab.check_stage_time(-1).status == "impossible"


def test_exercise_three_is_the_slowest_split_per_input():
    p = lab.merge_plan()
    stages = [by_hand(lab.replica_batches(p, i)) for i in range(2)]
    per_input = [2 * 8 / (1.0 * stages[0] / 1e3), 1 * 8 / (0.5 * stages[1] / 1e3)]
    assert lab.goodput() == pytest.approx(min(per_input)) == pytest.approx(16 / 7.5e-3)
    assert lab.check_goodput(2133).right and lab.check_goodput("2136 samples/s").right
    assert lab.check_goodput(max(per_input)).status == "high"
    forgot_share = lab.check_goodput(8 / (stages[1] / 1e3))              # split 2 without the 50 % reaching it
    assert forgot_share.status == "low" and "divide by that share" in forgot_share.text
    assert "2,286 inputs/s" in lab.check_goodput("answer").text


def test_exercise_four_the_optimizer_and_brute_force_cut_where_the_batch_halved():
    goodputs = lab.two_split_goodputs()
    assert max(goodputs, key=goodputs.get) == lab.cut_layer() == 1
    assert lab.brute_plan(*lab.CUT_PROBLEM).splits == lab.cut_plan().splits == [(0, 2), (2, 6)]
    assert goodputs[1] > lab.as_is_goodput() == pytest.approx(lab.cut_plan().baseline.goodput)
    assert lab.cut_plan().goodput == pytest.approx(goodputs[1])
    assert lab.check_cut("1").right
    late = lab.check_cut(3)
    assert late.status == "high" and "late cut" in late.text
    assert lab.check_cut(0).status == "low" and lab.check_cut(5).status == "impossible"
    assert "after 1: 1,455/s" in lab.check_cut("answer").text


def test_exercise_five_a_tight_slo_drops_the_pipeline():
    assert lab.tight_choice() == "unsplit" and lab.tight_plan().splits == [(0, 6)]
    tries = [lab.check_tight_slo("split") for _ in range(labs.TRIES)]
    first, last = tries[0], tries[-1]
    assert {t.status for t in tries} == {"wrong"} and "worst-case latency" in first.text and "16 ms" not in first.text
    assert "the answer: 'unsplit'" in last.text and "16 ms, too long" in last.text
    assert lab.check_tight_slo(" Unsplit. ").right and lab.check_tight_slo("pipeline").status == "invalid"


def test_exercise_six_is_the_split_plans_latency_over_the_budget_share():
    slo = lab.tightest_split_slo_ms()
    assert slo == pytest.approx(1e3 * lab.cut_plan().latency_s / (1 - lab.SLACK), abs=0.01)
    assert lab.split_kept(slo + 0.1) and not lab.split_kept(slo - 0.1)
    assert lab.check_tightest_slo("20 ms").right
    no_slack = lab.check_tightest_slo(1e3 * lab.cut_plan().latency_s)
    assert no_slack.status == "low" and "divide the worst-case latency" in no_slack.text
    assert lab.check_tightest_slo(40).status == "high"


def test_the_questions_state_the_labs_figures():
    text = "\n".join(c.source for c in nbformat.read(LAB, as_version=4).cells if c.cell_type == "markdown")
    assert all(f"{v:g}" in text for v in lab.PROFILE)
    assert f"{lab.FIXED_MS:g} ms + {lab.PER_SAMPLE_MS:g} ms" in text and f"{lab.TRANSFER_MS:g} ms" in text
    assert f"batch of **{lab.BATCH}**" in text
    assert f"{lab.TIGHT_SLO_MS:g} ms" in text and f"within {lab.STAGE_TOLERANCE_MS:g} ms" in text


def test_answers_are_the_checks_right_answers():
    checks = {"my_merged_batches": lab.check_merged_batches, "my_stage_ms": lab.check_stage_time,
              "my_goodput": lab.check_goodput, "my_cut": lab.check_cut, "my_tight_plan": lab.check_tight_slo,
              "my_tightest_slo_ms": lab.check_tightest_slo}
    answers = lab.answers()
    assert answers == RIGHT and set(answers) == set(checks)
    assert all(checks[name](value).right for name, value in answers.items())


def check_boxes(answers: dict) -> dict[str, str]:
    """Run the lab with ``answers`` typed in; the status class of each exercise's check box, by exercise."""
    shown = nbrun.check_boxes(nbrun.execute(LAB, answers=answers))
    return {re.search(r"<b>(Exercise \d)</b>", box).group(1): nbrun.box_status(box) for box in shown}


@pytest.mark.notebooks
def test_the_lab_with_right_and_with_wrong_answers():
    right = check_boxes({"my_merged_batches": "1", "my_stage_ms": "7 ms", "my_goodput": 2133, "my_cut": 1,
                         "my_tight_plan": "Unsplit", "my_tightest_slo_ms": 20})
    assert right == {f"Exercise {i}": "right" for i in range(1, 7)}
    wrong = check_boxes({"my_merged_batches": 2, "my_stage_ms": 9, "my_goodput": 2286, "my_cut": 0,
                         "my_tight_plan": "split", "my_tightest_slo_ms": 16})
    assert list(wrong.values()) == ["high", "high", "high", "low", "wrong", "low"]
