"""`eps-screen analyze-table FILE`: main effects and interactions of any two-level factorial table (no Prefect)."""

from __future__ import annotations

import sys

from eps_screen.analysis.cli import analyze_table


def run(args) -> int:
    code, text = analyze_table(args.file, args.response, args.factors, args.json)
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code
