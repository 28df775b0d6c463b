"""The local-gpu pool's job host (flows/runtime/job_host.py): a worker's flow runs, one after another, in one
process that outlives each of them; and what the job code keeps there between jobs (eps_screen.run.warm).

The host here runs a stand-in for Prefect's engine (`_record`), so what is checked is the hand-over: which process
ran each run, with which environment, what each client returned, and when the host ends."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.runtime import job_host


def _record(flow_run_id: str) -> int:
    """A run in the host: its pid and the environment it saw, one line; the exit code the run's id ends with."""
    with open(os.environ["EPS_TEST_RUNS"], "a") as out:
        out.write(f"{os.getpid()} {flow_run_id} {os.environ.get('PREFECT__FLOW_RUN_ID')} "
                  f"{os.environ.get('PREFECT__CONTROL_TOKEN', '-')} {os.environ.get('EPS_JOB_HOST')}\n")
    if flow_run_id.endswith("-dies"):
        os._exit(9)
    return int(flow_run_id.rsplit("-", 1)[-1])


def _serve(path: str, idle_s: float, worker: int | None = None) -> None:
    job_host.serve(Path(path), idle_s, run=_record, worker=worker)


def _hosts(started: list):
    """A `start` for the client: a host in a spawned process (as the real one spawns `python -m ...`)."""
    def start(path: Path) -> None:
        process = multiprocessing.get_context("spawn").Process(target=_serve, args=(str(path), 60.0))
        process.start()
        started.append(process)
    return start


def _wait_gone(path: Path, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not path.exists()


@pytest.fixture
def runs(tmp_path, monkeypatch):
    log = tmp_path / "runs.txt"
    monkeypatch.setenv("EPS_TEST_RUNS", str(log))
    monkeypatch.setenv("PREFECT__CONTROL_TOKEN", "one-shot")
    return log


def test_runs_share_one_host_until_one_fails_and_the_next_starts_a_new_one(tmp_path, runs, monkeypatch):
    path, started = tmp_path / "gpu0.sock", []
    try:
        codes = []
        for run_id in ["run-a-0", "run-b-0", "run-c-3", "run-d-0"]:
            monkeypatch.setenv("PREFECT__FLOW_RUN_ID", run_id)
            codes.append(job_host.client(run_id, path, start=_hosts(started)))
        assert codes == [0, 0, 3, 0]
        lines = [line.split() for line in runs.read_text().splitlines()]
        assert [line[1] for line in lines] == ["run-a-0", "run-b-0", "run-c-3", "run-d-0"]
        # the first three in one process; a run that did not complete ended it, so the fourth is in a new one
        assert lines[0][0] == lines[1][0] == lines[2][0] != lines[3][0]
        assert len(started) == 2
        # each run sees its own flow run id, never the runner's one-shot control channel, and knows it is hosted
        assert all(line[2] == line[1] and line[3] == "-" and line[4] == "1" for line in lines)
    finally:
        for process in started:
            process.terminate()
            process.join(10)


def test_a_host_that_dies_during_a_run_fails_that_run_and_leaves_no_socket_that_answers(tmp_path, runs):
    path, started = tmp_path / "gpu0.sock", []
    try:
        assert job_host.client("run-x-dies", path, start=_hosts(started)) == 1
        started[0].join(30)
        assert started[0].exitcode == 9
        # the socket file is left behind; the next client finds nothing answering there and starts a host
        assert job_host.client("run-y-0", path, start=_hosts(started)) == 0
        assert len(started) == 2
    finally:
        for process in started:
            process.terminate()
            process.join(10)


def test_a_client_that_meets_an_ending_host_starts_a_new_one(tmp_path, runs):
    """A host that is ending (idle, or after a run that did not complete) may take a connection and close it: the
    client tries again and starts a host of its own."""
    import socket
    import threading

    path, started = tmp_path / "gpu0.sock", []
    ending = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ending.bind(str(path))
    ending.listen(1)

    def take_one_and_end():
        conn, _ = ending.accept()
        conn.close()
        ending.close()
        path.unlink()

    thread = threading.Thread(target=take_one_and_end)
    thread.start()
    try:
        assert job_host.client("run-e-0", path, start=_hosts(started)) == 0
        thread.join(10)
        assert len(started) == 1 and runs.read_text().split()[1] == "run-e-0"
    finally:
        for process in started:
            process.terminate()
            process.join(10)


def test_an_idle_host_ends_and_removes_its_socket(tmp_path, runs):
    path = tmp_path / "gpu0.sock"
    process = multiprocessing.get_context("spawn").Process(target=_serve, args=(str(path), 0.5))
    process.start()
    process.join(60)
    assert process.exitcode == 0
    assert not path.exists()


def test_a_host_ends_when_its_worker_has_gone(tmp_path, runs):
    path = tmp_path / "gpu0.sock"
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    process = multiprocessing.get_context("spawn").Process(target=_serve, args=(str(path), 600.0, worker.pid))
    process.start()
    try:
        deadline = time.monotonic() + 60
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert path.exists() and process.is_alive()
        worker.kill()
        worker.wait()
        assert _wait_gone(path)
        process.join(30)
        assert process.exitcode == 128 + 15  # ended through SIGTERM's exit, so multiprocessing's finalizers ran
    finally:
        worker.kill()
        process.terminate()
        process.join(10)


def test_the_client_needs_a_flow_run(monkeypatch):
    monkeypatch.delenv("PREFECT__FLOW_RUN_ID", raising=False)
    with pytest.raises(SystemExit, match="PREFECT__FLOW_RUN_ID"):
        job_host.main([])


def test_a_host_per_worker_and_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("EPS_JOB_HOST_DIR", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    first, other_worker = job_host.address(), job_host.address(worker=os.getppid() + 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    second = job_host.address()
    assert len({first, second, other_worker}) == 3 and first.parent == tmp_path
    assert first.name == f"gpu0-worker{os.getppid()}.sock" and second.name.startswith("gpu1-")
    monkeypatch.chdir(tmp_path)  # a process worker starts each run in a directory of its own
    assert job_host.address() == second


def test_a_host_directory_others_can_write_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv("EPS_JOB_HOST_DIR", str(shared))
    with pytest.raises(SystemExit, match="writable by others.*EPS_JOB_HOST_DIR"):
        job_host.address()


def test_the_local_gpu_pool_runs_its_jobs_through_the_job_host():
    from flows.runtime.deploy import base_job_template, pool_specs

    command = base_job_template(pool_specs()["local-gpu"])["variables"]["properties"]["command"]["default"]
    assert command == f"{sys.executable} -m flows.runtime.job_host"
