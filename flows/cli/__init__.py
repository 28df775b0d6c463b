"""The eps-screen command line. Every command that runs a screen validates the config first.

One module per command (flows/cli/<command>.py, each with `run(args)`), the arguments in parser.py. Only the
command given is imported: those that only read (validate, design, analyze-table) never import Prefect, so they
answer in a second. SCREEN is a screen's name in the result store (--store, default `results`).
"""

from __future__ import annotations

import importlib

from flows.cli.parser import build_parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return importlib.import_module(f"flows.cli.{args.module}").run(args)
