"""What dispatch resubmits and why, and what it re-attaches to instead of submitting at all.

Resubmitted (`infrastructure_ended`): a run Crashed, or Failed by the infrastructure (submission, flow loading),
or ended by the infrastructure at any point: a Crashed state anywhere in its history, or the RunPod worker's
`eps-screen.killed-by` label (a pod's dying process can write Failed after the worker's Crashed). Prefect does not
retry Crashed flow runs by itself (PrefectHQ/prefect#10211); the job flow skips work already in the store, so a
resubmitted cell recomputes only what it had not finished. Not resubmitted: a Failed of the flow's own (a bug, a
bad input), a Cancelled, and the worker's `eps-screen.permanent-failure` (a rejected key, an unknown GPU type).

Kill criterion 6 (bootstrap silence) is decided by the worker and arrives as the run's `eps-screen.gate6` label;
each such run that did not complete is a recorded event (`Silences`), and the run is resubmitted like any other.

Re-attach (`attachable_runs`): every cell run carries the tag `eps-screen.config:<fingerprint>` of its screen's
config. A dispatch first looks for its cells' runs of that config on the deployment that are still Scheduled,
Pending or Running, whoever submitted them (a dispatcher that died, SIGKILL or a lost host, leaves them to the
worker), and waits on those instead of renting the cells again. A run that completed a moment ago, after the
screen read the store and before this look, is taken too, when the store has its cells finished.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from eps_screen_runpod import marks
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import StateType

from eps_screen.analysis import gates as kill
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import PRE_SCREEN_ID, Cell
from eps_screen.store.result_store import ResultStore
from flows.runtime.ledger import record_gate

_INFRA_FAILURE = re.compile(
    r"infrastructure|submission failed|could not be (retrieved|loaded|submitted)|pull step",
    re.IGNORECASE,
)
_LIVE = (StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING)
_PAGE = 200


def fingerprint(config: ScreenConfig) -> str:
    """The config's identity among cell runs: the same config (and so the same store) gives the same one."""
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:12]


def run_tags(config: ScreenConfig) -> list[str]:
    """The tags of every cell run: the screen's, and its config's fingerprint, which re-attach looks for."""
    return ["eps-screen", f"screen:{config.name}", f"eps-screen.config:{fingerprint(config)}"]


def resubmittable(state: Any) -> bool:
    if state.is_crashed():
        return True
    return bool(state.is_failed() and state.message and _INFRA_FAILURE.search(state.message))


async def infrastructure_ended(client: Any, run: Any, logger: Any) -> bool:
    """Did the infrastructure end this run, whatever its final state says? The final state (Crashed, an
    infrastructure message), the worker's kill label, then the run's state history: a Crashed state anywhere in it
    means a pod was killed under the run, and a Failed written after it came from the dying process."""
    if run.state is None or run.state.is_cancelled() or run.state.is_completed():
        return False
    if resubmittable(run.state) or (run.labels and run.labels.get(marks.KILLED_BY)):
        return True
    try:
        history = await client.read_flow_run_states(run.id)
    except Exception as exc:
        logger.warning("Cannot read the state history of flow run %s (%s); going by its final state", run.id,
                       type(exc).__name__)
        return False
    return any(s.is_crashed() for s in history)


def permanent_failure(run: Any) -> str | None:
    """The worker's one line for a job no retry can start (a rejected key, an unknown GPU type, a refused image)."""
    return (run.labels or {}).get(marks.PERMANENT) if not run.state.is_completed() else None


def wall_time_label(run: Any) -> str | None:
    """The label of kill criterion 5 decided by the worker on the pod's clock (max_wall_hours), if it fired."""
    return marks.GATE5 if (run.labels or {}).get(marks.GATE5) else None


async def attachable_runs(client: Any, deployment_id: Any, config: ScreenConfig, cell_ids: list[str],
                          store: ResultStore) -> list[tuple[Any, tuple[str, ...]]]:
    """The runs of these cells to wait on instead of submitting: (run, the wanted cells it holds), each cell in one.

    Live runs first (oldest first: the one furthest along); then Completed runs, for cells the store has finished
    (a cell deleted from the store is computed again, never taken from an old run)."""
    wanted = set(cell_ids)
    runs = await _config_runs(client, deployment_id, config)
    live = sorted((r for r in runs if r.state.type in _LIVE), key=lambda r: r.created)
    completed = [r for r in runs if r.state.is_completed()]
    taken: list[tuple[Any, tuple[str, ...]]] = []
    for run in live:
        cells = tuple(c for c in run.parameters.get("cell_ids", []) if c in wanted)
        if cells:
            taken.append((run, cells))
            wanted -= set(cells)
    for run in completed:
        cells = tuple(c for c in run.parameters.get("cell_ids", []) if c in wanted and c != PRE_SCREEN_ID
                      and store.is_finished(config, Cell.parse(c)))
        if cells:
            taken.append((run, cells))
            wanted -= set(cells)
    return taken


async def _config_runs(client: Any, deployment_id: Any, config: ScreenConfig) -> list[Any]:
    states = FlowRunFilterState(type=FlowRunFilterStateType(any_=[*_LIVE, StateType.COMPLETED]))
    run_filter = FlowRunFilter(tags=FlowRunFilterTags(all_=[f"eps-screen.config:{fingerprint(config)}"]),
                               state=states)
    deployments = DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
    runs: list[Any] = []
    while True:
        page = await client.read_flow_runs(flow_run_filter=run_filter, deployment_filter=deployments, limit=_PAGE,
                                           offset=len(runs))
        runs.extend(page)
        if len(page) < _PAGE:
            return runs


@dataclass
class Silences:
    """Kill criterion 6 as the worker decided it: one event per run it killed for bootstrap silence."""

    store: ResultStore
    logger: Any
    events: list[dict[str, Any]] = field(default_factory=list)

    async def run_ended(self, run: Any, cells: tuple[str, ...], job_name: str) -> None:
        """A finished run: an event when the worker killed it for silence. A flow that completed while the worker
        was killing it keeps the label but is its own success, no event."""
        label = (run.labels or {}).get(marks.GATE6)
        if not label or run.state.is_completed():
            return
        try:
            outcome = kill.GateOutcome.model_validate(json.loads(label))
        except ValueError as exc:
            self.logger.warning("Unreadable gate label on flow run %s (%s)", run.id, exc)
            return
        self.events.append({"flow_run_id": str(run.id), "cells": list(cells), **outcome.numbers})
        reason = (f"{outcome.reason}; cell {job_name}, {len(self.events)} event(s) in this dispatch "
                  "(each run resubmitted)")
        await record_gate(self.store, outcome.model_copy(update={
            "reason": reason, "numbers": {**outcome.numbers, "events": self.events}}), self.logger)

    async def record_quiet(self, limit_s: float, stored: dict[int, dict]) -> None:
        """No run was silent in this dispatch: criterion 6 passed, unless an earlier dispatch recorded it fired."""
        if self.events or stored.get(6, {}).get("fired"):
            return
        quiet = kill.bootstrap_silence(0.0, True, limit_s)
        await record_gate(self.store, quiet.model_copy(update={
            "reason": f"no GPU job was silent past {limit_s:g} s after its pod reached RUNNING"}), self.logger)
