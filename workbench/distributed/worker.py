"""The worker side of a :class:`~workbench.distributed.ranks.RankGroup`, knowing no mechanism: connect to the
parent's control socket, run each job it sends with the mechanism's runner, report progress and the result.

A mechanism's worker module calls :func:`serve` with a factory of its runner (an object with
``run(spec, progress) -> dict`` and ``rank``; :class:`Runner` joins the process group for it), made once; the messages are JSON lines:
``{"hello": rank, "pid": ...}`` first, then per job ``{"progress": job, "step": i, "label": ..., ...}``,
``{"done": job, "result": {...}}`` or ``{"error": job, "message": ..., "trace": ...}`` (the rank then exits).
"""
from __future__ import annotations

import json
import os
import socket
import traceback
from typing import Any, Callable

from workbench.distributed.wire import THREADS_ENV, TIMEOUT_ENV


class Runner:
    """One rank's ``torch.distributed`` (gloo) membership, read from the environment torchrun and the workbench
    set (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); a mechanism's runner adds ``run``."""

    def __init__(self):
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        torch.set_num_threads(int(os.environ.get(THREADS_ENV, "1")))
        dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "120"))))
        self.groups: dict = {}          # subgroups a Comm makes, kept between jobs

    def run(self, spec: dict, progress) -> dict:
        raise NotImplementedError


def serve(control: str, make_runner: Callable[[], Any]) -> int:
    """Run the parent's jobs until it says exit; 1 after a job failed (reported first), else 0."""
    from workbench import workers

    runner = make_runner()
    workers.ready()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(control)
        out = conn.makefile("w", encoding="utf-8")
        send = lambda msg: (out.write(json.dumps(msg) + "\n"), out.flush())
        send({"hello": runner.rank, "pid": os.getpid()})
        for line in conn.makefile("r", encoding="utf-8"):
            msg = json.loads(line)
            if msg.get("exit"):
                break
            job = msg["job"]
            try:
                result = runner.run(msg["spec"], lambda i, label, extra=None: send(
                    {"progress": job, "step": i, "label": label, **(extra or {})}))
            except Exception as exc:                           # reported to the parent, which ends the group
                send({"error": job, "message": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})
                return 1
            send({"done": job, "result": result})
    return 0
