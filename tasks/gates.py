"""The kill criteria as tasks: each judged gate is its own task run in the screen's graph, `gate N: NAME`.

A gate that fires and stops the screen (1, 2, 5) ends its task run in the state Killed, and the screen's run with
it; gates 3 and 4 only flag (state Flagged, the report says why). Every outcome is saved in the store first (the
report and `eps-screen status` read it there) and logged as one line. Never cached: a gate is judged on the
store's results of this run.
"""

from __future__ import annotations

import logging

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, Failed

from eps_screen.analysis import gates
from eps_screen.spec.config import ScreenConfig
from eps_screen.store.result_store import ResultStore

KILLED = "Killed"


def killed(outcome: gates.GateOutcome):
    return Failed(name=KILLED, message=f"kill criterion {outcome.number} ({outcome.name}): {outcome.reason}")


def _decided(store: ResultStore, outcome: gates.GateOutcome, stops: bool, save: bool = True):
    if save:
        store.save_gate(outcome.model_dump(mode="json"))
    get_run_logger().log(logging.WARNING if outcome.fired else logging.INFO, "gate %s (%s): %s: %s", outcome.number,
                         outcome.name, "FIRED" if outcome.fired else "passed", outcome.reason)
    if not outcome.fired:
        return outcome.model_dump(mode="json")
    return killed(outcome) if stops else Completed(name="Flagged", message=outcome.reason)


def _name(number: int) -> str:
    return f"gate {number}: {gates.GATE_NAMES[number]}"


@task(name=_name(1), task_run_name=_name(1), cache_policy=NO_CACHE)
def contamination_gate(config: ScreenConfig, store: ResultStore, pre: dict):
    """The base model must not already write the marker, pooled or under any prompt condition."""
    return _decided(store, gates.contamination(pre["marker_rate"], config.gates.contamination, pre["answers"],
                                                by_condition=pre.get("by_condition")), stops=True)


@task(name=_name(2), task_run_name=_name(2), cache_policy=NO_CACHE)
def smoke_gate(config: ScreenConfig, store: ResultStore, smoke: dict[str, dict]):
    """The smoke fraction must move the source rate but not saturate it; the phase's record keeps the verdict."""
    verdict = gates.smoke([c["source_rate"] for c in smoke.values()], config.gates.smoke_floor,
                          config.gates.smoke_ceiling)
    store.save_phase("smoke", {"verdict": verdict.model_dump(mode="json"), "cells": smoke})
    return _decided(store, verdict, stops=True)


@task(name="gate", task_run_name="gate {number}: {name}", cache_policy=NO_CACHE)
def judged_gate(store: ResultStore, number: int, name: str):
    """Gates 3 and 4, judged by the aggregation from every cell's effects (eps_screen/run/aggregate.py): their outcome,
    as the store has it, in the graph and the log."""
    outcome = next((g for g in store.gates() if int(g["number"]) == number), None)
    if outcome is None:
        get_run_logger().info("gate %s (%s): not judged (no aggregate yet)", number, name)
        return None
    return _decided(store, gates.GateOutcome.model_validate(outcome), stops=False, save=False)


@task(name=_name(5), task_run_name=_name(5), cache_policy=NO_CACHE)
def cost_gate(store: ResultStore, outcome: gates.GateOutcome):
    """Spend over the cap, or a job over its hours: dispatch stopped the cells (their pods are terminated). The
    spend ledger (flows/runtime/ledger.py) decided it and recorded it, once, with what followed; shown here."""
    return _decided(store, outcome, stops=True, save=False)
