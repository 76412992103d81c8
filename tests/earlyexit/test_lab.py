"""The E3 lab's self-checks: the expected answers are the engine's (the split optimizer, checked by brute force),
worked out again here by hand, and wrong answers are told why (a hint first, the answer after a few tries)."""
import math
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from workbench import labs
from workbench.earlyexit import lab

LAB = Path(__file__).resolve().parents[2] / "notebooks" / "labs" / "earlyexit_lab.ipynb"
RIGHT = {"my_replica_batch": 8, "my_stage_ms": 10.0, "my_cycle_ms": 12.0, "my_cut": 1, "my_tight_plan": "unsplit",
         "my_tightest_slo_ms": 24.4}


@pytest.fixture(autouse=True)
def fresh_tries():
    labs.forget_tries()
    yield
    labs.forget_tries()


def by_hand(batches) -> float:
    return sum(lab.FIXED_MS + lab.PER_SAMPLE_MS * b for b in batches)


def test_exercise_one_is_the_survivors_shared_among_the_replicas():
    p = lab.replica_plan()
    assert p.splits == [(0, 2), (2, 6)] and p.replicas == [2, 2] and p.batch_size == 32
    assert lab.replica_batch() == math.ceil(32 * lab.PROFILE[1] / 2) == 8
    assert lab.check_replica_batch(" 8 ").right and lab.check_replica_batch(8.0).right
    forgot_replicas = lab.check_replica_batch(16)
    assert forgot_replicas.status == "high" and "shared among its 2 replicas" in forgot_replicas.text
    assert "ceil" not in forgot_replicas.text                        # the answer waits for the third try
    low = lab.check_replica_batch(4)
    assert low.status == "low" and "after ramp 1" in low.text
    told = lab.check_replica_batch(4)
    assert "the answer: 8" in told.text and "32 x 0.5 = 16 samples reach layer 2" in told.text
    assert lab.check_replica_batch(33).status == "impossible" and lab.check_replica_batch(7.5).status == "invalid"
    assert lab.check_replica_batch(None).status == "unanswered"


def test_exercise_two_adds_the_layers_at_their_shrinking_batches():
    p = lab.replica_plan()
    assert lab.replica_batches(p, 1) == [8, 8, 4, 4]
    assert lab.stage_ms() == pytest.approx(by_hand([8, 8, 4, 4])) == pytest.approx(10.0)
    assert lab.check_stage_time("10 ms").right and lab.check_stage_time(10.04).right
    no_exits = lab.check_stage_time(by_hand([8, 8, 8, 8]))
    assert no_exits.status == "high" and "smaller batches" in no_exits.text
    assert lab.check_stage_time(by_hand([8, 8, 4, 4]) - 4 * lab.FIXED_MS).status == "low"
    assert "(within 0.05 ms)" in lab.check_stage_time(11).text
    assert lab.check_stage_time(-1).status == "impossible"


def test_exercise_three_is_the_slowest_stage_not_the_sum():
    p = lab.cycle_plan()
    assert len(p.splits) == 2 and p.pipelined
    stages = [by_hand(lab.replica_batches(p, i)) for i in range(2)]
    assert lab.cycle_ms() == pytest.approx(max(stages + [lab.TRANSFER_MS])) == pytest.approx(12.0)
    assert 1e3 * p.latency_s == pytest.approx(sum(stages) + lab.TRANSFER_MS)
    assert lab.check_cycle_time(12).right
    summed = lab.check_cycle_time(sum(stages) + lab.TRANSFER_MS)
    assert summed.status == "high" and "not their sum" in summed.text
    assert lab.check_cycle_time(min(stages)).status == "low"
    assert "2,667 samples/s" in lab.check_cycle_time("answer").text


def test_exercise_four_the_optimizer_and_brute_force_cut_where_the_batch_halved():
    cycles = lab.two_split_cycles()
    assert min(cycles, key=cycles.get) == lab.cut_layer() == 1
    assert lab.brute_plan(*lab.CUT_PROBLEM).splits == lab.cut_plan().splits == [(0, 2), (2, 6)]
    assert cycles[1] < lab.unsplit_cycle_ms() and 1e3 * lab.cut_plan().cycle_s == pytest.approx(cycles[1])
    assert lab.check_cut("1").right
    late = lab.check_cut(3)
    assert late.status == "high" and "late cut" in late.text
    assert lab.check_cut(0).status == "low" and lab.check_cut(5).status == "impossible"
    assert "after 1: 10 ms" in lab.check_cut("answer").text


def test_exercise_five_a_tight_slo_drops_the_pipeline():
    assert lab.tight_choice() == "unsplit" and lab.tight_plan().splits == [(0, 6)]
    tries = [lab.check_tight_slo("split") for _ in range(labs.TRIES)]
    first, last = tries[0], tries[-1]
    assert {t.status for t in tries} == {"wrong"} and "worst-case latency" in first.text and "19.5" not in first.text
    assert "the answer: 'unsplit'" in last.text and "19.5 ms, too long" in last.text
    assert lab.check_tight_slo(" Unsplit. ").right and lab.check_tight_slo("pipeline").status == "invalid"


def test_exercise_six_is_the_split_plans_latency_over_the_budget_share():
    slo = lab.tightest_split_slo_ms()
    assert slo == pytest.approx(1e3 * lab.cut_plan().latency_s / (1 - lab.SLACK), abs=0.01)
    assert lab.split_kept(slo + 0.1) and not lab.split_kept(slo - 0.1)
    assert lab.check_tightest_slo("24.4 ms").right
    no_slack = lab.check_tightest_slo(1e3 * lab.cut_plan().latency_s)
    assert no_slack.status == "low" and "divide the worst-case latency" in no_slack.text
    assert lab.check_tightest_slo(40).status == "high"


def test_the_questions_state_the_labs_figures():
    text = "\n".join(c.source for c in nbformat.read(LAB, as_version=4).cells if c.cell_type == "markdown")
    assert all(f"{v:g}" in text for v in lab.PROFILE)
    assert f"{lab.FIXED_MS:g} ms + {lab.PER_SAMPLE_MS:g} ms" in text and f"{lab.TRANSFER_MS:g} ms" in text
    assert f"{lab.TIGHT_SLO_MS:g} ms" in text and f"within {lab.STAGE_TOLERANCE_MS:g} ms" in text


def test_answers_are_the_checks_right_answers():
    checks = {"my_replica_batch": lab.check_replica_batch, "my_stage_ms": lab.check_stage_time,
              "my_cycle_ms": lab.check_cycle_time, "my_cut": lab.check_cut, "my_tight_plan": lab.check_tight_slo,
              "my_tightest_slo_ms": lab.check_tightest_slo}
    answers = lab.answers()
    assert answers == RIGHT and set(answers) == set(checks)
    assert all(checks[name](value).right for name, value in answers.items())


def check_boxes(answers: dict) -> dict[str, str]:
    """Run the lab with ``answers`` typed in; the status class of each exercise's check box, by exercise."""
    nb = nbformat.read(LAB, as_version=4)
    typed = set()
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        for name in set(answers) & set(re.findall(r"^(my_\w+) = None", cell.source, flags=re.M)):
            cell.source = cell.source.replace(f"{name} = None", f"{name} = {answers[name]!r}", 1)
            typed.add(name)
    assert typed == set(answers), f"the lab has no line for {sorted(set(answers) - typed)}"
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(LAB.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    shown = [o["data"]["text/html"] for o in outputs if "wb-check" in o.get("data", {}).get("text/html", "")]
    return {re.search(r"<b>(Exercise \d)</b>", box).group(1): re.search(r"wb-check-(\w+)", box).group(1)
            for box in shown}


@pytest.mark.notebooks
def test_the_lab_with_right_and_with_wrong_answers():
    right = check_boxes({"my_replica_batch": "8", "my_stage_ms": "10 ms", "my_cycle_ms": 12, "my_cut": 1,
                         "my_tight_plan": "Unsplit", "my_tightest_slo_ms": 24.4})
    assert right == {f"Exercise {i}": "right" for i in range(1, 7)}
    wrong = check_boxes({"my_replica_batch": 16, "my_stage_ms": 12, "my_cycle_ms": 23.5, "my_cut": 0,
                         "my_tight_plan": "split", "my_tightest_slo_ms": 19.5})
    assert list(wrong.values()) == ["high", "high", "high", "low", "wrong", "low"]
