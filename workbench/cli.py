"""The `workbench` command, built from the registered mechanisms.

Shared commands: ``prepare``, ``info``, ``dashboards``, ``bench``. Each mechanism adds
its own group (``workbench elastic plan|run|profile ...``); commands that existed before
mechanisms had groups stay reachable at the top level as aliases.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

from workbench.argtypes import Parser, existing_folder, tcp_port
from workbench.errors import WorkbenchError


def _cmd_prepare(args) -> int:
    from workbench.prepare import prepare
    from workbench.prepare_job import log_path, run_job, start_background

    if args.job:
        return run_job(args.preset, own_process=True)
    if args.background:
        state, _ = start_background(args.preset)
        print({"ready": f"every step of the {args.preset} preset is ready already",
               "running": "a prepare is running on this cache already",
               "started": f"started; its log: {log_path(args.preset)}"}[state])
        return 0

    report = prepare(args.preset, args.tasks or None, force=args.force, progress=not args.quiet,
                     measure_host=not args.no_host)
    print(report.summary())
    return 0


def _cmd_info(args) -> int:
    from workbench.info import print_device, print_info

    from workbench.prepare import print_preset_notice

    if args.device:
        print_device(args.device)
    else:
        print_preset_notice(args.preset)
        print_info(args.preset, as_json=args.json)
    return 0


def _stop_on_signals() -> None:
    """Ctrl-C and SIGTERM stop a server whatever its parent left them as (a script run in the background
    starts its children with SIGINT ignored)."""
    from workbench.workers import raise_interrupt

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_interrupt)


def _cmd_dashboards(args) -> int:
    from workbench.prepare import serve_now_hint
    from workbench.prepare_job import log_path, start_background
    from workbench.listen import check_tcp_port
    from workbench.serving import DASHBOARDS_DIR, voila_command, voila_env
    from workbench.workers import WorkerGroup

    port = check_tcp_port(args.port)
    cmd = voila_command(port, preheat=args.preheat)
    job, hint = None, ""
    if not args.no_prepare:
        state, job = start_background(args.preset, bound=True)
        if state != "ready":
            print(f"workbench dashboards: the {args.preset} prepare is running in the background "
                  f"({'started now' if state == 'started' else 'started elsewhere'}; log {log_path(args.preset)}); "
                  f"the gallery shows its progress and each page works once its artifacts are ready", flush=True)
            hint = serve_now_hint(args.preset)
    else:
        hint = serve_now_hint(args.preset)
    if hint:
        print(f"workbench dashboards: {hint}", flush=True)
    print(f"workbench dashboards: http://127.0.0.1:{port}/voila/render/index.ipynb  (Ctrl-C stops the server)",
          flush=True)
    _stop_on_signals()
    try:
        with WorkerGroup(cmd, name="voila", cwd=DASHBOARDS_DIR, env=voila_env({"WORKBENCH_PRESET": args.preset}),
                         logs="inherit", grace_s=20, fail_fast=False) as server:
            try:
                server.wait()
                returncode = server.exits[0].returncode
            except KeyboardInterrupt:          # the block's end stops the server and its kernels together
                returncode = 0
    finally:                                   # however the server ended, the job it started ends with it
        if job is not None and job.poll() == [None]:
            print("workbench dashboards: stopping the background prepare; it resumes where it stopped next time",
                  flush=True)
        if job is not None:
            job.close()
    return returncode


def _cmd_lab(args) -> int:
    from workbench.listen import check_tcp_port
    from workbench.serving import default_lab_root, lab_command

    port = check_tcp_port(args.port)
    cmd = lab_command(port, args.root or default_lab_root())
    print(f"workbench lab: JupyterLab on http://127.0.0.1:{port}/lab (the URL with its token follows; Ctrl-C stops "
          f"it and its kernels)", flush=True)
    for signum in (signal.SIGINT, signal.SIGTERM):      # an ignored signal would stay ignored across exec
        signal.signal(signum, signal.SIG_DFL)
    os.execvpe(cmd[0], cmd, {**os.environ, "WORKBENCH_PRESET": args.preset})


def _cmd_bench(args) -> int:
    from workbench.bench import run_benchmark

    run_benchmark(args.name, args.args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from workbench.bench import benchmarks
    from workbench.mechanisms import mechanisms
    from workbench.presets import add_preset_argument

    from workbench.data import TASKS
    from workbench.devices import profile_names

    parser = Parser(prog="workbench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("prepare", help="convert models, fine-tune, build stores, measure (cached by inputs)")
    add_preset_argument(p)
    p.add_argument("--tasks", nargs="*", choices=list(TASKS), help="tasks to prepare (default: all)")
    p.add_argument("--force", action="store_true", help="retrain even when a cached model exists")
    p.add_argument("--no-host", action="store_true", help="skip measuring the host's device profile")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--background", action="store_true",
                   help="run the whole prepare as a detached job (what `workbench dashboards` starts); "
                        "its progress shows in the gallery")
    p.add_argument("--job", action="store_true", help=argparse.SUPPRESS)     # the detached job itself
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser("info", help="models, tasks, cache, mechanisms and device profiles")
    add_preset_argument(p)
    p.add_argument("--json", action="store_true", help="print the information as JSON")
    p.add_argument("--device", choices=profile_names(),
                   help="show one device profile's per-layer compute and load times")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("dashboards", help="serve the Voila dashboard gallery on 127.0.0.1")
    add_preset_argument(p)
    p.add_argument("--no-prepare", action="store_true",
                   help="do not start the background prepare of missing artifacts")
    p.add_argument("--port", type=tcp_port, default=os.environ.get("WORKBENCH_PORT", "8866"),
                   help="port on 127.0.0.1 (default 8866, or $WORKBENCH_PORT; 0 picks a free one)")
    p.add_argument("--no-preheat", dest="preheat", action="store_false",
                   help="start each page's kernel on request (by default one kernel per page waits, already run)")
    p.set_defaults(func=_cmd_dashboards)

    p = sub.add_parser("lab", help="JupyterLab on 127.0.0.1 with the tutorials and labs, same environment")
    add_preset_argument(p)
    p.add_argument("--port", type=tcp_port, default=8888, help="port on 127.0.0.1 (default 8888; 0 picks a free one)")
    p.add_argument("--root", type=existing_folder,
                   help="folder JupyterLab opens (default: the tutorials and labs in a clone, else this folder)")
    p.set_defaults(func=_cmd_lab)

    p = sub.add_parser("bench", help="run a benchmark and print its figures (and write them as CSV)")
    p.add_argument("name", choices=sorted(benchmarks()), metavar="NAME",
                   help="one of: " + ", ".join(sorted(benchmarks())))
    p.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own options (NAME --help lists them)")
    p.set_defaults(func=_cmd_bench)

    servers = [s for m in mechanisms() for s in m.servers]
    if servers:
        serve = sub.add_parser("serve", help="run a mechanism's service: " + ", ".join(s.name for s in servers))
        kinds = serve.add_subparsers(dest="server", required=True, metavar="SERVICE")
        for server in servers:
            server.configure(kinds.add_parser(server.name, help=server.help))

    groups = {}
    for mechanism in mechanisms():
        if not any(not c.group for c in mechanism.commands):
            continue                            # a mechanism that brings a page only
        group = sub.add_parser(mechanism.name, help=mechanism.title)
        groups[mechanism.name] = group.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
    for mechanism in mechanisms():
        for command in mechanism.commands:
            if command.group:
                command.configure(groups[command.group].add_parser(
                    command.name, help=f"{command.help} (alias of `workbench {mechanism.name} ...`)"))
                continue
            command.configure(groups[mechanism.name].add_parser(command.name, help=command.help))
            if command.top_level_alias:
                command.configure(sub.add_parser(
                    command.name, help=f"alias of `workbench {mechanism.name} {command.name}`",
                    description=f"Alias of `workbench {mechanism.name} {command.name}`: {command.help}."))
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except WorkbenchError as exc:
        print(f"workbench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("workbench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
