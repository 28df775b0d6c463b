"""A screen whose process is killed in phase 2 resumes where it stopped (issue 6, "Done when" 2).

`eps-screen run` (simulated backend, all 114 cells, in-process cells) against a real Prefect server is killed
with SIGKILL once phase 2 is under way; `eps-screen status` then shows the run as gone and its cell as
interrupted, and `eps-screen retry` finishes the screen. Every cell's finished marker (metrics.json, written
atomically, a new inode per write) is written exactly once: none of the cells finished before the kill is
rewritten, so the cells trained equal the cells. The simulated cells are slowed to 0.2 s each by a wrapper
around the CLI (tests/integration/counted_cells.py) so that the kill lands in phase 2 on any machine; the wrapper
also counts every cell computation started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT
from tests.integration.servers import (
    EPS_SCREEN,
    background_lock_errors,
    client_env,
    count_retried_503s,
    prefect_server,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

COUNTED_CELLS = Path(__file__).with_name("counted_cells.py")  # slowed by SLOW_CELL_S, counted
CELLS = 96 + 18  # three slabs of 32, then the top 3 cells per source at two more seeds


def markers(screen_dir: Path) -> dict[str, tuple[int, int]]:
    """Each finished cell's marker file -> (inode, mtime): a rewrite changes the inode (temp file + rename)."""
    out = {}
    for p in screen_dir.glob("cells/*/*/metrics.json"):
        st = p.stat()
        out[p.parent.parent.name] = (st.st_ino, st.st_mtime_ns)
    return out


def test_killed_screen_resumes_without_recomputing(tmp_path: Path):
    store, counter = tmp_path / "store", tmp_path / "computed.txt"
    screen_dir = store / "simulated"
    config = ROOT / "deployments" / "configs" / "simulated.yaml"
    with prefect_server(tmp_path / "server") as (api, server_log):
        env = client_env(tmp_path / "cli", api, CELL_COUNTER=str(counter), SLOW_CELL_S="0.2")
        with open(tmp_path / "run1.log", "wb") as log:
            first = subprocess.Popen([sys.executable, str(COUNTED_CELLS), "run", str(config), "--store", str(store)], env=env,
                                     cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                deadline = time.time() + 300
                while len(markers(screen_dir)) < 20:  # the 8 smoke cells, then 12 of the first slab
                    assert first.poll() is None, (tmp_path / "run1.log").read_text()[-3000:]
                    assert time.time() < deadline, "the screen did not reach phase 2"
                    time.sleep(0.05)
            finally:
                if first.poll() is None:
                    os.killpg(first.pid, signal.SIGKILL)
                first.wait(timeout=30)
        before = markers(screen_dir)
        assert 20 <= len(before) < 96 and first.returncode == -signal.SIGKILL
        assert (screen_dir / "phases" / "smoke.json").exists()
        assert not (screen_dir / "phases" / "slab-programmer.json").exists()  # killed during phase 2

        status = subprocess.run([EPS_SCREEN, "status", "simulated", "--store", str(store)], env=env, cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
        assert status.returncode == 0, status.stderr
        assert "Running" in status.stdout and "process gone" in status.stdout, status.stdout
        assert "interrupted" in status.stdout, status.stdout

        started = time.time()
        retry = subprocess.run([sys.executable, str(COUNTED_CELLS), "retry", "simulated", "--store", str(store)], env=env,
                               cwd=ROOT, capture_output=True, text=True, timeout=480)
        retry_s = time.time() - started
        assert retry.returncode == 0, retry.stdout[-3000:] + retry.stderr[-3000:]
        assert "Crashed: its process is gone" in retry.stdout
        assert f"{len(before)} of 96 known cells finished" in retry.stdout
        assert f"{CELLS} of {CELLS} cells finished" in retry.stdout

        after = markers(screen_dir)
        assert len(after) == CELLS
        rewritten = [c for c, mark in before.items() if after[c] != mark]
        assert rewritten == []  # no cell finished before the kill was trained again
        computed = Counter(counter.read_text().split())
        assert set(computed) == set(after)
        again = [c for c, n in computed.items() if n > 1]
        assert len(again) <= 1 and not set(again) & set(before)  # at most the cell in flight at the kill
        assert sum(computed.values()) == CELLS + len(again)
        assert (screen_dir / "report" / "clean_result.html").exists()

        states = run_states(api)
        assert states == ["Completed", "Crashed"], states  # the resumed run, then the killed one
        # SQLite: nothing failed for good (no 500; the resumed run completed every cell, none lost or redone);
        # a write that met the lock answered 503 and was retried by its client: counted, not failed on
        count_retried_503s(server_log, "resume_sqlite", cells=CELLS, finished_before_kill=len(before))
        print(f"killed after {len(before)} cells; retry finished the other {CELLS - len(before)} in {retry_s:.0f} s; "
              f"recomputed after the kill: {again}; server background lock errors: {background_lock_errors(server_log)}")


def run_states(api: str) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.runtime.runs import screen_runs

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        return [r.state.name for r in screen_runs(client, "simulated")]
