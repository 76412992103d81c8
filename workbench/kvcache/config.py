"""How the LLM context service keeps contexts: ``ServiceConfig`` and the paper's baselines and ablations
as presets of it, with the checks every field gets when a configuration is made.

Torch-free, so commands can offer the presets and devices before anything heavy is imported.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass

from workbench.errors import UnknownNameError, WorkbenchError
from workbench.kvcache.chunks import CHUNK_SIZE, HALF_BITS, LEVELS
from workbench.devices import profile_names
from workbench.kvcache.density import assign_levels
from workbench.kvcache.lifecycle import check_policy

DEFAULT_MEMORY_BUDGET = 512 << 20
DEFAULT_MAX_CONTEXTS_PER_APP = 16
SWAP_DEVICES = tuple(profile_names("llms"))
"""Where the service's swapping-recompute pipeline plans: this host, measured, or an emulated preset."""

COMPRESSIONS = ("tolerance", "static8", "none")
GRANULARITIES = ("chunk", "context")
EVICTIONS = ("swap", "kill")
LOADINGS = ("pipeline", "swap_only")


MAX_CHUNK_SIZE = 8192
"""The most tokens a chunk may hold: the shipped decoder's whole context."""


def _one_of(field_name: str, value, allowed) -> None:
    if value not in allowed:
        raise UnknownNameError(field_name, value, allowed)


def check_whole(field_name: str, value, low: int, high: int | None, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise WorkbenchError(f"{field_name} is a whole number {bound} {unit}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    """How the service keeps contexts; LLMS by default, the paper's baselines by other values.

    compression: ``tolerance`` (8-bit chunks, full ones lowered to 4/2 bits by density), ``static8``
    (every chunk 8-bit, vLLM-SQ) or ``none`` (raw float16 chunks, as the paper's FP16 baselines: vLLM-S).
    granularity: ``chunk`` or ``context`` (whole contexts leave memory together).
    eviction: ``swap`` (to files) or ``kill`` (LMK: KV dropped, recomputed from the tokens; no files).
    policy: ``lctru``, ``lru`` or ``density`` (see ``lifecycle``).
    aot_swap_out: write changed chunks as a call returns (off: only at eviction).
    loading: ``pipeline`` or ``swap_only``; handed to the loader, which decides how to honour it.
    """
    compression: str = "tolerance"
    global_ratio: float = 0.5
    levels: tuple[int, ...] = LEVELS
    chunk_size: int = CHUNK_SIZE
    granularity: str = "chunk"
    eviction: str = "swap"
    policy: str = "lctru"
    aot_swap_out: bool = True
    loading: str = "pipeline"
    max_context_tokens: int | None = None

    def __post_init__(self):
        """Every field is checked here, so a configuration the call path cannot honour never reaches it."""
        _one_of("compression", self.compression, COMPRESSIONS)
        _one_of("granularity", self.granularity, GRANULARITIES)
        _one_of("eviction", self.eviction, EVICTIONS)
        _one_of("loading", self.loading, LOADINGS)
        check_policy(self.policy)
        levels = self.levels
        if (not isinstance(levels, tuple) or not levels or any(type(b) is not int for b in levels)
                or any(b not in LEVELS for b in levels) or list(levels) != sorted(set(levels), reverse=True)
                or levels[0] != LEVELS[0]):
            raise WorkbenchError(f"levels are distinct bit widths from {LEVELS} in descending order, starting at the "
                                 f"{LEVELS[0]}-bit base, e.g. (8, 4, 2) or (8, 2); got {levels!r}")
        ratio = self.global_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio):
            raise WorkbenchError(f"global_ratio is a number from {LEVELS[-1] / 8:g} to 1, got {ratio!r}")
        check_whole("chunk_size", self.chunk_size, 1, MAX_CHUNK_SIZE, "tokens")
        if self.max_context_tokens is not None:
            check_whole("max_context_tokens", self.max_context_tokens, 1, None, "tokens")
        if not isinstance(self.aot_swap_out, bool):
            raise WorkbenchError(f"aot_swap_out is True or False, got {self.aot_swap_out!r}")
        assign_levels([1.0], self.levels, self.global_ratio)            # names a ratio the levels cannot reach

    @property
    def base_bits(self) -> int:
        """Bits of a chunk as a call writes it."""
        return HALF_BITS if self.compression == "none" else 8

    @property
    def writes_ahead(self) -> bool:
        return self.eviction == "swap" and self.aot_swap_out

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def preset(cls, name: str) -> ServiceConfig:
        if name not in PRESETS:
            raise UnknownNameError("service preset", name, PRESETS)
        return PRESETS[name]


_BASELINE = dict(policy="lru", aot_swap_out=False, loading="swap_only")
PRESETS: dict[str, ServiceConfig] = {
    "llms": ServiceConfig(),
    "vllm_sq": ServiceConfig(compression="static8", **_BASELINE),
    "vllm_s": ServiceConfig(compression="none", **_BASELINE),
    "swapping": ServiceConfig(compression="none", granularity="context", **_BASELINE),
    "lmk": ServiceConfig(compression="none", granularity="context", eviction="kill", **_BASELINE),
    "llms_without_lifecycle": ServiceConfig(policy="lru", aot_swap_out=False),
    "llms_without_compression": ServiceConfig(compression="static8"),
    "llms_without_pipeline": ServiceConfig(loading="swap_only"),
}
"""The paper's baselines (section 4) and ablations (section 5.3) as service configurations."""
