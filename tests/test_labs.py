"""The feedback every lab shares: reading answers, too high / too low / wrong with the reason, the box."""
import numpy as np
import pytest

from workbench import labs
from workbench.labs import AnswerError, Feedback, check_choice, check_number

CHANGES = ("up", "down", "same")
REASONS = {"why_high": "HIGH-REASON", "why_low": "LOW-REASON", "right": "RIGHT-REASON"}


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
    assert feedback.status == status and feedback.text.endswith(reason)
    assert {"high": "too high", "low": "too low", "right": "right"}[status] in feedback.text
    assert not any(other in feedback.text for other in REASONS.values() if other != reason)


def test_a_number_not_answered_or_unreadable():
    unanswered = check_number("Q", None, 12, hint="HINT", **REASONS)
    assert unanswered.status == "unanswered" and "not answered yet" in unanswered.text and "HINT" in unanswered.text
    invalid = check_number("Q", "12.5", 12, whole=True, **REASONS)
    assert invalid.status == "invalid" and "not a whole number" in invalid.text and "REASON" not in invalid.text


def test_a_choice_is_right_or_wrong_with_the_reason():
    assert check_choice("Q", " Up ", "up", CHANGES, "WHY").status == "right"
    wrong = check_choice("Q", "SAME", "up", CHANGES, "WHY")
    assert (wrong.status, wrong.text) == ("wrong", "not 'same'. WHY")
    assert check_choice("Q", "sideways", "up", CHANGES, "WHY").status == "invalid"
    assert check_choice("Q", None, "up", CHANGES, "WHY", hint="HINT").status == "unanswered"


def test_feedback_shows_as_a_box_with_its_status_and_escaped_text():
    feedback = Feedback("Exercise 9", "high", "<b> is too high")
    shown = feedback._repr_html_()
    assert "wb-check wb-check-high" in shown and "&lt;b&gt; is too high" in shown and "<b> is" not in shown
    assert repr(feedback) == "Exercise 9: <b> is too high" and not feedback.right
    assert Feedback("E", "right", "")._repr_html_() != Feedback("E", "low", "")._repr_html_()
