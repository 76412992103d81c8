"""The LLM service's errors, importable without torch: a client re-raises them by class name."""
from __future__ import annotations

from workbench.errors import WorkbenchError


class StubError(WorkbenchError):
    """A context stub this app may not use: unknown, deleted, or made by another app."""


class ContextLimitError(WorkbenchError):
    """The app already holds as many contexts as one app may."""


class ContextLengthError(WorkbenchError):
    """A call whose prompt and answer would take the context beyond its token limit; nothing was run.
    ``room``, when known: the most new tokens the call could have asked for (below 1: the prompt alone is
    too long)."""
    room: int | None = None


class MemoryBudgetError(WorkbenchError):
    """The context being served does not fit in the memory budget by itself."""


class SwapStoreError(WorkbenchError):
    """The swap store could not be written (a full disk, say); the call or eviction was undone."""


class CallFailedError(WorkbenchError):
    """A call failed after inference began; it was undone, so the context is as before the call."""


class ServiceClosedError(WorkbenchError):
    """The service was closed."""


class DeadlineError(WorkbenchError):
    """A call whose turn came after its deadline; it was not run and the context is as it was."""


class ProtocolError(WorkbenchError):
    """A request the protocol does not allow, or a peer speaking another protocol version."""


class IdentityError(WorkbenchError):
    """A bind the service refuses: the app name is held by another owner, or its token is wrong."""
