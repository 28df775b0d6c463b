"""Fan cells out to a GPU work pool's `cell` deployment; resubmit crashed runs; enforce the spend cap.

The screen flow calls `dispatch_cells(config, cell_ids, "cell/<deployment>", budget_usd=plan_usd)` when
`config.execution.pool != "inprocess"`. The cells go in jobs of up to `execution.cells_per_job` (one flow run
each, the cells in a row on one GPU, the base model loaded once; smaller when that keeps more GPUs busy), at
most `execution.max_parallel_cells` jobs in flight, one run per job at a time:

- Completed -> its return value ({cell id: summary}) is collected; a Completed job is never re-run.
- Crashed, or Failed by the infrastructure (submission, flow loading), or ended by the infrastructure at
  any point (a Crashed state anywhere in the run's history, or the RunPod worker's `eps-screen.killed-by`
  label: a pod's dying process can write Failed after the worker's Crashed) -> resubmitted after
  `resubmit_backoff_s * 2**(attempt-1)`, at most `execution.crash_resubmits` times. Prefect does not retry
  Crashed flow runs by itself (PrefectHQ/prefect#10211); the cell flow skips work already in the store, so a
  resubmitted cell recomputes only what it had not finished.
- Failed by the flow itself (a bug, a bad input) or Cancelled by someone else -> not retried; reported.
- Failed for good by the infrastructure (the worker's `eps-screen.permanent-failure` label: a rejected key, an
  unknown GPU type, a refused image) -> dispatch stops at once, cancels the runs in flight and raises
  `InfrastructureRefused` with that one line: no retry can start such a job.

Kill criteria 5 and 6 are recorded in the store (`ResultStore.save_gate`), so the report shows them: criterion
6 (bootstrap silence) is decided by the worker (`gates.bootstrap_silence`) and arrives as the run's
`eps-screen.gate6` label; each such run that did not complete is a recorded event (the run is resubmitted; a flow
that completed while the worker was killing it keeps the label but is its own success). Criterion 5 is decided here
by `gates.cost_overrun`, or by the worker on its pod's clock (`max_wall_hours`, label `eps-screen.gate5`, which
stops dispatch like its own); a fired outcome is recorded at once, and a dispatch that ends without one records
the outcome it last saw.

Kill criterion 5 (cost overrun) is checked every poll: a job running longer than `gates.max_job_hours`, or
spend above `gates.spend_factor * budget_usd`. Spend = the pod costs the RunPod worker published as
artifacts for finished runs, plus (elapsed since the run left Scheduled) x `execution.gpu_hourly_usd` for
runs still in flight or without a cost artifact. On overrun, dispatch stops, cancels every run in flight
(the worker then terminates their pods), waits for them to settle, and raises `CostOverrun`.

Flow runs get idempotency keys `<key_prefix>:<cells>:a<attempt>`, so a screen flow run that is retried
re-attaches to its cells' runs instead of duplicating them.

The Prefect API may fail for a while (a SQLite-backed server answers 500 when every connection waits on its
lock; a restart drops connections). Dispatch outlives that: a submission or poll that fails with a 5xx or a
transport error is logged and tried again on the next poll (a submission keeps its idempotency key, so a run
created before the error is found again, not doubled). Only an API that stays down for `api_outage_s`
stops dispatch, with `ApiUnavailable`; the runs in flight keep going and write to the store, so running the
screen again later resumes.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from eps_screen import gates as kill
from eps_screen.config import ScreenConfig
from eps_screen.design import group_jobs

# Long enough to ride out a SQLite server's lock stall (minutes) or a server restart; short enough that a server
# that is gone for good stops the screen the same hour.
API_OUTAGE_S = 900.0

_INFRA_FAILURE = re.compile(
    r"infrastructure|submission failed|could not be (retrieved|loaded|submitted)|pull step",
    re.IGNORECASE,
)


class DispatchStopped(Exception):
    """Dispatch ended without every cell completing. `summaries` holds the cells that did complete."""

    outcome = "DispatchStopped"

    def __init__(self, message: str, summaries: dict[str, dict], **details: Any):
        super().__init__(message)
        self.summaries = summaries
        self.details = details


class CostOverrun(DispatchStopped):
    """Kill criterion 5: a job over gates.max_job_hours, or spend over gates.spend_factor x budget."""

    outcome = "CostOverrun"

    def __init__(self, message: str, summaries: dict[str, dict], *, spend_usd: float, budget_usd: float | None,
                 cancelled: list[str]):
        super().__init__(message, summaries, spend_usd=spend_usd, budget_usd=budget_usd, cancelled=cancelled)
        self.spend_usd, self.budget_usd, self.cancelled = spend_usd, budget_usd, cancelled


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


def _transient(exc: BaseException) -> bool:
    """An API error worth waiting out: a 5xx answer or no answer at all. A 4xx is a bug, raised at once."""
    import httpx

    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500
    return isinstance(exc, httpx.TransportError)


@dataclass
class _Job:
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


@dataclass
class _Ledger:
    """Money so far: published pod costs per finished run, or an estimate until one appears."""

    hourly_usd: float
    known: dict[UUID, float] = field(default_factory=dict)
    estimated: dict[UUID, tuple[float, int]] = field(default_factory=dict)  # run -> (usd, polls without artifact)

    def total(self, in_flight_seconds: list[float]) -> float:
        running = sum(s * self.hourly_usd / 3600 for s in in_flight_seconds)
        return sum(self.known.values()) + sum(v for v, _ in self.estimated.values()) + running


def dispatch_cells(config: ScreenConfig, cell_ids: list[str], deployment: str, budget_usd: float | None = None,
                   *, poll_s: float = 5.0, key_prefix: str | None = None,
                   cancel_wait_s: float = 60.0, on_done: Callable[[str], None] | None = None,
                   api_outage_s: float = API_OUTAGE_S) -> dict[str, dict]:
    """Blocking wrapper around `adispatch_cells` (usable from a sync flow)."""
    from prefect.utilities.asyncutils import run_coro_as_sync

    return run_coro_as_sync(adispatch_cells(config, cell_ids, deployment, budget_usd, poll_s=poll_s,
                                            key_prefix=key_prefix, cancel_wait_s=cancel_wait_s, on_done=on_done,
                                            api_outage_s=api_outage_s))


async def adispatch_cells(config: ScreenConfig, cell_ids: list[str], deployment: str, budget_usd: float | None = None,
                          *, poll_s: float = 5.0, key_prefix: str | None = None,
                          cancel_wait_s: float = 60.0, on_done: Callable[[str], None] | None = None,
                          api_outage_s: float = API_OUTAGE_S) -> dict[str, dict]:
    """Run every cell to completion on `deployment`; returns {cell_id: the cell flow's summary}.

    `on_done(cell_id)` is called (in a thread: it may call Prefect's sync client) as each cell completes, so the
    screen's progress artifact moves per cell rather than per phase.

    Raises CostOverrun (kill criterion 5), CellsFailed or ApiUnavailable; each carries `.summaries` of the
    completed cells.
    """
    import anyio
    from prefect import get_run_logger
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.exceptions import MissingContextError

    try:
        logger = get_run_logger()
    except MissingContextError:
        import logging

        logger = logging.getLogger("eps_screen.dispatch")
    if len(set(cell_ids)) != len(cell_ids):
        raise ValueError("cell_ids has duplicates")
    ex, gates = config.execution, config.gates
    prefix = key_prefix or _default_key_prefix(config)
    queue: deque[_Job] = deque(_Job(j) for j in group_jobs(config, cell_ids, ex.cells_per_job, ex.max_parallel_cells))
    in_flight: dict[str, _Job] = {}
    done: dict[str, dict] = {}
    failed: dict[str, str] = {}
    ledger = _Ledger(ex.gpu_hourly_usd)
    recorder = _GateRecorder(config, logger)
    cost_gate: Any = None
    job_variables = (
        {"bootstrap_timeout_s": gates.bootstrap_silence_s, "max_wall_hours": gates.max_job_hours,
         "gpu_types": list(ex.gpu_types)}  # the types `validate` checked the job's memory against
        if ex.pool == "runpod-gpu" else None
    )

    outage_since: float | None = None  # monotonic time of the first API failure of the current outage

    def api_failed(exc: BaseException, doing: str) -> None:
        nonlocal outage_since
        if not _transient(exc):
            raise exc
        outage_since = outage_since or time.monotonic()
        down = time.monotonic() - outage_since
        logger.warning("Prefect API failed while %s (%s: %s); down %.0f s, trying again in %.0f s", doing,
                       type(exc).__name__, str(exc)[:200], down, poll_s)
        if down > api_outage_s:
            raise ApiUnavailable(
                f"The Prefect API failed every request for {down:.0f} s (over {api_outage_s:.0f} s) while {doing}: "
                f"{type(exc).__name__}: {str(exc)[:200]}. {len(done)} cells finished and are in the store; "
                f"{len(in_flight)} job(s) in flight keep running. Once the server answers, run the screen again "
                "(or `eps-screen retry`): finished cells are not recomputed.", done) from exc

    async with get_client() as client:
        while queue or in_flight:
            now = time.monotonic()
            # 1. submit while there is room; jobs waiting out a backoff step aside
            for _ in range(len(queue)):
                if len(in_flight) >= ex.max_parallel_cells:
                    break
                job = queue.popleft()
                if job.not_before > now:
                    queue.append(job)
                    continue
                try:
                    job.flow_run_id = await _submit(client, config, job, deployment, prefix, job_variables)
                except Exception as exc:
                    queue.appendleft(job)
                    api_failed(exc, f"submitting cell {job.name}")
                    break
                outage_since = None
                job.active_since = None
                in_flight[job.name] = job
                logger.info("Cell %s attempt %d -> flow run %s", job.name, job.attempt, job.flow_run_id)

            # 2. read the runs in flight
            ids = [c.flow_run_id for c in in_flight.values() if c.flow_run_id is not None]
            in_ids = FlowRunFilter(id=FlowRunFilterId(any_=ids))
            try:
                runs = {r.id: r for r in await client.read_flow_runs(flow_run_filter=in_ids)} if ids else {}
                outage_since = None
            except Exception as exc:
                api_failed(exc, "reading the runs in flight")
                runs = {}
            for job in list(in_flight.values()):
                run = runs.get(job.flow_run_id)  # type: ignore[arg-type]
                state = run.state if run else None
                if state is None:
                    continue
                if job.active_since is None and not state.is_scheduled():
                    job.active_since = now
                if not state.is_final():
                    continue
                seconds = now - job.active_since if job.active_since else 0.0
                ledger.estimated[run.id] = (seconds * ledger.hourly_usd / 3600, 0)
                job.runs.append({"flow_run_id": str(run.id), "state": state.name, "message": state.message,
                                 "seconds": round(seconds, 1)})
                del in_flight[job.name]
                # A flow that completed while the worker was killing it for silence keeps the label: not an event
                if run.labels and run.labels.get(_marks("GATE6")) and not state.is_completed():
                    await recorder.silence(run, job)
                if run.labels and run.labels.get(_marks("GATE5")):  # the worker's wall-time backstop fired
                    why = await recorder.from_label(run, _marks("GATE5"))
                    cancelled = await _cancel_all(client, in_flight, f"kill criterion 5: {why}", cancel_wait_s, logger)
                    raise CostOverrun(f"Kill criterion 5 (cost overrun): cell {job.name}'s pod: {why}; cancelled "
                                      f"{len(cancelled)} cell(s) in flight", done, spend_usd=round(ledger.total([]), 4),
                                      budget_usd=budget_usd, cancelled=cancelled)
                permanent = run.labels.get(_marks("PERMANENT")) if run.labels else None
                if permanent and not state.is_completed():
                    failed.update(dict.fromkeys(job.cell_ids, f"{state.name}: {permanent}"))
                    cancelled = await _cancel_all(client, in_flight, f"stopped: {permanent}", min(cancel_wait_s, 10),
                                                  logger)
                    raise InfrastructureRefused(
                        f"{permanent}. Screen stopped at once ({len(done)} cell(s) done, {len(cancelled)} cancelled);"
                        " fix it and run the screen again.", done, failed=failed, cancelled=cancelled)
                if state.is_completed():
                    summaries = await _summaries(state, job, logger)
                    done.update(summaries)
                    if on_done is not None:
                        for cell_id in summaries:
                            await anyio.to_thread.run_sync(on_done, cell_id)
                elif job.attempt < ex.crash_resubmits and await _infrastructure_ended(client, run, logger):
                    job.attempt += 1
                    backoff = ex.resubmit_backoff_s * 2 ** (job.attempt - 1)
                    job.not_before = now + backoff
                    queue.append(job)
                    logger.warning("Cell %s run %s ended %s (%s); resubmitting in %.0f s (attempt %d of %d)",
                                   job.name, run.id, state.name, state.message, backoff, job.attempt,
                                   ex.crash_resubmits)
                else:
                    failed.update(dict.fromkeys(job.cell_ids, f"{state.name}: {state.message}"))
                    logger.error("Cell %s gave up after %d attempt(s): %s", job.name, job.attempt + 1,
                                 failed[job.cell_ids[0]])

            # 3. kill criterion 5
            try:
                await _price_finished_runs(client, ledger)
            except Exception as exc:
                api_failed(exc, "reading pod costs")
            active = [now - c.active_since for c in in_flight.values() if c.active_since is not None]
            spend = ledger.total(active)
            cost_gate = kill.cost_overrun(max(active, default=0.0) / 3600, spend,
                                          math.inf if budget_usd is None else budget_usd, gates.max_job_hours,
                                          gates.spend_factor)
            too_long = [c.name for c in in_flight.values()
                        if c.active_since is not None and now - c.active_since > gates.max_job_hours * 3600]
            if cost_gate.fired:
                await recorder.save(cost_gate)
                why = (f"job(s) {', '.join(too_long)} ran longer than gates.max_job_hours={gates.max_job_hours:g}"
                       if cost_gate.numbers["job_too_long"] else
                       f"spend ${spend:.2f} is over {gates.spend_factor:g} x the plan's ${budget_usd:.2f}")
                cancelled = await _cancel_all(client, in_flight, f"kill criterion 5: {why}", cancel_wait_s, logger)
                raise CostOverrun(f"Kill criterion 5 (cost overrun): {why}; cancelled {len(cancelled)} cell(s) in flight",
                                  done, spend_usd=round(spend, 4), budget_usd=budget_usd, cancelled=cancelled)
            if queue or in_flight:
                await anyio.sleep(poll_s)

    # only the RunPod worker watches for bootstrap silence: on other pools criterion 6 stays unrecorded
    await recorder.finish(cost_gate, gates.bootstrap_silence_s if ex.pool == "runpod-gpu" else None)
    if failed:
        raise CellsFailed(f"{len(failed)} of {len(cell_ids)} cells did not complete: {sorted(failed)}", done,
                          failed=failed)
    return done


def _default_key_prefix(config: ScreenConfig) -> str:
    from prefect.context import FlowRunContext

    fingerprint = hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:12]
    ctx = FlowRunContext.get()
    owner = str(ctx.flow_run.id) if ctx and ctx.flow_run else str(time.time_ns())
    return f"{config.name}:{fingerprint}:{owner}"


async def _submit(client: Any, config: ScreenConfig, job: _Job, deployment: str, prefix: str,
                  job_variables: dict[str, Any] | None) -> UUID:
    from prefect.deployments import arun_deployment

    run = await arun_deployment(
        deployment,
        client=client,
        parameters={"config": config.model_dump(mode="json"), "cell_ids": list(job.cell_ids)},
        timeout=0,
        flow_run_name=f"{job.name}-a{job.attempt}",
        idempotency_key=f"{prefix}:{','.join(job.cell_ids)}:a{job.attempt}",
        tags=["eps-screen", f"screen:{config.name}"],
        job_variables=job_variables,
    )
    return run.id


def _resubmittable(state: Any) -> bool:
    if state.is_crashed():
        return True
    return bool(state.is_failed() and state.message and _INFRA_FAILURE.search(state.message))


def _marks(name: str) -> str:
    """The RunPod worker's label names (eps_screen_runpod/marks.py); a name no run carries without it."""
    try:
        from eps_screen_runpod import marks
    except ImportError:
        return f"eps-screen.absent.{name}"
    return getattr(marks, name)


async def _infrastructure_ended(client: Any, run: Any, logger: Any) -> bool:
    """Did the infrastructure end this run, whatever its final state says? The final state (Crashed, an
    infrastructure message), the worker's kill label, then the run's state history: a Crashed state anywhere in it
    means a pod was killed under the run, and a Failed written after it came from the dying process."""
    if run.state is None or run.state.is_cancelled() or run.state.is_completed():
        return False
    if _resubmittable(run.state) or (run.labels and run.labels.get(_marks("KILLED_BY"))):
        return True
    try:
        history = await client.read_flow_run_states(run.id)
    except Exception as exc:
        logger.warning("Cannot read the state history of flow run %s (%s); going by its final state", run.id,
                       type(exc).__name__)
        return False
    return any(s.is_crashed() for s in history)


class _GateRecorder:
    """Kill criteria 5 and 6 into the store (save_gate), where the aggregation reads them for the report."""

    def __init__(self, config: ScreenConfig, logger: Any):
        self.config, self.logger = config, logger
        self.silent: list[dict[str, Any]] = []  # one entry per run the worker killed for bootstrap silence
        self.fired: set[int] = set()

    async def save(self, outcome: Any) -> None:
        import anyio

        from eps_screen.store import ResultStore

        if outcome.fired:
            self.fired.add(outcome.number)
        try:
            store = ResultStore.for_config(self.config)
            await anyio.to_thread.run_sync(store.save_gate, outcome.model_dump(mode="json"))
        except Exception as exc:  # a gate record must never stop the screen
            self.logger.warning("Could not record gate %d in the store (%s: %s)", outcome.number,
                                type(exc).__name__, str(exc)[:200])

    async def from_label(self, run: Any, label: str) -> str:
        """A kill criterion the worker decided for this run, recorded as it sent it; returns its reason."""
        try:
            outcome = kill.GateOutcome.model_validate(json.loads(run.labels[label]))
        except ValueError as exc:
            self.logger.warning("Unreadable gate label on flow run %s (%s)", run.id, exc)
            return f"the worker's label {label} on flow run {run.id}"
        await self.save(outcome)
        return outcome.reason

    async def silence(self, run: Any, job: _Job) -> None:
        """A run the worker killed for bootstrap silence: its GateOutcome, with every such event so far."""
        try:
            outcome = kill.GateOutcome.model_validate(json.loads(run.labels[_marks("GATE6")]))
        except ValueError as exc:
            self.logger.warning("Unreadable gate label on flow run %s (%s)", run.id, exc)
            return
        self.silent.append({"flow_run_id": str(run.id), "cells": list(job.cell_ids), **outcome.numbers})
        events = len(self.silent)
        reason = f"{outcome.reason}; cell {job.name}, {events} event(s) in this dispatch (each run resubmitted)"
        await self.save(outcome.model_copy(update={"reason": reason,
                                                   "numbers": {**outcome.numbers, "events": self.silent}}))

    async def finish(self, cost_gate: Any, silence_limit_s: float | None) -> None:
        """Outcomes for the gates that did not fire, unless an earlier dispatch recorded them fired."""
        import anyio

        from eps_screen.store import ResultStore

        try:
            stored = {int(g["number"]): g for g in await anyio.to_thread.run_sync(
                ResultStore.for_config(self.config).gates)}
        except Exception:
            stored = {}
        if cost_gate is not None and 5 not in self.fired and not stored.get(5, {}).get("fired"):
            await self.save(cost_gate)
        if silence_limit_s is not None and not self.silent and not stored.get(6, {}).get("fired"):
            quiet = kill.bootstrap_silence(0.0, True, silence_limit_s)
            await self.save(quiet.model_copy(update={
                "reason": f"no GPU job was silent past {silence_limit_s:g} s after its pod reached RUNNING"}))


async def _summaries(state: Any, job: _Job, logger: Any) -> dict[str, dict]:
    """The cell flow's return value, {cell_id: summary} (needs persisted results readable here); a stub for
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


async def _price_finished_runs(client: Any, ledger: _Ledger) -> None:
    """Swap estimates for the worker's published pod costs; give up on an estimate after 5 polls."""
    if not ledger.estimated:
        return
    try:
        from eps_screen_runpod.cost import read_pod_costs
    except ImportError:  # no RunPod worker package: estimates are all there is
        ledger.known.update({k: v for k, (v, _) in ledger.estimated.items()})
        ledger.estimated.clear()
        return
    published = await read_pod_costs(client, list(ledger.estimated))
    for run_id, (usd, polls) in list(ledger.estimated.items()):
        if run_id in published:
            ledger.known[run_id] = published[run_id]
            del ledger.estimated[run_id]
        elif polls >= 5:
            ledger.known[run_id] = usd
            del ledger.estimated[run_id]
        else:
            ledger.estimated[run_id] = (usd, polls + 1)


async def _cancel_all(client: Any, in_flight: dict[str, _Job], message: str, wait_s: float, logger: Any) -> list[str]:
    """Cancel every run in flight (Cancelling -> the worker terminates the pod), then wait for them to settle."""
    import anyio
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.states import Cancelled, Cancelling

    ids = {c.flow_run_id: c.name for c in in_flight.values() if c.flow_run_id is not None}
    cells = sorted(cell_id for c in in_flight.values() if c.flow_run_id is not None for cell_id in c.cell_ids)
    runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(ids))))
    for run in runs:
        if run.state is None or run.state.is_final():
            continue
        # A run no worker has picked up has no pod: cancel it outright; otherwise let the worker do it.
        target = Cancelled(message=message) if run.state.is_scheduled() else Cancelling(message=message)
        await client.set_flow_run_state(run.id, target, force=True)
        logger.warning("Cancelling cell %s (flow run %s): %s", ids[run.id], run.id, message)
    deadline = time.monotonic() + wait_s
    while ids and time.monotonic() < deadline:
        runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(ids))))
        if all(r.state is not None and r.state.is_final() for r in runs):
            break
        await anyio.sleep(1.0)
    return cells
