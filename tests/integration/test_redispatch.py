"""Issue 21: the dispatcher dies mid-screen (SIGKILL) and the screen's cells are dispatched again, as a user re-running
the screen would. The runs the dead dispatcher left (scheduled, pending, running) are re-attached, not rented again.

A real Prefect server, the real `runpod` worker and the fake RunPod API (one pod vanishes after RUNNING, ~10% of
deploy requests find no capacity), the real `job` flow on the simulated backend. The first dispatch runs in a
subprocess and is killed once a few cells are in the store while others are in flight; the second runs here, on
the cells the store does not have (what the screen does before dispatching). Then: every cell done and written
once, no pod left, no cell's flow run started twice (a run the infrastructure killed is resubmitted, that one is
allowed), and pods created <= cells + the pods the fake made vanish.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import anyio
import pytest
from eps_screen_runpod import marks
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowRunFilter, FlowRunFilterState
from prefect.client.schemas.filters import FlowRunFilterStateType
from prefect.client.schemas.objects import StateType
from prefect.settings import PREFECT_API_URL, PREFECT_RESULTS_LOCAL_STORAGE_PATH, temporary_settings

from eps_screen.spec import design
from eps_screen.spec.config import ScreenConfig
from eps_screen.store.result_store import ResultStore
from flows.runtime.dispatch import dispatch_cells
from tests.fakes.runpod_api import FakeRunPod, Faults
from tests.integration.conftest import PREFECT, ROOT, quiet_env, stop
from tests.integration.test_runpod_pool import RUNPOD_KEY, WriteWatcher, pool_template

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

POOL, DEPLOYMENT = "runpod-redispatch", "job/redispatch"
N_CELLS, PARALLEL = 12, 4
KILL_AFTER_DONE = 3  # cells in the store, at least, when the first dispatcher is killed (with runs in flight)
LIVE = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING]

FIRST_DISPATCH = """
import json, sys
from eps_screen.spec.config import ScreenConfig
from flows.runtime.dispatch import dispatch_cells
config = ScreenConfig.model_validate_json(open(sys.argv[1]).read())
dispatch_cells(config, json.loads(sys.argv[2]), sys.argv[3], budget_usd=100.0, poll_s=1.0)
"""


async def setup(results: Path) -> None:
    async with get_client() as client:
        await client.create_work_pool(WorkPoolCreate(name=POOL, type="runpod", base_job_template=pool_template()))
        flow_id = await client.create_flow_from_name("job")
        await client.create_deployment(
            flow_id=flow_id, name="redispatch", entrypoint="flows/job.py:job", work_pool_name=POOL,
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}],
            job_variables={"command": "python -m prefect.engine", "exit_grace_s": 3,
                           "env": {"PREFECT_RESULTS_PERSIST_BY_DEFAULT": "true",
                                   "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(results), "PYTHONUNBUFFERED": "1"}})


async def cell_runs(states: list[StateType] | None = None) -> list:
    async with get_client() as client:
        deployment = await client.read_deployment_by_name(DEPLOYMENT)
        run_filter = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=states))) if states \
            else None
        return await client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(
            any_=[deployment.id])), flow_run_filter=run_filter, limit=200)


async def histories(runs: list) -> dict:
    async with get_client() as client:
        return {run.id: [s.type for s in await client.read_flow_run_states(run.id)] for run in runs}


def test_a_dispatch_killed_mid_screen_and_dispatched_again_rents_no_cell_twice(prefect_server: str, tmp_path: Path):
    store_dir, results = tmp_path / "store", tmp_path / "results"
    faults = Faults(seed=21, vanish_pods={1}, vanish_after_s=(0.3, 1.2), no_capacity_rate=0.10,
                    start_delay_s=(0.5, 2.0))
    fake = FakeRunPod({RUNPOD_KEY: "main"}, workdir=ROOT, log_dir=tmp_path / "pods", faults=faults,
                      image_env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})
    fake_url = fake.start()
    api = {PREFECT_API_URL: prefect_server, PREFECT_RESULTS_LOCAL_STORAGE_PATH: results}
    config = ScreenConfig(
        name="redispatch", store=str(store_dir), backend={"generation": "simulated", "training": "simulated"},
        execution={"pool": "runpod-gpu", "max_parallel_cells": PARALLEL, "crash_resubmits": 6,
                   "resubmit_backoff_s": 1},
    )
    store = ResultStore.for_config(config)
    cells = [c.id for c in design.slab_cells(config, config.sources[0])][:N_CELLS]
    finished = lambda: [c for c in cells if store.is_finished(config, design.Cell.parse(c))]  # noqa: E731
    watcher = WriteWatcher({c: store.cell_dir(config, design.Cell.parse(c)) / "metrics.json" for c in cells})
    worker = first = None
    try:
        with temporary_settings(api):
            anyio.run(setup, results)
        env = quiet_env(tmp_path / "worker-home", PREFECT_API_URL=prefect_server, RUNPOD_API_KEY=RUNPOD_KEY,
                        RUNPOD_API_BASE_URL=fake_url, PREFECT_WORKER_QUERY_SECONDS="1",
                        PREFECT_WORKER_PREFETCH_SECONDS="5")
        with open(tmp_path / "worker.log", "wb") as log:
            worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", POOL, "--type", "runpod", "--limit", "8"],
                                      env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        watcher.start()

        # The first dispatcher, in a process of its own; killed without a word once KILL_AFTER_DONE cells are done.
        (tmp_path / "config.json").write_text(config.model_dump_json())
        first_env = quiet_env(tmp_path / "first-home", PREFECT_API_URL=prefect_server,
                              PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(results))
        with open(tmp_path / "first.log", "wb") as log:
            first = subprocess.Popen([sys.executable, "-c", FIRST_DISPATCH, str(tmp_path / "config.json"),
                                      json.dumps(cells), DEPLOYMENT], cwd=ROOT, env=first_env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        # Killed once KILL_AFTER_DONE cells are done and, read just before the kill, some of its runs are in flight:
        # those are what the second dispatch must re-attach to (they may end before it starts: it finds them so).
        deadline = time.time() + 400  # a hang guard: the store and the runs, not the clock, decide when to kill
        left: list = []
        while len(finished()) < KILL_AFTER_DONE or not left:
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.time() < deadline, (tmp_path / "worker.log").read_text(errors="replace")[-3000:]
            time.sleep(0.2)
            if len(finished()) >= KILL_AFTER_DONE:
                with temporary_settings(api):
                    left = anyio.run(cell_runs, LIVE)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)

        # The screen again: finished cells come from the store, the rest is dispatched.
        todo = [c for c in cells if c not in finished()]
        with temporary_settings(api):
            summaries = dispatch_cells(config, todo, DEPLOYMENT, budget_usd=100.0, poll_s=1.0)
        assert sorted(summaries) == sorted(todo) and sorted(finished()) == sorted(cells)
        computed = watcher.writes()
        watcher.halt.set()
        assert max(computed.values()) == 1, computed  # no cell computed twice

        deadline = time.time() + 300  # the worker lets go of each pod as its run ends
        while (fake.live_pods() or fake.running_processes()) and time.time() < deadline:
            time.sleep(0.5)
        assert fake.live_pods() == [] and fake.running_processes() == []
        with temporary_settings(api):
            runs = anyio.run(cell_runs)
            history = anyio.run(histories, runs)
    finally:
        watcher.halt.set()
        if first is not None and first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        if worker is not None:
            stop(worker)
        fake.stop()

    # No cell's run started twice: a cell has one run that reached Running, plus one per run the infrastructure
    # ended (the vanished pod's: Crashed, resubmitted), and exactly one Completed run.
    started, ended_by_infra, completed = Counter(), Counter(), Counter()
    for run in runs:
        for cell_id in run.parameters["cell_ids"]:
            started[cell_id] += StateType.RUNNING in history[run.id]
            completed[cell_id] += run.state.is_completed()
            ended_by_infra[cell_id] += (StateType.CRASHED in history[run.id]
                                        or bool((run.labels or {}).get(marks.KILLED_BY)))
    assert completed == Counter(dict.fromkeys(cells, 1)), completed
    twice = {c: started[c] for c in cells if started[c] - ended_by_infra[c] > 1}
    assert not twice, (twice, [(r.name, r.state.name) for r in runs])
    injected = len(fake.events_of("vanished"))
    pods = len(fake.events_of("created"))
    assert pods <= N_CELLS + injected, (pods, injected)
    out = ROOT / "test-output"
    out.mkdir(exist_ok=True)
    (out / "redispatch.json").write_text(json.dumps({
        "cells": N_CELLS, "killed_after_done": KILL_AFTER_DONE, "runs_left_in_flight": len(left),
        "pods_created": pods, "pods_vanished": injected, "flow_runs": len(runs),
        "flow_run_states": dict(Counter(r.state.name for r in runs))}, indent=2))
