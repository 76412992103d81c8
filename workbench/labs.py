"""Self-check feedback every teaching lab shares: reading answers, judging them, showing why.

Answers are read loosely: case and spaces do not matter for words, and a number may be an int, a float or a
numeric string (``12``, ``12.0``, ``"12"``, ``"64.4 ms"``). A wrong number is called too high or too low
with one sentence built from the engine's figures; a wrong word gets the reason behind the right one. Each
mechanism's lab (``workbench.elastic.lab``, ``workbench.kvcache.lab``) computes the expected answers with its
own engine; this module knows no mechanism.
"""
from __future__ import annotations

import html
import math
import numbers
from dataclasses import dataclass
from typing import Literal

Status = Literal["right", "high", "low", "wrong", "unanswered", "invalid"]

_COLORS = {"right": "#e6f4ea", "unanswered": "#f0f0f0", "invalid": "#fff4e5"}
_WRONG_COLOR = "#fdecea"
_UNANSWERED = "not answered yet: replace None with your answer and run the cell again."


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
    """``answer`` as one of ``choices`` (lower case), ignoring case, spaces, quotes and a final full stop."""
    wanted = f"one of {', '.join(repr(c) for c in choices)}"
    if not isinstance(answer, str):
        raise AnswerError(f"{answer!r} is not a word; answer with {wanted}")
    word = " ".join(answer.split()).strip("'\". ").lower()
    if word not in choices:
        raise AnswerError(f"{answer!r} is not {wanted}")
    return word


def with_unit(value: float, unit: str = "") -> str:
    """``value`` as feedback prints it: compact, followed by its unit if any."""
    text = f"{value:g}"
    return f"{text} {unit}" if unit else text


def check_number(exercise: str, answer, expected: float, *, why_high: str, why_low: str, right: str,
                 unit: str = "", tolerance: float = 0.0, whole: bool = False, hint: str = "") -> Feedback:
    """Right within ``tolerance`` of ``expected``, else too high or too low with the matching reason."""
    if answer is None:
        return unanswered(exercise, hint)
    try:
        value = as_whole(answer) if whole else as_number(answer, unit)
    except AnswerError as exc:
        return Feedback(exercise, "invalid", f"{exc}.")
    if abs(value - expected) <= tolerance:
        return Feedback(exercise, "right", f"right, {with_unit(value, unit)}. {right}")
    if value > expected:
        return Feedback(exercise, "high", f"{with_unit(value, unit)} is too high. {why_high}")
    return Feedback(exercise, "low", f"{with_unit(value, unit)} is too low. {why_low}")


def check_choice(exercise: str, answer, expected: str, choices: tuple[str, ...], why: str,
                 hint: str = "") -> Feedback:
    """Right when ``answer`` reads as ``expected``; otherwise the reason (``why``) for the right choice."""
    if answer is None:
        return unanswered(exercise, hint)
    try:
        word = as_choice(answer, choices)
    except AnswerError as exc:
        return Feedback(exercise, "invalid", f"{exc}.")
    if word == expected:
        return Feedback(exercise, "right", f"right, {word!r}. {why}")
    return Feedback(exercise, "wrong", f"not {word!r}. {why}")
