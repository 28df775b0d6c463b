"""A screen's Prefect runs: which process owns a screen run, the queries for a screen's runs, and crash marking.

A screen flow run whose process is gone stays "Running" in Prefect forever (nothing marks it), so every screen
run records `<host>:<pid>` of its own process as the run's infrastructure pid when it starts (whether the CLI or
a pool worker started it: a process worker records the bare pid, which says nothing about the host). Then
`process_alive` can tell a dead run on this host, and `retry` marks it Crashed with `mark_crashed`.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from eps_screen.spec.presets import screen_name

REPO = Path(__file__).resolve().parents[2]
# Prefect state types of a run that is, or may soon be, executing; and of one waiting to start.
RUNNING_STATES = {"RUNNING", "PENDING", "CANCELLING"}
QUEUED_STATES = {"SCHEDULED", "PAUSED"}


# --- which process owns a run ----------------------------------------------------------------------------------
def owner_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def record_owner(flow, flow_run, state) -> None:
    """The screen flow's on_running hook: the run's infrastructure pid = this process, with its host."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, infrastructure_pid=owner_tag())


def process_alive(run) -> bool | None:
    """True/False for a run owned by a process on this host (`host:pid`); None when that cannot be told here."""
    if run.state is not None and run.state.is_final():
        return False
    host, _, pid = (run.infrastructure_pid or "").rpartition(":")
    if not host or not pid.isdigit() or host != socket.gethostname():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- the queries -----------------------------------------------------------------------------------------------
def read_all(read, **kwargs) -> list:
    """Every row of a paged Prefect read (read_flow_runs, read_task_runs), 200 at a time."""
    out, offset = [], 0
    while True:
        page = read(limit=200, offset=offset, **kwargs)
        out += page
        if len(page) < 200:
            return out
        offset += 200


def screen_runs(client, name: str) -> list:
    """Flow runs of the `screen` flow for this screen name, newest first."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    runs = read_all(client.read_flow_runs, flow_filter=FlowFilter(name=FlowFilterName(any_=["screen"])),
                    sort=FlowRunSort.EXPECTED_START_TIME_DESC)
    return [r for r in runs if screen_name(r.parameters or {}, base=REPO) == name]


def phase_runs(client, run_ids: list) -> dict:
    """The phase subflow runs of these screen runs: {phase run id: its screen run id}."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    return {phase.id: run_id for run_id in run_ids for phase in read_all(
        client.read_flow_runs, flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(
            any_=[run_id])))}


def cell_runs(client, name: str) -> list:
    """The job flow runs dispatch submitted for this screen (tagged screen:NAME), on any pool."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    tagged = FlowRunFilter(tags=FlowRunFilterTags(all_=[f"screen:{name}"]))
    return read_all(client.read_flow_runs, flow_run_filter=tagged)


def mark_crashed(client, run, why: str) -> int:
    """Set a dead screen run Crashed, and its phase runs and task runs still 'Running' with it; returns the task runs
    changed."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.states import Crashed

    client.set_flow_run_state(run.id, Crashed(message=why), force=True)
    phases = phase_runs(client, [run.id])
    for phase in phases:
        if not client.read_flow_run(phase).state.is_final():
            client.set_flow_run_state(phase, Crashed(message=why), force=True)
    changed = 0
    for t in read_all(client.read_task_runs, flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id, *phases]))):
        if t.state is not None and not t.state.is_final():
            client.set_task_run_state(t.id, Crashed(message=why), force=True)
            changed += 1
    return changed
