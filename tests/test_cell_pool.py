"""The in-process screen's cell pool (eps_screen/run/cell_pool.py): a dead worker costs only its cell, and the
workers never outlive a cancelled or crashed screen.

Stand-in work (tests/pool_work.py) writes which process holds which cell; `slow` then sleeps 120 s. The screen side
crashes (an exception in the flow), is cancelled (SIGTERM, what a worker's cancellation sends) or dies outright
(SIGKILL). Each time every worker must be gone, checked by pid, and (crash, cancel) the cells in flight end Crashed
by name. (tests/integration/test_cell_pool_crash.py kills a worker in the middle of a whole screen.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prefect import flow

from eps_screen.run.cell_pool import CellPool, CellProcessDied, open_cell_pool
from eps_screen.spec import design
from eps_screen.spec.config import ScreenConfig
from eps_screen.store.result_store import ResultStore
from tasks.cells import cell_task
from tests import pool_work

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]
ROOT = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of this process is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def held_by(folder: Path, n: int, timeout: float = 90) -> dict[str, int]:
    """{cell id: pid} once `n` cells are held by the workers (their markers written)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = {}
        for marker in folder.iterdir():
            cell_id, _, pid = marker.name.rpartition(".")
            if pid.isdigit() and marker.read_text():
                held[cell_id] = int(pid)
        if len(held) >= n:
            return held
        time.sleep(0.1)
    raise AssertionError(f"cell workers did not start: {sorted(p.name for p in folder.iterdir())}")


def _config(tmp_path: Path) -> ScreenConfig:
    return ScreenConfig(name="pool", store=str(tmp_path / "store"),
                        execution={"pool": "inprocess", "max_parallel_cells": 2})


@pytest.fixture
def work_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.setenv("POOL_WORK", str(folder))  # spawned workers inherit it
    return folder


def test_a_dead_worker_costs_only_its_cell_and_a_fresh_one_takes_its_place(tmp_path, work_dir):
    """No Prefect: the pool alone, two cells on two workers, one worker killed with SIGKILL."""
    config = _config(tmp_path)
    cells = design.slab_cells(config, config.sources[0])[:3]
    pool = CellPool(config, 2, pool_work.slow)
    outcomes: dict[str, BaseException | dict] = {}

    def run(cell):
        try:
            outcomes[cell.id] = pool.run(cell)
        except BaseException as exc:  # noqa: BLE001 - what the cell's task run would see
            outcomes[cell.id] = exc

    threads = [threading.Thread(target=run, args=(c,)) for c in cells[:2]]
    try:
        for t in threads:
            t.start()
        held = held_by(work_dir, 2)
        victim, other = cells[0].id, cells[1].id
        os.kill(held[victim], signal.SIGKILL)
        threads[0].join(timeout=30)
        died = outcomes[victim]
        assert isinstance(died, CellProcessDied) and died.cell_id == victim
        assert str(died) == f"cell {victim}: its worker process {held[victim]} died (killed by SIGKILL)"
        assert other not in outcomes and _alive(held[other])  # the other worker's cell goes on
        pool.work = pool_work.failing  # a fresh worker is started with the pool's work as it is now
        asker = threading.Thread(target=run, args=(cells[2],))  # a cell task run's thread, ended after its cell
        asker.start()
        asker.join(timeout=60)
        assert isinstance(outcomes[cells[2].id], ValueError), outcomes[cells[2].id]
        assert any("in the cell worker process" in note for note in outcomes[cells[2].id].__notes__)
        fresh = [p for p in pool.pids() if p != held[other]]
        assert len(fresh) == 1 and fresh[0] != held[victim]
        # the fresh worker outlives the thread that asked for it (PR_SET_PDEATHSIG follows the starting thread)
        with pytest.raises(ValueError, match=f"no such recipe: {cells[2].id}"):
            pool.run(cells[2])
        assert sorted(pool.pids()) == sorted([held[other], fresh[0]])
    finally:
        assert pool.stop(RuntimeError("test over")) == [other]
    threads[1].join(timeout=30)
    assert isinstance(outcomes[other], CellProcessDied)
    assert "stopped because the screen crashed (RuntimeError: test over)" in str(outcomes[other])
    assert not [p for p in held.values() if _alive(p)]


def test_a_finished_screen_lets_its_workers_exit_and_leaves_no_semaphore(tmp_path, work_dir):
    """At a normal end the workers are not killed: each leaves its loop and exits 0, so what its libraries made is
    cleaned up (a terminated worker's semaphores stayed in /dev/shm until the screen's resource tracker warned of
    them after the screen's last line)."""
    config = _config(tmp_path)
    cells = design.slab_cells(config, config.sources[0])[:2]
    pool = CellPool(config, 2, pool_work.with_semaphore)
    results = []
    threads = [threading.Thread(target=lambda c=c: results.append(pool.run(c))) for c in cells]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert sorted(r["cell_id"] for r in results) == sorted(c.id for c in cells)
    workers = [*pool._idle]
    assert len(workers) == 2, "both cells at once: two workers"
    assert pool.stop(None) == []
    assert [w.process.exitcode for w in workers] == [0, 0]
    names = [json.loads(m.read_text())["semaphore"] for m in work_dir.iterdir()]
    assert len(names) == 2 and not [n for n in names if Path(f"/dev/shm/sem.{n.lstrip('/')}").exists()], names


def test_a_ctrl_c_at_the_terminal_is_the_screens_to_handle_not_its_workers(tmp_path, work_dir):
    """Ctrl-C reaches the terminal's whole process group: a worker ignores SIGINT (no KeyboardInterrupt traceback
    of its own), and the screen, which gets it too, stops the worker and its cell in flight."""
    config = _config(tmp_path)
    cell = design.slab_cells(config, config.sources[0])[0]
    pool = CellPool(config, 1, pool_work.slow)
    outcomes = []

    def run():
        try:
            outcomes.append(pool.run(cell))
        except BaseException as exc:  # noqa: BLE001 - what the cell's task run would see
            outcomes.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    pid = held_by(work_dir, 1)[cell.id]
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    ignored = int(next(line for line in status if line.startswith("SigIgn:")).split()[1], 16)
    assert ignored & (1 << (signal.SIGINT - 1)), "a cell worker would die of the terminal's Ctrl-C"
    os.kill(pid, signal.SIGINT)
    assert pool.stop(KeyboardInterrupt()) == [cell.id]
    thread.join(timeout=30)
    assert isinstance(outcomes[0], CellProcessDied) and not _alive(pid)


@flow(name="pool-crash")
def crashing_screen(config: ScreenConfig, folder: str) -> None:
    store = ResultStore.for_config(config)
    with open_cell_pool(config, work=pool_work.slow) as pool:
        for cell in design.slab_cells(config, config.sources[0])[:3]:  # 3 cells, 2 workers: one waits for a worker
            cell_task.submit(config, cell.id, store, pool)
        held_by(Path(folder), 2)
        raise RuntimeError("the screen crashed")


@pytest.mark.usefixtures("prefect_harness")
def test_a_crashed_screen_stops_its_cell_processes_and_marks_cells_in_flight_crashed(tmp_path, work_dir, caplog):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    config = _config(tmp_path)
    cells = [c.id for c in design.slab_cells(config, config.sources[0])[:3]]
    state = crashing_screen(config, str(work_dir), return_state=True)
    assert state.is_failed()
    pids = list(held_by(work_dir, 2).values())
    # stopped, not waited for: no cell lived out its 120 s (not a clock: the cells say whether they finished)
    assert len(pids) == 2 and not [p for p in pids if _alive(p)], pids
    assert not list(work_dir.glob("*.finished"))
    assert f"cells in flight marked Crashed: {', '.join(sorted(cells))}" in caplog.text
    deadline = time.monotonic() + 20  # task-run states reach the server as events, a little later
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
            if len(runs) == 3 and all(r.state.is_final() for r in runs) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert sorted(r.name for r in runs) == sorted(f"cell {c}" for c in cells)
    assert not [(r.name, r.state.name) for r in runs if not r.state.is_crashed()]  # none left Running
    for run in runs:
        assert run.state.message.startswith(f"{run.name}: "), run.state.message
        assert "the screen crashed (RuntimeError: the screen crashed)" in run.state.message


SCRIPT = """
import sys
from pathlib import Path
from prefect import flow
from eps_screen.run.cell_pool import open_cell_pool
from eps_screen.spec import design
from eps_screen.spec.config import ScreenConfig
from eps_screen.store.result_store import ResultStore
from tasks.cells import cell_task
from tests import pool_work
from tests.test_cell_pool import held_by

@flow(name="pool-cancel")
def screen(config, folder):
    store = ResultStore.for_config(config)
    with open_cell_pool(config, work=pool_work.slow) as pool:
        futures = [cell_task.submit(config, c.id, store, pool) for c in design.slab_cells(config, "librarian")[:2]]
        held_by(Path(folder), 2)
        print("READY", flush=True)
        [f.wait() for f in futures]

screen(ScreenConfig(name="pool", store=sys.argv[2], execution={"pool": "inprocess", "max_parallel_cells": 2}), sys.argv[1])
"""


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["cancel-SIGTERM", "killed-SIGKILL"])
def test_a_cancelled_or_killed_screen_process_leaves_no_cell_process_alive(tmp_path, work_dir, sig):
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(work_dir), str(tmp_path / "store")], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        pids = list(held_by(work_dir, 2).values())
        assert all(_alive(p) for p in pids)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in pids if _alive(p)], out[-3000:]
        if sig == signal.SIGTERM:
            cells = sorted(c.id for c in design.slab_cells(_config(tmp_path), "librarian")[:2])
            assert f"cells in flight marked Crashed: {', '.join(cells)}" in out, out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        for marker in work_dir.glob("*.[0-9]*"):
            try:
                os.kill(json.loads(marker.read_text())["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
