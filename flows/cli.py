"""The eps-screen command line. Every command that runs a screen validates the config first.

Commands that only read (validate, design, analyze-table) never import Prefect, so they answer in a second.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from eps_screen.config import ConfigError, ScreenConfig, load_config

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "deployments" / "configs" / "tiny.yaml"


def _load(path: str) -> ScreenConfig:
    try:
        return load_config(path)
    except ConfigError as err:
        for line in err.problems:
            print(f"error: {line}", file=sys.stderr)
        raise SystemExit(2) from None


def cmd_validate(args) -> int:
    from eps_screen.plan import make_plan

    config = _load(args.config)
    print(f"{args.config}: valid screen '{config.name}' (model {config.model.base}, sources {', '.join(config.sources)})")
    for line in make_plan(config).lines():
        print(f"  {line}")
    return 0


def cmd_design(args) -> int:
    from eps_screen.analysis_cli import design_listing

    code, text = design_listing(_load(args.config), args.phase, args.json)
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code


def cmd_analyze_table(args) -> int:
    from eps_screen.analysis_cli import analyze_table

    code, text = analyze_table(args.file, args.response, args.factors, args.json)
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code


def cmd_run(args) -> int:
    config = _load(args.config)
    if args.store:
        config = config.model_copy(update={"store": args.store})
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.screen import screen  # imports Prefect: only after the config is known to be good

    state = screen(config, return_state=True)
    if state.is_completed():
        result = state.result()
        if state.message:
            print(state.message, file=sys.stderr)
        print(result["report"])
        return 0
    print(f"screen '{config.name}' ended {state.name}: {state.message}", file=sys.stderr)
    return 3 if state.name == "Killed" else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eps-screen", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="check a config and print the plan")
    v.add_argument("config")
    v.set_defaults(func=cmd_validate)

    r = sub.add_parser("run", help="validate, then run the screen (Prefect; temporary server when no PREFECT_API_URL)")
    r.add_argument("config", nargs="?", default=str(DEFAULT_CONFIG))
    r.add_argument("--store", help="result store directory (overrides the config's store)")
    r.set_defaults(func=cmd_run)

    d = sub.add_parser("design", help="list a phase's cells and, for the smoke fraction, its alias structure")
    d.add_argument("config")
    d.add_argument("--phase", choices=["smoke", "slab", "multiseed", "all"], default="all")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_design)

    a = sub.add_parser("analyze-table", help="main effects and interactions of any two-level factorial table")
    a.add_argument("file")
    a.add_argument("--response", required=True)
    a.add_argument("--factors")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_analyze_table)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
