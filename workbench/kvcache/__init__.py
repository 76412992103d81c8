"""LLMS: an LLM context service keeping many KV-cache contexts in chunks (compressed by tolerance,
swapped and recomputed in a pipeline, evicted by an LCTRU queue).

The public names are importable from here (``from workbench.kvcache import LLMService, assign_levels``);
each is loaded on first use, so importing the package stays cheap (the service and recompute pull in
torch, the swap/recompute planner scipy).
"""
from workbench.lazy import lazy_exports

_EXPORTS = {
    "LLMService": "service", "AppSession": "service", "CtxStub": "protocol", "ServiceConfig": "config",
    "information_density": "density", "assign_levels": "density",
    "LCTRUQueue": "lifecycle",
    "recompute_chunks": "recompute",
    "plan_swap_recompute": "planner",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
