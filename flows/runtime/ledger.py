"""The spend ledger of one dispatch, and kill criterion 5 (cost overrun): decided here once, recorded here once.

Spend = what the screen's earlier dispatches recorded in the store (its earlier phases, a run before a resume),
plus the pod costs the RunPod worker published as artifacts for this dispatch's finished runs, plus (elapsed since
the run left Scheduled) x `execution.gpu_hourly_usd` for runs still in flight or without a cost artifact yet. The
budget is the whole screen's, so the spend it is held to is too. Every poll
`Ledger.decide` judges it with `gates.cost_overrun`: a job running longer than `gates.max_job_hours`, or spend
above `gates.spend_factor` x the plan's estimate. The worker may also decide criterion 5 on its pod's clock
(`max_wall_hours`) and send its outcome as a run label; `Ledger.adopt` takes that decision as it came.

The record: a fired outcome is saved once, after dispatch has cancelled the runs in flight, with what followed
(spend, budget, cells cancelled); the screen's `gate 5` task then shows it without writing it again. A dispatch
that ends without a fired outcome saves the last one it judged, unless an earlier dispatch recorded it fired.
docs/experiment.md, "Kill criteria", is the rule.

The cost record: as each finished run is priced (its pod records, or the estimate once none came), the ledger saves
it in the store split among the run's cells (eps_screen/plan/costs.py: GPU-seconds and USD per cell, what the report,
`status` and `results` show). A dispatch that ends waits for the last runs' pod records as pricing always does
(_POLLS_FOR_A_COST polls), and the next dispatch of the screen first re-prices any run its store still holds as an
estimate, so a resumed screen ends with every pod's recorded price.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import anyio
from eps_screen_runpod.cost import read_pod_records

from eps_screen.analysis import gates as kill
from eps_screen.plan import costs as cost_records
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import PRE_SCREEN_ID, Cell
from eps_screen.store.result_store import ResultStore, cell_key

# A run's pod cost is published by the worker as the pod goes; after this many polls without one, the estimate
# stands (a pool with no RunPod worker publishes none).
_POLLS_FOR_A_COST = 5


async def record_gate(store: ResultStore, outcome: kill.GateOutcome, logger: logging.Logger | Any) -> None:
    """A kill criterion into the store (save_gate), where the aggregation and the report read it."""
    try:
        await anyio.to_thread.run_sync(store.save_gate, outcome.model_dump(mode="json"))
    except Exception as exc:  # a gate record must never stop the screen
        logger.warning("Could not record gate %d in the store (%s: %s)", outcome.number, type(exc).__name__,
                       str(exc)[:200])


async def stored_gates(store: ResultStore) -> dict[int, dict]:
    try:
        return {int(g["number"]): g for g in await anyio.to_thread.run_sync(store.gates)}
    except Exception:  # an unreadable gate table: record as if nothing were there
        return {}


def _is_uuid(text: Any) -> bool:
    try:
        UUID(str(text))
    except ValueError:
        return False
    return True


@dataclass
class Ledger:
    """Money so far: a published pod cost per finished run, or an estimate until one appears."""

    config: ScreenConfig
    budget_usd: float | None
    store: ResultStore
    logger: Any
    known: dict[UUID, float] = field(default_factory=dict)
    estimated: dict[UUID, tuple[float, int]] = field(default_factory=dict)  # run -> (usd, polls without a cost)
    last: kill.GateOutcome | None = None  # the latest outcome judged
    last_spend: float = 0.0  # the spend it was judged on
    ended: dict[UUID, dict] = field(default_factory=dict)  # run -> what its cost record needs (run_ended, completed)
    stored_costs: dict[str, str] | None = None  # flow run id -> priced_from of the store's records (read_stored)
    earlier: dict[str, float] = field(default_factory=dict)  # flow run id -> USD recorded before this dispatch

    @property
    def hourly_usd(self) -> float:
        return self.config.execution.gpu_hourly_usd

    def run_ended(self, run_id: UUID, seconds: float, cell_ids: tuple[str, ...] = (), state: str = "") -> None:
        """A run that ran `seconds` is priced at the hourly rate until its pod's published cost arrives; its cells
        are those its cost is split among."""
        self.estimated[run_id] = (seconds * self.hourly_usd / 3600, 0)
        self.ended[run_id] = {"cells": tuple(cell_ids), "state": state, "seconds": seconds, "summaries": {}}

    def completed(self, run_id: UUID, summaries: dict[str, dict]) -> None:
        """The job flow's summaries of a completed run: their timings split its cost (costs.split_run)."""
        if run_id in self.ended:
            self.ended[run_id]["summaries"] = summaries

    async def price(self, client: Any) -> None:
        """Swap estimates for the worker's published pod costs; an estimate stands after _POLLS_FOR_A_COST polls.
        Each run priced is recorded in the store, split among its cells."""
        if not self.estimated:
            return
        published = await read_pod_records(client, list(self.estimated))
        for run_id, (usd, polls) in list(self.estimated.items()):
            if run_id in published or polls >= _POLLS_FOR_A_COST:
                pods = published.get(run_id)
                self.known[run_id] = sum(float(p["usd"]) for p in pods) if pods else usd
                del self.estimated[run_id]
                await self._record_cost(run_id, pods)
            else:
                self.estimated[run_id] = (usd, polls + 1)

    async def settle(self, client: Any, poll_s: float, publishes: bool, wait_s: float | None = None) -> None:
        """At the end of a dispatch: the last runs' pod records, waited for as `price` always waits
        (_POLLS_FOR_A_COST polls, or `wait_s`) when a RunPod worker publishes them (`publishes`), else the
        estimate at once (no one will publish one)."""
        deadline = time.monotonic() + (_POLLS_FOR_A_COST * poll_s if wait_s is None else wait_s)
        if self.estimated and publishes:
            await self.price(client)  # once at least: records published as their runs ended need no wait
        while self.estimated and publishes and time.monotonic() < deadline:
            await anyio.sleep(poll_s)
            await self.price(client)
        await self.flush()

    async def flush(self) -> None:
        """Every run still awaiting its pod's record, recorded at its estimate (no API call)."""
        for run_id, (usd, _) in list(self.estimated.items()):
            self.known[run_id] = usd
            del self.estimated[run_id]
            await self._record_cost(run_id, None)

    async def reprice_stored(self, client: Any) -> None:
        """Runs an earlier dispatch of this screen recorded as an estimate (it ended before their pods' records came)
        get their pods' records now, where the worker has published them since."""
        try:
            stale = [r for r in await anyio.to_thread.run_sync(self.store.run_costs)
                     if r.get("priced_from") == "estimate" and _is_uuid(r.get("flow_run_id"))]
        except Exception:  # an unreadable cost record never stops the screen
            return
        if not stale:
            return
        published = await read_pod_records(client, [UUID(r["flow_run_id"]) for r in stale])
        for record in stale:
            if pods := published.get(UUID(record["flow_run_id"])):
                try:
                    again = cost_records.repriced(record, pods)
                except (KeyError, TypeError, ValueError) as exc:  # a record of another version: left as it is
                    self.logger.warning("Could not re-price flow run %s (%s)", record.get("flow_run_id"), exc)
                    continue
                await self._save_cost(again)

    async def _record_cost(self, run_id: UUID, pods: list[dict] | None) -> None:
        ended = self.ended.pop(run_id, None)
        if ended is None or not ended["cells"]:
            return
        if self.stored_costs is None:
            await self.read_stored()
        # A completed run re-attached by a later dispatch is priced again: its pods' records are the same, but
        # without them its seconds here are counted from its start to now, so an earlier record stands.
        before = self.stored_costs.get(str(run_id))
        if before == "pod" or (before is not None and not pods):
            return
        try:
            keys = {c: None if c == PRE_SCREEN_ID else cell_key(self.config, Cell.parse(c)) for c in ended["cells"]}
            record = cost_records.run_cost_record(
                flow_run_id=str(run_id), state=ended["state"], pool=self.config.execution.pool,
                cell_ids=list(ended["cells"]), summaries=ended["summaries"], keys=keys, pods=pods,
                run_seconds=ended["seconds"], hourly_usd=self.hourly_usd)
        except Exception as exc:  # a cost record must never stop the screen (the spend cap has its figure)
            self.logger.warning("Could not split the cost of flow run %s among its cells (%s: %s)", run_id,
                                type(exc).__name__, str(exc)[:200])
            return
        await self._save_cost(record)

    async def _save_cost(self, record: dict) -> None:
        try:
            await anyio.to_thread.run_sync(self.store.save_run_cost, record)
            if self.stored_costs is not None:
                self.stored_costs[record["flow_run_id"]] = record["priced_from"]
        except Exception as exc:  # a cost record must never stop the screen
            self.logger.warning("Could not record the cost of flow run %s in the store (%s: %s)",
                                record["flow_run_id"], type(exc).__name__, str(exc)[:200])

    async def read_stored(self) -> None:
        """The screen's runs that earlier dispatches priced, read from the store once: their USD is part of its spend
        from the start, and how each was priced decides whether a run re-attached here is priced again."""
        try:
            found = await anyio.to_thread.run_sync(self.store.run_costs)
        except Exception:  # an unreadable cost record never stops the screen
            found = []
        self.stored_costs = {r["flow_run_id"]: r["priced_from"] for r in found}
        self.earlier = {str(r["flow_run_id"]): float(r.get("usd") or 0.0) for r in found if r.get("flow_run_id")}

    def spend(self, in_flight_seconds: list[float]) -> float:
        running = sum(s * self.hourly_usd / 3600 for s in in_flight_seconds)
        mine = {str(run) for run in (*self.known, *self.estimated)}  # a re-attached run is counted once, here
        earlier = sum(usd for run, usd in self.earlier.items() if run not in mine)
        return earlier + sum(self.known.values()) + sum(v for v, _ in self.estimated.values()) + running

    def decide(self, in_flight: list[tuple[str, float]]) -> tuple[kill.GateOutcome, str]:
        """Kill criterion 5 on the jobs in flight ((job name, seconds since it left Scheduled)); returns the
        outcome and, when it fired, why in words for the screen's log."""
        gates = self.config.gates
        seconds = [s for _, s in in_flight]
        spend = self.last_spend = self.spend(seconds)
        budget = math.inf if self.budget_usd is None else self.budget_usd
        self.last = kill.cost_overrun(max(seconds, default=0.0) / 3600, spend, budget, gates.max_job_hours,
                                      gates.spend_factor)
        if not self.last.fired:
            return self.last, ""
        too_long = [name for name, s in in_flight if s > gates.max_job_hours * 3600]
        if self.last.numbers["job_too_long"]:
            return self.last, (f"job(s) {', '.join(too_long)} ran longer than gates.max_job_hours="
                               f"{gates.max_job_hours:g}")
        return self.last, f"spend ${spend:.2f} is over {gates.spend_factor:g} x the plan's ${budget:.2f}"

    def adopt(self, run: Any, label: str) -> tuple[kill.GateOutcome, str]:
        """The worker's decision for one run, from its label, as it sent it."""
        self.last_spend = self.spend([])
        try:
            self.last = kill.GateOutcome.model_validate(json.loads(run.labels[label]))
        except ValueError as exc:
            self.logger.warning("Unreadable gate label on flow run %s (%s)", run.id, exc)
            why = f"the worker's label {label} on flow run {run.id}"
            self.last = kill.GateOutcome(name=kill.GATE_NAMES[5], number=5, fired=True, reason=why)
        return self.last, self.last.reason

    async def record_fired(self, outcome: kill.GateOutcome, why: str, cancelled: list[str]) -> kill.GateOutcome:
        """The one record of a fired criterion 5, with what followed it; returns it for the screen's gate task."""
        spend = round(self.last_spend, 4)
        final = outcome.model_copy(update={
            "reason": f"{why}; cancelled {len(cancelled)} cell(s) in flight",
            "numbers": {**outcome.numbers, "spend_usd": spend, "budget_usd": self.budget_usd,
                        "cancelled": len(cancelled)}})
        await record_gate(self.store, final, self.logger)
        return final

    async def record_passed(self, stored: dict[int, dict]) -> None:
        """A dispatch that ended without criterion 5 firing: its last outcome, unless one is recorded fired."""
        if self.last is not None and not self.last.fired and not stored.get(5, {}).get("fired"):
            await record_gate(self.store, self.last, self.logger)
