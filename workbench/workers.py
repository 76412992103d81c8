"""One way to start, watch and stop a group of worker processes.

A :class:`WorkerGroup` starts ``size`` processes, each in a session (and process group) of its
own, with its own log file and the environment ``torch.distributed`` reads (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``),
so a gloo worker runs unchanged under ``torchrun`` later. It waits until every worker is ready
(a call to :func:`ready` in the worker, a line of its log, or a check of the caller's), naming
who was not and the end of its log. It stops them with SIGTERM to each process group, then
SIGKILL after a grace period: when the block ends, on Ctrl-C (and SIGTERM, turned into
``KeyboardInterrupt`` while a group runs in the main thread), on :meth:`WorkerGroup.cancel` from
another thread or a ``should_stop()`` that turns true (a page's Cancel), and when the parent dies
even by SIGKILL (``PR_SET_PDEATHSIG`` set in each worker before its command starts, and a
watchdog process that stops the process groups once the parent is gone). Each worker's end is
reported as a :class:`WorkerExit`: which rank, and why (exit status or signal, its log's end).

Workers that call :func:`ready` also take part in a barrier: the parent times a few round trips
to each one (:attr:`WorkerGroup.clock_offsets_s`, for :meth:`workbench.timeline.Timeline.merge`)
and then releases them all together.
"""
from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence, Union

from workbench.errors import WorkbenchError
from workbench.listen import LOOPBACK, check_tcp_port

CHANNEL_ENV = "WORKBENCH_WORKER_FD"
CANCEL_GRACE_S = 1.0
"""How long a cancelled worker has between SIGTERM and SIGKILL, so that a page's Cancel ends within 2 s."""
PING_ROUNDS = 5
TAIL_LINES = 15
POLL_S = 0.05

Ready = Union[None, str, "re.Pattern[str]", Callable[["Worker"], bool]]

_PDEATHSIG = ("import ctypes, os, signal, sys\n"
              "ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
              "os.getppid() == int(sys.argv[1]) or os._exit(1)\n"
              "os.execvp(sys.argv[2], sys.argv[2:])\n")
"""Run in each worker before its command: SIGTERM when the parent dies (PR_SET_PDEATHSIG is 1)."""

_WATCHDOG = ("import os, signal, sys, time\n"
             "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
             "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
             "groups = set()\n"
             "for line in sys.stdin:\n"
             "    if line[0] == '+': groups.add(int(line[1:]))\n"
             "    elif line[0] == '-': groups.discard(int(line[1:]))\n"
             "    elif line[0] == 'x': sys.exit(0)\n"
             "def send(sig):\n"
             "    for g in list(groups):\n"
             "        try: os.killpg(g, sig)\n"
             "        except OSError: groups.discard(g)\n"
             "send(signal.SIGTERM)\n"
             "deadline = time.monotonic() + float(sys.argv[1])\n"
             "while groups and time.monotonic() < deadline:\n"
             "    time.sleep(0.05)\n"
             "    send(0)\n"
             "send(signal.SIGKILL)\n")
"""The watchdog: reads '+pgid' / '-pgid' lines; at end of input without 'x' (the parent is gone) it stops
the groups left, SIGTERM then SIGKILL after the grace period given as its argument."""


class WorkerFailed(WorkbenchError):
    """A worker ended on its own with a non-zero status (or a signal); ``exits`` says how each ended."""

    def __init__(self, message: str, exits: Sequence["WorkerExit | None"]):
        super().__init__(message)
        self.exits = list(exits)


class NotReady(WorkbenchError):
    """Workers not ready in time; ``ranks`` names them."""

    def __init__(self, message: str, ranks: Sequence[int]):
        super().__init__(message)
        self.ranks = list(ranks)


def ready(clock: Callable[[], float] = time.perf_counter) -> None:
    """In a worker: tell the group this worker is ready, answer its clock pings with ``clock()``, and return
    when the group releases every worker together. Does nothing in a process no group started (torchrun)."""
    fd = os.environ.pop(CHANNEL_ENV, None)
    if fd is None:
        return
    with socket.socket(fileno=int(fd)) as channel, channel.makefile("rb") as lines:
        channel.sendall(b"ready\n")
        for line in lines:
            if line == b"ping\n":
                channel.sendall(f"pong {clock()!r}\n".encode())
            elif line == b"go\n":
                return


@dataclass(frozen=True)
class WorkerExit:
    """How one worker ended: ``returncode`` as ``subprocess`` gives it (negative: the signal that ended it);
    ``stopped`` when the group stopped it (its block ended, Cancel, a failed peer, the parent's end)."""
    name: str
    rank: int
    world_size: int
    pid: int
    returncode: int
    stopped: bool
    log: Path | None
    log_tail: str

    @property
    def failed(self) -> bool:
        return self.returncode != 0 and not self.stopped

    @property
    def why(self) -> str:
        if self.returncode >= 0:
            how = f"exited with status {self.returncode}"
        else:
            how = f"was killed by {_signal_name(-self.returncode)}"
        return f"{how} (stopped by the group)" if self.stopped else how

    def describe(self, when: str = "") -> str:
        """One paragraph: which worker, why it ended (``when``), and the end of its log."""
        head = f"{self.name} rank {self.rank} of {self.world_size} (pid {self.pid}) {self.why}"
        head = f"{head} {when}" if when else head
        if self.log is None:
            return f"{head}; its output went to the parent's"
        return f"{head}; its log {self.log} ends:\n{self.log_tail}" if self.log_tail else f"{head}; its log {self.log} is empty"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def log_tail(path: Path | None, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log ('' when there is none)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


class Worker:
    """One process of a group: ``rank``, ``process`` (a ``subprocess.Popen``), ``log`` (None: the parent's output)."""

    def __init__(self, rank: int, process: subprocess.Popen, log: Path | None, channel: socket.socket | None):
        self.rank, self.process, self.log, self.channel = rank, process, log, channel
        self.pid = process.pid
        self.stopped = False
        self.exit: WorkerExit | None = None
        self._log_offset = 0
        self._partial = b""
        self._said = b""
        self.channel_closed = False

    def exited(self) -> bool:
        """Whether the process has ended (without reaping it, so its process group stays reserved)."""
        if self.process.returncode is not None:
            return True
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def signal_group(self, signum: int) -> None:
        if self.exit is None:
            try:
                os.killpg(self.pid, signum)
            except OSError:
                pass

    def new_log_lines(self) -> list[str]:
        """Lines the log gained since the last call."""
        if self.log is None:
            return []
        try:
            with open(self.log, "rb") as f:
                f.seek(self._log_offset)
                data = f.read()
        except OSError:
            return []
        self._log_offset += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        return [line.decode(errors="replace") for line in lines]

    def said_ready(self) -> bool:
        """Whether the worker called :func:`ready` (reads what its channel holds, never blocks)."""
        try:
            data = self.channel.recv(4096)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        self.channel_closed = not data
        self._said += data
        return b"ready\n" in self._said


_spawner: ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def _spawn(**popen) -> subprocess.Popen:
    """``Popen`` from one long-lived thread: PR_SET_PDEATHSIG fires when the thread that forked a process
    ends, so a group started from a short-lived thread would otherwise die with that thread."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(1, thread_name_prefix="workbench-workers")
    return _spawner.submit(subprocess.Popen, **popen).result()


class WorkerGroup:
    """``size`` worker processes running ``command`` (a list, or a function of the rank giving one).

    ``logs``: a folder (``<name>-<rank>.log`` in it), one path per rank, ``"inherit"`` (the parent's own
    output) or None (a temporary folder, removed when the group closes). ``ready``: None (ready once
    started), ``"signal"`` (the worker calls :func:`ready`), a regular expression a line of its log
    matches, or a function of the :class:`Worker` polled until true. ``bound=False`` lets the workers
    outlive the parent (a detached job). Use it as a context manager; :meth:`start` and :meth:`close`
    do the same by hand.

    With ``ready="signal"``, ``clock_offsets_s[i]`` added to a reading of worker ``i``'s clock (the one it
    gave :func:`ready`) puts it on ``clock``'s, and ``released_at`` is ``clock()`` when all were released.
    ``master_addr``: where rank 0's rendezvous listens (127.0.0.1 unless the workers run in network
    namespaces of their own, see :mod:`workbench.distributed.shaping`).
    """

    def __init__(self, command: Sequence[str] | Callable[[int], Sequence[str]], size: int = 1, *,
                 name: str = "worker", logs: Path | str | Sequence[Path] | None = None, log_mode: str = "w",
                 env: Mapping[str, str] | None = None, cwd: Path | str | None = None, ready: Ready = None,
                 ready_timeout_s: float = 60.0, grace_s: float = 5.0,
                 should_stop: Callable[[], bool] | None = None, fail_fast: bool = True, bound: bool = True,
                 master_port: int | None = None, master_addr: str = LOOPBACK,
                 clock: Callable[[], float] = time.perf_counter):
        if size < 1:
            raise WorkbenchError(f"a worker group needs at least one worker, got {size}")
        if logs == "inherit" and isinstance(ready, (str, re.Pattern)) and ready != "signal":
            raise WorkbenchError(f"{name}: a ready line is read from the logs; give the workers logs")
        self.command, self.size, self.name = command, size, name
        self.logs, self.log_mode, self.env, self.cwd = logs, log_mode, env, cwd
        self.ready, self.ready_timeout_s, self.grace_s = ready, ready_timeout_s, grace_s
        self.should_stop, self.fail_fast, self.bound = should_stop, fail_fast, bound
        self.master_port, self.master_addr, self.clock = master_port, master_addr, clock
        self.workers: list[Worker] = []
        self.clock_offsets_s: list[float] | None = None
        self.released_at: float | None = None
        self.cancelled = False
        self._cancel = threading.Event()
        self._watchdog: subprocess.Popen | None = None
        self._tmp: str | None = None
        self._old_sigterm = None

    # -- starting

    def __enter__(self) -> "WorkerGroup":
        return self if self.workers else self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _log_paths(self) -> list[Path | None]:
        if self.logs == "inherit":
            return [None] * self.size
        if self.logs is None:
            self._tmp = tempfile.mkdtemp(prefix=f"workbench-{self.name}-")
            folder = Path(self._tmp)
        elif isinstance(self.logs, (str, Path)):
            folder = Path(self.logs)
        else:
            if len(self.logs) != self.size:
                raise WorkbenchError(f"{len(self.logs)} log paths for {self.size} workers")
            return [Path(p) for p in self.logs]
        folder.mkdir(parents=True, exist_ok=True)
        return [folder / f"{self.name}-{rank}.log" for rank in range(self.size)]

    def _command(self, rank: int) -> list[str]:
        command = list(self.command(rank) if callable(self.command) else self.command)
        if shutil.which(command[0]) is None:
            raise WorkbenchError(f"cannot start {self.name} rank {rank}: no program {command[0]!r}")
        if self.bound and sys.platform == "linux":
            return [sys.executable, "-S", "-c", _PDEATHSIG, str(os.getpid()), *command]
        return command

    def start(self) -> "WorkerGroup":
        """Start every worker and wait until all are ready (or the group is cancelled)."""
        port = self.master_port or check_tcp_port(0)
        try:
            if self.bound:
                self._watchdog = subprocess.Popen([sys.executable, "-S", "-c", _WATCHDOG, repr(self.grace_s)],
                                                  stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                                  stderr=subprocess.DEVNULL, start_new_session=True, text=True)
                self._catch_sigterm()
            for rank, log in enumerate(self._log_paths()):
                self.workers.append(self._start_one(rank, log, port))
            self._await_ready()
        except BaseException:
            self.close()
            raise
        return self

    def _start_one(self, rank: int, log: Path | None, port: int) -> Worker:
        env = {**(os.environ if self.env is None else self.env), "RANK": str(rank), "WORLD_SIZE": str(self.size),
               "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(self.size), "MASTER_ADDR": self.master_addr,
               "MASTER_PORT": str(port)}
        env.setdefault("PYTHONUNBUFFERED", "1")
        ours = theirs = None
        if self.ready == "signal":
            ours, theirs = socket.socketpair()
            env[CHANNEL_ENV] = str(theirs.fileno())
        out = open(log, self.log_mode) if log is not None else None
        try:
            process = (_spawn if self.bound else subprocess.Popen)(
                args=self._command(rank), env=env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT if out is not None else None, start_new_session=True,
                pass_fds=(theirs.fileno(),) if theirs is not None else ())
        except BaseException:
            if ours is not None:
                ours.close()
            raise
        finally:
            if out is not None:
                out.close()
            if theirs is not None:
                theirs.close()
        if ours is not None:
            ours.setblocking(False)
        if self._watchdog is not None:
            self._tell_watchdog(f"+{process.pid}")
        return Worker(rank, process, log, ours)

    def _tell_watchdog(self, line: str) -> None:
        try:
            self._watchdog.stdin.write(line + "\n")
            self._watchdog.stdin.flush()
        except (OSError, ValueError):
            pass

    def _catch_sigterm(self) -> None:
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._old_sigterm = signal.signal(signal.SIGTERM, raise_interrupt)

    def _is_ready(self, worker: Worker) -> bool:
        if self.ready is None:
            return True
        if self.ready == "signal":
            return worker.said_ready()
        if isinstance(self.ready, (str, re.Pattern)):
            return any(re.search(self.ready, line) for line in worker.new_log_lines())
        return bool(self.ready(worker))

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        pending = list(self.workers)
        with selectors.DefaultSelector() as sel:
            for w in self.workers:
                if w.channel is not None:
                    sel.register(w.channel, selectors.EVENT_READ)
            while pending:
                if self._cancel_requested():
                    return
                pending = [w for w in pending if not self._is_ready(w)]
                if not pending:
                    break
                dead = [w for w in pending if w.exited()]
                if dead:
                    self._fail(dead[0], "before it was ready")
                if time.monotonic() > deadline:
                    self.stop()
                    raise NotReady(f"{self.name}: {_ranks(pending)} of {self.size} not ready within "
                                   f"{self.ready_timeout_s:g} s\n" + "\n".join(
                                       f"rank {w.rank}'s log {w.log} ends:\n{log_tail(w.log)}" if w.log else
                                       f"rank {w.rank} wrote to the parent's output" for w in pending),
                                   [w.rank for w in pending])
                if self.ready == "signal":
                    for w in pending:
                        if w.channel_closed and w.channel in sel.get_map():
                            sel.unregister(w.channel)
                    sel.select(POLL_S)
                else:
                    time.sleep(POLL_S if isinstance(self.ready, (str, re.Pattern)) else 0.3)
        if self.ready == "signal":
            self._barrier(deadline)

    def _barrier(self, deadline: float) -> None:
        """Time round trips to each worker, then release them all together."""
        from workbench.timeline import round_trip_offset

        offsets = []
        for w in self.workers:
            w.channel.setblocking(True)
            w.channel.settimeout(max(5.0, deadline - time.monotonic()))
            samples = []
            with w.channel.makefile("rb") as lines:
                for _ in range(PING_ROUNDS):
                    sent = self.clock()
                    w.channel.sendall(b"ping\n")
                    answer = lines.readline()
                    received = self.clock()
                    if not answer.startswith(b"pong "):
                        if w.exited():
                            self._fail(w, "during the start barrier")
                        self.stop()
                        raise WorkbenchError(f"{self.name} rank {w.rank} answered {answer!r} to a clock ping")
                    samples.append((sent, float(answer.split()[1]), received))
            offsets.append(-round_trip_offset(samples))
        self.clock_offsets_s = offsets
        for w in self.workers:
            w.channel.sendall(b"go\n")
        self.released_at = self.clock()
        for w in self.workers:
            w.channel.close()
            w.channel = None

    # -- running

    def cancel(self) -> None:
        """Stop the run (from any thread): SIGTERM to every worker now, SIGKILL after :data:`CANCEL_GRACE_S`."""
        self._cancel.set()
        for w in self.workers:
            w.stopped = w.stopped or not w.exited()
            w.signal_group(signal.SIGTERM)
        timer = threading.Timer(CANCEL_GRACE_S, self._kill_left)
        timer.daemon = True
        timer.start()

    def _kill_left(self) -> None:
        for w in self.workers:
            if not w.exited():
                w.signal_group(signal.SIGKILL)

    def _cancel_requested(self) -> bool:
        if not self._cancel.is_set() and self.should_stop is not None and self.should_stop():
            self.cancel()
        if self._cancel.is_set():
            self.cancelled = True
            self.stop(min(self.grace_s, CANCEL_GRACE_S))
        return self.cancelled

    def poll(self) -> list[int | None]:
        """Each worker's return code, None while it runs (reaping those that ended)."""
        for w in self.workers:
            if w.exit is None and w.exited():
                self._reap(w)
        return [w.exit.returncode if w.exit else None for w in self.workers]

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every worker has ended (True) or ``timeout`` passed (False). A cancelled group stops its
        workers and returns True (``cancelled`` says so). With ``fail_fast`` a worker that fails stops the
        others and raises :class:`WorkerFailed`."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._cancel_requested():
                return True
            codes = self.poll()
            failed = [w for w in self.workers if w.exit is not None and w.exit.failed]
            if failed and self.fail_fast:
                self._fail(failed[0])
            if all(code is not None for code in codes):
                return True
            if end is not None and time.monotonic() >= end:
                return False
            time.sleep(POLL_S if end is None else min(POLL_S, max(0.0, end - time.monotonic())))

    @property
    def exits(self) -> list[WorkerExit | None]:
        return [w.exit for w in self.workers]

    def _fail(self, worker: Worker, when: str = "") -> None:
        self._reap(worker)
        self.stop()
        raise WorkerFailed(worker.exit.describe(when), self.exits)

    def _reap(self, worker: Worker) -> None:
        """Collect an ended worker: SIGKILL what is left of its process group, then its status."""
        if worker.exit is not None:
            return
        try:
            os.killpg(worker.pid, signal.SIGKILL)
        except OSError:
            pass
        code = worker.process.wait()
        if self._watchdog is not None:
            self._tell_watchdog(f"-{worker.pid}")
        worker.exit = WorkerExit(self.name, worker.rank, self.size, worker.pid, code, worker.stopped and code != 0,
                                 worker.log, log_tail(worker.log))

    # -- stopping

    def stop(self, grace_s: float | None = None) -> list[WorkerExit | None]:
        """SIGTERM each running worker's process group, SIGKILL after ``grace_s`` (the group's grace by
        default); returns how each ended."""
        grace_s = self.grace_s if grace_s is None else grace_s
        running = [w for w in self.workers if w.exit is None and not w.exited()]
        for w in running:
            w.stopped = True
            w.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(not w.exited() for w in running) and time.monotonic() < deadline:
            time.sleep(0.02)
        for w in running:
            if not w.exited():
                w.signal_group(signal.SIGKILL)
        for w in self.workers:
            self._reap(w)
        return self.exits

    def close(self) -> None:
        """Stop what runs, end the watchdog, and remove the temporary logs."""
        try:
            self.stop()
        finally:
            for w in self.workers:
                if w.channel is not None:
                    w.channel.close()
                    w.channel = None
            if self._watchdog is not None:
                self._tell_watchdog("x")
                try:
                    self._watchdog.stdin.close()
                except OSError:
                    pass
                self._watchdog.wait()
                self._watchdog = None
            if self._old_sigterm is not None:
                signal.signal(signal.SIGTERM, self._old_sigterm)
                self._old_sigterm = None
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None


def raise_interrupt(signum, frame):
    """A signal handler that ends the program as Ctrl-C does (``finally`` blocks and cleanup run)."""
    raise KeyboardInterrupt


def _ranks(workers: Sequence[Worker]) -> str:
    ranks = [str(w.rank) for w in workers]
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(ranks)}"

