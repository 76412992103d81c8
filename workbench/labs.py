"""Self-check feedback every teaching lab shares: reading answers, judging them, teaching before telling.

Answers are read loosely: case and spaces do not matter for words, and a number may be an int, a float or a
numeric string (``12``, ``12.0``, ``"12"``, ``"64.4 ms"``); feedback echoes the answer as it was typed. A
wrong answer first gets a hint (too high or too low, and the quantity to look at); the answer and why come
after ``TRIES`` wrong tries of the exercise, or at once when the learner types ``"answer"``. A value the
quantity can never take (a negative count of bytes) is named impossible, not too low. A tolerance is stated
in every feedback of the exercise (``within(...)`` says it the same way in the question). Each mechanism's lab
(``workbench.elastic.lab``, ``workbench.kvcache.lab``) computes the expected answers with its own engine;
this module knows no mechanism.
"""
from __future__ import annotations

import html
import math
import numbers
from dataclasses import dataclass
from typing import Literal

Status = Literal["right", "high", "low", "wrong", "unanswered", "invalid", "impossible", "shown"]

_COLORS = {"right": "#e6f4ea", "unanswered": "#f0f0f0", "invalid": "#fff4e5", "impossible": "#fff4e5",
           "shown": "#e8f0fe"}
_WRONG_COLOR = "#fdecea"
_UNANSWERED = "not answered yet: replace None with your answer and run the cell again."
TRIES = 3
"""Wrong tries of one exercise after which its feedback gives the answer."""
ASK = "answer"
"""What a learner types in place of an answer to be shown it."""
_wrong_tries: dict[tuple[str, str], int] = {}


@dataclass(frozen=True, repr=False)
class Feedback:
    """The outcome of one self-check: a status and a line of text, shown as a coloured box in a notebook."""
    exercise: str
    status: Status
    text: str

    @property
    def right(self) -> bool:
        return self.status == "right"

    def __repr__(self) -> str:
        return f"{self.exercise}: {self.text}"

    def _repr_html_(self) -> str:
        color = _COLORS.get(self.status, _WRONG_COLOR)
        return (f"<div class='wb-check wb-check-{self.status}' style='background:{color};padding:6px 10px;"
                f"border-radius:4px'><b>{html.escape(self.exercise)}</b>: {html.escape(self.text)}</div>")


def unanswered(exercise: str, hint: str = "") -> Feedback:
    """The feedback for an exercise still at ``None``: what to do, and ``hint`` if one helps."""
    return Feedback(exercise, "unanswered", f"{_UNANSWERED} {hint}".strip())


class AnswerError(ValueError):
    """An answer that cannot be read as what the exercise asks for (the message says what was expected)."""


def forget_tries() -> None:
    """Start every exercise afresh (its count of wrong tries back to 0)."""
    _wrong_tries.clear()


def asks_for_answer(answer) -> bool:
    return isinstance(answer, str) and answer.strip().strip("'\".").lower() == ASK


def typed(answer, unit: str = "") -> str:
    """The learner's answer as they typed it: a string stripped of outer spaces, a number compact."""
    if isinstance(answer, str):
        return answer.strip()
    return with_unit(float(answer), unit) if isinstance(answer, numbers.Real) else repr(answer)


def within(tolerance: float, unit: str = "") -> str:
    """How an exercise states its tolerance, in the question and in every feedback: "within 1 ms"."""
    return f"within {with_unit(tolerance, unit)}" if tolerance else "exactly"


def judge(exercise: str, key, status: Status, said: str, hint: str, answer: str, why: str) -> Feedback:
    """A wrong answer's feedback: ``said`` ("12 is too high") and the ``hint`` on the first tries; ``said``,
    the ``answer`` and ``why`` once the exercise has had ``TRIES`` wrong tries. ``key`` tells exercises apart."""
    tries = _wrong_tries[(exercise, repr(key))] = _wrong_tries.get((exercise, repr(key)), 0) + 1
    if tries >= TRIES:
        return Feedback(exercise, status, f"{said}. After {tries} tries, the answer: {answer}. {why}")
    left = TRIES - tries
    return Feedback(exercise, status, f"{said}. Hint: {hint} ({left} more {'try' if left == 1 else 'tries'} before "
                                      f"the answer is shown, or type {ASK!r} to see it now.)")


def shown(exercise: str, answer: str, why: str) -> Feedback:
    """The answer, asked for."""
    return Feedback(exercise, "shown", f"the answer: {answer}. {why}")


# ----------------------------------------------------------------------------- reading answers


def as_number(answer, unit: str = "") -> float:
    """``answer`` as a finite float: an int, a float or a numeric string, which may end in ``unit``."""
    wanted = f"a number of {unit}" if unit else "a number"
    if isinstance(answer, str):
        text = " ".join(answer.split()).lower()
        if unit and text.endswith(unit.lower()):
            text = text[:-len(unit)].strip()
        try:
            value = float(text)
        except ValueError:
            raise AnswerError(f"{answer!r} is not {wanted}") from None
    elif isinstance(answer, numbers.Real) and not isinstance(answer, bool):
        value = float(answer)
    else:
        raise AnswerError(f"{answer!r} is not {wanted}")
    if not math.isfinite(value):
        raise AnswerError(f"{answer!r} is not {wanted}")
    return value


def as_whole(answer) -> int:
    """``answer`` as an int; ``12``, ``12.0`` and ``" 12 "`` all give 12, ``12.5`` is an error."""
    value = as_number(answer)
    if not value.is_integer():
        raise AnswerError(f"{answer!r} is not a whole number")
    return int(value)


def as_choice(answer, choices: tuple[str, ...]) -> str:
    """``answer`` as one of ``choices`` (as the choice is spelt), ignoring case, spaces, quotes and a final
    full stop."""
    wanted = f"one of {', '.join(repr(c) for c in choices)}"
    if not isinstance(answer, str):
        raise AnswerError(f"{answer!r} is not a word; answer with {wanted}")
    word = " ".join(answer.split()).strip("'\". ").lower()
    spelt = {c.lower(): c for c in choices}
    if word not in spelt:
        raise AnswerError(f"{answer!r} is not {wanted}")
    return spelt[word]


def with_unit(value: float, unit: str = "") -> str:
    """``value`` as feedback prints it: compact, followed by its unit if any."""
    text = f"{value:g}"
    return f"{text} {unit}" if unit else text


def check_number(exercise: str, answer, expected: float, *, why_high: str, why_low: str, right: str,
                 unit: str = "", tolerance: float = 0.0, whole: bool = False, hint: str = "",
                 minimum: float | None = None, maximum: float | None = None, quantity: str = "") -> Feedback:
    """Right within ``tolerance`` of ``expected``; else too high or too low with the matching hint
    (``why_high``, ``why_low``: what to look at, not the answer) and, after ``TRIES`` tries, the answer
    with ``right`` (the explanation). Outside ``minimum``..``maximum`` ``quantity`` is impossible."""
    if answer is None:
        return unanswered(exercise, hint)
    stated = "" if whole else f" ({within(tolerance, unit)})"
    answer_text = f"{with_unit(expected, unit)}{stated}"
    if asks_for_answer(answer):
        return shown(exercise, answer_text, right)
    try:
        value = as_whole(answer) if whole else as_number(answer, unit)
    except AnswerError as exc:
        return Feedback(exercise, "invalid", f"{exc}.")
    echo = typed(answer, unit)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = (f"from {with_unit(minimum, unit)} to {with_unit(maximum, unit)}" if None not in (minimum, maximum)
                  else f"at least {with_unit(minimum, unit)}" if minimum is not None
                  else f"at most {with_unit(maximum, unit)}")
        return Feedback(exercise, "impossible", f"{echo} is impossible: {quantity or 'the answer'} is {bounds}.")
    if abs(value - expected) <= tolerance:
        return Feedback(exercise, "right", f"right, {echo}{stated}. {right}")
    if value > expected:
        return judge(exercise, expected, "high", f"{echo} is too high{stated}", why_high, answer_text, right)
    return judge(exercise, expected, "low", f"{echo} is too low{stated}", why_low, answer_text, right)


def check_choice(exercise: str, answer, expected: str, choices: tuple[str, ...], why: str,
                 hint: str = "") -> Feedback:
    """Right when ``answer`` reads as ``expected``; a wrong one gets ``hint`` and, after ``TRIES`` tries,
    the right choice with ``why``."""
    if answer is None:
        return unanswered(exercise, hint)
    if asks_for_answer(answer):
        return shown(exercise, repr(expected), why)
    try:
        word = as_choice(answer, choices)
    except AnswerError as exc:
        return Feedback(exercise, "invalid", f"{exc}.")
    if word == expected:
        return Feedback(exercise, "right", f"right, {typed(answer)!r}. {why}")
    return judge(exercise, expected, "wrong", f"not {typed(answer)!r}", hint, repr(expected), why)
