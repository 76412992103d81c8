"""The peak resident memory of one LLMS call, measured in a fresh process (`workbench bench llms --tables memory`).

A context is made and kept on disk by one process; a second opens the service on that swap directory
(nothing in memory), touches the weights with a tiny call, then makes one call on the context: the
switch loads and dequantizes every chunk, then inference and compression run. Its peak resident
memory (``VmHWM``, reset through ``/proc/self/clear_refs``) above the process before the call is the
call's own, not the context's making nor the model's.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

MEMORY_NEW_TOKENS = 4


def _status_mb(field: str) -> float:
    """A memory figure of this process from /proc/self/status (``VmRSS`` now, ``VmHWM`` its peak), in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak_rss() -> None:
    """Start ``VmHWM`` again from the current resident memory (Linux's clear_refs, value 5)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def memory_probe(swap_dir: str, tokens: int, build: bool) -> dict:
    """Run in a fresh process by :func:`memory_table`. ``build``: make a context of about ``tokens``
    tokens (one call whose prompt is held-out text of that length) and keep it in ``swap_dir``.
    Otherwise: open the service on ``swap_dir`` (nothing in memory), then make one call on that context
    (switch: load every chunk, dequantize; then inference and compression) and report the call's peak
    resident memory above the process before it (after a first tiny call has touched the weights)."""
    from workbench.data import heldout_text
    from workbench.kvcache.chunks import working_nbytes
    from workbench.kvcache.service import CtxStub, LLMService
    from workbench.models.decoder import decoder_tokenizer, load_decoder

    model = load_decoder()
    stub_file = Path(swap_dir) / "bench-stub"
    with LLMService(model, swap_dir, memory_budget_bytes=1 << 32) as svc:
        app = svc.bind("bench")
        if build:
            tok = decoder_tokenizer()
            ids = tok.encode(heldout_text(400))[:tokens]
            stub = app.new_ctx()
            app.call(stub, tok.decode(ids), max_new_tokens=1)
            stub_file.write_text(stub.token)
            return {}
        warm = app.new_ctx()                 # the first call touches the mapped weights: not the call's memory
        app.call(warm, "Hi.", max_new_tokens=1)
        app.delete(warm)
        _reset_peak_rss()
        before = _status_mb("VmRSS")
        _, stats = app.call_with_stats(CtxStub(stub_file.read_text()), "Go on.", MEMORY_NEW_TOKENS)
        peak = _status_mb("VmHWM")
        ctx = svc._contexts[stats.ctx]
        return {"context_tokens": stats.context_tokens, "at_rest_mb": sum(r.nbytes for r in ctx.chunks) / 1e6,
                "working_cache_mb": working_nbytes(model.cfg, stats.context_tokens, svc.config.base_bits) / 1e6,
                "rss_before_call_mb": before, "peak_rss_mb": peak, "call_peak_over_before_mb": peak - before,
                "switch_ms": 1e3 * stats.switch_s, "dequantize_ms": 1e3 * stats.dequantize_s}


def memory_table(opts) -> list[dict]:
    """Peak resident memory of one call on a context of each of ``--memory-tokens`` lengths, each measured
    in a fresh process (so the peak is the call's, not the context's making)."""
    rows = []
    for tokens in opts.memory_tokens:
        with tempfile.TemporaryDirectory(prefix="llms-memory-") as swap_dir:
            for build in (True, False):
                code = ("import json, sys; from workbench.kvcache.memory import memory_probe; "
                        f"print(json.dumps(memory_probe({swap_dir!r}, {tokens}, {build})))")
                run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
                if run.returncode != 0:
                    raise SystemExit(f"workbench bench llms: the memory probe at {tokens} tokens failed: "
                                     f"{run.stderr.strip().splitlines()[-1] if run.stderr.strip() else run.returncode}")
            row = {"requested_tokens": tokens, **json.loads(run.stdout.strip().splitlines()[-1])}
        print(f"memory: a call on {row['context_tokens']} tokens ({row['at_rest_mb']:.1f} MB at rest, working cache "
              f"{row['working_cache_mb']:.1f} MB in float16): peak RSS {row['peak_rss_mb']:.0f} MB, "
              f"{row['call_peak_over_before_mb']:.0f} MB over the process before the call", flush=True)
        rows.append(row)
    return rows
