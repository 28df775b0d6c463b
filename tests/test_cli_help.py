"""`eps-screen <command> --help` explains every argument and states its default ("required" where it has none)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli.parser import build_parser

ROOT = Path(__file__).resolve().parent.parent


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


SUBCOMMANDS = sorted(_subparsers(build_parser()))


def help_problems(p: argparse.ArgumentParser) -> list[str]:
    """Arguments of `p` without help, or whose help states neither a default nor that the argument is required."""
    problems = []
    for action in p._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        text = action.help or ""
        if not text.strip() or text == argparse.SUPPRESS:
            problems.append(f"{name}: no help")
            continue
        required = action.required or (not action.option_strings and action.nargs is None)
        if not re.search(r"\bdefault\b" if not required else r"\brequired\b", text):
            problems.append(f"{name}: help does not state its {'being required' if required else 'default'}")
    return problems


def _help_text(sub: str, capsys, monkeypatch) -> str:
    from flows.cli import main

    monkeypatch.setenv("COLUMNS", "400")  # no wrapping, so each help string appears whole
    with pytest.raises(SystemExit) as exit_:
        main([sub, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_every_subcommand_is_checked() -> None:
    assert {"validate", "run", "design", "analyze-table", "deploy", "status", "retry", "report", "doctor"} <= set(SUBCOMMANDS)


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_every_argument_has_help_with_its_default(sub: str, capsys, monkeypatch) -> None:
    p = _subparsers(build_parser())[sub]
    assert help_problems(p) == []
    shown = " ".join(_help_text(sub, capsys, monkeypatch).split())
    for action in p._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        for flag in action.option_strings or [action.metavar or action.dest]:
            assert flag in shown, f"{sub} --help does not show {flag}"
        assert " ".join(action.help.split()) in shown, f"{sub} --help does not show the help of {action.dest}"


def test_the_check_can_fail() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("--bare")
    p.add_argument("--no-default", help="some words")
    p.add_argument("--fine", default=3, help="a number (default: 3)")
    p.add_argument("screen2", nargs="?", default="x", help="optional, default: x")
    assert sorted(help_problems(p)) == [
        "--bare: no help", "--no-default: help does not state its default", "config: no help",
    ]


def test_the_installed_command_shows_the_same_help() -> None:
    """The console script is this parser: one real `eps-screen <command> --help`."""
    exe = Path(sys.executable).parent / "eps-screen"
    if not exe.exists():
        pytest.skip("eps-screen is not installed in this environment")
    out = subprocess.run([str(exe), "run", "--help"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "400"}, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for action in _subparsers(build_parser())["run"]._actions:
        assert " ".join(action.help.split()) in text
