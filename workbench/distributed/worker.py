"""The worker side of a :class:`~workbench.distributed.ranks.RankGroup`, knowing no mechanism: connect to the
parent's control socket, run each job it sends with the mechanism's runner, report progress and the result.

A mechanism's worker module calls :func:`serve` with a factory of its runner (an object with
``run(spec, progress) -> dict`` and ``rank``), made once the process group is up; the messages are JSON lines:
``{"hello": rank, "pid": ...}`` first, then per job ``{"progress": job, "step": i, "label": ..., ...}``,
``{"done": job, "result": {...}}`` or ``{"error": job, "message": ..., "trace": ...}`` (the rank then exits).
"""
from __future__ import annotations

import json
import os
import socket
import traceback
from typing import Any, Callable


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
