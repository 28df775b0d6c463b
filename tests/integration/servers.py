"""Processes the operations tests start and always stop: a Prefect server with extra settings, workers, PostgreSQL.

Built on the helpers of tests/integration/conftest.py (free_port, quiet_env, stop); `conftest.prefect_server`
stays the plain per-module server. Every process gets its own session (process group) and is stopped in a
`finally`, so a failing test leaves nothing running.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.integration.conftest import PREFECT, ROOT, free_port, quiet_env, stop
from tests.integration.conftest import serve as prefect_server  # noqa: F401  (re-exported for the ops tests)

EPS_SCREEN = str(Path(PREFECT).parent / "eps-screen")


def client_env(home: Path, api: str, **extra: str) -> dict[str, str]:
    """The environment of a CLI or worker process talking to `api`."""
    return quiet_env(home, PREFECT_API_URL=api, PREFECT_UI_URL=api.removesuffix("/api"), **extra)


@contextmanager
def worker(pool: str, env: dict[str, str], log_path: Path, *args: str) -> Iterator[subprocess.Popen]:
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([PREFECT, "worker", "start", "--pool", pool, *args], env=env, cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            stop(proc)


def wait_for_workers(pool: str, n: int = 1, limit_s: float = 180) -> None:
    """Until `n` workers of the pool are online (a worker's first heartbeat comes seconds after it starts, more on a
    loaded machine): a screen fails at once on a pool with no worker online."""
    from prefect.client.orchestration import get_client

    from flows.runtime.workers import online_workers

    deadline = time.monotonic() + limit_s
    with get_client(sync_client=True) as client:
        while len(online_workers(client, pool)) < n:
            assert time.monotonic() < deadline, f"fewer than {n} worker(s) online for pool {pool!r} after {limit_s} s"
            time.sleep(1)


def server_errors(log_path: Path) -> list[str]:
    """API requests the server failed: a 503 (SQLite busy/locked and other retryable errors; logged because the
    server runs with PREFECT_SERVER_LOG_RETRYABLE_ERRORS) or a 500."""
    text = log_path.read_text(errors="replace")
    return [line for line in text.splitlines()
            if "Encountered retryable exception in request" in line or "Encountered exception in request" in line]


_API_FUNCTION = re.compile(r"prefect/server/api/(?!server\.py)\w+\.py\", line \d+, in (\w+)")


def _failed_requests(log_path: Path, retryable: bool | None) -> list[tuple[str, str]]:
    """(the log from the request's error on, the API function behind it or "?") of each request the server failed;
    only the 503s (retryable=True), only the 500s (False) or both (None)."""
    kind = {True: "retryable ", False: "", None: "(?:retryable )?"}[retryable]
    blocks = re.split(rf"Encountered {kind}exception in request", log_path.read_text(errors="replace"))[1:]
    return [(b, m[1] if (m := _API_FUNCTION.search(b)) else "?") for b in blocks]


def failed_endpoints(log_path: Path, retryable: bool | None = None) -> list[str]:
    """The server's API function behind each request it failed (see server_errors), e.g. update_flow_run_labels;
    only the 503s (retryable=True) or only the 500s (False)."""
    return [function for _, function in _failed_requests(log_path, retryable)]


# Prefect 3.7's PATCH /flow_runs/{id}/labels (a worker labels every run it submits) reads the run and writes it back
# in a DEFERRED SQLite transaction: when another writer holds the lock, SQLite refuses the read-to-write upgrade at
# once (busy_timeout cannot help), the server answers 503 and the client retries it. Upstream, not ours: the
# transaction would need Prefect's `with_for_update=True` (BEGIN IMMEDIATE).
PREFECT_DEFERRED_WRITE = {"update_flow_run_labels"}


def stalled_reads(log_path: Path) -> list[str]:
    """The API function behind each 500 that was a read waiting out the server's database connection pool (30 s,
    Prefect's default) while its connections waited on SQLite's lock: seen on a loaded 2-core box, once, on a
    worker's `read_work_pool` poll. It changes nothing (a read), and the worker polls again."""
    return [function for log, function in _failed_requests(log_path, retryable=False)
            if "QueuePool limit of size" in log.split("Encountered ")[0] and function.startswith("read_")]


def count_retried_503s(log_path: Path, output: str, **figures: Any) -> list[str]:
    """Nothing failed for good on a SQLite server: no request answered 500 but a read that waited out the
    connection pool (`stalled_reads`). A write that meets the lock may answer 503 and be retried by the client; those
    are counted, not failed on (a client that runs out of retries fails its caller, which the test sees), and
    written with `figures` to test-output/<output>.json. Returns the API function behind each retried 503
    (docs/walkthroughs.md, "PostgreSQL for the server")."""
    retried, stalled = failed_endpoints(log_path, retryable=True), stalled_reads(log_path)
    assert len(retried) + len(stalled) == len(server_errors(log_path)), server_errors(log_path)
    out = ROOT / "test-output"
    out.mkdir(exist_ok=True)
    (out / f"{output}.json").write_text(json.dumps(
        {**figures, "retried_503": len(retried), "by_endpoint": dict(Counter(retried)),
         "label_updates_among_them": sum(1 for e in retried if e in PREFECT_DEFERRED_WRITE),
         "reads_past_the_pool_timeout": dict(Counter(stalled))}, indent=2))
    return retried


def gave_up(log_path: Path) -> list[str]:
    """Lines of a client process's log (a worker's, which carries its runs' output) where a request failed for
    good: a client that runs out of retries logs an ERROR with its traceback."""
    return [line for line in log_path.read_text(errors="replace").splitlines()
            if "| ERROR" in line or "Traceback" in line or "Service Unavailable" in line]


def background_lock_errors(log_path: Path) -> int:
    """SQLite lock errors of the server's own background services (docket tasks such as mark_deployments_ready,
    which records when a worker last polled). No request fails; the service runs again on the next poll."""
    text = log_path.read_text(errors="replace")
    return sum(1 for block in text.split("docket.dependencies")[1:] if "database is locked" in block.split("| ERROR")[0])


# --- MLflow ---------------------------------------------------------------------------------------------------------
@contextmanager
def mlflow_server(home: Path) -> Iterator[str]:
    """A real `mlflow server` on 127.0.0.1: a SQLite backend store and artifacts under `home`, uploaded through the
    server as from another machine (--artifacts-destination); yields its tracking URI."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = home / "mlflow.log"
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(Path(PREFECT).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers",
             "1", "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}", "--artifacts-destination",
             str(home / "artifacts")], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while not _answers(f"{url}/health"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow server did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
                time.sleep(0.5)
            yield url
        finally:
            stop(proc, timeout=5)  # its workers' graceful shutdown takes 10-15 s, and nothing is left to flush


def _answers(url: str) -> bool:
    import requests

    try:
        return requests.get(url, timeout=2).ok
    except requests.RequestException:
        return False


# --- PostgreSQL ---------------------------------------------------------------------------------------------------
def postgres_bin() -> Path | None:
    """The directory of initdb/pg_ctl: on PATH, or Debian's /usr/lib/postgresql/<version>/bin."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return versions[-1].parent if versions else None


@contextmanager
def postgres_cluster() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (trust auth, database `prefect`); yields its asyncpg URL.

    initdb refuses to run as root: as root the cluster belongs to the `postgres` system user (runuser).
    """
    bindir = postgres_bin()
    assert bindir is not None
    root = Path(tempfile.mkdtemp(prefix="eps-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sock, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()

    def run(*cmd: str) -> None:
        out = subprocess.run([*as_user, *cmd], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {out.stdout[-1500:]}{out.stderr[-1500:]}")

    run(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
    opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
    try:
        run(str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "pg.log"), "-w", "-t", "60", "start")
        run(str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "prefect")
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/prefect"
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)
