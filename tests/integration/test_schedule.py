"""The scheduled `aggregate` deployment, run by a worker, refreshes a report that new results made stale
(issue 6, "Done when" 3).

A simulated screen finishes (report written); then one cell result becomes newer than the report, as a late
cell would. `eps-screen deploy` applies the deployments with the aggregate schedule set to every minute and the
test's store; a `cpu` worker runs the run the server's scheduler creates; the report is rewritten.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT
from tests.integration.servers import EPS_SCREEN, client_env, count_retried_503s, gave_up, prefect_server, worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def aggregate_runs(api: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name("aggregate-all/aggregate")
        return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])))


def test_scheduled_aggregate_refreshes_a_stale_report(tmp_path: Path):
    store = tmp_path / "store"
    report = store / "simulated" / "report" / "aggregate_metrics.json"
    with prefect_server(tmp_path / "server") as (api, server_log):
        env = client_env(tmp_path / "cli", api)
        run = subprocess.run([EPS_SCREEN, "run", str(ROOT / "deployments/configs/simulated.yaml"), "--store", str(store)],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        first = report.stat().st_mtime_ns
        late = sorted((store / "simulated").glob("cells/*/*/metrics.json"))[0]
        os.utime(late, ns=(first + 10**9, first + 10**9))  # a cell result newer than the report

        deployed = subprocess.run([EPS_SCREEN, "deploy", "--pool", "cpu", "--aggregate-cron", "* * * * *",
                                   "--aggregate-store", str(store)], env=env, cwd=ROOT, capture_output=True, text=True,
                                  timeout=300)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        assert "schedule cron '* * * * *'" in deployed.stdout

        with worker("cpu", client_env(tmp_path / "worker", api, PREFECT_WORKER_QUERY_SECONDS="2"),
                    tmp_path / "worker.log", "--name", "cpu-schedule-test"):
            deadline = time.time() + 420  # a hang guard: the scheduler and the worker wait on SQLite's lock too
            while not (done := [r for r in aggregate_runs(api) if r.state.is_final()]):
                log = server_log.read_text(errors="replace")
                assert "Can't evaluate bulk DML statement" not in log, (
                    "the server's scheduler cannot insert runs: Prefect 3.7.7 with SQLAlchemy 2.1 "
                    "(pin sqlalchemy<2.1)")
                assert time.time() < deadline, (tmp_path / "worker.log").read_text(errors="replace")[-3000:]
                time.sleep(2)
        scheduled = done[0]
        assert scheduled.auto_scheduled and scheduled.state.is_completed(), scheduled.state
        assert report.stat().st_mtime_ns > first  # the newer report
        assert (report.parent / "clean_result.html").stat().st_mtime_ns > first
        assert "re-aggregated 1 screen(s): ['simulated']" in (tmp_path / "worker.log").read_text(errors="replace")
        # SQLite: nothing failed for good. The screen and every scheduled run that ended completed, no request
        # answered 500 and the worker gave up on none; a write that met the lock answered 503 and was retried by
        # its client (one CI run saw one, on a subflow's run creation): counted in test-output/, not failed on.
        assert all(r.state.is_completed() for r in done), [r.state for r in done]
        assert not gave_up(tmp_path / "worker.log"), gave_up(tmp_path / "worker.log")[:5]
        count_retried_503s(server_log, "schedule_sqlite", scheduled_runs_ended=len(done))
