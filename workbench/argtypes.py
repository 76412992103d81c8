"""Argument types for the command line that check values before any work starts, in the user's units."""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path


def _number(text: str, unit: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of {unit}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number of {unit}, got {text!r}")
    return value


def positive(unit: str):
    """A float > 0, e.g. ``positive("ms")``; the error names the value and the unit."""
    def parse(text: str) -> float:
        value = _number(text, unit)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text} {unit}")
        return value
    parse.__name__ = f"number of {unit}"
    return parse


def non_negative(unit: str):
    def parse(text: str) -> float:
        value = _number(text, unit)
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be 0 or more, got {text} {unit}")
        return value
    parse.__name__ = f"number of {unit}"
    return parse


def count(minimum: int = 1):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    parse.__name__ = "whole number"
    return parse


def tcp_port(text: str) -> int:
    """A TCP port number, 0 (pick a free one) to 65535."""
    value = count(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {value}")
    return value


tcp_port.__name__ = "port"


def text(value: str) -> str:
    """Input text for a model: anything but empty or whitespace-only."""
    if not value.strip():
        raise argparse.ArgumentTypeError("the text is empty; give a sentence to classify")
    return value


text.__name__ = "text"


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (what is wrong, where to read more), exit status 2.

    Sub-parsers inherit the class, so every ``workbench`` command and benchmark speaks alike."""

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
