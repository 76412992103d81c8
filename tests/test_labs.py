"""The feedback every lab shares: reading answers, too high / too low / wrong with the reason, the box."""
import numpy as np
import pytest

from workbench import labs
from workbench.labs import AnswerError, Feedback, check_choice, check_number

CHANGES = ("up", "down", "same")
REASONS = {"why_high": "HIGH-REASON", "why_low": "LOW-REASON", "right": "RIGHT-REASON"}


@pytest.fixture(autouse=True)
def fresh_tries():
    labs.forget_tries()
    yield
    labs.forget_tries()


@pytest.mark.parametrize("answer", [12, 12.0, np.int64(12), np.float32(12), "12", " 12 ", "12.0", "1.2e1"])
def test_numbers_are_read_from_ints_floats_and_strings(answer):
    assert labs.as_number(answer) == 12.0
    assert labs.as_whole(answer) == 12


def test_a_number_may_end_in_its_unit():
    assert labs.as_number("64.4 ms", "ms") == labs.as_number(" 64.4MS ", "ms") == 64.4
    with pytest.raises(AnswerError, match="not a number$"):
        labs.as_number("64.4 ms")


@pytest.mark.parametrize("answer", [True, None, [12], "twelve", "", float("nan"), float("inf"), "inf"])
def test_what_is_not_a_number(answer):
    with pytest.raises(AnswerError, match="is not a number"):
        labs.as_number(answer)


def test_a_whole_number_has_no_fraction():
    with pytest.raises(AnswerError, match="not a whole number"):
        labs.as_whole("12.5")


@pytest.mark.parametrize("answer", ["up", "Up", " UP ", "up.", '"up"', "'Up'"])
def test_words_ignore_case_spaces_and_quotes(answer):
    assert labs.as_choice(answer, CHANGES) == "up"


@pytest.mark.parametrize("answer, message", [("sideways", "is not one of 'up', 'down', 'same'"),
                                             ("u p", "is not one of"), (1, "is not a word")])
def test_what_is_not_a_choice(answer, message):
    with pytest.raises(AnswerError, match=message):
        labs.as_choice(answer, CHANGES)


@pytest.mark.parametrize("answer, status, reason", [(13, "high", "HIGH-REASON"), ("11", "low", "LOW-REASON"),
                                                    (12.4, "right", "RIGHT-REASON"), (11.6, "right", "RIGHT-REASON")])
def test_a_number_is_too_high_too_low_or_right_with_its_own_reason(answer, status, reason):
    feedback = check_number("Q", answer, 12, tolerance=0.5, **REASONS)
    assert feedback.status == status and reason in feedback.text
    assert {"high": "too high", "low": "too low", "right": "right"}[status] in feedback.text
    assert not any(other in feedback.text for other in REASONS.values() if other != reason)


def test_a_wrong_number_gets_a_hint_first_and_the_answer_after_a_few_tries():
    tries = [check_number("Q", 13, 12, **REASONS) for _ in range(labs.TRIES)]
    for early in tries[:-1]:
        assert "HIGH-REASON" in early.text and "RIGHT-REASON" not in early.text and "12" not in early.text
        assert "'answer'" in early.text
    assert tries[-1].status == "high" and "the answer: 12" in tries[-1].text and "RIGHT-REASON" in tries[-1].text


def test_the_answer_on_request_and_each_exercise_counts_its_own_tries():
    asked = check_number("Q", " Answer ", 12, unit="ms", tolerance=1, **REASONS)
    assert asked.status == "shown" and "the answer: 12 ms (within 1 ms)" in asked.text and "RIGHT-REASON" in asked.text
    assert check_choice("C", "answer", "up", CHANGES, "WHY", hint="HINT").text == "the answer: 'up'. WHY"
    for _ in range(labs.TRIES - 1):
        check_number("Q", 13, 12, **REASONS)
    assert "RIGHT-REASON" not in check_number("R", 13, 12, **REASONS).text


def test_the_tolerance_is_stated_in_every_feedback_and_used_in_the_check():
    for answer in (13.2, 12.9, 10.8):
        feedback = check_number("Q", answer, 12, unit="ms", tolerance=1, **REASONS)
        assert "(within 1 ms)" in feedback.text
    assert check_number("Q", 12.9, 12, unit="ms", tolerance=1, **REASONS).right
    assert not check_number("Q", 13.2, 12, unit="ms", tolerance=1, **REASONS).right
    assert labs.within(1, "ms") == "within 1 ms" and labs.within(0) == "exactly"


def test_answers_are_echoed_as_typed():
    assert "'SAME'" in check_choice("Q", "SAME", "up", CHANGES, "WHY", hint="HINT").text
    assert "right, 'Up'" in check_choice("Q", " Up ", "up", CHANGES, "WHY").text
    assert check_number("Q", "12.0 ms", 12, unit="ms", **REASONS).text.startswith("right, 12.0 ms")
    assert labs.as_choice("b1", ("A1", "B1")) == "B1"


@pytest.mark.parametrize("answer", [-1, "-1", 9])
def test_impossible_values_are_named_as_such(answer):
    feedback = check_number("Q", answer, 2, whole=True, minimum=0, maximum=8, quantity="a count of chunks", **REASONS)
    assert feedback.status == "impossible" and "impossible" in feedback.text and "too" not in feedback.text
    assert "a count of chunks is from 0 to 8" in feedback.text and str(answer) in feedback.text


def test_a_number_not_answered_or_unreadable():
    unanswered = check_number("Q", None, 12, hint="HINT", **REASONS)
    assert unanswered.status == "unanswered" and "not answered yet" in unanswered.text and "HINT" in unanswered.text
    invalid = check_number("Q", "12.5", 12, whole=True, **REASONS)
    assert invalid.status == "invalid" and "not a whole number" in invalid.text and "REASON" not in invalid.text


def test_a_choice_is_right_or_wrong_with_the_reason():
    assert check_choice("Q", " Up ", "up", CHANGES, "WHY").status == "right"
    wrong = check_choice("Q", "SAME", "up", CHANGES, "WHY", hint="HINT")
    assert wrong.status == "wrong" and wrong.text.startswith("not 'SAME'. Hint: HINT") and "WHY" not in wrong.text
    assert check_choice("Q", "sideways", "up", CHANGES, "WHY").status == "invalid"
    assert check_choice("Q", None, "up", CHANGES, "WHY", hint="HINT").status == "unanswered"


def test_feedback_shows_as_a_box_with_its_status_and_escaped_text():
    feedback = Feedback("Exercise 9", "high", "<b> is too high")
    shown = feedback._repr_html_()
    assert "wb-check wb-check-high" in shown and "&lt;b&gt; is too high" in shown and "<b> is" not in shown
    assert repr(feedback) == "Exercise 9: <b> is too high" and not feedback.right
    assert Feedback("E", "right", "")._repr_html_() != Feedback("E", "low", "")._repr_html_()
