"""Argument types for the command line that check values before any work starts, in the user's units.

Every number has a range: a lower bound and an upper bound with the reason for it (what the thing
can hold: the decoder's context, this machine's memory or cores, a run time). The same type checks
the command-line option (an ``argparse`` error) and the Python API's argument (:class:`OutOfRangeError`),
so both say the same line, and :class:`Parser` adds the range to the option's help."""
from __future__ import annotations

import argparse
import math
import numbers
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from workbench.errors import WorkbenchError

LONGEST_RUN_S = 3600
"""The longest run a command starts on its own estimate (an hour, about what the full benchmarks take): a
longer one is a slip of the keyboard, and refusing it keeps the slip from holding the machine."""


class OutOfRangeError(WorkbenchError, ValueError):
    """A value given through the Python API outside its range; the message names it and the range."""


class NotTextError(WorkbenchError):
    """A file that should hold UTF-8 text does not."""


@dataclass(frozen=True)
class Bound:
    """An upper bound and why it is there, e.g. ``Bound(8192, "the decoder's context")``."""
    value: float
    why: str


@lru_cache(maxsize=None)
def machine_memory_bytes() -> int:
    """This machine's physical memory in bytes."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 30


@lru_cache(maxsize=None)
def machine_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def per_core(each: int, what: str) -> Bound:
    """At most ``each`` processes, threads or clients per core of this machine."""
    cores = machine_cores()
    return Bound(each * cores, f"{each} {what} per core of this machine's {cores}")


def memory_holds(bytes_each: float, what: str, share: float = 0.5) -> Bound:
    """As many items of ``bytes_each`` bytes as ``share`` of this machine's memory holds."""
    gigabytes = machine_memory_bytes() / 1e9
    return Bound(int(share * machine_memory_bytes() // bytes_each),
                 f"{what} that {'half' if share == 0.5 else f'{share:.0%} of'} this machine's {gigabytes:.0f} GB hold")


def _show(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


class Number:
    """A bounded number: ``minimum`` (excluded where ``open_minimum``) to ``at_most.value``, in ``unit``.

    Called with the text of an option it returns the value or raises ``argparse.ArgumentTypeError``;
    :meth:`check` does the same for a value given in Python and raises :class:`OutOfRangeError`."""

    def __init__(self, unit: str, *, minimum: float, at_most: Bound, whole: bool, open_minimum: bool = False):
        self.unit, self.minimum, self.at_most, self.whole, self.open_minimum = unit, minimum, at_most, whole, open_minimum
        self.maximum = at_most.value
        self.kind = "whole number" if whole else "number"
        self.__name__ = f"{self.kind} of {unit}" if unit else self.kind

    def _of(self, value: float) -> str:
        return f"{_show(value)} {self.unit}" if self.unit else _show(value)

    def accepts(self, value: float) -> bool:
        """Whether ``value`` is in range (the test of every option asks this of 0)."""
        return self._problem(value) is None

    @property
    def range_text(self) -> str:
        low = f"more than {_show(self.minimum)}" if self.open_minimum else _show(self.minimum)
        return f"{low} to {self._of(self.maximum)} ({self.at_most.why})"

    def _problem(self, value) -> str | None:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
                (self.whole and not isinstance(value, numbers.Integral)):
            return f"expected a {self.__name__}, got {value!r}"
        if not math.isfinite(value):
            return f"expected a finite {self.__name__}, got {value}"
        if self.open_minimum and value <= self.minimum:
            return f"must be more than {self._of(self.minimum)}, got {_show(value)}"
        if value < self.minimum:
            return f"must be at least {self._of(self.minimum)}, got {_show(value)}"
        if value > self.maximum:
            return f"must be at most {self._of(self.maximum)} ({self.at_most.why}), got {_show(value)}"
        return None

    def __call__(self, text: str):
        try:
            value = int(text) if self.whole else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {self.__name__}, got {text!r}") from None
        problem = self._problem(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    def check(self, name: str, value):
        """``value`` if in range, else :class:`OutOfRangeError` naming ``name``, the value and the range."""
        problem = self._problem(value)
        if problem:
            raise OutOfRangeError(f"{name}: {problem}")
        return value

    def __repr__(self) -> str:
        return f"<{self.__name__}: {self.range_text}>"


def positive(unit: str, at_most: Bound) -> Number:
    """A number > 0, e.g. ``positive("ms", Bound(...))``."""
    return Number(unit, minimum=0, open_minimum=True, at_most=at_most, whole=False)


def non_negative(unit: str, at_most: Bound) -> Number:
    """A number >= 0."""
    return Number(unit, minimum=0, at_most=at_most, whole=False)


def count(minimum: int = 1, *, at_most: Bound, unit: str) -> Number:
    """A whole number from ``minimum``; ``unit`` names what is counted (e.g. "tokens")."""
    return Number(unit, minimum=minimum, at_most=at_most, whole=True)


seed = Number("", minimum=0, at_most=Bound(2**32 - 1, "seeds are 32-bit"), whole=True)
"""A random seed: 0 to 2**32 - 1."""
seed.__name__ = "seed"

tcp_port = Number("", minimum=0, at_most=Bound(65535, "the largest TCP port; 0 picks a free one"), whole=True)
"""A TCP port number, 0 (pick a free one) to 65535."""
tcp_port.__name__ = "port"


def text(value: str) -> str:
    """Input text for a model: anything but empty or whitespace-only."""
    if not value.strip():
        raise argparse.ArgumentTypeError("the text is empty; give a sentence to classify")
    return value


text.__name__ = "text"


def read_text_file(path: Path | str) -> str:
    """The UTF-8 text of ``path``; a missing file or one that is not UTF-8 text (UTF-16, binary) is
    :class:`NotTextError` in one line naming the file and the encoding expected."""
    path = Path(path).expanduser()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise NotTextError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise NotTextError(f"{path} is a folder, not a text file") from None
    except OSError as exc:
        raise NotTextError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        found = " (it starts with a UTF-16 byte-order mark)" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise NotTextError(f"{path} is not UTF-8 text{found}: byte 0x{raw[exc.start]:02x} at offset {exc.start} "
                           f"is not UTF-8; save the file as UTF-8") from None


def text_file(value: str) -> str:
    """An option naming a text file: its UTF-8 text, read and checked before any work."""
    try:
        return read_text_file(value)
    except NotTextError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


text_file.__name__ = "text file"


def help_with_range(action: argparse.Action) -> str | None:
    """An option's help followed by its range, where its type is a bounded :class:`Number`."""
    if isinstance(action.type, Number) and action.help != argparse.SUPPRESS:
        stated = action.type.range_text.replace("%", "%%")
        return f"{action.help} [{stated}]" if action.help else f"[{stated}]"
    return action.help


class _RangeHelp(argparse.HelpFormatter):
    def _get_help_string(self, action):
        return help_with_range(action)


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (what is wrong, where to read more), exit status 2,
    and whose bounded options say their range in their help.

    Sub-parsers inherit the class, so every ``workbench`` command and benchmark speaks alike."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _RangeHelp)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def existing_folder(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a folder")
    return path


def writable_folder(text: str) -> Path:
    """A folder that exists or can be made (its nearest existing ancestor is a writable folder)."""
    path = Path(text).expanduser()
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot use {text} as a folder: {probe} is not a writable folder")
    return path


def writable_file(text: str) -> Path:
    """A path whose folder exists and is writable (checked now, so a long run cannot fail at its end)."""
    path = Path(text).expanduser()
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text}: permission denied")
    return path
