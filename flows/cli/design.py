"""`eps-screen design CONFIG`: the designs a config declares, phase by phase: cells, generators, defining relation,
resolution and alias structure (no Prefect)."""

from __future__ import annotations

import sys

from eps_screen.analysis_cli import design_listing
from flows.cli.session import load


def run(args) -> int:
    code, text = design_listing(load(args.config), args.phase, args.json)
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code
