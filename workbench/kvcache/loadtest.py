"""Many client processes calling one served LLM service at once, checked against one process making the same calls.

The load (:func:`run_load`): ``clients`` processes, each an app of its own holding its share of
``contexts`` contexts, make ``calls`` calls each over the service's socket, all released at once.
Each client's calls follow a synthesized random-switching trace over its own contexts (prompts cut
from the shipped texts, :func:`~workbench.kvcache.traces.synthesize_trace`).

The check (:func:`reference_replies`, :func:`check_replies`): every reply carries the service's call
counter (``CallStats.tick``), so the order in which the service served the interleaved calls is
known. One process then makes the same calls on a fresh service of the same configuration and
budget, in that order. The service is deterministic given the order (greedy decoding, levels from
each context's own attention, evictions by policy and call counter, plans from the cost model), so
every reply must be equal: a context lost, served to the wrong caller or mixed with another shows
up as a reply that differs, or as a call without a reply.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from workbench.errors import WorkbenchError
from workbench.workers import WorkerFailed, WorkerGroup

SYSTEM_PROMPT = "Answer in a few words."


@dataclass(frozen=True)
class LoadCall:
    """One call of the load: ``client``'s ``index``-th, on its ``context``-th context."""
    client: int
    index: int
    context: int
    prompt: str


@dataclass(frozen=True)
class LoadReply:
    """What the service answered to one :class:`LoadCall`, and when it served it."""
    client: int
    index: int
    context: int
    text: str
    tick: int                   # the service's call counter
    latency_s: float            # from sending the call to its reply, in the client
    queue_wait_s: float         # waiting for the model, in the service
    switch_s: float


@dataclass(frozen=True)
class LoadRun:
    """One load run: every reply, and what went wrong in the clients."""
    clients: int
    calls_per_client: int
    contexts: int
    max_new_tokens: int
    wall_s: float               # from releasing the clients to the last one done
    replies: tuple[LoadReply, ...]
    errors: tuple[str, ...]

    @property
    def calls_per_s(self) -> float:
        return len(self.replies) / self.wall_s if self.wall_s > 0 else 0.0

    def latency_ms(self, q: float) -> float:
        return float(np.percentile([r.latency_s for r in self.replies], q) * 1e3) if self.replies else 0.0


def plan_calls(clients: int, calls: int, contexts: int, *, seed: int = 0, prompt_words: int = 8,
               texts: dict[str, list[str]] | None = None) -> list[list[LoadCall]]:
    """Per client, its calls: client ``c`` holds contexts ``c, c + clients, ...`` of ``contexts`` (numbered
    locally 0, 1, ...) and switches among them at random (seed ``seed + c``)."""
    from workbench.kvcache.traces import synthesize_trace

    if clients < 1 or calls < 1:
        raise WorkbenchError(f"a load needs at least one client and one call each, got {clients} and {calls}")
    if contexts < clients:
        raise WorkbenchError(f"every client holds a context of its own: {contexts} contexts for {clients} clients")
    plans = []
    for c in range(clients):
        own = len(range(c, contexts, clients))
        trace = synthesize_trace(own, calls, "random", seed=seed + c, max_prompt_words=prompt_words, texts=texts)
        plans.append([LoadCall(c, i, call.context, call.prompt) for i, call in enumerate(trace.calls)])
    return plans


def app_name(client: int) -> str:
    return f"load-{client}"


# ----------------------------------------------------------------------------- the client processes

def _client_main(spec_path: str, out_path: str) -> int:
    """One client process: bind, make its contexts, say ready, wait until every client is, make its calls."""
    from workbench.kvcache.client import connect
    from workbench.workers import ready

    spec = json.loads(Path(spec_path).read_text())
    calls = [LoadCall(**c) for c in spec["calls"]]
    replies, errors = [], []
    with connect(app_name(spec["client"]), spec["address"]) as llm:
        stubs = [llm.new_ctx(SYSTEM_PROMPT) for _ in range(spec["contexts"])]
        ready()
        for call in calls:
            t0 = time.perf_counter()
            try:
                text, stats = llm.call_with_stats(stubs[call.context], call.prompt, spec["max_new_tokens"])
            except WorkbenchError as exc:
                errors.append(f"client {call.client} call {call.index}: {type(exc).__name__}: {exc}")
                continue
            replies.append(LoadReply(call.client, call.index, call.context, text, stats.tick,
                                     time.perf_counter() - t0, stats.queue_wait_s, stats.switch_s))
            print("done", flush=True)
    Path(out_path).write_text(json.dumps({"replies": [asdict(r) for r in replies], "errors": errors}))
    return 0


def run_load(address: str, plans: list[list[LoadCall]], max_new_tokens: int = 2,
             workdir: Path | str | None = None, progress=None) -> LoadRun:
    """Start one process per client plan, release them together once all are bound, wait for all.
    ``progress(done, total)`` is called every few seconds with the calls answered so far."""
    with tempfile.TemporaryDirectory(prefix="llms-load-", dir=workdir) as tmp:
        for c, calls in enumerate(plans):
            (Path(tmp) / f"client-{c}.json").write_text(json.dumps({
                "client": c, "address": address, "max_new_tokens": max_new_tokens,
                "contexts": 1 + max(call.context for call in calls), "calls": [asdict(call) for call in calls]}))
        group = WorkerGroup(lambda c: [sys.executable, "-m", "workbench.kvcache.loadtest",
                                       str(Path(tmp) / f"client-{c}.json"), str(Path(tmp) / f"client-{c}.out")],
                            len(plans), name="load-client", logs=tmp, ready="signal", ready_timeout_s=BIND_TIMEOUT_S,
                            fail_fast=False)
        try:
            group.start()
        except WorkerFailed as exc:
            failed = next(e for e in exc.exits if e is not None and e.failed)
            raise WorkbenchError(f"load client {failed.rank} could not bind to the service on {address}: "
                                 f"{exc}") from None
        with group:
            total, next_report = sum(len(p) for p in plans), group.released_at + 5.0
            while not group.wait(timeout=0.25):
                if progress is not None and time.perf_counter() >= next_report:
                    progress(sum(_answered(w.log) for w in group.workers), total)
                    next_report += 5.0
            wall = time.perf_counter() - group.released_at
        replies, errors = [], []
        for c, ended in enumerate(group.exits):
            out = Path(tmp) / f"client-{c}.out"
            if ended.returncode != 0 or not out.exists():
                errors.append(f"client {c} {ended.why}: {(ended.log_tail.splitlines() or [''])[-1]}")
                continue
            got = json.loads(out.read_text())
            replies += [LoadReply(**r) for r in got["replies"]]
            errors += got["errors"]
    contexts = sum(1 + max(call.context for call in calls) for calls in plans)
    return LoadRun(clients=len(plans), calls_per_client=max(len(p) for p in plans), contexts=contexts,
                      max_new_tokens=max_new_tokens, wall_s=wall,
                      replies=tuple(sorted(replies, key=lambda r: r.tick)), errors=tuple(errors))


BIND_TIMEOUT_S = 600.0
"""How long a load client may take to bind and make its contexts before the load gives up on it."""


def _answered(log: Path) -> int:
    """The calls a client answered so far: the "done" lines of its log."""
    try:
        return log.read_text(errors="replace").splitlines().count("done")
    except OSError:
        return 0


# ----------------------------------------------------------------------------- the check

def reference_replies(plans: list[list[LoadCall]], result: LoadRun, *, memory_budget_bytes: int,
                      method: str = "llms", model=None, swap_dir: Path | str | None = None,
                      progress=None) -> dict[tuple[int, int], str]:
    """(client, index) -> the reply one process gets making the load's calls in the order the service served
    them (its call counter), on a fresh service of the same ``method`` and budget. Calls the service
    never answered are left out (they are reported as missing)."""
    from workbench.kvcache.service import LLMService

    by_key = {(call.client, call.index): call for calls in plans for call in calls}
    order = [by_key[(r.client, r.index)] for r in sorted(result.replies, key=lambda r: r.tick)]
    out = {}
    with tempfile.TemporaryDirectory(prefix="llms-reference-") as tmp, \
            LLMService(model, swap_dir or tmp, memory_budget_bytes, config=load_config(method)) as svc:
        sessions = {c: svc.bind(app_name(c)) for c in range(len(plans))}
        stubs = {(c, k): sessions[c].new_ctx(SYSTEM_PROMPT) for c, calls in enumerate(plans)
                 for k in range(1 + max(call.context for call in calls))}
        for n, call in enumerate(order):
            out[(call.client, call.index)] = sessions[call.client].call(stubs[(call.client, call.context)],
                                                                       call.prompt, result.max_new_tokens)
            if progress is not None:
                progress(n + 1, len(order))
    return out


def check_replies(plans: list[list[LoadCall]], result: LoadRun, reference: dict[tuple[int, int], str]) -> list[str]:
    """What is wrong with a load run, one line each: client errors, calls without a reply, calls answered
    twice, replies that differ from the single-process run's. Empty when nothing is."""
    problems = list(result.errors)
    seen: dict[tuple[int, int], LoadReply] = {}
    for r in result.replies:
        if (r.client, r.index) in seen:
            problems.append(f"client {r.client} call {r.index} was answered twice")
        seen[(r.client, r.index)] = r
    ticks = [r.tick for r in result.replies]
    if len(set(ticks)) != len(ticks):
        problems.append("the service gave two calls the same call counter")
    for calls in plans:
        for call in calls:
            got = seen.get((call.client, call.index))
            if got is None:
                problems.append(f"client {call.client} call {call.index} got no reply")
            elif got.context != call.context:
                problems.append(f"client {call.client} call {call.index} came back for context {got.context}, "
                                f"not {call.context}")
            elif got.text != reference.get((call.client, call.index)):
                problems.append(f"client {call.client} call {call.index} (context {call.context}) answered "
                                f"{got.text!r}; one process making the same calls got "
                                f"{reference.get((call.client, call.index))!r}")
    return problems


# ----------------------------------------------------------------------------- a served service

LOAD_CONTEXT_TOKENS = 2048
"""The context limit of the load's service (``--max-context-tokens``): far above what a client's calls
reach, and a working-cache reserve small beside the default budget."""


def budget_bytes(memory_mb: float, model=None) -> int:
    """The budget the load's service gets: ``memory_mb`` for chunks beside the working cache reserved for
    a call of :data:`LOAD_CONTEXT_TOKENS` (the reference must use the same)."""
    from workbench.kvcache.chunks import working_nbytes
    from workbench.models.config import shipped_decoder_config

    return int(memory_mb * 1e6) + working_nbytes(model.cfg if model is not None else shipped_decoder_config(),
                                                 LOAD_CONTEXT_TOKENS)


def load_config(method: str = "llms"):
    """The configuration of the load's service: ``method``'s preset at :data:`LOAD_CONTEXT_TOKENS`."""
    from dataclasses import replace

    from workbench.kvcache.config import ServiceConfig

    return replace(ServiceConfig.preset(method), max_context_tokens=LOAD_CONTEXT_TOKENS)


@contextmanager
def served(swap_dir: Path | str, memory_mb: float, method: str = "llms", address: str | None = None,
           timeout_s: float = 300.0) -> Iterator[str]:
    """`workbench serve llms` in a process of its own on ``address`` (a Unix socket in ``swap_dir`` by
    default) with ``memory_mb`` for chunks (:func:`budget_bytes`, :func:`load_config`); yields the address
    once it serves, stops it with SIGTERM after."""
    address = address or f"unix:{Path(swap_dir) / 'llms.sock'}"
    cmd = [sys.executable, "-m", "workbench.cli", "serve", "llms", "--address", address, "--swap-dir",
           str(swap_dir), "--memory-mb", repr(budget_bytes(memory_mb) / 1e6), "--method", method,
           "--max-context-tokens", str(LOAD_CONTEXT_TOKENS)]
    with WorkerGroup(cmd, name="serve-llms", ready=r"^llms: serving on", ready_timeout_s=timeout_s, grace_s=60,
                     fail_fast=False):
        yield address


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(_client_main(sys.argv[1], sys.argv[2]))
