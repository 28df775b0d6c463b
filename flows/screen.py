"""The screen: phases 0-4 of docs/experiment.md, read top to bottom. Gates end the run in a state named "Killed".

Cells run in-process (pool 'inprocess': here, or on the `execution.max_parallel_cells` worker processes of the cell
pool, eps_screen/run/cell_pool.py) or as runs of the `job` deployment on a GPU work pool (flows/runtime/dispatch.py:
resubmits crashed runs, enforces the spend cap). Either way every finished cell is in the store, so running the
screen again resumes it; gate decisions read the store, not the runs' return values.

A screen run makes its store, plan, cell pool and progress artifact once and hands them to each phase: the phases
are flows on a `ScreenRun`, so Prefect stores only their own parameters (a store's options may hold credentials).
"""

from __future__ import annotations

from collections import Counter
from contextlib import nullcontext

import polars as pl
from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.futures import as_completed
from prefect.runtime import flow_run
from prefect.states import Completed, Failed
from prefect.utilities.annotations import quote

from eps_screen.analysis import gates
from eps_screen.analysis.stats import factorial_effects
from eps_screen.plan.screen_plan import Plan, make_plan, multiseed_pick
from eps_screen.report.serve import shown_link
from eps_screen.run import pipeline, tracking
from eps_screen.spec import design
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import PRE_SCREEN_ID, Cell
from eps_screen.spec.presets import screen_name
from eps_screen.store.claims import Busy, RunLease
from eps_screen.store.provenance import provenance
from eps_screen.store.result_store import ResultStore
from flows.aggregate import aggregate, publish
from eps_screen.run.cell_pool import CellPool, open_cell_pool
from flows.runtime.dispatch import CellsFailed, CostOverrun, DispatchStopped, dispatch_cells
from flows.runtime.names import JOB_DEPLOYMENTS
from flows.runtime.phase_progress import PhaseProgress
from flows.runtime.runs import record_owner
from flows.runtime.workers import pool_problem
from tasks.cells import answer_sets_task, cell_summary, cell_task, pre_screen_task
from tasks.gates import contamination_gate, cost_gate, judged_gate, smoke_gate

PHASES = ("Each phase is a subflow (phase 0: pre-screen, phase 1: smoke, phase 1b: fold-over when design.fold_over, "
          "phase 2: slabs, phase 3: multi-seed, phase 4: aggregation) and each kill criterion a task ("
          + ", ".join(f"gate {n}: {gates.GATE_NAMES[n]}" for n in (1, 2, 3, 4, 5)) + "). Gates 1, 2 and 5 end their task "
          "and the screen Killed when they fire; gates 3 and 4, judged after the aggregation, flag it (Flagged). ")

JOB_NAMES = (
    "Cells are named <source>-<factor><level>...-s<seed> (each declared factor's letter and its level, 0 or 1, in "
    "the config's order, then the seed). On a GPU "
    "pool each `job` run is a GPU job, its cells run in a row, named <first cell>[+<N more cells>]-a<attempt>: "
    "librarian-A0B1C0D1E0-s42+7-a1 is that cell and 7 more, resubmitted once (a0 is the first submission); "
    "`pre-screen` is phase 0's base-model sample."
)


def run_name() -> str:
    """`screen-<name>`, however the run started (CLI, --submit, either deployment's form)."""
    return f"screen-{screen_name(flow_run.parameters)}"


@flow(name="screen", on_running=[record_owner],  # `host:pid`, however it started (CLI or worker)
      flow_run_name=run_name, description="A factorial screen, phases 0-4. " + PHASES + JOB_NAMES)
def screen(config: ScreenConfig, force: bool = False) -> dict:
    """force: run even while another run of this screen holds its store (eps_screen/store/claims.py)."""
    return run_screen(config, force)


def run_screen(config: ScreenConfig, force: bool = False):
    """The body of both screen flows (the full config here, a preset in flows/preset.py). A run that finds another
    run of the screen live on its store ends in a Failed state named Busy, saying which (unless force)."""
    tag_run(config)
    store, plan = ResultStore.for_config(config), make_plan(config)
    try:
        pool_has_worker(config)
    except Stopped as stop:
        return stop.state
    lease = RunLease(store, prefect_run=str(flow_run.id))
    try:
        lease.start(force)
    except Busy as busy:
        return Failed(name="Busy", message=str(busy))
    try:
        with open_cell_pool(config) as pool:  # an exception stops its processes; a gate's Stopped has none in flight
            try:
                return ScreenRun(config, store, plan, pool, PhaseProgress(config, plan), lease).phases()
            except Stopped as stop:
                tracking.end_screen(config, store, killed=stop.state.name == "Killed")
                return stop.state
    finally:
        lease.end()


class Stopped(Exception):
    """The screen ends early in `state`: a gate fired, a GPU pool's dispatch stopped (spend cap, cells failed after
    every resubmission), or work ran but is not in the store. Raised through the phase subflows to the screen."""

    def __init__(self, state):
        super().__init__(state.message)
        self.state = state


class ScreenRun:
    """One run of the screen: its config, store, plan, cell pool (None: cells run here or on a GPU pool) and
    progress artifact, and its phases."""

    def __init__(self, config: ScreenConfig, store: ResultStore, plan: Plan, pool: CellPool | None = None,
                 progress: PhaseProgress | None = None, lease: RunLease | None = None):
        self.config, self.store, self.plan, self.pool, self.progress = config, store, plan, pool, progress
        self.lease = lease

    def phases(self):
        config, store, progress = self.config, self.store, self.progress
        store.check_writable()
        store.save_screen({"config": config.model_dump(mode="json"), "provenance": provenance()})
        tracking.start_screen(config, store)  # the parent run, before any cell process looks it up

        # Phase 0: the base model must not already emit the marker.
        progress.begin("phase 0: pre-screen")
        pre = self.pre_screen_phase()
        _gate(contamination_gate(quote(config), quote(store), quote(pre), return_state=True))

        # Phase 1: the smoke fraction on one source must move the source rate, but not saturate it.
        progress.begin(f"phase 1: smoke ({len(design.smoke_cells(config))} cells)")
        _gate(smoke_gate(quote(config), quote(store), quote(self.smoke_phase()), return_state=True))

        # Phase 1b (design.fold_over): the smoke fraction with every level flipped. With the smoke's cells, the main
        # effects are clear of two-factor interactions, which the smoke fraction alone aliases with them.
        folded = design.fold_over_cells(config)
        if folded:
            progress.begin(f"phase 1b: fold-over ({len(folded)} cells)")
            self.fold_over_phase()

        # Phase 2: every source's slab design (design.slab) at the primary seed, all sources in one dispatch.
        progress.begin(f"phase 2: slabs ({len(design.all_slab_cells(config))} cells)")
        self.slab_phase()

        # Phase 3: the top cells of each source again at the extra seeds.
        multiseed = multiseed_pick(config, store) or []
        progress.begin(f"phase 3: multi-seed ({len(multiseed)} cells)")
        self.multiseed_phase([c.id for c in multiseed])

        # Phase 4: statistics, the later gates, figures and the clean-result page.
        progress.begin("phase 4: aggregation")
        result = aggregate.with_options(flow_run_name="phase 4: aggregation")(config)
        publish(config, result)  # the summary and report link on this run too, not only on the aggregate subflow
        names = {3: gates.GATE_NAMES[3], 4: gates.GATE_NAMES[4]}
        names.update((int(g["number"]), g["name"]) for g in store.gates() if int(g["number"]) >= 3)
        for number, name in sorted(names.items()):
            # Quoted: Prefect links an input to the run that returned an object of the same id(), and the gate's
            # name or number can share one with a value in the aggregation's result (the graph then showed gate 3
            # as fed by that subflow, which empties the UI's task-run list).
            judged_gate(quote(store), quote(number), quote(name))
        progress.begin(None)
        get_run_logger().info("report: %s", shown_link(result.get("url"), result["report"]))
        fired = result.get("fired") or []
        if fired:
            return Completed(message=f"report {result['report']}; gates fired: {', '.join(fired)}", data=result)
        return result

    @flow(name="phase-0-pre-screen", flow_run_name="phase 0: pre-screen")
    def pre_screen_phase(self) -> dict:
        """The base model on the eval panel under every prompt condition: here in-process; on a GPU pool there
        (a 7B model on the screen's CPU would take days), or read from the store when finished."""
        config, store = self.config, self.store
        done = lambda: pipeline.finished_pre_screen(config, store) is not None  # noqa: E731
        with self.lease.holding(PRE_SCREEN_ID, done) if self.lease else nullcontext():  # one run computes it
            if config.execution.pool == "inprocess":
                return pre_screen_task(config, store)
            if not done():
                self.dispatch([PRE_SCREEN_ID])
        pre = pipeline.finished_pre_screen(config, store)
        if pre is None:  # a GPU pool that writes to a store this flow cannot read
            raise Stopped(Failed(message=f"the pre-screen ran but is not in the store {store.location}"))
        return pre

    @flow(name="phase-1-smoke", flow_run_name="phase 1: smoke")
    def smoke_phase(self) -> dict[str, dict]:
        """The smoke fraction (design.smoke) on the smoke source; every cell must be in the store for gate 2."""
        cells = design.smoke_cells(self.config)
        done = self.cells(cells)
        missing = [c.id for c in cells if self.store.cell_metrics(self.config, c) is None]
        if missing:  # a GPU pool that writes to a store this flow cannot read
            raise Stopped(Failed(message=f"smoke cells ran but are not in the store {self.store.location}: {missing}"))
        return done

    @flow(name="phase-1b-fold-over", flow_run_name="phase 1b: fold-over")
    def fold_over_phase(self) -> dict[str, dict]:
        """The smoke fraction's fold-over on the smoke source (slab cells: the slab finds them finished). Its record
        keeps the main effects of smoke and fold-over together, each clear of the two-factor interactions."""
        config, store = self.config, self.store
        done = self.cells(design.fold_over_cells(config))
        both = design.smoke_cells(config) + design.fold_over_cells(config)
        metrics = [store.cell_metrics(config, c) for c in both]
        missing = [c.id for c, m in zip(both, metrics, strict=True) if m is None]
        if missing:  # a GPU pool that writes to a store this flow cannot read
            raise Stopped(Failed(message=f"fold-over cells ran but are not in the store {store.location}: {missing}"))
        effects = clear_main_effects(config, both, metrics)
        store.save_phase("fold-over", {"cells": done, "design": f"{design.phases(config).smoke.describe()} and its "
                                       f"fold-over, {len(both)} runs", "main_effects": effects})
        get_run_logger().info("smoke + fold-over main effects on SR (clear of two-factor interactions): %s",
                              ", ".join(f"{f} {e:+.3f}" for f, e in effects["SR"].items()))
        return done

    @flow(name="phase-2-slabs", flow_run_name="phase 2: slabs")
    def slab_phase(self) -> dict[str, dict]:
        """Every cell of each source's slab design at the primary seed (the smoke and fold-over cells are found
        finished). One phase for all sources: no gate lies between them, and on a GPU pool one dispatch fills its
        jobs with cells of any source, so fewer jobs pay a pod's start-up (qwen7b.yaml: 4 instead of 12, one
        source after another). Each source's slab is still saved as its own phase record."""
        cells = design.all_slab_cells(self.config)
        done = self.cells(cells)
        for source in self.config.sources:
            self.store.save_phase(f"slab-{source}", {"source": source,
                                                     "cells": {c.id: done[c.id] for c in cells if c.source == source}})
        return done

    @flow(name="phase-3-multi-seed", flow_run_name="phase 3: multi-seed")
    def multiseed_phase(self, cell_ids: list[str]) -> dict[str, dict]:
        """The top cells of each source again at the extra seeds."""
        done = self.cells([Cell.parse(c) for c in cell_ids])
        self.store.save_phase("multiseed", {"cells": done})
        return done

    # --- where a phase's cells run ------------------------------------------------------------------------------
    def cells(self, cells: list[Cell]) -> dict[str, dict]:
        """{cell id: summary} of these cells, each run where the config says (finished ones read from the store).
        Only cells this run holds a claim on are computed; those another live run holds are waited for."""
        if self.lease is None:
            return self._cells(cells)
        results, waiting = {}, cells
        while waiting:
            mine, theirs = self.lease.claim(self.config, waiting)
            try:
                results.update(self._cells(mine))
            finally:
                self.lease.release(self.config, mine)
            if theirs:
                get_run_logger().info("%d cell(s) are being computed by another run of this screen: waiting for them",
                                      len(theirs))
            waiting = self.lease.wait(self.config, theirs)
        return {c.id: results[c.id] for c in cells}

    def _cells(self, cells: list[Cell]) -> dict[str, dict]:
        if not cells:
            return {}
        if self.config.execution.pool != "inprocess":
            return self._on_gpu_pool(cells)
        if cells and not self.config.simulated:
            answer_sets_task(self.config, design.regimes(self.config, cells), self.store)  # answers first, once, here
        # Finished cells return from the store at once; worker processes (slow to start) only for the others.
        todo = [] if self.pool is None else [c for c in cells if not self.store.is_finished(self.config, c)]
        results = {}
        for cell in cells:
            if cell not in todo:
                results[cell.id] = cell_task(self.config, cell.id, self.store)
                self.progress.advance([cell.id])
        results.update(self._on_cell_pool(todo))
        return {c.id: results[c.id] for c in cells}

    def _on_cell_pool(self, cells: list[Cell]) -> dict[str, dict]:
        """The cells on the cell pool, as many task runs at a time as it has workers (a run waiting for a worker would
        show Running). A cell whose worker died ends its run Crashed and is run again in a new one, at most
        `execution.crash_resubmits` times; the others go on."""
        config, pool = self.config, self.pool
        pending, running, crashes, results = list(cells), {}, Counter(), {}
        try:
            while pending or running:
                while pending and len(running) < pool.size:
                    cell = pending.pop(0)
                    running[cell_task.submit(config, cell.id, self.store, pool)] = cell
                future = next(as_completed(list(running)))
                cell = running.pop(future)
                future.wait()
                if future.state.is_crashed():
                    crashes[cell.id] += 1
                    if crashes[cell.id] > config.execution.crash_resubmits:
                        raise Stopped(Failed(message=f"{future.state.message}; crashed {crashes[cell.id]} times"))
                    get_run_logger().warning("%s: marked Crashed; running it again (%d of %d)", future.state.message,
                                             crashes[cell.id], config.execution.crash_resubmits)
                    pending.insert(0, cell)
                    continue
                results[cell.id] = future.result()  # a cell failed after its retries fails the phase
                self.progress.advance([cell.id])
        except BaseException as exc:
            # Here, not only where the pool was opened: the phase's task runner waits for its runs before an
            # exception leaves the phase, and those runs wait for workers that only stopping ends.
            pool.stop(exc)
            raise
        return results

    def _on_gpu_pool(self, cells: list[Cell]) -> dict[str, dict]:
        """The cells not yet in the store, in jobs of the `job` deployment on the config's GPU pool.

        Finished cells are read here: a GPU job started only to find its cells finished would cost a pod start-up
        (minutes, billed) for every smoke cell in its slab and for every cell of a resumed screen."""
        with self.store.listing():
            metrics = {c.id: self.store.cell_metrics(self.config, c) for c in cells}
        finished = {cell_id: cell_summary(m) for cell_id, m in metrics.items() if m is not None}
        self.progress.advance(list(finished))
        todo = [c.id for c in cells if c.id not in finished]
        dispatched = self.dispatch(todo, on_done=lambda cell_id: self.progress.advance([cell_id])) if todo else {}
        return {c.id: finished.get(c.id) or dispatched[c.id] for c in cells}

    def dispatch(self, ids: list[str], on_done=None) -> dict[str, dict]:
        """dispatch_cells under the screen's rules: kill criterion 5 ends the screen Killed, with its gate saved;
        cells that failed every resubmission end it Failed. Finished work stays in the store either way."""
        config, plan = self.config, self.plan
        if plan.problems:  # before anything is rented: a job that cannot fit its GPU would crash on it
            raise Stopped(Failed(message="; ".join(plan.problems)))
        try:
            return dispatch_cells(config, ids, JOB_DEPLOYMENTS[config.execution.pool], budget_usd=spend_limit(plan),
                                  on_done=on_done)
        except CostOverrun as stop:  # decided and recorded by the spend ledger; the gate task shows it
            _gate(cost_gate(quote(self.store), quote(stop.gate), return_state=True))
        except CellsFailed as stop:
            failed = "; ".join(f"{c}: {m}" for c, m in list(stop.failed.items())[:5])
            raise Stopped(Failed(message=f"cells failed after every resubmission: {failed}")) from None
        except DispatchStopped as stop:
            raise Stopped(Failed(message=str(stop))) from None


def spend_limit(plan: Plan) -> float | None:
    """The estimate kill criterion 5 holds spend to; None for a plan priced at $0 (CPU-hours: the tiny model on a
    GPU pool), whose every spend would be "over 1.5 x the plan's $0.00" at the first poll."""
    return plan.estimate.get("cost_usd") or None


def clear_main_effects(config: ScreenConfig, cells: list[Cell], metrics: list[dict]) -> dict[str, dict[str, float]]:
    """{response: {factor: level-1 minus level-0 mean}} over a fraction and its fold-over (a resolution IV design)."""
    table = pl.DataFrame([{**dict(zip(c.factors, c.levels, strict=True)), "SR": m["source_rate"], "LR": m["leakage"]}
                          for c, m in zip(cells, metrics, strict=True)])
    shorts = list(config.design.shorts)
    return {r: factorial_effects(table, r, shorts).main_effects for r in ("SR", "LR")}


# Gate tasks take their inputs quoted: Prefect 3.7 records a subflow's result passed to a task as an input of type
# "flow_run", and its UI then lists none of the run's task runs ("No task runs"); quoted, no input is recorded.
def _gate(state) -> None:
    """A gate task's state: Killed stops the screen in that state."""
    if state.is_failed():
        raise Stopped(Failed(name=state.name, message=state.message))


def tag_run(config: ScreenConfig) -> None:
    """The tag `screen:<name>` on this run (the cell runs it submits carry it too)."""
    try:
        with get_client(sync_client=True) as client:
            tags = client.read_flow_run(flow_run.id).tags
            client.update_flow_run(flow_run.id, tags=sorted({*tags, "eps-screen", f"screen:{config.name}"}))
    except Exception as exc:  # a tag is not worth a screen
        get_run_logger().warning("run not tagged (%s: %s)", type(exc).__name__, str(exc)[:200])


def pool_has_worker(config: ScreenConfig) -> None:
    """A GPU pool with no worker online stops the screen at once, with the command that starts one: its jobs would
    otherwise sit Late, with no message, for as long as the screen waits."""
    if config.execution.pool == "inprocess":
        return
    with get_client(sync_client=True) as client:
        problem = pool_problem(client, config.execution.pool)
    if problem:
        get_run_logger().error("%s", problem)
        raise Stopped(Failed(message=problem))
