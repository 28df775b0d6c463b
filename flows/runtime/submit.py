"""Running a screen from the CLI: in this process or as a run of the `screen` deployment, watched; `retry` (mark
dead runs Crashed, wait for cell runs still on a pool, run again: only unfinished cells are computed) and `report`.

Prefect and the flows are imported inside the functions: the progress line is on screen before Prefect's import
and its temporary server (several seconds) begin.
"""

from __future__ import annotations

import time
from collections import Counter

from eps_screen.plan.screen_plan import Plan, make_plan
from eps_screen.run.aggregate import aggregate_stored
from eps_screen.spec.config import ScreenConfig
from eps_screen.store.result_store import ResultStore
from flows.runtime.api import api_problem, api_url, ui_url
from flows.runtime.names import SCREEN
from flows.runtime.runs import cell_runs, mark_crashed, process_alive
from flows.runtime.status import render_gates, screen_status, store_status
from flows.runtime.terminal import TerminalProgress
from flows.runtime.workers import pool_problem


def _progress(config: ScreenConfig, store: ResultStore, plan: Plan, console) -> TerminalProgress:
    return TerminalProgress(config, store, plan.distinct_cells, console, f"screen {config.name}")


def run_screen_here(config: ScreenConfig, store: ResultStore, plan: Plan, console, force: bool = False):
    """The screen flow in this process (finished cells are read from the store), its progress shown from the
    first second; returns the flow's final state. Ctrl-C or SIGTERM (flows.runtime.interrupt) raises
    KeyboardInterrupt once the run has recorded its end and the temporary server, if any, has stopped."""
    with _progress(config, store, plan, console) as progress:
        from flows.runtime.interrupt import temporary_server  # imports Prefect: seconds the progress line covers
        from flows.screen import screen

        progress.route_prefect_logs()  # its log handlers exist now
        with temporary_server():
            return screen(config, force=force, return_state=True)


class CannotSubmit(RuntimeError):
    """The `screen` deployment is missing, or its pool has no worker to run it: one line with the fix."""


def submit_problem(client) -> str | None:
    """Why a run of the `screen` deployment would not start now (it would sit Late, silently), or None."""
    from prefect.exceptions import ObjectNotFound

    try:
        deployment = client.read_deployment_by_name(SCREEN.full_name)
    except ObjectNotFound:
        return f"deployment {SCREEN.full_name!r} does not exist: run `eps-screen deploy` from the repository root"
    return pool_problem(client, deployment.work_pool_name)


def submit_screen(config: ScreenConfig, store: ResultStore, plan: Plan, console, watch: bool = True,
                  force: bool = False):
    """A run of the `screen` deployment with this config; watched (progress bar) until it ends unless watch=False.
    Raises CannotSubmit, before submitting, when no worker could run it."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    with get_client(sync_client=True) as client:
        problem = submit_problem(client)
    if problem:
        raise CannotSubmit(problem)
    parameters = {"config": config.model_dump(mode="json")} | ({"force": True} if force else {})
    run = run_deployment(SCREEN.full_name, parameters=parameters, timeout=0)
    url = ui_url(run.id)
    console.print(f"submitted {SCREEN.full_name} run {run.name} ({run.id})" + (f": {url}" if url else ""))
    if not watch:
        return run.state
    with get_client(sync_client=True) as client, _progress(config, store, plan, console):
        try:
            while not (state := client.read_flow_run(run.id).state).is_final():
                time.sleep(2)
        except KeyboardInterrupt:
            console.print(f"stopped watching; run {run.id} goes on")
            return None
    return state


def wait_for_cell_runs(client, name: str, console, limit_s: float) -> bool:
    """Wait for job flow runs of this screen still on a pool (they may finish cells); False if they outlast limit_s."""
    deadline = time.monotonic() + limit_s
    active = [r for r in cell_runs(client, name) if not r.state.is_final()]
    if not active:
        return True
    console.print(f"{len(active)} cell run(s) of the last screen run are still on a pool; waiting for them")
    while active and time.monotonic() < deadline:
        time.sleep(3)
        active = [r for r in cell_runs(client, name) if not r.state.is_final()]
    return not active


def _abandon_dead_runs(status, console, force: bool, wait_s: float) -> bool:
    """Mark the screen's runs whose process is gone (or all unfinished ones, with force) Crashed, then wait for its
    cell runs still on a pool; False (said why) when a run may still be alive or cell runs outlast wait_s."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for run in status.screen_runs:
            if run.state.is_final():
                continue
            alive = process_alive(run)
            if alive is False or force:
                why = "its process is gone" if alive is False else "marked by `eps-screen retry --force`"
                n = mark_crashed(client, run, f"screen run abandoned: {why}")
                console.print(f"marked screen run {run.name} ({run.id}) Crashed: {why} ({n} task runs with it)")
            else:
                where = "on this host" if alive else "(its process is not on this host)"
                console.print(f"[red]error[/]: screen run {run.name} ({run.id}) is {run.state.name} {where}; "
                              f"wait for it, cancel it, or pass --force if its process is gone")
                return False
        if not wait_for_cell_runs(client, status.config.name, console, wait_s):
            console.print("[red]error[/]: cell runs still in flight; try again later")
            return False
    return True


def retry(config: ScreenConfig, store: ResultStore, console, *, force: bool = False, submit: bool = False,
          wait_s: float = 3600) -> int:
    """Run the screen again, so that only its unfinished (failed, crashed, missing) cells are computed; then
    re-aggregate. Refuses while an earlier run of it may still be alive, unless force."""
    name = config.name
    status = screen_status(config, store)
    if api_url() and not status.prefect_note:
        if not _abandon_dead_runs(status, console, force, wait_s):
            return 2
        status = screen_status(config, store)
    todo = status.unfinished()
    counts = Counter(c.state for c in todo)
    known = len(status.cells)
    console.print(f"screen {name}: {known - len(todo)} of {known} known cells finished; to compute: "
                  + (", ".join(f"{n} {s}" for s, n in counts.most_common()) or "none")
                  + ("" if status.multiseed_known else " (+ the multi-seed cells, once the slabs finish)"))
    for c in todo:
        if c.state in {"failed", "crashed", "cancelled", "interrupted"}:
            console.print(f"  {c.cell_id}: {c.state} {c.message[:100]}")
    plan = make_plan(config)
    if submit:
        state = submit_screen(config, store, plan, console, force=force)
    else:
        state = run_screen_here(config, store, plan, console, force=force)
    if state is None:
        return 0
    if state.name == "Busy":  # another run holds the store (eps_screen/store/claims.py)
        console.print(f"[red]error[/]: {state.message}")
        return 2
    console.print(f"screen run ended {state.name}" + (f": {state.message}" if state.message else ""))
    if not state.is_completed():  # the run did not reach its own report
        report(config, store, console)
    after = store_status(config, store)
    left = after.unfinished()
    console.print(f"{len(after.cells) - len(left)} of {len(after.cells)} cells finished")
    return 0 if state.is_completed() else (3 if state.name == "Killed" else 1)


def report(config: ScreenConfig, store: ResultStore, console) -> int:
    """Re-aggregate one screen now, whatever its state (partial screens give a partial report).

    As a run of the `aggregate` flow (its summary and link artifacts in the UI) when a Prefect API answers;
    otherwise here, without Prefect: the store is all it reads, so no temporary server is started for it."""
    name = config.name
    with_prefect = bool(api_url()) and api_problem(required=True) is None
    with console.status(f"aggregating {name} ({store.finished_count()} finished cells)"):
        if with_prefect:
            from flows.aggregate import aggregate

            state = aggregate(config, return_state=True)
            if not state.is_completed():
                console.print(f"[red]error[/]: aggregate ended {state.name}: {state.message}")
                return 1
            result = state.result()
        else:
            result, _ = aggregate_stored(config, store)
    if result["report"] is None:
        console.print(f"screen {name}: no finished cells yet, nothing to aggregate")
        return 1
    title = f"{name}: {result['cells']} cells" + (" (partial)" if result["partial"] else "")
    render_gates(store.gates(), console, title=title)
    console.print(result["report"])
    return 0
