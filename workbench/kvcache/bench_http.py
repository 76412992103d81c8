"""`workbench bench llms --tables http`: what context reuse buys a client of the OpenAI-compatible endpoint.

Two scenarios, each served twice through the real endpoint (uvicorn on loopback, streamed requests
read as server-sent events):

* ``conversation``: one conversation of ``--http-turns`` turns;
* ``interleaved``: ``--http-conversations`` conversations taking turns round-robin, ``--http-rounds``
  turns each, under a chunk budget of ``--http-memory-mb`` beside the working cache, so contexts are
  compressed, evicted and swapped back as LLMS does.

``llms`` continues each conversation's context; ``reprocess`` is the same decoder and endpoint with
context reuse off: every turn is a new context holding the whole conversation, deleted after it (what a
server without a prompt cache does). The ``reprocess`` run sends exactly the requests the ``llms`` run
sent (the same messages, the ``llms`` run's answers in them), in the same order, so both process the same
conversations.

Per row: time to first token (from sending the request to the first text event; mean and median over
the turns), decode rate (tokens after the first over the time from the first to the last), the prompt
tokens the model processed against those the requests held, the service's mean switch and the chunks
it swapped in, recomputed and evicted, and the wall time.
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace

WORDS = ("river", "lamp", "orbit", "garden", "engine", "winter", "harbor", "violin", "desert", "signal", "forest",
         "copper", "planet", "bridge", "market", "canvas", "thunder", "island", "mirror", "ladder")
CONTEXT_TOKENS = 2048
"""The context limit of the bench's services: the working cache reserved for a call stays small."""


def tokens_per_turn(words: int, new_tokens: int) -> int:
    """A generous bound on what one turn adds to a conversation: the user turn (two tokens a word and
    its framing) and the answer."""
    return 2 * words + 32 + new_tokens


@dataclass(frozen=True)
class Turn:
    """One streamed request as a client saw it."""
    conversation: int
    ttft_s: float
    total_s: float
    decode_s: float
    completion_tokens: int
    prompt_tokens: int
    processed_tokens: int
    text: str
    switch_s: float = 0.0
    swapped_in: int = 0
    recomputed: int = 0
    evictions: int = 0


def prompt(conversation: int, turn: int, words: int) -> str:
    picked = [WORDS[(conversation * 7 + turn * 3 + i * i) % len(WORDS)] for i in range(words)]
    return f"Conversation {conversation + 1}, turn {turn + 1}: tell me how these fit together: {', '.join(picked)}."


def stream_turn(base: str, key: str, model_id: str, messages: list[dict], max_tokens: int, conversation: int) -> Turn:
    """One streamed chat completion over HTTP, timed at the client."""
    body = json.dumps({"model": model_id, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(base + "/chat/completions", data=body, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    t0 = time.perf_counter()
    first = last = None
    pieces, usage, stats = [], None, {}
    try:
        reply = urllib.request.urlopen(req, timeout=600)
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"the endpoint refused a turn of conversation {conversation + 1} ({exc.code}): "
                           f"{json.loads(exc.read())['error']['message']}") from None
    with reply:
        for raw in reply:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                raise RuntimeError(f"the endpoint failed mid-stream: {event['error']['message']}")
            for choice in event.get("choices", []):
                text = choice["delta"].get("content")
                if text:
                    last = time.perf_counter()
                    first = first or last
                    pieces.append(text)
            if event.get("usage"):
                usage, stats = event["usage"], event.get("llms", {})
    end = time.perf_counter()
    first = first or end
    return Turn(conversation=conversation, ttft_s=first - t0, total_s=end - t0, decode_s=(last or first) - first,
                completion_tokens=usage["completion_tokens"], prompt_tokens=usage["prompt_tokens"],
                processed_tokens=stats.get("prompt_tokens", usage["prompt_tokens"]), text="".join(pieces),
                switch_s=stats.get("switch_s", 0.0), swapped_in=stats.get("chunks_loaded", 0),
                recomputed=stats.get("chunks_recomputed", 0), evictions=stats.get("evictions", 0))


def scenario_requests(conversations: int, turns: int, words: int) -> list[tuple[int, str]]:
    """(conversation, user prompt) in the order they are sent: round-robin over the conversations."""
    return [(c, prompt(c, t, words)) for t in range(turns) for c in range(conversations)]


def serve_and_run(model, *, reuse: bool, memory_bytes: int | None, plan: list[tuple[int, str]],
                  sent: list[list[dict]] | None, max_tokens: int, progress=None) -> tuple[list[Turn], list[list[dict]]]:
    """Serve a fresh service through the endpoint and send ``plan``'s turns; with ``sent`` (an earlier
    run's requests), send those exactly instead. Returns the turns and the requests sent."""
    from workbench.kvcache.config import ServiceConfig
    from workbench.kvcache.endpoint import MODEL_ID, ChatEndpoint, HTTPServer
    from workbench.kvcache.service import LLMService
    from workbench.kvcache.chunks import working_nbytes
    from workbench.listen import bind_tcp

    config = replace(ServiceConfig.preset("llms"), max_context_tokens=CONTEXT_TOKENS)
    reserve = working_nbytes(model.cfg, CONTEXT_TOKENS, config.base_bits)
    budget = reserve + (memory_bytes if memory_bytes is not None else 1 << 30)
    with tempfile.TemporaryDirectory(prefix="llms-http-bench-") as swap:
        service = LLMService(model, swap, memory_budget_bytes=budget, config=config)
        endpoint = ChatEndpoint(service, reuse=reuse)
        key = endpoint.keys.add("bench")
        server = HTTPServer(endpoint, bind_tcp(0)).start()
        try:
            histories: dict[int, list[dict]] = {}
            turns, requests = [], []
            for i, (conv, user) in enumerate(plan):
                if sent is not None:
                    messages = sent[i]
                else:
                    messages = histories.setdefault(conv, []) + [{"role": "user", "content": user}]
                turn = stream_turn(server.url, key, MODEL_ID, messages, max_tokens, conv)
                turns.append(turn)
                requests.append(messages)
                histories[conv] = messages + [{"role": "assistant", "content": turn.text}]
                if progress is not None:
                    progress(i + 1, len(plan))
        finally:
            server.stop()
            service.close()
    return turns, requests


def summarize(scenario: str, server: str, turns: list[Turn], wall_s: float, memory_mb: float | None) -> dict:
    decode = [(t.completion_tokens - 1) / t.decode_s for t in turns if t.completion_tokens > 1 and t.decode_s > 0]
    return {"scenario": scenario, "server": server, "turns": len(turns),
            "conversations": len({t.conversation for t in turns}),
            "memory_mb": memory_mb if memory_mb is not None else float("nan"),
            "ttft_mean_ms": 1e3 * statistics.fmean(t.ttft_s for t in turns),
            "ttft_p50_ms": 1e3 * statistics.median(t.ttft_s for t in turns),
            "ttft_last_turn_ms": 1e3 * turns[-1].ttft_s,
            "decode_tokens_per_s": statistics.fmean(decode) if decode else float("nan"),
            "completion_tokens": sum(t.completion_tokens for t in turns),
            "prompt_tokens": sum(t.prompt_tokens for t in turns),
            "processed_tokens": sum(t.processed_tokens for t in turns),
            "switch_mean_ms": 1e3 * statistics.fmean(t.switch_s for t in turns),
            "chunks_swapped_in": sum(t.swapped_in for t in turns), "chunks_recomputed": sum(t.recomputed for t in turns),
            "evictions": sum(t.evictions for t in turns), "wall_s": wall_s}


def http_table(opts, model) -> list[dict]:
    """The two scenarios, each with context reuse (``llms``) and without (``reprocess``)."""
    rows = []
    scenarios = (("conversation", 1, opts.http_turns, None),
                 ("interleaved", opts.http_conversations, opts.http_rounds, opts.http_memory_mb))
    for name, conversations, turns, memory_mb in scenarios:
        plan = scenario_requests(conversations, turns, opts.http_prompt_words)
        sent = None
        for server, reuse in (("llms", True), ("reprocess", False)):
            t0 = time.perf_counter()
            step = max(1, len(plan) // 5)

            def progress(done, n, server=server, t0=t0):
                if done % step == 0 or done == n:
                    print(f"  http {name} {server}: {done}/{n} turns ({time.perf_counter() - t0:.0f} s)", flush=True)

            got, requests = serve_and_run(model, reuse=reuse, memory_bytes=None if memory_mb is None
                                          else round(memory_mb * 1e6), plan=plan, sent=sent,
                                          max_tokens=opts.http_new_tokens, progress=progress)
            sent = sent or requests
            rows.append(summarize(name, server, got, time.perf_counter() - t0, memory_mb))
    return rows


def report(rows: list[dict]) -> None:
    for r in rows:
        print(f"http {r['scenario']} ({r['conversations']} conversations, {r['turns']} turns) {r['server']}: time to "
              f"first token mean {r['ttft_mean_ms']:.0f} ms (median {r['ttft_p50_ms']:.0f}, last turn "
              f"{r['ttft_last_turn_ms']:.0f}), decode {r['decode_tokens_per_s']:.1f} tokens/s, processed "
              f"{r['processed_tokens']} of {r['prompt_tokens']} prompt tokens, switch {r['switch_mean_ms']:.1f} ms "
              f"({r['chunks_swapped_in']} chunks swapped in, {r['chunks_recomputed']} recomputed, {r['evictions']} "
              f"evicted), {r['wall_s']:.1f} s", flush=True)
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        by = {r["server"]: r for r in rows if r["scenario"] == scenario}
        if {"llms", "reprocess"} <= set(by):
            print(f"http {scenario}: context reuse cuts the mean time to first token "
                  f"{by['reprocess']['ttft_mean_ms'] / by['llms']['ttft_mean_ms']:.2f}x "
                  f"({by['reprocess']['ttft_mean_ms']:.0f} -> {by['llms']['ttft_mean_ms']:.0f} ms)", flush=True)
