"""Fan cells out to a GPU work pool's `job` deployment and wait for every one: the dispatch loop.

The screen flow calls `dispatch_cells(config, cell_ids, "job/<deployment>", budget_usd=plan_usd)` when
`config.execution.pool != "inprocess"`. First the cells' runs of this config that are still scheduled or running
are re-attached (flows/runtime/recovery.py), whoever submitted them. The other cells go in jobs of up to
`execution.cells_per_job` (one flow run each, the cells in a row on one GPU, the base model loaded once; smaller
when that keeps more GPUs busy), at most `execution.max_parallel_cells` jobs in flight, one run per job at a time.
Each poll:

1. submit jobs while there is room (a job waiting out its resubmission backoff steps aside);
2. read the runs in flight; a finished run is Completed (its {cell id: summary} collected, never re-run), ended by
   the infrastructure (resubmitted after `resubmit_backoff_s * 2**(attempt-1)`, at most `execution.crash_resubmits`
   times), failed for good by the infrastructure (dispatch stops at once, `InfrastructureRefused`) or failed by
   itself (reported, `CellsFailed`); recovery.py says which is which;
3. kill criterion 5 (flows/runtime/ledger.py): on overrun, every run in flight is cancelled (the worker then
   terminates their pods) and `CostOverrun` carries the one recorded outcome to the screen's `gate 5` task.

Flow runs get idempotency keys `<screen>:<fingerprint>:<owner>:<cells>:a<attempt>`, so a submission whose answer
was lost, or a screen flow run that is retried, finds its run again instead of doubling it.

The Prefect API may fail for a while (a SQLite-backed server answers 500 when every connection waits on its
lock; a restart drops connections). Dispatch outlives that: a submission or poll that fails with a 5xx or a
transport error is logged and tried again on the next poll. Only an API that stays down for `api_outage_s`
stops dispatch, with `ApiUnavailable`; the runs in flight keep going and write to the store, so running the
screen again later resumes (and re-attaches to them).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import anyio
import httpx
from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.context import FlowRunContext
from prefect.deployments import arun_deployment
from prefect.exceptions import MissingContextError
from prefect.states import Cancelled, Cancelling
from prefect.utilities.asyncutils import run_coro_as_sync

from eps_screen.analysis import gates as kill
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import group_jobs
from eps_screen.store.result_store import ResultStore
from flows.runtime import recovery
from flows.runtime.ledger import Ledger, stored_gates
from flows.runtime.names import RUNPOD_POOL

# Long enough to ride out a SQLite server's lock stall (minutes) or a server restart; short enough that a server
# that is gone for good stops the screen the same hour.
API_OUTAGE_S = 900.0


class DispatchStopped(Exception):
    """Dispatch ended without every cell completing. `summaries` holds the cells that did complete."""

    outcome = "DispatchStopped"

    def __init__(self, message: str, summaries: dict[str, dict], **details: Any):
        super().__init__(message)
        self.summaries = summaries
        self.details = details


class CostOverrun(DispatchStopped):
    """Kill criterion 5 fired; `gate` is its outcome as the ledger recorded it (once) in the store."""

    outcome = "CostOverrun"

    def __init__(self, message: str, summaries: dict[str, dict], *, gate: kill.GateOutcome, cancelled: list[str]):
        super().__init__(message, summaries, spend_usd=gate.numbers.get("spend_usd"),
                         budget_usd=gate.numbers.get("budget_usd"), cancelled=cancelled)
        self.gate, self.cancelled = gate, cancelled
        self.spend_usd, self.budget_usd = gate.numbers.get("spend_usd"), gate.numbers.get("budget_usd")


class CellsFailed(DispatchStopped):
    """Some cells failed by themselves or ran out of resubmissions; `failed` maps cell id -> last message."""

    outcome = "CellsFailed"

    def __init__(self, message: str, summaries: dict[str, dict], *, failed: dict[str, str]):
        super().__init__(message, summaries, failed=failed)
        self.failed = failed


class InfrastructureRefused(DispatchStopped):
    """The GPU pool can never start these jobs (a rejected key, an unknown GPU type, a refused image)."""

    outcome = "InfrastructureRefused"


class ApiUnavailable(DispatchStopped):
    """The Prefect API failed every request for longer than the outage dispatch tolerates."""

    outcome = "ApiUnavailable"


@dataclass
class Job:
    """One flow run's worth of cells, run in a row on one GPU (the base model loads once per job)."""

    cell_ids: tuple[str, ...]
    attempt: int = 0
    flow_run_id: UUID | None = None
    not_before: float = 0.0
    active_since: float | None = None  # monotonic time the current run left Scheduled
    runs: list[dict[str, Any]] = field(default_factory=list)  # every finished run: id, state, message, seconds

    @property
    def name(self) -> str:
        return self.cell_ids[0] if len(self.cell_ids) == 1 else f"{self.cell_ids[0]}+{len(self.cell_ids) - 1}"


def dispatch_cells(config: ScreenConfig, cell_ids: list[str], deployment: str, budget_usd: float | None = None,
                   **options: Any) -> dict[str, dict]:
    """Blocking wrapper around `adispatch_cells` (usable from a sync flow)."""
    return run_coro_as_sync(adispatch_cells(config, cell_ids, deployment, budget_usd, **options))


async def adispatch_cells(config: ScreenConfig, cell_ids: list[str], deployment: str, budget_usd: float | None = None,
                          *, poll_s: float = 5.0, key_prefix: str | None = None,
                          cancel_wait_s: float = 60.0, on_done: Callable[[str], None] | None = None,
                          api_outage_s: float = API_OUTAGE_S, store: ResultStore | None = None,
                          cost_wait_s: float | None = None) -> dict[str, dict]:
    """Run every cell to completion on `deployment`; returns {cell_id: the job flow's summary}.

    `on_done(cell_id)` is called (in a thread: it may call Prefect's sync client) as each cell completes, so the
    screen's progress artifact moves per cell rather than per phase.

    `cost_wait_s`: how long the end waits for the last runs' pod cost records (default: the ledger's
    _POLLS_FOR_A_COST polls); one not there by then is recorded as an estimate, re-priced by the next dispatch.

    Raises CostOverrun (kill criterion 5), CellsFailed, InfrastructureRefused or ApiUnavailable; each carries
    `.summaries` of the completed cells.
    """
    if len(set(cell_ids)) != len(cell_ids):
        raise ValueError("cell_ids has duplicates")
    async with get_client() as client:
        loop = _Dispatch(client, config, deployment, budget_usd, store or ResultStore.for_config(config),
                         poll_s=poll_s, key_prefix=key_prefix or _default_key_prefix(config),
                         cancel_wait_s=cancel_wait_s, on_done=on_done, api_outage_s=api_outage_s,
                         cost_wait_s=cost_wait_s)
        return await loop.run(cell_ids)


def _default_key_prefix(config: ScreenConfig) -> str:
    ctx = FlowRunContext.get()
    owner = str(ctx.flow_run.id) if ctx and ctx.flow_run else str(time.time_ns())
    return f"{config.name}:{recovery.fingerprint(config)}:{owner}"


def _logger() -> Any:
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("eps_screen.dispatch")


class _Outage:
    """How long the Prefect API has failed every request; past `limit_s`, dispatch stops (ApiUnavailable)."""

    def __init__(self, limit_s: float, poll_s: float, logger: Any):
        self.limit_s, self.poll_s, self.logger = limit_s, poll_s, logger
        self.since: float | None = None  # monotonic time of the first failure of the current outage

    def ok(self) -> None:
        self.since = None

    def failed(self, exc: BaseException, doing: str, done: dict[str, dict], in_flight: int) -> None:
        """Wait out a 5xx answer or no answer at all; a 4xx is a bug, raised at once."""
        transient = (exc.response.status_code >= 500 if isinstance(exc, httpx.HTTPStatusError)
                     else isinstance(exc, httpx.TransportError))
        if not transient:
            raise exc
        self.since = self.since or time.monotonic()
        down = time.monotonic() - self.since
        self.logger.warning("Prefect API failed while %s (%s: %s); down %.0f s, trying again in %.0f s", doing,
                            type(exc).__name__, str(exc)[:200], down, self.poll_s)
        if down > self.limit_s:
            raise ApiUnavailable(
                f"The Prefect API failed every request for {down:.0f} s (over {self.limit_s:.0f} s) while {doing}: "
                f"{type(exc).__name__}: {str(exc)[:200]}. {len(done)} cells finished and are in the store; "
                f"{in_flight} job(s) in flight keep running. Once the server answers, run the screen again "
                "(or `eps-screen retry`): finished cells are not recomputed.", done) from exc


class _Dispatch:
    """One dispatch: the queue of jobs, the runs in flight (by flow run id), what is done and what failed."""

    def __init__(self, client: Any, config: ScreenConfig, deployment: str, budget_usd: float | None,
                 store: ResultStore, *, poll_s: float, key_prefix: str, cancel_wait_s: float,
                 on_done: Callable[[str], None] | None, api_outage_s: float, cost_wait_s: float | None = None):
        self.client, self.config, self.deployment, self.store = client, config, deployment, store
        self.poll_s, self.prefix, self.cancel_wait_s, self.on_done = poll_s, key_prefix, cancel_wait_s, on_done
        self.cost_wait_s = cost_wait_s
        self.logger = _logger()
        self.outage = _Outage(api_outage_s, poll_s, self.logger)
        self.ledger = Ledger(config, budget_usd, store, self.logger)
        self.silences = recovery.Silences(store, self.logger)
        self.queue: deque[Job] = deque()
        self.in_flight: dict[UUID, Job] = {}
        self.done: dict[str, dict] = {}
        self.failed: dict[str, str] = {}
        ex = config.execution
        self.job_variables = (
            {"bootstrap_timeout_s": config.gates.bootstrap_silence_s, "max_wall_hours": config.gates.max_job_hours,
             "gpu_types": list(ex.gpu_types)}  # the types `validate` checked the job's memory against
            if ex.pool == RUNPOD_POOL else None
        )

    async def run(self, cell_ids: list[str]) -> dict[str, dict]:
        await self._attach(cell_ids)
        if self.config.execution.pool == RUNPOD_POOL:  # earlier runs of the screen whose pods' records came late
            try:
                await self.ledger.reprice_stored(self.client)
            except Exception as exc:
                self.outage.failed(exc, "re-pricing earlier runs", self.done, len(self.in_flight))
        await self.ledger.read_stored()
        while self.queue or self.in_flight:
            now = time.monotonic()
            await self._submit_ready(now)
            runs = await self._read_in_flight()
            for run_id, job in list(self.in_flight.items()):
                if run_id in runs:
                    await self._settle(job, runs[run_id], now)
            await self._check_spend(now)
            if self.queue or self.in_flight:
                await anyio.sleep(self.poll_s)
        await self._settle_costs()
        stored = await stored_gates(self.store)
        await self.ledger.record_passed(stored)
        if self.config.execution.pool == RUNPOD_POOL:  # only its worker watches for bootstrap silence
            await self.silences.record_quiet(self.config.gates.bootstrap_silence_s, stored)
        if self.failed:
            raise CellsFailed(f"{len(self.failed)} of {len(cell_ids)} cells did not complete: {sorted(self.failed)}",
                              self.done, failed=self.failed)
        return self.done

    async def _attach(self, cell_ids: list[str]) -> None:
        """The runs of these cells still scheduled or running go in flight as they are; the rest into the queue."""
        while True:
            try:
                deployment = await self.client.read_deployment_by_name(self.deployment)
                attached = await recovery.attachable_runs(self.client, deployment.id, self.config, cell_ids,
                                                          self.store)
                break
            except Exception as exc:
                self.outage.failed(exc, "looking for the cells' runs", self.done, 0)
                await anyio.sleep(self.poll_s)
        self.outage.ok()
        now, wall = time.monotonic(), dt.datetime.now(dt.UTC)
        for run, cells in attached:
            job = Job(cells, attempt=_attempt(run.name), flow_run_id=run.id)
            if run.start_time is not None:  # it has been costing since then
                job.active_since = now - max(0.0, (wall - run.start_time).total_seconds())
            self.in_flight[run.id] = job
            self.logger.info("Cell %s: re-attached to flow run %s (%s), submitted earlier", job.name, run.id,
                             run.state.name)
        covered = {c for _, cells in attached for c in cells}
        ex = self.config.execution
        rest = [c for c in cell_ids if c not in covered]
        self.queue.extend(Job(j) for j in group_jobs(self.config, rest, ex.cells_per_job, ex.max_parallel_cells))

    async def _submit_ready(self, now: float) -> None:
        for _ in range(len(self.queue)):
            if len(self.in_flight) >= self.config.execution.max_parallel_cells:
                return
            job = self.queue.popleft()
            if job.not_before > now:
                self.queue.append(job)
                continue
            try:
                job.flow_run_id = await _submit(self.client, self.config, job, self.deployment, self.prefix,
                                                self.job_variables)
            except Exception as exc:
                self.queue.appendleft(job)
                self.outage.failed(exc, f"submitting cell {job.name}", self.done, len(self.in_flight))
                return
            self.outage.ok()
            job.active_since = None
            self.in_flight[job.flow_run_id] = job
            self.logger.info("Cell %s attempt %d -> flow run %s", job.name, job.attempt, job.flow_run_id)

    async def _read_in_flight(self) -> dict[UUID, Any]:
        if not self.in_flight:
            return {}
        try:
            runs = await self.client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(self.in_flight))))
        except Exception as exc:
            self.outage.failed(exc, "reading the runs in flight", self.done, len(self.in_flight))
            return {}
        self.outage.ok()
        return {r.id: r for r in runs}

    async def _settle(self, job: Job, run: Any, now: float) -> None:
        """One run's news: it left Scheduled, or it ended and what follows (done, resubmit, stop, failed)."""
        state = run.state
        if state is None:
            return
        if job.active_since is None and not state.is_scheduled():
            job.active_since = now
        if not state.is_final():
            return
        seconds = now - job.active_since if job.active_since else 0.0
        # its cost goes to every cell the run was submitted with (a re-attached job may want fewer of them)
        run_cells = (run.parameters or {}).get("cell_ids") or list(job.cell_ids)
        self.ledger.run_ended(run.id, seconds, tuple(run_cells), state.name)
        job.runs.append({"flow_run_id": str(run.id), "state": state.name, "message": state.message,
                         "seconds": round(seconds, 1)})
        del self.in_flight[run.id]
        await self.silences.run_ended(run, job.cell_ids, job.name)
        if label := recovery.wall_time_label(run):  # the worker's wall-time backstop fired
            outcome, why = self.ledger.adopt(run, label)
            await self._overrun(outcome, f"cell {job.name}'s pod: {why}")
        if permanent := recovery.permanent_failure(run):
            self.failed.update(dict.fromkeys(job.cell_ids, f"{state.name}: {permanent}"))
            cancelled = await self._cancel_all(f"stopped: {permanent}", min(self.cancel_wait_s, 10))
            raise InfrastructureRefused(
                f"{permanent}. Screen stopped at once ({len(self.done)} cell(s) done, {len(cancelled)} cancelled);"
                " fix it and run the screen again.", self.done, failed=self.failed, cancelled=cancelled)
        ex = self.config.execution
        if state.is_completed():
            summaries = await _summaries(state, job, self.logger)
            self.ledger.completed(run.id, summaries)
            self.done.update(summaries)
            if self.on_done is not None:
                for cell_id in summaries:
                    await anyio.to_thread.run_sync(self.on_done, cell_id)
        elif job.attempt < ex.crash_resubmits and await recovery.infrastructure_ended(self.client, run, self.logger):
            job.attempt += 1
            backoff = ex.resubmit_backoff_s * 2 ** (job.attempt - 1)
            job.not_before = now + backoff
            self.queue.append(job)
            self.logger.warning("Cell %s run %s ended %s (%s); resubmitting in %.0f s (attempt %d of %d)", job.name,
                                run.id, state.name, state.message, backoff, job.attempt, ex.crash_resubmits)
        else:
            self.failed.update(dict.fromkeys(job.cell_ids, f"{state.name}: {state.message}"))
            self.logger.error("Cell %s gave up after %d attempt(s): %s", job.name, job.attempt + 1,
                              self.failed[job.cell_ids[0]])

    async def _settle_costs(self) -> None:
        """The last runs' costs into the store (Ledger.settle); an API that fails meanwhile leaves them as estimates
        for the next dispatch to re-price, never the screen's failure."""
        try:
            await self.ledger.settle(self.client, self.poll_s, publishes=self.config.execution.pool == RUNPOD_POOL,
                                     wait_s=self.cost_wait_s)
        except Exception as exc:
            self.logger.warning("Could not read the last runs' pod costs (%s: %s); recorded as estimates",
                                type(exc).__name__, str(exc)[:200])
            await self.ledger.flush()

    async def _record_stopped_costs(self) -> None:
        """Dispatch stops with runs unpriced: what they cost so far goes in the store as estimates (runs cancelled
        in flight at their seconds until now), for the next dispatch of the screen to re-price from their pods."""
        now = time.monotonic()
        for run_id, job in self.in_flight.items():
            if job.active_since is not None:  # a run no worker picked up rented nothing
                self.ledger.run_ended(run_id, now - job.active_since, job.cell_ids, "Cancelled")
        try:
            await self.ledger.flush()
        except Exception as exc:  # the stop it follows is what the screen must see
            self.logger.warning("Could not record the stopped runs' costs (%s)", type(exc).__name__)

    async def _check_spend(self, now: float) -> None:
        try:
            await self.ledger.price(self.client)
        except Exception as exc:
            self.outage.failed(exc, "reading pod costs", self.done, len(self.in_flight))
        active = [(j.name, now - j.active_since) for j in self.in_flight.values() if j.active_since is not None]
        outcome, why = self.ledger.decide(active)
        if outcome.fired:
            await self._overrun(outcome, why)

    async def _overrun(self, outcome: kill.GateOutcome, why: str) -> None:
        """Kill criterion 5 fired: cancel every run in flight, record the outcome once with that, stop."""
        cells = sorted(c for job in self.in_flight.values() for c in job.cell_ids)
        try:
            await self._cancel_all(f"kill criterion 5: {why}", self.cancel_wait_s)
        finally:  # recorded even when the API refuses the cancellations
            gate = await self.ledger.record_fired(outcome, why, cells)
            await self._record_stopped_costs()
        raise CostOverrun(f"Kill criterion 5 (cost overrun): {gate.reason}", self.done, gate=gate, cancelled=cells)

    async def _cancel_all(self, message: str, wait_s: float) -> list[str]:
        """Cancel every run in flight (Cancelling -> the worker terminates the pod), then wait for them to settle."""
        ids = {run_id: job.name for run_id, job in self.in_flight.items()}
        cells = sorted(c for job in self.in_flight.values() for c in job.cell_ids)
        in_ids = FlowRunFilter(id=FlowRunFilterId(any_=list(ids)))
        for run in await self.client.read_flow_runs(flow_run_filter=in_ids):
            if run.state is None or run.state.is_final():
                continue
            # A run no worker has picked up has no pod: cancel it outright; otherwise let the worker do it.
            target = Cancelled(message=message) if run.state.is_scheduled() else Cancelling(message=message)
            await self.client.set_flow_run_state(run.id, target, force=True)
            self.logger.warning("Cancelling cell %s (flow run %s): %s", ids[run.id], run.id, message)
        deadline = time.monotonic() + wait_s
        while ids and time.monotonic() < deadline:
            runs = await self.client.read_flow_runs(flow_run_filter=in_ids)
            if all(r.state is not None and r.state.is_final() for r in runs):
                break
            await anyio.sleep(1.0)
        return cells


def _attempt(run_name: str) -> int:
    """The attempt a run was submitted as (`<job>-a<attempt>`), so a re-attached job keeps its resubmission count."""
    found = re.search(r"-a(\d+)$", run_name or "")
    return int(found[1]) if found else 0


async def _submit(client: Any, config: ScreenConfig, job: Job, deployment: str, prefix: str,
                  job_variables: dict[str, Any] | None) -> UUID:
    run = await arun_deployment(
        deployment,
        client=client,
        parameters={"config": config.model_dump(mode="json"), "cell_ids": list(job.cell_ids)},
        timeout=0,
        flow_run_name=f"{job.name}-a{job.attempt}",
        idempotency_key=f"{prefix}:{','.join(job.cell_ids)}:a{job.attempt}",
        tags=recovery.run_tags(config),
        job_variables=job_variables,
    )
    return run.id


async def _summaries(state: Any, job: Job, logger: Any) -> dict[str, dict]:
    """The job flow's return value, {cell_id: summary} (needs persisted results readable here); a stub for
    a cell whose summary cannot be read."""
    try:
        result = await state.aresult(raise_on_failure=False)
    except Exception as exc:
        logger.warning("Cell %s completed but its result could not be read (%s); returning stubs",
                       job.name, type(exc).__name__)
        result = None
    result = result if isinstance(result, dict) else {}
    stub = {"result_missing": True, "flow_run_id": job.runs[-1]["flow_run_id"]}
    return {c: {"cell_id": c, **(result[c] if isinstance(result.get(c), dict) else stub)} for c in job.cell_ids}
