"""Progress of long work, shown as a terminal bar and reported to whoever listens.

Engine code reports progress through :func:`progress_bar` only. In a terminal it draws a
tqdm bar; the background prepare job (and the gallery reading its status file) listens
with :func:`listen`, so the same training loop shows the same progress everywhere.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

Listener = Callable[[str, int, int, float], None]          # (desc, done, total, seconds since start)
_listeners: list[Listener] = []
_lock = threading.Lock()


@contextmanager
def listen(listener: Listener) -> Iterator[None]:
    """Call ``listener`` on every progress update made inside the block."""
    with _lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)


class ProgressBar:
    """A counter of done units out of ``total``; ``update`` advances it."""

    def __init__(self, total: int, desc: str, enabled: bool = True):
        from tqdm.auto import tqdm

        self.total, self.desc, self.done = int(total), desc, 0
        self.started = time.monotonic()
        self._bar = tqdm(total=total, desc=desc, disable=not enabled)
        self._notify()

    def update(self, n: int = 1, **postfix) -> None:
        self.done += n
        self._bar.update(n)
        if postfix:
            self._bar.set_postfix(**postfix, refresh=False)
        self._notify()

    def _notify(self) -> None:
        with _lock:
            listeners = list(_listeners)
        for listener in listeners:
            listener(self.desc, self.done, self.total, time.monotonic() - self.started)

    def close(self) -> None:
        self._bar.close()


@contextmanager
def progress_bar(total: int, desc: str, enabled: bool = True) -> Iterator[ProgressBar]:
    bar = ProgressBar(total, desc, enabled)
    try:
        yield bar
    finally:
        bar.close()
