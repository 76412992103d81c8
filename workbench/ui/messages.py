"""How an exception and a notice read in a page, shared by the panels (:mod:`workbench.ui.base`) and the prepare
progress (:mod:`workbench.ui.preparing`); it sits below both so neither imports the other for it."""
from __future__ import annotations

import html
import traceback

from workbench.errors import WorkbenchError


def error_html(exc: BaseException) -> str:
    """A user error (:class:`WorkbenchError`) as its message; anything else as an internal error with its
    traceback folded away, so a bug never passes for something the user did."""
    if isinstance(exc, WorkbenchError):
        return f"<div class='wb-error'>{html.escape(str(exc))}</div>"
    trace = "".join(traceback.format_exception(exc))
    return (f"<div class='wb-error wb-internal-error'>internal error: "
            f"{html.escape(type(exc).__name__)}: {html.escape(str(exc))} (a bug in the workbench; please report it)"
            f"<details><summary>traceback</summary><pre>"
            f"{html.escape(trace)}</pre></details></div>")
