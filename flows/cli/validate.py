"""`eps-screen validate CONFIG`: check a config and print the plan (no Prefect)."""

from __future__ import annotations

import sys

from eps_screen.plan import make_plan
from flows.cli.session import load


def run(args) -> int:
    config = load(args.config)
    print(f"{args.config}: valid screen '{config.name}' (model {config.model.base}, sources {', '.join(config.sources)})")
    plan = make_plan(config)
    for line in plan.lines():
        print(f"  {line}")
    for line in plan.problems:
        print(f"error: {line}", file=sys.stderr)
    return 2 if plan.problems else 0
