"""`eps-screen run [CONFIG]`: validate, then run the screen in this process, or (--submit) as a run of the
`screen` deployment on the cpu pool, watched from here. The report's path is the last line of stdout. Ctrl-C or
SIGTERM ends an in-process run: one line on stderr, exit 130 or 143 (flows.runtime.interrupt)."""

from __future__ import annotations

import sys

from eps_screen.models.packaged import weights_problems
from eps_screen.plan.screen_plan import make_plan
from eps_screen.report.stores import register
from eps_screen.store.claims import RunLease, describe
from eps_screen.store.result_store import ResultStore
from flows.cli.session import command_env, console, load
from flows.runtime.api import api_problem
from flows.runtime.interrupt import until_interrupted
from flows.runtime.submit import CannotSubmit, run_screen_here, submit_screen


def run(args) -> int:
    config = load(args.config)
    if args.store:
        config = config.model_copy(update={"store": args.store})
    if problems := weights_problems(config):
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        return 2
    command_env()
    store, plan = ResultStore.for_config(config), make_plan(config)
    holder = None if args.force else RunLease(store).holder()
    if holder is not None:  # before Prefect and its temporary server start: the flow checks again, race-free
        print(f"error: {describe(holder, config.name)}", file=sys.stderr)
        return 2
    register(store)  # status, retry and report find the screen by its name from now on, even before its report
    return until_interrupted(lambda: _run(args, config, store, plan), store.finished_count)


def _run(args, config, store: ResultStore, plan) -> int:
    if args.submit:
        problem = api_problem(required=True)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        try:
            state = submit_screen(config, store, plan, console(), watch=not args.no_watch, force=args.force)
        except CannotSubmit as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        if state is None or not state.is_final():
            return 0
        if state.is_completed():  # the run's return value stays with the worker; the report is in the store
            print(store.report_dir / "clean_result.html")
            return 0
    else:  # in this process, with live progress on stdout
        state = run_screen_here(config, store, plan, console(), force=args.force)
    if state.is_completed():
        result = state.result()
        if state.message:
            print(state.message, file=sys.stderr)
        print(result["report"])
        return 0
    if state.name == "Busy":  # another run holds the store (eps_screen/store/claims.py)
        print(f"error: {state.message}", file=sys.stderr)
        return 2
    print(f"screen '{config.name}' ended {state.name}: {state.message}", file=sys.stderr)
    return 3 if state.name == "Killed" else 1
