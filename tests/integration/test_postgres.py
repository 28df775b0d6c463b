"""A PostgreSQL-backed Prefect server runs a whole screen (issue 6, "What it must contain" 5).

The test sets up its own throwaway cluster (Debian's `postgresql` package: initdb/pg_ctl in a temp dir, trust
auth on 127.0.0.1, as the `postgres` user when run as root), points `prefect server start` at it with
PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://..., and runs the simulated screen (114 cells)
through it. It skips only when the PostgreSQL binaries are missing (apt-get install -y postgresql).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT
from tests.integration.servers import EPS_SCREEN, client_env, postgres_bin, postgres_cluster, prefect_server, server_errors

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
    pytest.mark.skipif(postgres_bin() is None, reason="PostgreSQL binaries (initdb, pg_ctl) not installed: "
                                                       "apt-get install -y postgresql"),
]


def psql(url: str, sql: str) -> str:
    host_port = url.split("@", 1)[1].split("/", 1)[0]
    host, port = host_port.split(":")
    out = subprocess.run([str(postgres_bin() / "psql"), "-h", host, "-p", port, "-U", "postgres", "-d", "prefect",
                          "-tAc", sql], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_screen_through_a_postgres_backed_server(tmp_path: Path):
    store = tmp_path / "store"
    with postgres_cluster() as db_url, prefect_server(tmp_path / "server",
                                                      PREFECT_API_DATABASE_CONNECTION_URL=db_url) as (api, log):
        assert "postgresql" in psql(db_url, "select version()").lower()
        env = client_env(tmp_path / "cli", api)
        run = subprocess.run([EPS_SCREEN, "run", str(ROOT / "deployments/configs/simulated.yaml"), "--store", str(store)],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=400)
        assert run.returncode == 0, run.stderr[-3000:]
        assert Path(run.stdout.strip().splitlines()[-1]).name == "clean_result.html"
        status = subprocess.run([EPS_SCREEN, "status", "simulated", "--store", str(store), "--cells", "none"], env=env,
                                cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert status.returncode == 0 and "Completed" in status.stdout, status.stdout + status.stderr

        # the runs live in PostgreSQL, not in a SQLite file
        cells = psql(db_url, "select count(*), count(distinct name) from task_run where name like 'cell %'")
        assert cells == f"{8 + 96 + 18}|{96 + 18}"  # the smoke cells run again in their slab (found finished)
        assert psql(db_url, "select state_name from flow_run f join flow on f.flow_id = flow.id "
                            "where flow.name = 'screen'") == "Completed"
        assert not list((tmp_path / "server").glob("*.db"))
        assert server_errors(log) == []
