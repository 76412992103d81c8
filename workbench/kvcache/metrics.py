"""The service's counters in Prometheus text format, on a registry of its own (never the process-wide
one, so several services in one process do not clash), served on a loopback port on request."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

SWITCH_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServiceMetrics:
    """Counters of one LLM service: swaps, recomputes, switching time, memory per level, evictions, queue wait."""

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.calls = Counter("llms_calls", "LLM calls served", registry=r)
        self.swap_ins = Counter("llms_swap_ins", "Chunks read from their swap files", registry=r)
        self.swap_outs = Counter("llms_swap_outs", "Chunk files written", ["when"], registry=r)
        self.recomputed = Counter("llms_recomputed_chunks", "Chunks recomputed from their tokens", registry=r)
        self.bytes_read = Counter("llms_swap_in_bytes", "Bytes read from swap files", registry=r)
        self.bytes_written = Counter("llms_swap_out_bytes", "Bytes written to swap files", registry=r)
        self.switch_seconds = Counter("llms_switch_seconds", "Time making room for and bringing in the served "
                                      "context's missing chunks, before inference", registry=r)
        self.switch_parts = Counter("llms_switch_part_seconds", "Switching time by part: reclaim (evicting "
                                    "others), load (missing chunks into memory), dequantize (chunks into the "
                                    "decoder's cache)", ["part"], registry=r)
        self.recompute_seconds = Counter("llms_recompute_seconds", "Part of the switching time spent recomputing",
                                         registry=r)
        self.recompute_share = Gauge("llms_recompute_share_of_switch", "Share of all switching time spent "
                                     "recomputing", registry=r)
        self.switch_latency = Histogram("llms_switch_latency_seconds", "Switching latency per call",
                                        buckets=SWITCH_BUCKETS, registry=r)
        self.queue_wait = Histogram("llms_queue_wait_seconds", "Time a call waited for the model",
                                    buckets=SWITCH_BUCKETS, registry=r)
        self.memory_bytes = Gauge("llms_memory_bytes", "Bytes of chunks in memory per level", ["bits"], registry=r)
        self.budget_bytes = Gauge("llms_memory_budget_bytes", "The memory budget for chunks", registry=r)
        self.evictions = Counter("llms_evictions", "Chunks evicted, by policy and action", ["policy", "action"],
                                 registry=r)
        self.contexts = Gauge("llms_contexts", "Contexts held (in memory or not)", registry=r)
        self.damaged_files = Counter("llms_damaged_chunk_files", "Swap files that failed their size or CRC-32 "
                                     "check when read; each chunk was recomputed from its tokens", registry=r)

    def record_call(self, stats) -> None:
        self.calls.inc()
        self.swap_ins.inc(stats.chunks_loaded)
        self.recomputed.inc(stats.chunks_recomputed)
        self.bytes_read.inc(stats.bytes_read)
        self.switch_seconds.inc(stats.switch_s)
        for part in ("reclaim", "load", "dequantize"):
            self.switch_parts.labels(part=part).inc(getattr(stats, f"{part}_s"))
        self.recompute_seconds.inc(stats.recompute_s)
        self.switch_latency.observe(stats.switch_s)
        self.queue_wait.observe(stats.queue_wait_s)
        total = self.registry.get_sample_value("llms_switch_seconds_total") or 0.0
        spent = self.registry.get_sample_value("llms_recompute_seconds_total") or 0.0
        self.recompute_share.set(spent / total if total > 0 else 0.0)

    def record_writes(self, chunks: int, nbytes: int, when: str) -> None:
        """``when``: ``ahead_of_time`` (as a call returns) or ``eviction``."""
        self.swap_outs.labels(when=when).inc(chunks)
        self.bytes_written.inc(nbytes)

    def record_damaged(self, chunks: int) -> None:
        self.damaged_files.inc(chunks)

    def record_eviction(self, policy: str, action: str) -> None:
        self.evictions.labels(policy=policy, action=action).inc()

    def set_memory(self, by_level: dict[int, int], budget: int, contexts: int) -> None:
        for bits in (32, 16, 8, 4, 2):
            self.memory_bytes.labels(bits=str(bits)).set(by_level.get(bits, 0))
        self.budget_bytes.set(budget)
        self.contexts.set(contexts)

    def text(self) -> str:
        return generate_latest(self.registry).decode()

    def values(self) -> dict[str, float]:
        """Every sample as ``name{label="v",...}`` -> value (for the JSON snapshot)."""
        out = {}
        for family in self.registry.collect():
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def start_server(self, port: int = 0):
        """Serve ``/metrics`` on 127.0.0.1:``port`` (0: any free port) in a background thread;
        returns the HTTP server (its ``server_port`` is the port) and the thread."""
        return start_http_server(port, addr="127.0.0.1", registry=self.registry)
