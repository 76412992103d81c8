"""Every option of every `workbench` command and benchmark, given a bad value: exit status 2 and one line
that names the option, before any work starts (the commands are walked from the parser, so a new
mechanism's options are covered as soon as they exist)."""
import argparse
import json
import re
import subprocess
import sys
import textwrap

import pytest

from workbench import argtypes
from workbench.bench import bench_parser, benchmarks
from workbench.cli import build_parser, main

pytestmark = pytest.mark.xdist_group("cli-arguments")     # one worker makes the module's shared fixture, once

HOSTILE = ("0", "-1", "nan", "1e12", str(10**18), "x")
"""What every numeric option is given; 0 and -1 are skipped where the option's type accepts them."""
LIMIT_S, LIMIT_BYTES = 5, 500 * 2**20

BAD = {
    "text": "   ",
    argtypes.writable_file.__name__: "/proc/no-such-folder/out.json",
    argtypes.existing_folder.__name__: "/no/such/folder",
    argtypes.writable_folder.__name__: "/etc/hostname/swap",
    argtypes.text_file.__name__: "/no/such/file.txt",
    "memory fall": "rpi3:x:5",
    "device and layer": "rpi3",
    "mix": "80:x",
    "GPUs per type": "v100=-1",
    "ramps": "1,x",
    "group": "no-such-group-here",
    "loopback address": "0.0.0.0:8080",
}
"""A value each argument type other than a number must refuse, by the type's name."""


def leaf_parsers(parser: argparse.ArgumentParser, path=()):
    """(command path, parser) of every runnable command under ``parser``."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs or parser.get_default("func") is not None:      # runnable itself (`serve llms`, beside `keys`)
        yield path, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from leaf_parsers(child, path + (name,))


def commands():
    """Every command of the CLI and every benchmark, as (path, parser)."""
    found = [(path, parser) for path, parser in leaf_parsers(build_parser()) if path != ("bench",)]
    return found + [(("bench", name), bench_parser(name)) for name in sorted(benchmarks())]


COMMANDS = commands()
OPTIONS = [(path, parser, action) for path, parser in COMMANDS for action in parser._actions
           if action.option_strings and action.help != argparse.SUPPRESS
           and not isinstance(action, argparse._HelpAction)]


def bad_value(action: argparse.Action) -> str | None:
    if action.choices is not None:
        return "no-such-value"
    if action.type is None or isinstance(action.type, argtypes.Number):
        return None
    name = getattr(action.type, "__name__", str(action.type))
    assert name in BAD, f"{action.option_strings}: no bad value known for argument type {name!r}; add one to BAD"
    return BAD[name]


def required_args(parser: argparse.ArgumentParser) -> list[str]:
    args = []
    for action in parser._actions:
        if action.required and action.option_strings:
            args += [action.option_strings[0], str(list(action.choices)[0])]
    return args


def argv_for(path, parser, action, value) -> list[str]:
    option = action.option_strings[-1]
    return list(path) + [a for a in required_args(parser) if a != option] + [f"{option}={value}"]


def accepted(kind: argtypes.Number, text: str) -> bool:
    """Whether the type itself takes ``text`` (0 is a valid port or seed; the type says so by its minimum)."""
    try:
        kind(text)
    except argparse.ArgumentTypeError:
        return False
    return True


CASES = [(path, parser, action) for path, parser, action in OPTIONS if bad_value(action) is not None]
NUMERIC = [(path, parser, action, value) for path, parser, action in OPTIONS if isinstance(action.type, argtypes.Number)
           for value in HOSTILE if not (value in ("0", "-1") and accepted(action.type, value))]


def case_id(path, action, value=None) -> str:
    return " ".join(path) + " " + action.option_strings[-1] + ("" if value is None else f"={value}")


def test_the_walk_reaches_every_kind_of_command():
    paths = {path for path, _, _ in OPTIONS}
    for expected in [("plan",), ("elastic", "run"), ("elastic", "profile", "importance"), ("dashboards",),
                     ("lab",), ("bench", "elastic"), ("bench", "browser"), ("prepare",), ("info",),
                     ("kvcache", "trace"), ("kvcache", "costs"), ("serve", "llms"), ("bench", "llms")]:
        assert expected in paths, expected
    assert len(NUMERIC) >= 200


def test_every_option_has_a_help_text():
    missing = [case_id(path, action) for path, _, action in OPTIONS if not (action.help or "").strip()]
    assert not missing, f"options without help: {missing}"


def test_every_number_is_a_bounded_type_whose_range_the_help_states():
    """A plain ``type=int`` or ``float`` has no upper bound; a bounded one says its range in ``--help``."""
    for path, parser, action in OPTIONS:
        assert action.type not in (int, float), f"{case_id(path, action)}: use a bounded type of workbench.argtypes"
        if isinstance(action.type, argtypes.Number):
            shown = " ".join(parser.format_help().split())
            assert " ".join(action.type.range_text.split()) in shown, case_id(path, action)


def test_zero_is_tried_only_where_the_type_takes_it():
    """Ports and seeds start at 0 (the type's minimum says so); counts and positive numbers refuse it."""
    assert argtypes.tcp_port.accepts(0) and argtypes.seed.accepts(0) and not argtypes.seed.accepts(-1)
    assert not argtypes.positive("ms", argtypes.Bound(1, "test")).accepts(0)
    assert not argtypes.count(1, unit="calls", at_most=argtypes.Bound(9, "test")).accepts(0)
    assert argtypes.count(0, unit="processes", at_most=argtypes.Bound(9, "test")).accepts(0)


CHILD = textwrap.dedent("""
    import contextlib, io, json, resource, signal, sys, time
    from workbench import cli
    from workbench.cli import main

    parser = cli.build_parser()             # built once (12 ms a time, 800 cases): main parses with it
    cli.build_parser = lambda: parser

    def status(field):
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(field + ":"))

    def vm_size():
        return status("VmSize")

    resource.setrlimit(resource.RLIMIT_AS, (vm_size() + LIMIT_BYTES, resource.RLIM_INFINITY))
    def too_long(*_):
        raise TimeoutError(f"took more than {LIMIT_S} s")
    signal.signal(signal.SIGALRM, too_long)
    results = []
    for argv in json.load(sys.stdin):
        err, started = io.StringIO(), time.perf_counter()
        signal.alarm(LIMIT_S)
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = main(argv)
        except SystemExit as stop:
            code = stop.code
        except BaseException as exc:
            code, err = f"raised {type(exc).__name__}: {exc}", err
        finally:
            signal.alarm(0)
        results.append({"code": code, "err": err.getvalue(), "seconds": time.perf_counter() - started,
                        "peak_bytes": status("VmHWM")})   # ru_maxrss keeps the forking parent's peak
    print(json.dumps(results))
""").replace("LIMIT_BYTES", str(LIMIT_BYTES)).replace("LIMIT_S", str(LIMIT_S))


@pytest.fixture(scope="module")
def hostile_results():
    """Every numeric case parsed in one child process with an address-space limit of 500 MB beyond its start-up
    and a 5 s alarm per case, so a value that allocates or hangs fails its case instead of the machine."""
    argvs = [argv_for(path, parser, action, value) for path, parser, action, value in NUMERIC]
    done = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(argvs), capture_output=True, text=True,
                          timeout=LIMIT_S * len(argvs) + 60)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(zip(map(tuple, argvs), json.loads(done.stdout)))


@pytest.mark.parametrize("path,parser,action,value", NUMERIC,
                         ids=[case_id(p, a, v) for p, _, a, v in NUMERIC])
@pytest.mark.integration
def test_a_hostile_number_is_refused_in_one_line_quickly_and_in_little_memory(path, parser, action, value,
                                                                                 hostile_results):
    got = hostile_results[tuple(argv_for(path, parser, action, value))]
    err = got["err"].strip()
    assert got["code"] == 2, (got["code"], err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"argument {'/'.join(action.option_strings)}" in err or action.option_strings[-1] in err, err
    assert got["seconds"] < LIMIT_S and got["peak_bytes"] < LIMIT_BYTES, got


@pytest.mark.parametrize("path,parser,action", CASES, ids=[case_id(p, a) for p, _, a in CASES])
def test_a_bad_value_is_refused_in_one_line(path, parser, action, capsys):
    option, value = action.option_strings[-1], bad_value(action)
    argv = list(path) + [a for a in required_args(parser) if a != option] + [option, value]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2, err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err and f"argument {'/'.join(action.option_strings)}" in err, err
    assert f"workbench {' '.join(path)}: error:" in err


SEEN = [
    (["kvcache", "costs", "--chunk-size", "100000000"], "--chunk-size: must be at most 1024 tokens"),
    (["kvcache", "trace", "--contexts", "99999999999"], "--contexts: must be at most"),
    (["kvcache", "trace", "--calls", "1000000000"], "--calls: must be at most"),
    (["plan", "--target-ms", "1e30"], "--target-ms: must be at most 3600000 ms"),
    (["kvcache", "trace", "--seed", "-1"], "--seed: must be at least 0, got -1"),
    (["kvcache", "call", "hi", "--context", "abc", "--system", "be brief"], "--system: not allowed with argument --context"),
]


def _limit_memory():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 * LIMIT_BYTES, resource.RLIM_INFINITY))


@pytest.mark.parametrize("argv,said", SEEN, ids=[" ".join(a) for a, _ in SEEN])
@pytest.mark.integration
def test_the_cases_seen_in_the_issue_end_in_one_line_as_a_real_process(argv, said):
    done = subprocess.run([sys.executable, "-m", "workbench.cli", *argv], capture_output=True, text=True,
                          timeout=LIMIT_S + 10, preexec_fn=_limit_memory)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_file_that_is_not_utf8_is_named_in_one_line(tmp_path, capsys):
    utf16 = tmp_path / "prompt.txt"
    utf16.write_text("Summarise this.", encoding="utf-16")
    for argv in (["kvcache", "call", "--prompt-file", str(utf16)], ["elastic", "run", "--text-file", str(utf16)]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert stop.value.code == 2 and len(err.splitlines()) == 1, err
        assert str(utf16) in err and "not UTF-8 text" in err and "UTF-16" in err, err


def test_a_utf8_file_is_read_as_the_text(tmp_path):
    given = tmp_path / "review.txt"
    given.write_text("Très bien.", encoding="utf-8")
    args = build_parser().parse_args(["elastic", "run", "--text-file", str(given)])
    assert args.text == "Très bien."
    with pytest.raises(argtypes.NotTextError, match=re.escape(str(tmp_path / "none.txt"))):
        argtypes.read_text_file(tmp_path / "none.txt")


def test_user_errors_after_parsing_are_one_line_too(capsys, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("WORKBENCH_CACHE", str(blocker))
    assert main(["elastic", "plan", "--preset", "full"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("workbench: error:") and str(blocker) in err


def test_a_prompt_file_is_what_the_call_sends(tmp_path, monkeypatch, capsys):
    from contextlib import contextmanager

    from workbench.kvcache import client

    sent = []

    class Session:
        def new_ctx(self, system):
            return type("Stub", (), {"token": "t"})()

        def call_stream(self, stub, prompt, max_new_tokens):
            sent.append(prompt)
            return iter(["ok"])

    @contextmanager
    def connect(app, address):
        yield Session()

    monkeypatch.setattr(client, "connect", connect)
    given = tmp_path / "prompt.txt"
    given.write_text("Name a colour.", encoding="utf-8")
    assert main(["kvcache", "call", "--prompt-file", str(given)]) == 0
    assert sent == ["Name a colour."]
