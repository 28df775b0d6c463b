"""A screen run reads on its own (issue 13): named `screen-<name>`, tagged `screen:<name>`, a log line per phase
start and end and per gate, "N of M cells", a progress artifact with the counts and the phase, the summary (TL;DR,
gates, effects) and an http report link on the screen run itself; the scheduled aggregate skips a screen whose run
is still going and gives its own run the artifacts of the screens it re-aggregates.

A small simulated screen (every phase, seconds) on the session's Prefect test harness."""

from __future__ import annotations

import os
import time

import pytest
import yaml

from tests.conftest import CONFIGS

TOTAL = 114  # the plan's distinct cells: 3 x 32 at the primary seed and 18 at the extra seeds
pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(300)]


def _of_run(flow_run_id):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    return ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterParentFlowRunId,
        LogFilter,
        LogFilterFlowRunId,
    )

    from eps_screen.spec.config import parse_config
    from flows.screen import screen

    data = yaml.safe_load((CONFIGS / "simulated.yaml").read_text())
    store = tmp_path_factory.mktemp("store")
    data.update(name="readable", store=str(store), eval={"personas": 4, "questions": 4, "samples": 2,
                                                          "random_controls": 2},
                bootstrap={"resamples": 200})
    config = parse_config(data)
    state = screen(config, return_state=True)
    assert state.is_completed(), state.message
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(state.state_details.flow_run_id)
        # Filtered on the server: the session's harness holds every earlier test's logs and artifacts, and an
        # unfiltered read returns only the first page of them.
        artifacts = {a.key: a for a in client.read_artifacts(artifact_filter=_of_run(flow_run.id))}
        deadline = time.monotonic() + 30  # log lines reach the server in batches, after the run
        while True:
            logs, page = [], None
            while page is None or len(page) == 200:  # the server's page size
                page = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id])), limit=200,
                                        offset=len(logs))
                logs += page
            # The run's own lines and its gate tasks' (each gate is a task of the screen run; the UI's Logs tab of
            # the run shows both). Cell tasks run in the phase subflows and log there.
            done = any(e.message.startswith("Finished in state") for e in logs if e.task_run_id is None)
            logs = [entry.message for entry in logs]
            if done or time.monotonic() > deadline:
                break
            time.sleep(1)
        subflows = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run.id])))
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
    return config, store, flow_run, artifacts, logs, subflows, tasks


def test_named_tagged_and_described(run):
    from flows.screen import screen

    _, _, flow_run, *_ = run
    assert flow_run.name == "screen-readable"
    assert "screen:readable" in flow_run.tags
    assert "-a<attempt>" in screen.description and "+<N more cells>" in screen.description


def test_log_has_phases_gates_and_counts(run):
    logs = run[4]
    text = "\n".join(logs)
    for phase in ("phase 0: pre-screen", "phase 1: smoke", "phase 2: slabs", "phase 3: multi-seed",
                  "phase 4: aggregation"):
        assert f"{phase}" in text and "started" in text, phase
    assert "phase 4: aggregation: finished (" in text
    assert "gate 1 (" in text and "gate 2 (" in text and "gate 3 (" in text and "gate 4 (" in text
    assert any(f"of {TOTAL} cells" in line for line in logs if "finished (" in line), text


def test_artifacts_on_the_screen_run_itself(run):
    from eps_screen.report.stores import store_id

    store, artifacts = run[1], run[3]
    assert {"summary-readable", "report-readable", "progress-readable"} <= set(artifacts)
    summary = artifacts["summary-readable"].data
    assert "**TL;DR.**" in summary and "| gate | fired | reason |" in summary
    assert "| effect (pooled over sources) |" in summary and f"of {TOTAL} cells" in summary
    link = artifacts["report-readable"].data
    sid = store_id(str(store.resolve()))  # the link names its store: it works whatever store `eps-screen serve` has
    assert f"http://127.0.0.1:8765/stores/{sid}/readable/report/clean_result.html?store=" in link
    assert "file://" not in link
    assert artifacts["progress-readable"].description == f"finished: {TOTAL} of {TOTAL} cells"


def test_the_graph_shows_phases_as_subflows_and_gates_as_tasks(run):
    _, _, _, _, _, subflows, tasks = run
    assert sorted(r.name for r in subflows) == sorted(
        ["phase 0: pre-screen", "phase 1: smoke", "phase 2: slabs",
         "phase 3: multi-seed", "phase 4: aggregation"])
    assert all(r.state.is_completed() for r in subflows)
    gate_runs = {t.name: t.state.name for t in tasks if t.name.startswith("gate ")}
    assert gate_runs == {"gate 1: pre-screen contamination": "Completed", "gate 2: smoke verdict": "Completed",
                         "gate 3: sign instability": "Completed", "gate 4: all below noise": "Completed"}, gate_runs
    assert not [t.name for t in tasks if t.name.startswith("cell ")]  # the cells are in the phases, not one fan
    # an input recorded as coming from a subflow run empties the UI's task-run list (Prefect 3.7)
    assert not [t.name for t in tasks if t.name.startswith("gate ") for refs in t.task_inputs.values() for ref in refs
                if ref.input_type == "flow_run"]


def test_scheduled_aggregate_skips_a_running_screen_and_labels_counts(run, caplog):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Running

    from flows.aggregate import aggregate_all

    store = run[1]
    late = min((store / "readable").glob("cells/*/*/metrics.json"))
    newer = (store / "readable" / "report" / "aggregate_metrics.json").stat().st_mtime + 10
    os.utime(late, (newer, newer))
    with get_client(sync_client=True) as client:  # another run of this screen, still going
        @flow(name="screen")
        def placeholder(config: dict):
            return None

        other = client.create_flow_run(placeholder, parameters={"config": {"name": "readable"}})
        client.set_flow_run_state(other.id, Running(), force=True)
        assert aggregate_all(str(store)) == {}
        assert f"readable: still running ({TOTAL} of {TOTAL} cells finished), skipped" in caplog.text
        client.set_flow_run_state(other.id, Cancelled(), force=True)
    state = aggregate_all(str(store), return_state=True)
    assert set(state.result()) == {"readable"}
    with get_client(sync_client=True) as client:
        keys = {a.key for a in client.read_artifacts(artifact_filter=_of_run(state.state_details.flow_run_id))}
    assert {"summary-readable", "report-readable"} <= keys


def test_a_fired_gate_ends_its_task_and_the_screen_killed(tmp_path):
    """Kill criterion 2 with a floor the smoke cells cannot pass: the gate's task run and the screen end Killed, in
    view in the graph; no later phase starts."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId

    from eps_screen.spec.config import parse_config
    from flows.screen import screen

    data = yaml.safe_load((CONFIGS / "simulated.yaml").read_text())
    data.update(name="killed", store=str(tmp_path), eval={"personas": 4, "questions": 4, "samples": 2,
                                                          "random_controls": 2}, gates={"smoke_floor": 0.9})
    state = screen(parse_config(data), return_state=True)
    assert state.is_failed() and state.name == "Killed", state
    assert state.message.startswith("kill criterion 2 (smoke verdict): "), state.message
    run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
        phases = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run_id])))
    assert {t.name: t.state.name for t in tasks if t.name.startswith("gate ")} == {
        "gate 1: pre-screen contamination": "Completed", "gate 2: smoke verdict": "Killed"}
    assert sorted((r.name, r.state.name) for r in phases) == [("phase 0: pre-screen", "Completed"),
                                                              ("phase 1: smoke", "Completed")]
    assert len(list((tmp_path / "killed" / "cells").iterdir())) == 8  # the smoke cells, no slab
