"""Every option of every `workbench` command and benchmark, given a bad value: exit status 2 and one line
that names the option, before any work starts (the commands are walked from the parser, so a new
mechanism's options are covered as soon as they exist)."""
import argparse

import pytest

from workbench import argtypes
from workbench.bench import bench_parser, benchmarks
from workbench.cli import build_parser, main

BAD = {
    "whole number": "-1", "port": "70000",
    "text": "   ", "int": "x", "float": "x",
    argtypes.writable_file.__name__: "/proc/no-such-folder/out.json",
    argtypes.existing_folder.__name__: "/no/such/folder",
    argtypes.writable_folder.__name__: "/etc/hostname/swap",
}
"""A value each argument type must refuse, by the type's name."""


def leaf_parsers(parser: argparse.ArgumentParser, path=()):
    """(command path, parser) of every runnable command under ``parser``."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from leaf_parsers(child, path + (name,))


def bad_value(action: argparse.Action) -> str | None:
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        return "no-such-value"
    if action.type is None:
        return None
    name = getattr(action.type, "__name__", str(action.type))
    if name.startswith("number of "):                  # positive(unit) / non_negative(unit): any unit
        return "-1"
    assert name in BAD, f"{action.option_strings}: no bad value known for argument type {name!r}; add one to BAD"
    return BAD[name]


def required_args(parser: argparse.ArgumentParser) -> list[str]:
    args = []
    for action in parser._actions:
        if action.required and action.option_strings:
            args += [action.option_strings[0], str(list(action.choices)[0])]
    return args


def cases():
    parsers = [(path, parser) for path, parser in leaf_parsers(build_parser()) if path != ("bench",)]
    parsers += [(("bench", name), bench_parser(name)) for name in sorted(benchmarks())]
    return [(path, parser, action) for path, parser in parsers for action in parser._actions
            if action.option_strings and action.help != argparse.SUPPRESS and bad_value(action) is not None]


CASES = cases()


def test_the_walk_reaches_every_kind_of_command():
    paths = {path for path, _, _ in CASES}
    for expected in [("plan",), ("elastic", "run"), ("elastic", "profile", "importance"), ("dashboards",),
                     ("lab",), ("bench", "elastic"), ("bench", "browser"), ("prepare",), ("info",)]:
        assert expected in paths, expected
    assert len(CASES) >= 40


@pytest.mark.parametrize("path,parser,action", CASES,
                         ids=[" ".join(p) + " " + a.option_strings[-1] for p, _, a in CASES])
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


def test_user_errors_after_parsing_are_one_line_too(capsys, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("WORKBENCH_CACHE", str(blocker))
    assert main(["elastic", "plan", "--preset", "full"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("workbench: error:") and str(blocker) in err
