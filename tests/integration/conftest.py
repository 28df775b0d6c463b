"""A real `prefect server start` on 127.0.0.1 for the integration tier (one per module, always stopped)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PREFECT = str(Path(sys.executable).parent / "prefect")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quiet_env(home: Path, **extra: str) -> dict[str, str]:
    """A clean environment for a Prefect process: no inherited PREFECT_* settings, its own PREFECT_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RUNPOD_"))}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="false")
    env.update(extra)
    return env


def stop(proc: subprocess.Popen, timeout: float = 20) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextmanager
def serve(home: Path, **env: str) -> Iterator[tuple[str, Path]]:
    """`prefect server start` on 127.0.0.1 with extra settings; yields (api url, log path)."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    log_path = home / "server.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            env=quiet_env(home, PREFECT_UI_API_URL=url, PREFECT_SERVER_LOG_RETRYABLE_ERRORS="true",
                                          **env), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 120
        while True:
            try:
                if requests.get(f"{url}/health", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"prefect server did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        yield url, log_path
    finally:
        stop(proc)
        log.close()


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory) -> Iterator[str]:
    with serve(tmp_path_factory.mktemp("prefect-server")) as (url, _log):
        yield url
