"""What the LLM context service (LLMS) brings to the workbench: prepare steps, commands, its service,
its benchmark, page and notebooks."""
from __future__ import annotations

from workbench.kvcache import commands
from workbench.mechanisms import Command, Dashboard, InfoSection, Mechanism, Notebook, OverviewSection, PrepareStep

COSTS_STEP = "llms swap costs: host"
REPLAYS_STEP = "llms replays: default trace"


def _costs(preset: str, progress: bool, force: bool) -> str:
    from workbench.kvcache.costmodel import profile_host
    from workbench.models.decoder import load_decoder

    costs = profile_host(load_decoder(), remeasure=force)
    return (f"recompute {1e3 * costs.t_re(1):.0f} ms per chunk, swap-in of an 8-bit chunk "
            f"{1e3 * costs.t_io(costs.chunk_bytes[8]):.2f} ms")


def _costs_ready(preset: str) -> bool:
    """Whether the host's cost model is cached, read from the converted decoder's config (no weights loaded)."""
    import json
    from types import SimpleNamespace

    from workbench.assets import converted_decoder_path

    config = converted_decoder_path() / "config.json"
    if not config.exists():
        return False
    from workbench.kvcache.costmodel import host_cost_path
    from workbench.models.config import DecoderConfig

    cfg = DecoderConfig(**json.loads(config.read_text()))
    return host_cost_path(SimpleNamespace(cfg=cfg)).exists()


def _replays(preset: str, progress: bool, force: bool) -> str:
    from workbench.kvcache.artifacts import prepare_replays

    return prepare_replays(preset, progress=progress, force=force)


def _replays_ready(preset: str) -> bool:
    from workbench.kvcache.artifacts import replays_ready

    return replays_ready(preset)


def _steps(preset: str) -> list[PrepareStep]:
    return [
        PrepareStep(name=COSTS_STEP, run=_costs, ready=_costs_ready, estimate_s={"full": 60, "quick": 60}),
        # full: 900 s were measured with 4 tokens a call; with one token the five replays took 0.61 of the time
        # (433 s against 714 s, back to back on one busy 2-core host), hence 550.
        PrepareStep(name=REPLAYS_STEP, run=_replays, ready=_replays_ready, estimate_s={"full": 550, "quick": 140}),
    ]


def _info(preset: str) -> InfoSection:
    """The prepared replays' mean switching latency per method (None where they are not prepared)."""
    from workbench.kvcache.artifacts import DEFAULTS, default_replays, replays_ready

    if not replays_ready(preset):
        return InfoSection(data={"replays": None}, lines=("replays   not prepared",))
    means = {m: r.mean_switch_s() for m, r in default_replays(preset).items()}
    device = DEFAULTS[preset]["device"]
    return InfoSection(data={"replays": {"device": device, "mean_switch_s": means}},
                       lines=(f"replays   mean switching latency on {device}: "
                              + ", ".join(f"{m} {1e3 * s:.1f} ms" for m, s in means.items()),))


def _test_artifacts(preset: str) -> dict[str, object]:
    """The replays of the preset's default trace under every method."""
    from workbench.kvcache.artifacts import default_replays, prepare_replays

    prepare_replays(preset)
    return {"replays": default_replays(preset)}


MECHANISM = Mechanism(
    name="kvcache",
    title="LLM context service (LLMS)",
    paper="LLMS: KV-cache contexts in chunks, compressed by tolerance, swapped and recomputed, evicted by LCTRU",
    prepare_steps=_steps,
    commands=(
        Command(name="trace", help="synthesize a context-switching trace (Poisson calls, a switching pattern)",
                configure=commands.configure_trace),
        Command(name="costs", help="the swap cost model of the host (measured) or an emulated device",
                configure=commands.configure_costs),
        Command(name="call", help="call a running `workbench serve llms` service from the command line",
                configure=commands.configure_call),
    ),
    servers=(Command(name="llms", help="the LLM context service on a Unix socket or 127.0.0.1",
                     configure=commands.configure_serve),),
    benchmarks={"llms": "workbench.kvcache.bench"},
    dashboard=Dashboard(
        page="kvcache.ipynb", title="LLM context service (LLMS)",
        summary="memory budget, contexts, compression ratio, switching pattern and device -> the KV-chunk map "
                "through a trace, the LCTRU queue, evictions with their reasons, switching latency of LLMS and "
                "its baselines, the swap/recompute pipeline of a call",
        requires=(COSTS_STEP, REPLAYS_STEP), probe_control="Call", probe_figure="chunks",
        ends=(("Active contexts", "max"), ("Calls", 1000), ("Call", "max")),
        panel="workbench.ui.kvcache:KVCachePanel"),
    notebooks=(
        Notebook(path="kvcache_service.ipynb", title="The LLM context service: a tutorial", kind="tutorial"),
        Notebook(path="labs/kvcache_lab.ipynb", title="The LLM context service: a teaching lab", kind="lab"),
        Notebook(path="kvcache_evaluation.ipynb", title="The LLM context service beside the paper",
                 kind="evaluation"),
    ),
    info=_info,
    overview=OverviewSection(title="LLM context service (LLMS): switching latency of the prepared replays",
                             panel="workbench.ui.kvcache:KVCacheOverview", requires=(REPLAYS_STEP,)),
    test_artifacts=_test_artifacts,
)
