"""The screen: phases 0-4 of SPEC.md, read top to bottom. Gates end the run in a state named "Killed".

Cells run here (pool 'inprocess': in this process, or on `execution.max_parallel_cells` worker processes that
each keep one base model loaded) or as runs of the `cell` deployment on a GPU work pool (flows/runtime/dispatch.py:
resubmits crashed runs, enforces the spend cap). Either way every finished cell is in the store, so running
the screen again resumes it; gate decisions read the store, not the runs' return values.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.futures import as_completed
from prefect.states import Completed, Failed
from prefect.task_runners import ProcessPoolTaskRunner
from prefect.utilities.annotations import quote

from eps_screen import design, gates, pipeline
from eps_screen.config import ScreenConfig
from eps_screen.design import PRE_SCREEN_ID, Cell
from eps_screen.plan import make_plan, multiseed_pick
from eps_screen.presets import screen_name
from eps_screen.provenance import provenance
from eps_screen.store import ResultStore
from flows.aggregate import aggregate, publish
from flows.runtime.runs import record_owner
from flows.runtime.names import CELL_DEPLOYMENTS
from tasks.cells import artifact_key, cell_summary, cell_task, pre_screen_task, regime_task
from tasks.gates import contamination_gate, cost_gate, judged_gate, smoke_gate


class Progress:
    """The screen's progress artifact: distinct cells finished out of the plan's cells, and the current phase
    (its description, e.g. "phase 2: slab librarian: 40 of 114 cells"); a log line at each phase's start and end."""

    def __init__(self, config: ScreenConfig):
        self.done: set[str] = set()
        self.total = make_plan(config).distinct_cells
        self.phase = ""
        self.id = create_progress_artifact(
            progress=0.0, key=artifact_key(f"progress-{config.name}"), description=self.text()
        )

    def count(self) -> str:
        return f"{len(self.done)} of {self.total} cells"

    def text(self) -> str:
        return f"{self.phase or 'starting'}: {self.count()}"

    def begin(self, phase: str | None) -> None:
        """The phase before ends and this one starts (None: the last one ended)."""
        logger = get_run_logger()
        if self.phase:
            logger.info("%s: finished (%s)", self.phase, self.count())
        self.phase = phase or "finished"
        if phase:
            logger.info("%s: started (%s finished so far)", phase, self.count())
        self.advance([])

    def advance(self, cell_ids: list[str]) -> None:
        self.done.update(cell_ids)
        try:
            update_progress_artifact(self.id, progress=100.0 * len(self.done) / self.total, description=self.text())
        except Exception as exc:  # a bar that lags must not stop the screen; the next cell's update catches up
            get_run_logger().warning("progress artifact not updated (%s: %s)", type(exc).__name__, str(exc)[:200])


def run_name() -> str:
    """`screen-<name>`, however the run started (CLI, --submit, either deployment's form)."""
    from prefect.runtime import flow_run

    return f"screen-{screen_name(flow_run.parameters)}"


def tag_run(config: ScreenConfig) -> None:
    """The tag `screen:<name>` on this run (the cell runs it submits carry it too)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    try:
        with get_client(sync_client=True) as client:
            tags = client.read_flow_run(flow_run.id).tags
            client.update_flow_run(flow_run.id, tags=sorted({*tags, "eps-screen", f"screen:{config.name}"}))
    except Exception as exc:  # a tag is not worth a screen
        get_run_logger().warning("run not tagged (%s: %s)", type(exc).__name__, str(exc)[:200])


class Stopped(Exception):
    """The screen ends early in `state`: a gate fired, a GPU pool's dispatch stopped (spend cap, cells failed after
    every resubmission), or work ran but is not in the store. Raised through the phase subflows to the screen."""

    def __init__(self, state):
        super().__init__(state.message)
        self.state = state


def run_cells(config: ScreenConfig, cells: list[Cell], progress: Progress, pool=None) -> dict[str, dict]:
    if config.execution.pool == "inprocess":
        return _run_here(config, cells, progress, pool)
    return _dispatch(config, cells, progress)


def _dispatch(config: ScreenConfig, cells: list[Cell], progress: Progress) -> dict[str, dict]:
    """The cells not yet in the store, in jobs of the `cell` deployment on the config's GPU pool.

    Finished cells are read here: a GPU job started only to find its cells finished would cost a pod start-up
    (minutes, billed) for every smoke cell in its slab and for every cell of a resumed screen."""
    store = ResultStore.for_config(config)
    with store.listing():
        metrics = {c.id: store.cell_metrics(config, c) for c in cells}
    finished = {cell_id: cell_summary(m) for cell_id, m in metrics.items() if m is not None}
    progress.advance(list(finished))
    todo = [c.id for c in cells if c.id not in finished]
    dispatched = _on_pool(config, todo, on_done=lambda cell_id: progress.advance([cell_id])) if todo else {}
    return {c.id: finished.get(c.id) or dispatched[c.id] for c in cells}


def _pre_screen(config: ScreenConfig) -> dict:
    """Phase 0 where the cells run: on a GPU pool the base model is sampled there (a 7B model on the screen's
    CPU would take days); a finished pre-screen is read from the store."""
    if config.execution.pool == "inprocess":
        return pre_screen_task(config)
    store = ResultStore.for_config(config)
    if pipeline.finished_pre_screen(config, store) is None:
        _on_pool(config, [PRE_SCREEN_ID])
    pre = pipeline.finished_pre_screen(config, store)
    if pre is None:  # a GPU pool that writes to a store this flow cannot read
        raise Stopped(Failed(message=f"the pre-screen ran but is not in the store {store.location}"))
    return pre


def _on_pool(config: ScreenConfig, ids: list[str], on_done=None) -> dict[str, dict]:
    """dispatch_cells under the screen's rules: kill criterion 5 ends the screen Killed, with its gate saved;
    cells that failed every resubmission end it Failed. Finished work stays in the store either way."""
    from flows.runtime.dispatch import CellsFailed, CostOverrun, DispatchStopped, dispatch_cells

    plan = make_plan(config)
    if plan.problems:  # before anything is rented: a job that cannot fit its GPU would crash on it
        raise Stopped(Failed(message="; ".join(plan.problems)))
    budget = plan.estimate.get("cost_usd")
    try:
        return dispatch_cells(config, ids, CELL_DEPLOYMENTS[config.execution.pool], budget_usd=budget, on_done=on_done)
    except CostOverrun as stop:
        _gate(cost_gate(quote(config), stop.gate, return_state=True))
    except CellsFailed as stop:
        failed = "; ".join(f"{c}: {m}" for c, m in list(stop.failed.items())[:5])
        raise Stopped(Failed(message=f"cells failed after every resubmission: {failed}")) from None
    except DispatchStopped as stop:
        raise Stopped(Failed(message=str(stop))) from None


def _run_here(config: ScreenConfig, cells: list[Cell], progress: Progress, pool) -> dict[str, dict]:
    """Answers first (once per regime, here), then the cells: here, or on the worker processes of `pool`."""
    results = {}
    for regime in design.regimes(cells) if not config.simulated else []:
        regime_task(config, regime)
    store = ResultStore.for_config(config)
    # Finished cells return from the store at once; worker processes (slow to start) only for the others.
    parallel = [] if pool is None else [c for c in cells if not store.is_finished(config, c)]
    for cell in cells:
        if cell not in parallel:
            results[cell.id] = cell_task(config, cell.id)
            progress.advance([cell.id])
    futures = {pool.submit(cell_task, {"config": config, "cell_id": c.id}): c.id for c in parallel}
    for future in as_completed(futures):
        results[futures[future]] = future.result()
        progress.advance([futures[future]])
    return {c.id: results[c.id] for c in cells}


@contextmanager
def cell_processes(config: ScreenConfig):
    """In-process cells on several CPU cores: worker processes that each keep their own loaded base model
    (one process trains one LoRA at a time on its copy; threads would share, and corrupt, one base).

    A cancelled or crashed screen stops them (CellPool.stop): none is left computing or holding its model, and
    each cell in flight is marked Crashed by name. If this process dies without a word (SIGKILL, out of memory),
    the kernel ends them too (PR_SET_PDEATHSIG)."""
    n = config.execution.max_parallel_cells
    if config.execution.pool != "inprocess" or n == 1 or config.simulated:
        yield None
        return
    with ProcessPoolTaskRunner(max_workers=n) as runner:
        pool = CellPool(runner)
        try:
            yield pool
        except BaseException as exc:
            pool.stop(exc)
            raise


class CellPool:
    """The screen's cell processes: ProcessPoolTaskRunner's submit, and which cell each pending future holds."""

    def __init__(self, runner: ProcessPoolTaskRunner):
        self.runner = runner
        # PrefectFuture -> (cell id, task): the task to create a Crashed run the server never saw
        self.in_flight: dict = {}
        executor = runner._executor  # processes start on demand: each first runs _die_with_parent
        executor._initargs = (executor._initializer, executor._initargs)
        executor._initializer = _die_with_parent

    def submit(self, task, parameters: dict):
        future = self.runner.submit(task, parameters)
        self.in_flight[future] = (parameters.get("cell_id", "?"), task)
        return future

    def pids(self) -> list[int]:
        executor = self.runner._executor
        return list((getattr(executor, "_processes", None) or {}).keys())

    def stop(self, why: BaseException) -> list[str]:
        """Kill the processes (SIGTERM, SIGKILL after 5 s), then mark the cells in flight Crashed; returns them."""
        import signal

        from prefect.client.orchestration import get_client
        from prefect.context import FlowRunContext
        from prefect.states import Crashed

        what = ("was cancelled or stopped" if not isinstance(why, Exception)
                else f"crashed ({type(why).__name__}: {str(why)[:200]})")
        cells = [cell_id for future, (cell_id, _) in self.in_flight.items() if not _done(future)]
        processes = list((getattr(self.runner._executor, "_processes", None) or {}).values())
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                try:
                    os.kill(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.join(timeout=5)
        # Task-run states reach the server as events, processed a little later: a cell's own Running, sent before
        # its process died, can land after a Crashed written at once. Write, read back, write again (10 s at most).
        # A run the server has not seen yet (its events queued behind a loaded server, or lost with the killed
        # process) is created Crashed under its own id: its late events, older than that state, are ignored.
        todo = {f.task_run_id: (c, task) for f, (c, task) in self.in_flight.items() if c in cells}
        ctx = FlowRunContext.get()  # stop runs inside the screen's flow: its cells' runs belong to it
        flow_run_id = ctx.flow_run.id if ctx and ctx.flow_run else None
        deadline = time.monotonic() + 10
        with get_client(sync_client=True) as client:
            while todo and time.monotonic() < deadline:
                for run_id, (cell_id, task) in list(todo.items()):
                    crashed = Crashed(message=f"cell {cell_id}: its worker process was stopped because the screen {what}")
                    try:
                        client.set_task_run_state(run_id, crashed, force=True)
                    except Exception:  # noqa: BLE001 - no such run yet, or the API is busy: create it, else retry
                        try:
                            client.create_task_run(task, flow_run_id, dynamic_key=str(run_id), id=run_id,
                                                   name=f"{task.name}-{cell_id}", state=crashed)
                        except Exception:  # noqa: BLE001 - ingested meanwhile, or the API is down: read back, retry
                            pass
                time.sleep(1.0)
                for run_id in list(todo):
                    try:
                        state = client.read_task_run(run_id).state
                    except Exception:
                        continue
                    if state is not None and state.is_crashed():
                        del todo[run_id]
        if todo:
            logging.getLogger(__name__).warning("could not mark cell(s) %s Crashed", ", ".join(c for c, _ in todo.values()))
        logging.getLogger(__name__).warning("screen %s: stopped %d cell process(es); cells in flight marked Crashed: %s",
                                            what, len(processes), ", ".join(cells) or "none")
        return cells


def _done(future) -> bool:
    wrapped = getattr(future, "wrapped_future", None)
    return bool(wrapped is not None and wrapped.done())


def _die_with_parent(initializer, initargs) -> None:
    """First thing in each cell process: the kernel sends it SIGKILL when the screen's process dies (Linux)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: cancel and crash still stop the processes (CellPool.stop)
    if os.getppid() == 1:  # the parent died before prctl
        os._exit(1)
    if initializer is not None:
        initializer(*initargs)


JOB_NAMES = (
    "Cells are named <source>-A?B?C?D?E?-s<seed> (the level, 0 or 1, of each factor A-E, and the seed). On a GPU "
    "pool each `cell` run is a job of cells run in a row, named <first cell>[+<N more cells>]-a<attempt>: "
    "librarian-A0B1C0D1E0-s42+7-a1 is that cell and 7 more, resubmitted once (a0 is the first submission); "
    "`pre-screen` is phase 0's base-model sample."
)


PHASES = ("Each phase is a subflow (phase 0: pre-screen, phase 1: smoke, phase 2: slab SOURCE, phase 3: multi-seed, "
          "phase 4: aggregation) and each kill criterion a task ("
          + ", ".join(f"gate {n}: {gates.GATE_NAMES[n]}" for n in (1, 2, 3, 4, 5)) + "). Gates 1, 2 and 5 end their task "
          "and the screen Killed when they fire; gates 3 and 4, judged after the aggregation, flag it (Flagged). ")


@flow(name="screen", on_running=[record_owner],  # `host:pid`, however it started (CLI or worker)
      flow_run_name=run_name, description="A factorial screen, phases 0-4. " + PHASES + JOB_NAMES)
def screen(config: ScreenConfig) -> dict:
    return run_screen(config)


def run_screen(config: ScreenConfig):
    """The body of both screen flows (the full config here, a preset in flows/preset.py)."""
    tag_run(config)
    try:
        pool_has_worker(config)
    except Stopped as stop:
        return stop.state
    with cell_processes(config) as pool:  # an exception stops its processes; a gate's Stopped has none in flight
        token = _RUNNING.set((pool, Progress(config)))
        try:
            return _phases(config)
        except Stopped as stop:
            return stop.state
        finally:
            _RUNNING.reset(token)


def pool_has_worker(config: ScreenConfig) -> None:
    """A GPU pool with no worker online stops the screen at once, with the command that starts one: its jobs would
    otherwise sit Late, with no message, for as long as the screen waits."""
    if config.execution.pool == "inprocess":
        return
    from prefect.client.orchestration import get_client

    from flows.runtime.workers import pool_problem

    with get_client(sync_client=True) as client:
        problem = pool_problem(client, config.execution.pool)
    if problem:
        get_run_logger().error("%s", problem)
        raise Stopped(Failed(message=problem))


# The running screen's cell processes and progress artifact, for its phase subflows (objects, not parameters:
# a subflow's parameters are stored in the API).
_RUNNING: ContextVar[tuple[Any, Progress]] = ContextVar("eps_screen_running")


def _cells(config: ScreenConfig, cells: list[Cell]) -> dict[str, dict]:
    pool, progress = _RUNNING.get()
    return run_cells(config, cells, progress, pool)


@flow(name="phase-0-pre-screen", flow_run_name="phase 0: pre-screen")
def pre_screen_phase(config: ScreenConfig) -> dict:
    """The base model on the eval panel under every prompt condition (on the GPU pool when cells go there)."""
    return _pre_screen(config)


@flow(name="phase-1-smoke", flow_run_name="phase 1: smoke")
def smoke_phase(config: ScreenConfig) -> dict[str, dict]:
    """The 2^(5-2) smoke fraction on the first source; every cell must be in the store for gate 2."""
    cells = design.smoke_cells(config)
    done = _cells(config, cells)
    store = ResultStore.for_config(config)
    missing = [c.id for c in cells if store.cell_metrics(config, c) is None]
    if missing:  # a GPU pool that writes to a store this flow cannot read
        raise Stopped(Failed(message=f"smoke cells ran but are not in the store {store.location}: {missing}"))
    return done


@flow(name="phase-2-slab", flow_run_name="phase 2: slab {source}")
def slab_phase(config: ScreenConfig, source: str) -> dict[str, dict]:
    """All 32 cells of one source at the primary seed (its smoke cells are found finished)."""
    slab = _cells(config, design.slab_cells(config, source))
    ResultStore.for_config(config).save_phase(f"slab-{source}", {"source": source, "cells": slab})
    return slab


@flow(name="phase-3-multi-seed", flow_run_name="phase 3: multi-seed")
def multiseed_phase(config: ScreenConfig, cell_ids: list[str]) -> dict[str, dict]:
    """The top cells of each source again at the extra seeds."""
    done = _cells(config, [Cell.parse(c) for c in cell_ids])
    ResultStore.for_config(config).save_phase("multiseed", {"cells": done})
    return done


# Gate tasks take their inputs quoted: Prefect 3.7 records a subflow's result passed to a task as an input of type
# "flow_run", and its UI then lists none of the run's task runs ("No task runs"); quoted, no input is recorded.
def _gate(state) -> None:
    """A gate task's state: Killed stops the screen in that state."""
    if state.is_failed():
        raise Stopped(Failed(name=state.name, message=state.message))


def _phases(config: ScreenConfig):
    logger = get_run_logger()
    store = ResultStore.for_config(config)
    store.check_writable()
    store.save_screen({"config": config.model_dump(mode="json"), "provenance": provenance()})
    _, progress = _RUNNING.get()

    # Phase 0: the base model must not already emit the marker.
    progress.begin("phase 0: pre-screen")
    pre = pre_screen_phase(config)
    _gate(contamination_gate(quote(config), quote(pre), return_state=True))

    # Phase 1: the smoke fraction on one source must move the source rate, but not saturate it.
    progress.begin(f"phase 1: smoke ({len(design.smoke_cells(config))} cells)")
    _gate(smoke_gate(quote(config), quote(smoke_phase(config)), return_state=True))

    # Phase 2: all 32 cells of every source at the primary seed.
    for source in config.sources:
        progress.begin(f"phase 2: slab {source}")
        slab_phase(config, source)

    # Phase 3: the top cells of each source again at the extra seeds.
    multiseed = multiseed_pick(config, store) or []
    progress.begin(f"phase 3: multi-seed ({len(multiseed)} cells)")
    multiseed_phase(config, [c.id for c in multiseed])

    # Phase 4: statistics, the later gates, figures and the clean-result page.
    progress.begin("phase 4: aggregation")
    result = aggregate.with_options(flow_run_name="phase 4: aggregation")(config)
    publish(config, result)  # the summary and report link on this run too, not only on the aggregate subflow
    names = {3: gates.GATE_NAMES[3], 4: gates.GATE_NAMES[4]}
    names.update((int(g["number"]), g["name"]) for g in store.gates() if int(g["number"]) >= 3)
    for number, name in sorted(names.items()):
        judged_gate(quote(config), number, name)
    progress.begin(None)
    logger.info("report: %s (%s)", result.get("url") or result["report"], result["report"])
    fired = result.get("fired") or []
    if fired:
        return Completed(message=f"report {result['report']}; gates fired: {', '.join(fired)}", data=result)
    return result
