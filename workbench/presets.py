"""The prepare preset: how much work `workbench prepare` does, and which artifacts readers use.

Two presets exist. ``full`` trains and measures everything as the papers do (what
the dashboards show by default); ``quick`` runs every code path on a few batches,
so a fresh machine (and the test suite) gets usable, if inaccurate, artifacts in a
few minutes. Every command, dashboard and notebook that reads prepared artifacts
takes the preset from here: the ``--preset`` flag where there is one, else
``$WORKBENCH_PRESET``, else ``full``.
"""
from __future__ import annotations

import argparse
import os
from typing import Literal, get_args

from workbench.errors import UnknownNameError

Preset = Literal["full", "quick"]
PRESETS: tuple[str, ...] = get_args(Preset)
ENV_VAR = "WORKBENCH_PRESET"
LEGACY_ENV_VAR = "WORKBENCH_PROFILE"      # the name before "preset"; still read


def check_preset(name: str) -> Preset:
    """``name`` if it is a preset, else an error that lists the presets."""
    if name not in PRESETS:
        raise UnknownNameError("preset", name, PRESETS)
    return name  # type: ignore[return-value]


def default_preset() -> Preset:
    """The preset readers use when none is given: $WORKBENCH_PRESET (or the legacy $WORKBENCH_PROFILE), else full."""
    return check_preset(os.environ.get(ENV_VAR) or os.environ.get(LEGACY_ENV_VAR) or "full")


def page_preset() -> Preset:
    """The preset a served page uses: ``?preset=quick`` (or ``full``) in its address, which Voila hands the
    page's kernel as ``$QUERY_STRING`` (the gallery's links to a page's quick version), else
    :func:`default_preset`."""
    from urllib.parse import parse_qs

    asked = parse_qs(os.environ.get("QUERY_STRING", "")).get("preset", [""])[-1]
    return check_preset(asked) if asked in PRESETS else default_preset()


def prepare_hint(preset: str) -> str:
    """The command that prepares ``preset``'s artifacts."""
    return "workbench prepare" if preset == "full" else f"workbench prepare --preset {preset}"


def add_preset_argument(parser) -> None:
    """The one ``--preset`` option every command and benchmark takes."""
    parser.add_argument("--preset", default=default_preset(), choices=PRESETS,
                        help="prepared artifacts to use: full (what `workbench prepare` builds) or quick "
                             "(every step on a few batches; what the tests use)")
    parser.add_argument("--profile", dest="preset", choices=PRESETS, help=argparse.SUPPRESS)   # old name
