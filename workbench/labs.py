"""Self-checks for the teaching labs: answers are compared with what the engine computes."""
from __future__ import annotations

import html

from IPython.display import HTML


def check(question: str, answer, expected, hint: str = "") -> HTML:
    """A green, red or grey box: right, wrong (with the hint) or not answered yet (``answer is None``)."""
    if answer is None:
        color, text = "#f0f0f0", f"{question}: not answered yet. {hint}"
    elif answer == expected:
        color, text = "#e6f4ea", f"{question}: right ({answer!r})."
    else:
        color, text = "#fdecea", f"{question}: not quite ({answer!r}). {hint}"
    return HTML(f"<div class='wb-check' style='background:{color};padding:6px 10px;border-radius:4px'>"
                f"{html.escape(text)}</div>")
