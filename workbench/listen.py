"""Binding the workbench's servers: addresses and folders checked before any work, one line when unusable.

Every server the workbench starts (``serve llms``, ``dashboards``, ``lab``, and those to come) takes
its port, socket path and folders through these functions, so a port in use or a folder that cannot
be made is refused the same way, naming the address or path and what to do, before a model loads,
and what a failed start made is removed again.
"""
from __future__ import annotations

import errno
import os
import shutil
import socket
from pathlib import Path

from workbench.errors import WorkbenchError

LOOPBACK = "127.0.0.1"


class AddressError(WorkbenchError):
    """An address to listen on or a folder to write to that cannot be used."""


def _reason(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "the port is in use"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return (exc.strerror or str(exc)).rstrip(".").lower()


def bind_tcp(port: int, host: str = LOOPBACK, *, option: str = "--port", free: str = "--port 0") -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port), or an ``AddressError`` naming the address,
    the option it came from and ``free``, the way to ask for a free port."""
    if not 0 <= port <= 65535:
        raise AddressError(f"{option}: a port is 0 to 65535, got {port}; pass another port, or {free} for a free one")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen()
    except OSError as exc:
        sock.close()
        raise AddressError(f"cannot listen on {host}:{port} ({option}): {_reason(exc)}; stop what serves there or "
                           f"pass another port ({free} picks a free one)") from None
    return sock


def check_tcp_port(port: int, host: str = LOOPBACK, *, option: str = "--port", free: str = "--port 0") -> int:
    """``port`` (a free one for 0) when a server started next can listen on it (for servers that bind
    themselves: Voila, JupyterLab), else the ``bind_tcp`` error."""
    with bind_tcp(port, host, option=option, free=free) as sock:
        return sock.getsockname()[1]


def make_folder(path: Path | str, *, what: str, mode: int | None = None, made: list[Path] | None = None) -> Path:
    """``path`` as a writable folder, made if missing (its top new folder appended to ``made``, so a failed
    start can ``remove_made`` it); ``mode`` is applied to ``path``. Else an ``AddressError`` naming ``what``."""
    path = Path(path).expanduser()
    missing = path
    while not missing.parent.exists() and missing.parent != missing:
        missing = missing.parent
    try:
        existed = path.exists()
        path.mkdir(mode=mode if mode is not None else 0o777, parents=True, exist_ok=True)
        if not existed and made is not None:
            made.append(missing)
        if mode is not None:
            os.chmod(path, mode)
    except OSError as exc:
        raise AddressError(f"cannot use {path} as {what}: {_reason(exc)}; give a writable folder") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise AddressError(f"cannot use {path} as {what}: permission denied; give a writable folder")
    return path


def remove_made(made: list[Path]) -> None:
    """Remove the folders ``make_folder`` made (after a failed start), newest first."""
    for path in reversed(made):
        shutil.rmtree(path, ignore_errors=True)
    made.clear()
