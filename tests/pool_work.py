"""Stand-ins for what a cell worker computes (eps_screen/run/cell_pool.py `Work`), for the cell pool's tests.

A spawned worker imports its work by module name, so these live here, with no Prefect import: a worker that
imports Prefect shows it in the marker each stand-in writes. $POOL_WORK names the folder they write to.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from eps_screen.run import pipeline
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import Cell
from eps_screen.store.result_store import ResultStore


def _folder() -> Path:
    return Path(os.environ["POOL_WORK"])


def _mark(cell: Cell, **more) -> None:
    """<folder>/<cell id>.<pid>: this process holds the cell (and whether it imported Prefect, and `more`)."""
    marker = _folder() / f"{cell.id}.{os.getpid()}"
    marker.write_text(json.dumps({"pid": os.getpid(), "prefect": "prefect" in sys.modules, **more}))


def slow(config: ScreenConfig, cell: Cell, store: ResultStore) -> dict:
    """Holds its cell for 120 s, then says it finished (a screen that waited a stopped cell out: a bug)."""
    _mark(cell)
    time.sleep(120)
    (_folder() / f"{cell.id}.finished").touch()
    return {"cell_id": cell.id}


_LOCKS: list = []  # kept for the process's life, as libraries keep theirs (tqdm's write lock)


def with_semaphore(config: ScreenConfig, cell: Cell, store: ResultStore) -> dict:
    """Makes a named semaphore, as a library in a real cell does, and says its name in the cell's marker."""
    import multiprocessing

    lock = multiprocessing.get_context("spawn").Lock()
    _LOCKS.append(lock)
    _mark(cell, semaphore=lock._semlock.name)
    return {"cell_id": cell.id}


def failing(config: ScreenConfig, cell: Cell, store: ResultStore) -> dict:
    raise ValueError(f"no such recipe: {cell.id}")


def held(config: ScreenConfig, cell: Cell, store: ResultStore) -> dict:
    """The real (simulated) cell; a cell of the second source first waits for <folder>/release, so that phase 2
    has a cell on each worker when the test kills one."""
    _mark(cell)
    release = _folder() / "release"
    deadline = time.monotonic() + 300
    while cell.source == config.sources[1] and not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return pipeline.run_cell(config, cell, store)
