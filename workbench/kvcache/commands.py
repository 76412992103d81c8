"""`workbench serve llms` and `workbench kvcache trace|costs|call`: the LLM context service's commands.

Arguments are checked before anything loads (``workbench.argtypes``); the decoder and torch
are imported inside the commands.
"""
from __future__ import annotations

import argparse
import json

from workbench.argtypes import count, seed, tcp_port, text_file, writable_folder
from workbench.kvcache import limits
from workbench.kvcache.config import PRESETS, SWAP_DEVICES
from workbench.kvcache.traces import PATTERNS


def _serve(args) -> int:
    from dataclasses import replace

    from workbench.kvcache.server import serve
    from workbench.kvcache.config import ServiceConfig

    config = replace(ServiceConfig.preset(args.method), max_context_tokens=args.max_context_tokens)
    serve(args.address, swap_dir=args.swap_dir, memory_budget_bytes=round(args.memory_mb * 1e6),
          max_contexts_per_app=args.max_contexts_per_app, config=config,
          metrics_port=args.metrics_port, device=args.device, verbose=args.verbose, group=args.group,
          http=args.http)
    return 0


def _http_address(text: str) -> str:
    from workbench.errors import WorkbenchError
    from workbench.kvcache.endpoint import parse_http_address

    try:
        parse_http_address(text)
    except WorkbenchError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--http ")) from None
    return text


_http_address.__name__ = "loopback address"


def configure_serve(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", help="unix:PATH or tcp:127.0.0.1:PORT (default: a Unix socket in the cache)")
    parser.add_argument("--swap-dir", type=writable_folder, help="where swapped chunks and the index live "
                                                                 "(default: in the cache)")
    parser.add_argument("--memory-mb", type=limits.memory_mb, default=512.0,
                        help="KV-cache memory budget (MB): chunks in memory and the working cache of the call served")
    parser.add_argument("--max-context-tokens", type=count(1, unit="tokens", at_most=limits.decoder_tokens),
                        help="the longest context served, in tokens (default: the decoder's context); the budget "
                             "reserves the working cache of a call this long")
    parser.add_argument("--max-contexts-per-app", type=limits.contexts, default=16,
                        help="contexts one app may hold at once")
    parser.add_argument("--method", choices=tuple(PRESETS), default="llms",
                        help="LLMS, or one of the paper's baselines and ablations on the same engine")
    parser.add_argument("--metrics-port", type=tcp_port,
                        help="also serve Prometheus metrics on 127.0.0.1:PORT (0 picks a free port)")
    parser.add_argument("--device", choices=SWAP_DEVICES, default="host",
                        help="plan the swap-in pipeline for this host (measured) or pad loads to an emulated preset")
    parser.add_argument("--verbose", action="store_true",
                        help="log one line per request (by default: one per start, stop and failed request)")
    parser.add_argument("--group", type=_group, metavar="NAME",
                        help="let this group's members connect too (the socket 0660, the swap directory 0710, "
                             "both the group's); each member's apps stay its own uid's")
    parser.add_argument("--http", type=_http_address, metavar="127.0.0.1:PORT",
                        help="also serve an OpenAI-compatible chat endpoint (POST /v1/chat/completions, GET "
                             "/v1/models) on this loopback address (port 0 picks a free one); apps authenticate "
                             "with keys from `workbench serve llms keys add NAME`")
    parser.set_defaults(func=_serve)
    keys = parser.add_subparsers(dest="keys_command", metavar="keys", title="API keys of the HTTP endpoint")
    manage = keys.add_parser("keys", help="add, list or remove the bearer keys of the HTTP endpoint (--http)",
                             description="Each key names one app; it is printed once and stored only as its "
                                         "SHA-256 digest in the swap directory (0600). A running service sees a "
                                         "new key at once.")
    action = manage.add_subparsers(dest="keys_action", required=True, metavar="{add,list,remove}")
    for name, helptext in (("add", "issue a key for app NAME and print it"), ("list", "list the apps with keys"),
                           ("remove", "remove app NAME's key (its clients get 401 from then on)")):
        sub = action.add_parser(name, help=helptext)
        if name != "list":
            sub.add_argument("name", type=_key_name, help="the app's name")
        sub.add_argument("--swap-dir", type=writable_folder, help="the service's swap directory (default: in the "
                                                                  "cache)")
        sub.set_defaults(func=_keys)


def _key_name(text: str) -> str:
    from workbench.errors import WorkbenchError
    from workbench.kvcache.endpoint import APIKeys

    try:
        return APIKeys.check_name(text)
    except WorkbenchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_key_name.__name__ = "name"


def _keys(args) -> int:
    from workbench.kvcache.endpoint import APIKeys
    from workbench.kvcache.server import private_dir
    from workbench.kvcache.service import default_swap_dir

    keys = APIKeys(private_dir(args.swap_dir if args.swap_dir is not None else default_swap_dir()))
    if args.keys_action == "add":
        print(keys.add(args.name))
    elif args.keys_action == "remove":
        keys.remove(args.name)
        print(f"removed the key of {args.name}")
    else:
        for name in keys.names():
            print(name)
    return 0


def _group(name: str) -> str:
    """A group this user may give the socket to, checked before anything starts."""
    from workbench.errors import WorkbenchError
    from workbench.kvcache.server import group_id

    try:
        group_id(name)
    except WorkbenchError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--group {name}: ").removeprefix("--group: ")) from None
    return name


_group.__name__ = "group"


def _trace(args) -> int:
    from workbench.kvcache.traces import synthesize_trace

    trace = synthesize_trace(args.contexts, args.calls, args.pattern, args.mean_interval_s, args.seed)
    if args.json:
        print(json.dumps({"contexts": trace.contexts, "pattern": trace.pattern, "sources": trace.sources,
                          "calls": [c.__dict__ for c in trace.calls]}))
        return 0
    print(f"{trace.pattern} trace: {len(trace.calls)} calls over {trace.contexts} contexts, "
          f"{trace.switches()} switches, mean interval {trace.mean_interval_s:.0f} s (seed {trace.seed})")
    for c in trace.calls:
        print(f"{c.time_s:9.1f} s  context {c.context:2d} ({trace.sources[c.context]:8s})  {c.prompt[:70]}")
    return 0


def configure_trace(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--contexts", type=limits.contexts, default=4, help="active contexts the calls go to")
    parser.add_argument("--calls", type=limits.trace_calls, default=12, help="calls in the trace")
    parser.add_argument("--pattern", choices=PATTERNS, default="markov", help="how the next call's context is chosen")
    parser.add_argument("--mean-interval-s", type=limits.mean_interval_s, default=300.0,
                        help="mean seconds between calls")
    parser.add_argument("--seed", type=seed, default=0, help="seed of the trace's random draws")
    parser.add_argument("--json", action="store_true", help="print the trace as JSON")
    parser.set_defaults(func=_trace)


def _costs(args) -> int:
    from workbench.kvcache.costmodel import device_cost_model, profile_host
    from workbench.models.decoder import load_decoder

    host = profile_host(load_decoder(), args.chunk_size, remeasure=args.remeasure)
    costs = device_cost_model(args.device, host)
    if args.json:
        print(json.dumps(costs.to_dict()))
        return 0
    print(f"{costs.device} ({costs.source}): chunks of {costs.chunk_size} tokens; {costs.notes}")
    print(f"recompute: {1e3 * costs.recompute_fixed_s:.1f} ms + {1e3 * costs.recompute_per_chunk_s:.1f} ms per chunk")
    print(f"swap-in:   {1e3 * costs.io_fixed_s:.2f} ms + {1e3 * costs.io_per_chunk_s:.2f} ms per chunk + bytes at "
          f"{costs.read_bytes_per_s / 1e6:.0f} MB/s; "
          + ", ".join(f"{b}-bit chunk {1e3 * costs.t_io(n):.2f} ms" for b, n in sorted(costs.chunk_bytes.items())))
    print(f"recompute / load of one 8-bit chunk: {costs.recompute_to_load_ratio(8):.1f}")
    return 0


def configure_costs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=SWAP_DEVICES, default="host", help="host (measured) or an emulated preset")
    parser.add_argument("--chunk-size", type=limits.measured_chunk_size, default=16, help="tokens per chunk")
    parser.add_argument("--remeasure", action="store_true", help="measure the host again")
    parser.add_argument("--json", action="store_true", help="print the cost model as JSON")
    parser.set_defaults(func=_costs)


def _call(args) -> int:
    from workbench.kvcache.client import connect
    from workbench.kvcache.protocol import CtxStub

    with connect(args.app, args.address) as session:
        stub = session.new_ctx(args.system) if args.context is None else CtxStub(args.context)
        prompt = args.prompt if args.prompt is not None else args.prompt_file
        for piece in session.call_stream(stub, prompt, max_new_tokens=args.max_new_tokens):
            print(piece, end="", flush=True)
        print()
    if args.context is None:
        print(f"(continue this context with --context={stub.token})")
    return 0


def configure_call(parser: argparse.ArgumentParser) -> None:
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("prompt", type=_prompt, nargs="?", help="the prompt (or --prompt-file)")
    prompt.add_argument("--prompt-file", type=text_file, help="read the prompt from this UTF-8 text file")
    parser.add_argument("--app", default="cli", help="the app the context belongs to")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--context", help="a context stub from an earlier call (default: a new context)")
    which.add_argument("--system", help="system prompt of a new context (one given by --context keeps its own)")
    parser.add_argument("--max-new-tokens", type=limits.new_tokens, default=32, help="tokens to generate at most")
    parser.add_argument("--address", help="the service's address (default: its Unix socket in the cache)")
    parser.set_defaults(func=_call)


def _prompt(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the prompt is empty")
    return text


_prompt.__name__ = "text"
