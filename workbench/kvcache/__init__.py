"""LLMS: an LLM context service keeping many KV-cache contexts in chunks (compressed by tolerance,
swapped and recomputed in a pipeline, evicted by an LCTRU queue)."""
