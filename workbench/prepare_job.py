"""`workbench prepare` as a background job: one per cache, its state in a status file the gallery reads.

``workbench dashboards`` serves at once and starts the full prepare in the background
(:func:`start_background`): a detached ``workbench prepare --job`` process (the quick preset's steps
first, a few minutes, so every page has a labelled version to open while the full ones are made) whose output
goes to a log and whose state (each step pending, running, done, failed or stopped; the running
step's progress; when it started; the job stopped by a signal, or dead when its process vanished) is
rewritten atomically in ``status.json`` at most twice a second. Every prepare, in a terminal or in
the background, holds the cache's lock (:func:`workbench.prepare.prepare_lock`) for its whole run, so
two servers (or a server and a terminal) never prepare into one cache at once. An interrupted job resumes where it
stopped: finished steps are cached, the importance ablation resumes per layer, and a
fine-tuning that was cut short resumes from its last save (at most a minute of work is redone;
:mod:`workbench.train.resume`).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from workbench.cache import cache_dir, write_json
from workbench import prepare as preparation
from workbench.workers import WorkerGroup, raise_interrupt

WRITE_EVERY_S = 0.5


def job_dir(preset: str) -> Path:
    return cache_dir() / "prepare-job" / preset


def status_path(preset: str) -> Path:
    return job_dir(preset) / "status.json"


def log_path(preset: str) -> Path:
    return job_dir(preset) / "log.txt"


class StatusWriter:
    """Keeps ``status.json`` up to date while a prepare runs (steps, the running step's progress)."""

    def __init__(self, preset: str, steps):
        self.path = status_path(preset)
        measured = preparation.host_step_times()
        self.status = {"preset": preset, "pid": os.getpid(), "state": "running", "started": time.time(),
                       "updated": time.time(), "error": None, "log": str(log_path(preset)),
                       "steps": [{"name": s.name, "state": "ready" if s.ready(preset) else "pending",
                                  "estimate_s": preparation.step_estimate(s, preset, measured), "seconds": None,
                                  "progress": None}
                                 for s in steps]}
        self._written = 0.0
        self.write(force=True)

    def _step(self, name: str) -> dict:
        return next(s for s in self.status["steps"] if s["name"] == name)

    def on_step(self, name: str, state: str) -> None:
        step = self._step(name)
        if state == "running":
            step.update(state="running", started=time.time(), progress=None)
        else:
            step.update(state=state, seconds=time.time() - step.get("started", time.time()))
        self.write(force=True)

    def on_progress(self, desc: str, done: int, total: int, elapsed_s: float) -> None:
        running = [s for s in self.status["steps"] if s["state"] == "running"]
        if running:
            running[0]["progress"] = {"desc": desc, "done": done, "total": total, "elapsed_s": elapsed_s}
        self.write(force=done >= total)

    def finish(self, error: BaseException | None) -> None:
        """The job's end: "done", "stopped" (a signal or Ctrl-C) or "failed" (an error, named)."""
        stopped = isinstance(error, (KeyboardInterrupt, SystemExit))
        self.status["state"] = "done" if error is None else "stopped" if stopped else "failed"
        if error is not None:
            self.status["error"] = "stopped by a signal" if stopped else f"{type(error).__name__}: {error}"
            for step in self.status["steps"]:
                if step["state"] == "running":
                    step["state"] = "stopped" if stopped else "failed"
        self.write(force=True)

    def write(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._written < WRITE_EVERY_S:
            return
        self._written = now
        self.status["updated"] = time.time()
        write_json(self.path, self.status)


def read_status(preset: str) -> dict | None:
    """The last status a job wrote for ``preset`` (None if no job ever ran); "running" with no lock held
    reads as "dead" (the job's process is gone without saying so: killed outright, or its machine restarted)."""
    try:
        status = json.loads(status_path(preset).read_text())
    except (OSError, ValueError):
        return None
    if status.get("state") == "running" and not preparation.lock_held():
        status["state"] = "dead"
        status["error"] = f"its process (pid {status.get('pid')}) is gone"
    return status


STOP_GAP = "quick"
"""The preset a full job makes first, in minutes, so every page has a version to open while the full one
is made (each waiting page and the gallery offer it, labelled)."""


def _prepare_reporting(preset: str, writer: StatusWriter):
    from workbench.progress import listen

    try:
        with listen(writer.on_progress):
            report = preparation.prepare(preset, progress=True, on_step=writer.on_step, hold_lock=False)
    except BaseException as exc:
        writer.finish(exc)
        raise
    writer.finish(None)
    return report


def run_job(preset: str, *, own_process: bool = False) -> int:
    """The body of ``workbench prepare --job``: the prepare of ``preset``, reporting to its status file; a
    job for another preset than ``STOP_GAP`` first makes ``STOP_GAP``'s steps (reporting to that preset's
    status file; the main status says so in ``phase``). In the job's ``own_process``, SIGTERM (how its
    server stops it) ends it as Ctrl-C would, so its status says stopped."""
    if own_process and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, raise_interrupt)
    with preparation.prepare_lock():             # before any status is written: a second job changes nothing
        writer = StatusWriter(preset, preparation.steps(preset))
        stop_gap = [s for s in preparation.steps(STOP_GAP) if not s.ready(STOP_GAP)] if preset != STOP_GAP else []
        if stop_gap:
            measured = preparation.host_step_times()
            left = sum(preparation.step_estimate(s, STOP_GAP, measured) for s in stop_gap)
            writer.status["phase"] = {"preset": STOP_GAP, "estimate_s": left, "started": time.time()}
            writer.write(force=True)
            print(f"[prepare] the {STOP_GAP} versions first ({len(stop_gap)} steps, about {left / 60:.0f} min), so "
                  f"every page can open one while the {preset} ones are made", flush=True)
            try:
                _prepare_reporting(STOP_GAP, StatusWriter(STOP_GAP, preparation.steps(STOP_GAP)))
            except BaseException as exc:
                writer.finish(exc)
                raise
            writer.status["phase"] = None
            writer.write(force=True)
        report = _prepare_reporting(preset, writer)
    print(report.summary(), flush=True)
    return 0


def start_background(preset: str, *, bound: bool = False) -> tuple[str, WorkerGroup | None]:
    """Start ``workbench prepare --job`` in a session of its own unless a prepare runs or every step is ready.

    Returns what happened, "ready", "running" (someone else's job) or "started", and the
    started job as a one-worker :class:`~workbench.workers.WorkerGroup` (``close()`` stops it;
    it resumes where it stopped when started again). The job outlives this process unless
    ``bound``.
    """
    if preparation.lock_held():
        return "running", None
    if all(s.ready(preset) for s in preparation.steps(preset)):
        return "ready", None
    job_dir(preset).mkdir(parents=True, exist_ok=True)
    with open(log_path(preset), "a") as log:
        log.write(f"\n=== workbench prepare --preset {preset} --job, started {time.ctime()} ===\n")
    job = WorkerGroup([sys.executable, "-m", "workbench.cli", "prepare", "--preset", preset, "--job"],
                      name="prepare", logs=[log_path(preset)], log_mode="a", bound=bound, grace_s=20)
    return "started", job.start()
