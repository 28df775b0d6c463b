"""A cell worker killed with SIGKILL in the middle of phase 2 of a whole in-process screen (issue 21, item 11).

The screen is tiny.yaml on the simulated backend, its cells on a two-worker cell pool (a simulated cell would run in
this process: the test puts it on the pool). The stand-in work (tests/pool_work.py `held`) computes the real
simulated cell, but the second source's cells first wait until the test has killed one of the two workers holding
them. Then only that worker's cell is Crashed, by name, and run again; the screen completes; every cell's task run
sits under its own phase and none is left Running; the workers never import Prefect, so they start no server.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from functools import partial
from pathlib import Path

import pytest

from tests.conftest import tiny_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(600)]
SIMULATED = {"generation": "simulated", "training": "simulated"}


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (a worker that started a temporary Prefect server would have one)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            pass
    return found


def _held(folder: Path, source: str) -> dict[str, int]:
    """{cell id: pid} of the second source's cells the workers hold now."""
    held = {}
    for marker in folder.glob(f"{source}-*.[0-9]*"):
        cell_id, _, pid = marker.name.rpartition(".")
        if marker.read_text():
            held[cell_id] = int(pid)
    return held


def _kill_one_worker(folder: Path, source: str, killed: dict, timeout: float = 300) -> None:
    """Once both workers hold a cell of `source`: SIGKILL one, note which cell it held, then let the cells go."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            held = _held(folder, source)
            if len(set(held.values())) >= 2:
                cell_id, pid = sorted(held.items())[0]
                killed.update(cell=cell_id, pid=pid, held=held, children={p: _children(p) for p in held.values()})
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.1)
    finally:
        (folder / "release").touch()


def test_a_killed_cell_worker_costs_only_its_cell_and_the_screen_completes(tmp_path, monkeypatch, caplog):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterName

    import eps_screen.run.cell_pool as cell_pool
    import flows.screen
    from eps_screen.spec import design
    from eps_screen.store.result_store import ResultStore
    from flows.runtime.runs import phase_runs
    from flows.screen import screen
    from tests import pool_work

    # the phases' run loggers may not propagate to the root, where caplog listens
    logging.getLogger("prefect.flow_runs").addHandler(caplog.handler)
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.setenv("POOL_WORK", str(folder))  # spawned workers inherit it
    monkeypatch.setattr(cell_pool, "wants_cell_pool", lambda config: True)
    monkeypatch.setattr(flows.screen, "open_cell_pool", partial(cell_pool.open_cell_pool, work=pool_work.held))
    config = tiny_config(tmp_path / "store", name="crash", backend=SIMULATED, bootstrap={"resamples": 200})
    source = config.sources[1]
    killed: dict = {}
    killer = threading.Thread(target=_kill_one_worker, args=(folder, source, killed), daemon=True)
    killer.start()
    try:
        state = screen(config, return_state=True)
    finally:
        logging.getLogger("prefect.flow_runs").removeHandler(caplog.handler)
    killer.join(timeout=10)

    assert state.is_completed(), state.message
    victim = killed["cell"]
    # the two workers held a cell each, and neither had started a process of its own (a temporary server)
    assert len(set(killed["held"].values())) == 2 and killed["children"] == {p: [] for p in killed["held"].values()}
    markers = [json.loads(m.read_text()) for m in folder.glob("*.[0-9]*")]
    assert markers and not [m for m in markers if m["prefect"]]  # no worker ever imported Prefect
    # only the killed worker's cell was marked Crashed, by name, and ran again in another process
    records = dict.fromkeys(caplog.records)  # a record seen through both handlers, once
    lines = [r.getMessage() for r in records if "marked Crashed" in r.getMessage()]
    assert lines == [f"cell {victim}: its worker process {killed['pid']} died (killed by SIGKILL): marked Crashed;"
                     f" running it again (1 of {config.execution.crash_resubmits})"], lines
    assert len({int(m.name.rpartition(".")[2]) for m in folder.glob(f"{victim}.[0-9]*")}) == 2
    store = ResultStore.for_config(config)
    assert store.finished_count() == len({c.id for c in design.smoke_cells(config) + design.all_slab_cells(config)}) \
        + len(store.phase("multiseed")["cells"])

    # in Prefect: each cell's task runs under the phase that ran it; one Crashed run, the victim's; none unfinished
    screen_run = state.state_details.flow_run_id
    phase_cells = {"phase 1: smoke": {c.id for c in design.smoke_cells(config)},
                   "phase 3: multi-seed": set(store.phase("multiseed")["cells"])}
    phase_cells["phase 2: slabs"] = {c.id for c in design.all_slab_cells(config)}
    deadline = time.monotonic() + 30  # task-run states reach the server as events, a little later
    with get_client(sync_client=True) as client:
        phases = {p: client.read_flow_run(p).name for p in phase_runs(client, [screen_run])}
        assert set(phase_cells) <= set(phases.values()), phases
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(phases))),
                                         task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="cell ")))
            if all(r.state.is_final() for r in runs) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert not [(r.name, r.state.name) for r in runs if not r.state.is_final()]  # none left Running
    misplaced = [(r.name, phases[r.flow_run_id]) for r in runs
                 if r.name.removeprefix("cell ") not in phase_cells.get(phases[r.flow_run_id], set())]
    assert not misplaced, misplaced
    crashed = [(r.name, phases[r.flow_run_id], r.state.message) for r in runs if r.state.is_crashed()]
    assert crashed == [(f"cell {victim}", "phase 2: slabs",
                        f"cell {victim}: its worker process {killed['pid']} died (killed by SIGKILL)")], crashed
    victim_runs = [r for r in runs if r.name == f"cell {victim}" and phases[r.flow_run_id] == "phase 2: slabs"]
    assert sorted(r.state.type.value for r in victim_runs) == ["COMPLETED", "CRASHED"]
