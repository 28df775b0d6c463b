"""The eps-screen command line. Every command that runs a screen validates the config first.

Commands that only read (validate, design, analyze-table) never import Prefect, so they answer in a second.
The operations commands (deploy, status, retry, report, doctor) live in flows/deploy.py, flows/ops.py and
flows/doctor.py; SCREEN is a screen's name in the result store (--store, default `results`).
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
    plan = make_plan(config)
    for line in plan.lines():
        print(f"  {line}")
    for line in plan.problems:
        print(f"error: {line}", file=sys.stderr)
    return 2 if plan.problems else 0


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


def _prefect_env() -> None:
    """Before Prefect is imported: no telemetry, and time for a temporary server to start on a busy machine."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def _console():
    import shutil

    from rich.console import Console

    # Piped output (logs, CI) gets 120 columns instead of rich's 80, so the tables stay readable.
    return Console(highlight=False, width=None if sys.stdout.isatty() else max(120, shutil.get_terminal_size().columns))


def cmd_run(args) -> int:
    config = _load(args.config)
    if args.store:
        config = config.model_copy(update={"store": args.store})
    _prefect_env()
    if args.submit:  # a run of the `screen` deployment (cpu pool), watched from here
        from flows.ops import CannotSubmit, api_problem, submit_screen

        problem = api_problem(required=True)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        try:
            state = submit_screen(config, _console(), watch=not args.no_watch)
        except CannotSubmit as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        if state is None or not state.is_final():
            return 0
        if state.is_completed():  # the run's return value stays with the worker; the report is in the store
            from eps_screen.store import ResultStore

            print(ResultStore.for_config(config).report_dir / "clean_result.html")
            return 0
    else:  # in this process, with live progress on stdout (the report's path stays its last line)
        from flows.ops import run_screen_here  # imports Prefect only after the config is known to be good

        state = run_screen_here(config, _console())
    if state.is_completed():
        result = state.result()
        if state.message:
            print(state.message, file=sys.stderr)
        print(result["report"])
        return 0
    print(f"screen '{config.name}' ended {state.name}: {state.message}", file=sys.stderr)
    return 3 if state.name == "Killed" else 1


def cmd_deploy(args) -> int:
    _prefect_env()
    from flows.deploy import deploy, template_json

    if args.print_template:
        print(template_json(args.print_template))
        return 0
    return deploy(_console(), pools=args.pool, gpus=args.gpus, aggregate_cron=args.aggregate_cron,
                  aggregate_store=args.aggregate_store)


def _screen_command(fn):
    """status/retry/report: a missing screen, or a --submit no worker could run, is one line on stderr, exit 2."""

    def run(args) -> int:
        _prefect_env()
        from flows.ops import CannotSubmit, ScreenNotFound

        try:
            return fn(args)
        except (ScreenNotFound, CannotSubmit) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except ConfigError as err:
            print(f"error: the stored config of {args.screen!r} is no longer valid: {err.problems[0]}", file=sys.stderr)
            return 2

    return run


@_screen_command
def cmd_status(args) -> int:
    from flows.ops import render, screen_status

    status = screen_status(args.store, args.screen, with_prefect=not args.store_only)
    render(status, _console(), cells=args.cells)
    return 0


@_screen_command
def cmd_retry(args) -> int:
    from flows.ops import retry

    return retry(args.store, args.screen, _console(), force=args.force, submit=args.submit, wait_s=args.wait)


@_screen_command
def cmd_report(args) -> int:
    from flows.ops import report

    return report(args.store, args.screen, _console())


def cmd_doctor(args) -> int:
    _prefect_env()
    from flows.doctor import doctor

    return doctor(args.config, _console())


def cmd_serve(args) -> int:
    from eps_screen.report.serve import REPORT_URL_ENV, make_server
    from eps_screen.store import ResultStore

    root = ResultStore(args.store, "-").root  # a URL store: its local mirror on this machine
    server = make_server(root, args.host, args.port)
    host, port = server.server_address[:2]
    print(f"serving the reports of {root} at http://{host}:{port}/ (read-only; Ctrl-C stops it); screen runs link "
          f"here unless {REPORT_URL_ENV} says otherwise", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


CONFIG_HELP = "a screen config (YAML), e.g. deployments/configs/tiny.yaml"
STORE_HELP = "result store, a directory or a URL such as s3://bucket/prefix"


def parser() -> argparse.ArgumentParser:
    """Every argument's help states its default ("required" where there is none); tests/test_cli_help.py checks it."""
    p = argparse.ArgumentParser(prog="eps-screen", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="check a config and print the plan")
    v.add_argument("config", help=f"{CONFIG_HELP} (required)")
    v.set_defaults(func=cmd_validate)

    r = sub.add_parser("run", help="validate, then run the screen (Prefect; temporary server when no PREFECT_API_URL)")
    r.add_argument("config", nargs="?", default=str(DEFAULT_CONFIG),
                   help=f"{CONFIG_HELP} (default: deployments/configs/tiny.yaml)")
    r.add_argument("--store", help=f"{STORE_HELP} (default: the config's `store`, which this overrides)")
    r.add_argument("--submit", action="store_true",
                   help="run it as a run of the `screen` deployment (cpu pool worker) instead of in this process, "
                        "and watch it until it ends (needs PREFECT_API_URL and `eps-screen deploy`; default: off, "
                        "the screen runs in this process)")
    r.add_argument("--no-watch", action="store_true",
                   help="with --submit: return once the run is submitted (default: off, watch until it ends)")
    r.set_defaults(func=cmd_run)

    d = sub.add_parser("design", help="list a phase's cells and, for the smoke fraction, its alias structure")
    d.add_argument("config", help=f"{CONFIG_HELP} (required)")
    d.add_argument("--phase", choices=["smoke", "slab", "multiseed", "all"], default="all",
                   help="which phase's cells to list: smoke (the 2^(5-2) fraction), slab (32 cells per source), "
                        "multiseed (the re-run at extra seeds) or all (default: all)")
    d.add_argument("--json", action="store_true", help="print JSON instead of text (default: off, text)")
    d.set_defaults(func=cmd_design)

    a = sub.add_parser("analyze-table", help="main effects and interactions of any two-level factorial table")
    a.add_argument("file", help="the table, CSV or parquet, one row per run (required)")
    a.add_argument("--response", required=True, help="the column to analyse (required; no default)")
    a.add_argument("--factors",
                   help="factor columns, separated by commas, e.g. A,B,C (default: every column but the response)")
    a.add_argument("--json", action="store_true", help="print JSON instead of text (default: off, text)")
    a.set_defaults(func=cmd_analyze_table)

    dp = sub.add_parser("deploy", help="create/update the work pools and apply deployments/prefect.yaml (idempotent)")
    dp.add_argument("--pool", action="append",
                    help="only this pool and its deployments; repeatable (default: every pool in deployments/pools)")
    dp.add_argument("--gpus", type=int, help="local-gpu concurrency limit (default: the GPUs nvidia-smi lists)")
    dp.add_argument("--aggregate-cron",
                    help="replace the aggregate deployment's schedule with this cron, in UTC (default: leave it; "
                         "deployments/prefect.yaml sets hourly, '0 * * * *')")
    dp.add_argument("--aggregate-store",
                    help="store the aggregate deployment re-aggregates (default: leave it; deployments/prefect.yaml "
                         "sets results)")
    dp.add_argument("--print-template", metavar="POOL",
                    help="only print a pool's base job template (for prefect work-pool create --base-job-template) "
                         "and exit (default: off)")
    dp.set_defaults(func=cmd_deploy)

    for name, fn, text in (("status", cmd_status, "a screen per phase and per cell: the store and its Prefect runs"),
                           ("retry", cmd_retry, "run a screen again: only unfinished (failed, crashed, missing) "
                                                "cells are computed; then re-aggregate"),
                           ("report", cmd_report, "re-aggregate a screen now (partial screens too)")):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("screen", help="the screen's name (a directory of the store; required)")
        sp.add_argument("--store", default="results", help=f"{STORE_HELP} (default: results)")
        sp.set_defaults(func=fn)
        if name == "status":
            sp.add_argument("--cells", choices=["unfinished", "all", "none"], default="unfinished",
                            help="which cells to list (default: unfinished)")
            sp.add_argument("--store-only", action="store_true",
                            help="read only the store, do not ask Prefect (default: off, Prefect's runs too)")
        if name == "retry":
            sp.add_argument("--force", action="store_true",
                            help="mark an earlier screen run that still looks alive Crashed (its process is gone) "
                                 "(default: off, refuse while it looks alive)")
            sp.add_argument("--submit", action="store_true",
                            help="run it as a run of the `screen` deployment (cpu pool) instead of in this process "
                                 "(default: off, in this process)")
            sp.add_argument("--wait", type=float, default=3600,
                            help="seconds to wait for cell runs of the last screen run still in flight "
                                 "(default: 3600)")

    sv = sub.add_parser("serve", help="serve the store's reports over HTTP, read-only (what the screen run links to)")
    sv.add_argument("--store", default="results", help=f"{STORE_HELP}; a URL store's local mirror is served "
                                                        "(default: results)")
    sv.add_argument("--port", type=int, default=8765, help="port; 0 picks a free one (default: 8765)")
    sv.add_argument("--host", default="127.0.0.1",
                    help="address to bind; 0.0.0.0 exposes the reports to the network (default: 127.0.0.1)")
    sv.set_defaults(func=cmd_serve)

    dr = sub.add_parser("doctor", help="preflight checks: config, store, Prefect API, pool, workers, credentials")
    dr.add_argument("config", nargs="?", default=str(DEFAULT_CONFIG),
                    help=f"{CONFIG_HELP} (default: deployments/configs/tiny.yaml)")
    dr.set_defaults(func=cmd_doctor)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
