"""The in-process screen's cell pool: worker processes of its own, each computing one cell at a time on its own
loaded base model (threads would share, and corrupt, one base).

The workers never talk to Prefect. A cell's task run lives in the screen's process, under the phase that asked for
the cell, and only the computation (pipeline.run_cell) crosses to a worker: an in-process screen runs one Prefect
server however many workers it has. A worker that dies (SIGKILL, out of memory) costs only the cell it held: `run`
raises CellProcessDied for that cell alone, and a fresh process takes the dead one's place.

A screen that stops (cancelled, crashed) stops its workers (CellPool.stop): none is left computing or holding its
model, and each cell in flight ends Crashed, by name. If the screen's process dies without a word, the kernel ends
the workers too (PR_SET_PDEATHSIG, Linux).
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from multiprocessing.connection import wait

from eps_screen.run import pipeline
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import Cell
from eps_screen.store.result_store import ResultStore

logger = logging.getLogger(__name__)

# What a worker computes for a cell: (config, cell, the worker's store) -> the cell's metrics. Module-level, so a
# spawned worker imports it by name.
Work = Callable[[ScreenConfig, Cell, ResultStore], dict]


class CellProcessDied(Exception):
    """The worker process computing `cell_id` ended before it answered: killed, out of memory, or stopped by the
    screen. Its cell is not finished; running it again resumes from the store."""

    def __init__(self, cell_id: str, message: str):
        super().__init__(f"cell {cell_id}: {message}")
        self.cell_id = cell_id


def wants_cell_pool(config: ScreenConfig) -> bool:
    """In-process cells on several cores; a simulated cell takes milliseconds, less than a worker's start-up."""
    return config.execution.pool == "inprocess" and config.execution.max_parallel_cells > 1 and not config.simulated


@contextmanager
def open_cell_pool(config: ScreenConfig, work: Work = pipeline.run_cell) -> Iterator[CellPool | None]:
    """The screen's cell pool, or None when its cells run in this process; an exception stops the pool's workers
    (cells in flight end Crashed) before it goes on up."""
    if not wants_cell_pool(config):
        yield None
        return
    pool = CellPool(config, config.execution.max_parallel_cells, work)
    try:
        yield pool
    except BaseException as exc:
        pool.stop(exc)
        raise
    finally:
        pool.stop(None)


class CellPool:
    """`size` worker processes, started on demand; `run(cell)` computes a cell on an idle one (waiting for one) and
    may be called from several threads at once (the phase's cell task runs)."""

    def __init__(self, config: ScreenConfig, size: int, work: Work = pipeline.run_cell):
        self.config, self.size, self.work = config, size, work
        self._context = multiprocessing.get_context("spawn")  # the screen's process has threads: no fork
        self._lock = threading.Condition()
        self._idle: list[_Worker] = []
        self._started = 0  # workers alive or starting
        self._in_flight: dict[int, str] = {}  # thread id -> the cell it waits for
        self._busy: set[_Worker] = set()
        self._stopped: str | None = None  # why, once stopped: no new cell starts
        # Workers are started from this one thread, alive as long as the pool: the kernel sends PR_SET_PDEATHSIG
        # when the *thread* that started a process ends, and the cell task runs that ask for cells are threads
        # of a phase's task runner, gone when the phase ends.
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cell-pool-starter")

    def run(self, cell: Cell) -> dict:
        """The cell's metrics, computed on a worker; raises CellProcessDied if that worker ends first, and what the
        computation raised if it raised."""
        me = threading.get_ident()
        with self._lock:
            self._in_flight[me] = cell.id
        try:
            worker = self._take(cell)
            try:
                return worker.compute(cell, lambda: self._stopped)
            finally:
                self._give_back(worker)
        finally:
            with self._lock:
                self._in_flight.pop(me, None)
                self._lock.notify_all()

    def pids(self) -> list[int]:
        with self._lock:
            return [w.process.pid for w in (*self._idle, *self._busy) if w.process.pid]

    def stop(self, why: BaseException | None) -> list[str]:
        """End every worker: at a normal end (`why` None) an idle one leaves its loop and exits; any other at once
        (SIGTERM, SIGKILL after 5 s), and each cell in flight, or waiting for a worker, gets CellProcessDied and its
        task run ends Crashed. Waits (10 s at most) for those runs to have it, then returns their cells. Stopping
        twice does nothing more."""
        if why is None:
            what = "finished"
        elif isinstance(why, Exception):
            what = f"crashed ({type(why).__name__}: {str(why)[:200]})"
        else:
            what = "was cancelled or stopped"
        with self._lock:
            if self._stopped is not None:
                return []
            self._stopped = what
            cells = sorted(self._in_flight.values())
            leaving, killed = ([*self._idle], [*self._busy]) if why is None else ([], [*self._idle, *self._busy])
            self._lock.notify_all()
        for worker in leaving:  # all told at once (a closed pipe ends a worker's loop), so they exit side by side
            worker.conn.close()
        for worker in leaving:
            worker.end(exit_s=30)
        for worker in killed:
            worker.end()
        with self._lock:
            self._lock.wait_for(lambda: not self._in_flight, timeout=10)
        self._starter.shutdown(wait=False)
        if why is not None:
            logger.warning("screen %s: stopped %d cell process(es); cells in flight marked Crashed: %s",
                           what, len(killed), ", ".join(cells) or "none")
        return cells

    def _take(self, cell: Cell) -> _Worker:
        with self._lock:
            while True:
                if self._stopped is not None:
                    raise CellProcessDied(cell.id, f"not started: the screen {self._stopped}")
                if self._idle:
                    worker = self._idle.pop()
                    if worker.process.is_alive():
                        break
                    self._started -= 1  # died while idle (out of memory): a fresh one instead
                    continue
                if self._started < self.size:
                    self._started += 1
                    worker = None
                    break
                self._lock.wait()
            if worker is not None:
                self._busy.add(worker)
                return worker
        try:
            worker = self._starter.submit(_Worker, self._context, self.config, self.work).result()
        except BaseException:
            with self._lock:
                self._started -= 1
                self._lock.notify_all()
            raise
        with self._lock:
            if self._stopped is None:
                self._busy.add(worker)
                return worker
            self._started -= 1
        worker.end()  # started while the pool stopped
        raise CellProcessDied(cell.id, f"not started: the screen {self._stopped}")

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            self._busy.discard(worker)
            if worker.process.is_alive() and self._stopped is None:
                self._idle.append(worker)
            else:
                worker.end()
                self._started -= 1  # a fresh process takes its place at the next cell
            self._lock.notify_all()


class _Worker:
    """One worker process and the pipe it is asked and answers on."""

    def __init__(self, context, config: ScreenConfig, work: Work):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, config, work), daemon=True,
                                       name="eps-screen cell worker")
        self.process.start()
        child.close()

    def compute(self, cell: Cell, stopped: Callable[[], str | None]) -> dict:
        try:
            self.conn.send(cell.id)
        except OSError:
            pass  # it died before it was asked: told below
        wait([self.conn, self.process.sentinel])
        if self.conn.poll():
            try:
                kind, payload = self.conn.recv()
            except (EOFError, OSError):
                kind, payload = "died", None
            if kind == "ok":
                return payload
            if kind == "error":
                raise pickle.loads(payload)
        self.process.join(timeout=5)
        why = stopped()
        if why is not None:
            raise CellProcessDied(cell.id, f"its worker process was stopped because the screen {why}")
        code = self.process.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        raise CellProcessDied(cell.id, f"its worker process {self.process.pid} died ({how})")

    def end(self, exit_s: float = 0) -> None:
        """Stop the process: after `exit_s` seconds to exit by itself (its pipe closed, it returns from its loop and
        its interpreter exits as a process should), SIGTERM, then SIGKILL after 5 s. A terminated worker's
        semaphores (what its libraries made) stay registered with the screen's resource tracker, which then warns
        of leaked semaphores after the screen's last line."""
        if exit_s:
            self.process.join(timeout=exit_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
        if self.process.is_alive():
            try:
                os.kill(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.join(timeout=5)


def _serve(conn, config: ScreenConfig, work: Work) -> None:
    """A worker process: its own store, then one cell id at a time in, (kind, metrics or exception) out."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the whole group: the screen stops its workers
    store = ResultStore.for_config(config)
    while True:
        try:
            cell_id = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(("ok", work(config, Cell.parse(cell_id), store)))
        except Exception as exc:  # noqa: BLE001 - the cell's task run raises it in the screen's process
            conn.send(("error", _portable(exc)))


def _portable(exc: Exception) -> bytes:
    """The exception pickled, with the worker's traceback as a note; one that does not pickle becomes a RuntimeError
    with its type and message."""
    exc.add_note("in the cell worker process:\n" + "".join(traceback.format_exception(exc)))
    try:
        return pickle.dumps(exc)
    except Exception:  # noqa: BLE001 - unpicklable attributes
        plain = RuntimeError(f"{type(exc).__name__}: {exc}")
        plain.add_note(exc.__notes__[-1])
        return pickle.dumps(plain)


def _die_with_parent() -> None:
    """First thing in each worker: the kernel sends it SIGKILL when the screen's process dies (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: cancel and crash still stop the workers (CellPool.stop)
    if os.getppid() == 1:  # the parent died before prctl
        os._exit(1)
