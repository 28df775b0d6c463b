"""Ending an in-process screen on Ctrl-C or SIGTERM: the run records its end, finished cells stay in the store, and
the command says so in one line and exits 130 (Ctrl-C) or 143 (SIGTERM), the temporary Prefect server stopped last.

A Ctrl-C reaches the terminal's whole process group, and `timeout`, a batch scheduler or `docker stop` may signal the
group too. Prefect's own temporary server is a child in that group: it died at once, and the run then spent minutes
retrying its calls to it. Here the temporary server runs in a session of its own, so only this process stops it,
once the run's end is recorded and its logs and events are sent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

INTERRUPTED_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal, as a shell reports it


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread where Ctrl-C raises KeyboardInterrupt, so both end the run the same way."""


def exit_code(stop: KeyboardInterrupt) -> int:
    return INTERRUPTED_EXIT[signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT]


def interrupted_line(finished: int) -> str:
    return f"interrupted: {finished} cells finished are kept; run the same command to resume"


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises Terminated in the main thread. A flow run swaps in Prefect's own handler while it runs; that
    handler records the run Crashed and then sends SIGTERM again, which lands here."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def temporary_server() -> Iterator[None]:
    """A temporary Prefect server for this process when no PREFECT_API_URL is set (else nothing), in a session of
    its own; stopped on the way out, whatever ends the run, after the run's logs and events are sent. Signals that
    arrive while it stops are ignored: the stop is bounded (5 s, then SIGKILL)."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

    if PREFECT_API_URL.value():
        yield
        return

    class DetachedServer(SubprocessASGIServer):
        def _run_uvicorn_command(self) -> subprocess.Popen:
            return _start_detached(self.port)

    server = DetachedServer()
    server.start()
    try:
        # It serves no UI: no "View at" links to it.
        with temporary_settings(updates={PREFECT_API_URL: server.api_url, PREFECT_UI_URL: ""}):
            yield
            _drain()
    finally:
        held = {s: signal.signal(s, signal.SIG_IGN) for s in INTERRUPTED_EXIT}
        try:
            _drain()
            server.stop()
        finally:
            for s, handler in held.items():
                signal.signal(s, handler)


def _start_detached(port: int) -> subprocess.Popen:
    """Prefect 3.7's temporary server command (SubprocessASGIServer._run_uvicorn_command), in a new session: out of
    reach of the signals sent to this process's group."""
    import prefect
    from prefect.settings import get_current_settings

    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
           **get_current_settings().to_environment_variables(exclude_unset=True)}
    return subprocess.Popen([sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent),
                             "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port",
                             str(port), "--log-level", "error", "--lifespan", "on"], env=env, start_new_session=True)


def _drain() -> None:
    """Send what Prefect's log and event workers still hold, while the server is there to take it (10 s at most)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        try:
            worker.drain_all(timeout=10)
        except Exception as exc:  # noqa: BLE001 - a log not sent must not hide how the run ended
            print(f"(Prefect's {worker.__name__} not drained: {type(exc).__name__})", file=sys.stderr)


def until_interrupted(work: Callable[[], int], finished: Callable[[], int]) -> int:
    """work()'s exit code; on Ctrl-C or SIGTERM, one line with the `finished()` cells kept, and 130 or 143."""
    with sigterm_interrupts():
        try:
            return work()
        except KeyboardInterrupt as stop:
            code = exit_code(stop)
    print(interrupted_line(finished()), file=sys.stderr)
    return code
