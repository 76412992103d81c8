"""A group of real worker processes for distributed runs, parent side, knowing no mechanism.

:class:`RankGroup` starts K ranks of a worker module through :class:`workbench.workers.WorkerGroup` (gloo,
rendezvous on 127.0.0.1, or inside network namespaces with shaped links, :mod:`workbench.distributed.shaping`),
optionally holds each to a device's speed with a CPU cgroup (:mod:`workbench.distributed.cpulimit`), sends each
job to every rank over a Unix socket, follows their progress step by step and collects each rank's result;
:meth:`RankGroup.merge` puts their timelines on the parent's clock (per-rank clocks aligned by the group's ping
offsets). A mechanism's runtime subclasses it and turns its plans into jobs (``workbench.partition.runtime``).

A worker that dies is reported at once with its rank and device; one that stops answering is
named when the run's deadline passes (its last step said). Either way the whole group is stopped,
no process is left, and the next run starts a fresh group.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from workbench.argtypes import machine_cores
from workbench.distributed.wire import THREADS_ENV, TIMEOUT_ENV
from workbench.errors import WorkbenchError
from workbench.timeline import Span, Timeline

START_TIMEOUT_S = 120.0
DEADLINE_FACTOR, DEADLINE_MARGIN_S = 5.0, 60.0
"""A run must finish within 5x its prediction plus a minute, or the ranks that did not are named."""


class RunFailed(WorkbenchError):
    """A rank died, failed or hung during a run, or the run was cancelled (``cancelled``); the message names
    the rank and its device, ``rank`` the rank (None when cancelled)."""

    def __init__(self, message: str, rank: int | None = None, cancelled: bool = False, kind: str = "failed"):
        super().__init__(message)
        self.rank, self.cancelled = rank, cancelled
        self.kind = "cancelled" if cancelled else kind      # "died" (killed), "hung", "failed" (an error, or exited
                                                            # by itself) or "cancelled"


class RankGroup:
    """K worker ranks of ``worker`` (a module run as ``python -m worker --control SOCKET``, which serves jobs with
    :func:`workbench.distributed.worker.serve`), started once and reused while their settings hold.

    ``shaped``: per-rank link bandwidths (bytes/s) to shape for real with ``tc`` in network namespaces
    (None: loopback). ``cpu``: per-rank device speeds (FLOP/s) to hold each rank to with a CPU cgroup of its
    own, calibrated by a probe running one layer of ``probe_layer``'s shape (hidden, heads, FFN, positions;
    :mod:`workbench.distributed.cpulimit`, counted as the cost model counts Gamma; None: no limit); the ranks
    then run one thread each. ``threads``: torch threads per rank (default: one when limited, else this
    machine's cores over K)."""

    def __init__(self, size: int, worker: str, *, shaped: Sequence[float] | None = None, threads: int | None = None,
                 logs: Path | None = None, should_stop: Callable[[], bool] | None = None,
                 rank_timeout_s: float = 120.0, cpu: Sequence[float] | None = None,
                 probe_layer: Sequence[int] = (384, 12, 1536, 128), name: str = "ranks"):
        if not (isinstance(size, int) and size >= 1):
            raise WorkbenchError(f"a group has 1 or more worker processes, got {size!r}")
        self.worker, self.name = worker, name
        self.size, self.shaped = size, tuple(shaped) if shaped is not None else None
        self.cpu = tuple(float(f) for f in cpu) if cpu is not None else None
        if self.cpu is not None and len(self.cpu) != size:
            raise WorkbenchError(f"{len(self.cpu)} CPU limits for {size} worker processes: give one per rank")
        self.threads = threads or (1 if self.cpu is not None else max(1, machine_cores() // size))
        self.cpu_groups: list = []
        self.calibrations: tuple = ()
        self.probe_layer = tuple(probe_layer)
        self.logs, self.should_stop, self.rank_timeout_s = logs, should_stop, rank_timeout_s
        self.group = None
        self.network = None
        self._conns: list[socket.socket] = []
        self._files: list = []
        self._tmp: str | None = None
        self._job = 0
        self.runs = 0
        self.steps: list[int] = []      # the step each rank last reported in the current job
        self.reports: list[dict] = []   # what the terminal reported on the way (e.g. Hepti's decisions)
        self.first_progress_at = None   # when the terminal first reported (its inference began), parent's clock

    @property
    def settings(self) -> tuple:
        return (self.size, self.shaped, self.threads, self.cpu, self.probe_layer if self.cpu else None)

    def __enter__(self) -> "RankGroup":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self.group is not None and all(code is None for code in self.group.poll())

    def start(self) -> "RankGroup":
        from workbench.workers import WorkerGroup

        self._tmp = tempfile.mkdtemp(prefix="workbench-partition-")
        path = os.path.join(self._tmp, "control.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(self.size)
        env = {**os.environ, THREADS_ENV: str(self.threads), TIMEOUT_ENV: str(self.rank_timeout_s),
               "OMP_NUM_THREADS": str(self.threads), "OMP_WAIT_POLICY": "PASSIVE"}
        command = [sys.executable, "-m", self.worker, "--control", path]
        master_addr, prefix = "127.0.0.1", lambda rank: []
        try:
            if self.shaped is not None:
                from workbench.distributed.shaping import ShapedNetwork

                self.network = ShapedNetwork(self.size, list(self.shaped))
                master_addr, prefix = self.network.master_addr, self.network.prefix
                env.update(self.network.env())
            self.group = WorkerGroup(lambda rank: [*prefix(rank), *command], self.size, name=self.name,
                                     logs=self.logs, env=env, ready="signal", ready_timeout_s=START_TIMEOUT_S,
                                     should_stop=self.should_stop, master_addr=master_addr, grace_s=2.0)
            self.group.start()
            listener.settimeout(START_TIMEOUT_S)
            hello = {}
            while len(hello) < self.size:
                conn, _ = listener.accept()
                file = conn.makefile("r", encoding="utf-8")
                rank = json.loads(file.readline())["hello"]
                hello[rank] = (conn, file)
            self._conns = [hello[r][0] for r in range(self.size)]
            self._files = [hello[r][1] for r in range(self.size)]
            if self.cpu is not None:
                self._limit_cpu()
        except BaseException:
            self.close()
            raise
        finally:
            listener.close()
        return self

    def _limit_cpu(self) -> None:
        """A CPU group per rank, calibrated (one probe process visiting each group in turn while the ranks
        wait for work), then the rank moved in."""
        from workbench.distributed.cpulimit import CpuGroup, Probe, calibrate

        calibrations = []
        with Probe("layer", self.probe_layer) as probe:
            for rank in range(self.size):
                group = CpuGroup()
                self.cpu_groups.append(group)
                calibrations.append(calibrate(group, self.cpu[rank] / 1e9, probe=probe))
        for rank, group in enumerate(self.cpu_groups):
            group.add(self.group.workers[rank].process.pid)
        self.calibrations = tuple(calibrations)

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.sendall(b'{"exit": true}\n')
            except OSError:
                pass
        for conn in self._conns:
            conn.close()
        self._conns, self._files = [], []
        if self.group is not None:
            self.group.close()
            self.group = None
        if self.network is not None:
            self.network.close()
            self.network = None
        for group in self.cpu_groups:
            group.close()
        self.cpu_groups, self.calibrations = [], ()
        if self._tmp:
            for name in os.listdir(self._tmp):
                os.unlink(os.path.join(self._tmp, name))
            os.rmdir(self._tmp)
            self._tmp = None

    def _device(self, names: Sequence[str], rank: int) -> str:
        return f"rank {rank} ({names[rank]})"

    def run_spec(self, spec: dict, names: Sequence[str], total_steps: int, deadline_s: float,
                 progress: Callable[[int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> dict[int, dict]:
        """Send one job to every rank and collect each rank's result (the rank's dict, by rank)."""
        if len(names) != self.size:
            raise WorkbenchError(f"the job names {len(names)} devices but this runtime has {self.size} worker processes")
        if self.group is None:
            self.start()
        self._job += 1
        job = self._job
        self.steps = [-1] * self.size
        self.reports = []
        self.first_progress_at = None
        spec = {**spec, "link": "shaped" if self.shaped is not None else "emulated"}
        message = (json.dumps({"job": job, "spec": spec}) + "\n").encode()
        for conn in self._conns:
            conn.sendall(message)
        results = self._collect(names, total_steps, job, time.monotonic() + deadline_s, progress,
                                should_stop or self.should_stop)
        self.runs += 1
        return results

    def _collect(self, names, total, job, deadline, progress, should_stop):
        steps = self.steps
        labels = [""] * self.size
        results: dict[int, dict] = {}
        selector = selectors.DefaultSelector()
        for rank, conn in enumerate(self._conns):
            selector.register(conn, selectors.EVENT_READ, rank)
        buffers = [b""] * self.size
        try:
            while len(results) < self.size:
                if should_stop is not None and should_stop():
                    self.close()
                    raise RunFailed("the run was cancelled; its worker processes were stopped", cancelled=True)
                if time.monotonic() > deadline:
                    self._hung(names, steps, labels, results)
                for key, _ in selector.select(timeout=0.1):
                    rank = key.data
                    chunk = key.fileobj.recv(1 << 20)
                    if not chunk:
                        self._check_alive(names, steps, total, wait_s=2.0)
                        self._fail(f"{self._device(names, rank)} closed its connection mid-run", rank, "died")
                    buffers[rank] += chunk
                    while b"\n" in buffers[rank]:
                        line, buffers[rank] = buffers[rank].split(b"\n", 1)
                        msg = json.loads(line)
                        if msg.get("progress") == job:
                            steps[rank], labels[rank] = msg["step"], msg["label"]
                            if rank == 0 and self.first_progress_at is None:
                                self.first_progress_at = time.perf_counter()
                            if "report" in msg:
                                self.reports.append(msg["report"])
                            if progress is not None:
                                progress(min(steps) + 1, total)
                        elif msg.get("done") == job:
                            results[rank] = msg["result"]
                        elif msg.get("error") == job:
                            # a peer's death shows first as a broken connection in the others: name the killed
                            # one (peers that exit after an error of their own are not the cause)
                            self._check_alive(names, steps, total, wait_s=1.5, besides={rank}, killed_only=True)
                            self._fail(f"{self._device(names, rank)} failed: {msg['message']}", rank)
                if len(results) < self.size:
                    self._check_alive(names, steps, total)     # after the messages: an error said is read first
        finally:
            selector.close()
        return results

    def _check_alive(self, names, steps, total, wait_s: float = 0.0, besides=(), killed_only: bool = False) -> None:
        """Fail naming the first rank whose process ended (waiting ``wait_s`` for one to show), ranks in
        ``besides`` (which reported an error of their own and may exit because of it) apart; ``killed_only``:
        only ranks killed from outside (a signal other than gloo's own abort of a rank whose peer failed)."""
        end = time.monotonic() + wait_s
        while True:
            codes = self.group.poll() if self.group is not None else []
            dead = [r for r, c in enumerate(codes) if c is not None and r not in besides
                    and not (killed_only and (c > 0 or c == -signal.SIGABRT))]
            if dead or time.monotonic() >= end:
                break
            time.sleep(0.05)
        if len(dead) > 1:
            time.sleep(0.2)                     # let the others' ends show, then name the cause, not a consequence:
            codes = self.group.poll() if self.group is not None else codes
            # gloo aborts (SIGABRT) or fails the peers of a rank that was killed; a kill or a crash of its own comes first
            dead = sorted(dead, key=lambda r: (codes[r] == -signal.SIGABRT, codes[r] is not None and codes[r] >= 0, r))
        if dead:
            exits = self.group.exits if self.group is not None else []
            exit = exits[dead[0]] if exits else None
            why = exit.why if exit is not None else f"exit status {codes[dead[0]]}"
            last = [line for line in (exit.log_tail if exit is not None else "").splitlines() if line.strip()]
            why += f"; its log ends: {last[-1].strip()}" if last else ""
            at = f" after step {steps[dead[0]] + 1} of {total}" if steps[dead[0]] >= 0 else ""
            # killed (a signal) is a device lost; a process that exited by itself failed in its own code
            code = codes[dead[0]]
            self._fail(f"{self._device(names, dead[0])} died ({why}){at}", dead[0],
                       "failed" if code is not None and code > 0 else "died")

    def _hung(self, names, steps, labels, results) -> None:
        waiting = [r for r in range(self.size) if r not in results]
        behind = min(steps[r] for r in waiting)
        late = [r for r in waiting if steps[r] == behind]
        last = f"its last step was {labels[late[0]]!r}" if behind >= 0 else "it finished no step"
        self._fail(f"{', '.join(self._device(names, r) for r in late)} did not answer within the run's "
                   f"deadline; {last}", late[0], "hung")

    def _fail(self, message: str, rank: int | None = None, kind: str = "failed"):
        self.close()
        raise RunFailed(f"{message}; every worker process of the run was stopped", rank, kind=kind)

    def merge(self, results: dict[int, dict], name: str) -> tuple[Timeline, float]:
        """Every rank's timeline on the parent's clock, and where it starts on ``time.perf_counter()``."""
        offsets = self.group.clock_offsets_s or [0.0] * self.size
        starts = [results[r]["t0"] + offsets[r] for r in range(self.size)]
        origin = min(starts)
        timelines = [Timeline.from_dict(results[r]["timeline"]) for r in range(self.size)]
        return split_waits(Timeline.merge(timelines, [s - origin for s in starts], name=name)), origin


def split_waits(timeline: Timeline) -> Timeline:
    """Each measured All-Gather or All-Reduce span cut where the last rank entered it: before, this rank
    stalled waiting for the others; after, the collective moved its bytes."""
    groups: dict[tuple, list[Span]] = {}
    for s in timeline.spans:
        if s.kind == "comm" and s.flow is None:
            groups.setdefault((s.label, s.layer), []).append(s)
    out = []
    for s in timeline.spans:
        members = groups.get((s.label, s.layer)) if s.kind == "comm" and s.flow is None else None
        if members and len(members) > 1:
            last_in = max(m.start for m in members)
            if s.start < last_in < s.end:
                out.append(replace(s, kind="stall", end=last_in, label=f"waits for {s.label}", nbytes=0, meta={}))
                out.append(replace(s, start=last_in))
                continue
        out.append(s)
    return Timeline(tuple(sorted(out, key=lambda s: s.start)), timeline.source, timeline.counters, timeline.name)
