"""Leases and claims in the store (eps_screen/store/claims.py), without Prefect: a second run finds the first, a
claimed cell is not another run's to compute, and a run's death (its process gone, or its heartbeat stale on another
host) releases both. The same on an S3 store in tests/test_store_bad_files_s3.py; two whole runs in
tests/integration/test_two_runs.py."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from eps_screen.spec.design import Cell
from eps_screen.store.claims import TTL_S, Busy, RunLease, alive
from eps_screen.store.result_store import ResultStore
from tests.test_store_bad_files import small_screen

CELLS = [Cell.parse(c) for c in ("librarian-A0B0C0D0E0F0-s42", "librarian-A1B1C1D1E1F1-s42", "surgeon-A1B0C0D0E1F0-s42")]


def dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def lease_of(store: ResultStore, **record) -> RunLease:
    """A lease as another run wrote it (another process, or another host)."""
    other = RunLease(store)
    other.record.update(record)
    other.record["token"] = other.token = f"{record.get('host', 'h')}-{record.get('pid', 1)}-x"
    other.record["held"] = True
    other.files.put(other.path, other.record)
    return other


def check_leases_and_claims(config, store: ResultStore) -> None:
    first = RunLease(store, prefect_run="run-1")
    first.start()
    try:
        with pytest.raises(Busy) as busy:
            RunLease(ResultStore.for_config(config)).start()
        line = str(busy.value)
        assert line.startswith(f"screen {config.name!r} is running elsewhere on this store: ")
        assert f"on {socket.gethostname()}, pid {first.record['pid']}, Prefect run run-1, since " in line
        assert "--force" in line and "\n" not in line
        assert len(first.live_runs()) == 1  # the stopped run left no lease behind

        beside = RunLease(ResultStore.for_config(config))
        beside.start(force=True)
        mine, theirs = first.claim(config, CELLS[:2])
        assert (mine, theirs) == (CELLS[:2], [])
        mine, theirs = beside.claim(config, CELLS)
        assert (mine, theirs) == ([CELLS[2]], CELLS[:2])

        first.release(config, CELLS[:1])
        assert beside.claim(config, CELLS[:2]) == ([CELLS[0]], [CELLS[1]])
        beside.end()
    finally:
        first.end()
    later = RunLease(ResultStore.for_config(config))
    later.start()  # the screen is free once its run ended
    assert later.claim(config, CELLS) == (CELLS, [])
    later.end()
    assert not first.files.records("claims/*/*/*.json") and not first.files.records("runs/*.json")


def test_a_second_run_is_stopped_and_claims_keep_cells_to_one_run(tmp_path):
    config = small_screen(str(tmp_path), "claims")
    check_leases_and_claims(config, ResultStore.for_config(config))


def test_a_dead_runs_lease_and_claims_are_released(tmp_path):
    config = small_screen(str(tmp_path), "claims")
    store = ResultStore.for_config(config)
    here = socket.gethostname()
    gone = lease_of(store, host=here, pid=dead_pid())  # its process exited without ending its run
    gone.files.put(gone._claim_path(config, CELLS[0]), {"token": gone.token, "held": True})
    stale = lease_of(store, host="elsewhere", pid=1, beat=time.time() - TTL_S - 1)  # another host, silent too long
    run = RunLease(store)
    run.start()
    assert run.claim(config, CELLS) == (CELLS, [])
    assert set(run.live_runs()) == {run.token}
    assert not alive(gone.record) and not alive(stale.record)
    assert alive({**stale.record, "beat": time.time()})  # another host: alive while it beats
    run.end()


def test_a_waiting_run_takes_over_the_cells_of_a_run_that_dies(tmp_path):
    config = small_screen(str(tmp_path), "claims")
    store = ResultStore.for_config(config)
    other = lease_of(store, host="elsewhere", pid=1, beat=time.time())
    other.files.put(other._claim_path(config, CELLS[0]), {"token": other.token, "held": True})
    run = RunLease(store)
    run.start(force=True)
    assert run.claim(config, CELLS[:1]) == ([], CELLS[:1])
    threading.Timer(0.5, lambda: other.files.delete(other.path)).start()  # its run ends, without finishing the cell
    assert run.wait(config, CELLS[:1], poll_s=0.1) == CELLS[:1]
    assert run.claim(config, CELLS[:1]) == (CELLS[:1], [])
    run.end()


def test_a_finished_cell_needs_no_claim(tmp_path):
    from eps_screen.run import pipeline

    config = small_screen(str(tmp_path), "claims")
    store = ResultStore.for_config(config)
    pipeline.run_cell(config, CELLS[0], store)
    run = RunLease(store)
    run.start()
    assert run.claim(config, CELLS[:1]) == (CELLS[:1], []) and not run.claimed
    run.end()


def test_status_names_the_runs_live_on_the_store(tmp_path):
    from rich.console import Console

    from flows.runtime.status import render, store_status

    config = small_screen(str(tmp_path), "claims")
    store = ResultStore.for_config(config)
    run = RunLease(store)
    run.start()
    try:
        status = store_status(config, store)
        console = Console(record=True, width=200)
        render(status, console, cells="none")
        out = console.export_text()
    finally:
        run.end()
    assert [lease["token"] for lease in status.live] == [run.token]
    assert f"running on this store: {run.record['user']} on {socket.gethostname()}, pid {run.record['pid']}" in out
    assert not store_status(config, store).live


def test_the_pre_screen_is_computed_by_one_run_and_the_other_waits_for_it(tmp_path):
    config = small_screen(str(tmp_path), "claims")
    first, beside = RunLease(ResultStore.for_config(config)), RunLease(ResultStore.for_config(config))
    first.start()
    beside.start(force=True)
    holds, finished, order = threading.Event(), threading.Event(), []

    def compute():
        with first.holding("pre-screen", finished.is_set):
            holds.set()
            order.append("first computes")
            time.sleep(0.3)
            finished.set()

    worker = threading.Thread(target=compute)
    worker.start()
    holds.wait(10)
    with beside.holding("pre-screen", finished.is_set, poll_s=0.05):
        order.append(f"beside goes on, finished: {finished.is_set()}")
    worker.join()
    assert order == ["first computes", "beside goes on, finished: True"]
    beside.end()
    first.end()
