"""The `local-gpu` pool's jobs of one worker, run one after another in one long-lived process: the job host.

A GPU job loads what it needs: its process's imports, the trainer processes (each with the base, compiled), and the
vLLM engines. On SmolLM2 that was about 70 s of each job after the first, and a screen sends four jobs to a GPU
(the pre-screen, the smoke cells, the slabs, the multi-seed cells). So the pool's command (deployments/pools/
local-gpu.yaml) is this module, not `prefect.engine`:

- `python -m flows.runtime.job_host` (the worker's command for each flow run, the client) hands its flow run to the
  worker's host, starting one if none answers, waits for it, and exits with the run's exit code. The worker sees an
  ordinary flow-run process: it ends when the run ends; killed (a cancelled run), it takes the host with it.
- The host runs each flow run in its own process with Prefect's engine (`run_flow`), as `prefect.engine` would. The
  job code keeps its engines and trainers between runs (eps_screen.run.warm): a job of the same config finds them
  up; one of another config starts afresh.
- A run that did not complete ends the host after it replies (a crash may leave the card or the engines in a bad
  state): the next job starts in a new one. The host also ends when its worker is gone, or after
  EPS_JOB_HOST_IDLE_S seconds (default 120) without a job, giving the card back.

One host per worker: its socket is named by the worker's pid and CUDA_VISIBLE_DEVICES, in EPS_JOB_HOST_DIR
(default: a directory of this user's in the system's temp dir), beside its log.
To run jobs in processes of their own again, set the pool's `command` job variable to `python -m prefect.engine`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

# The runner's one-shot cancellation channel belongs to the client's process, not to the host's next runs.
_NOT_FORWARDED = {"PREFECT__CONTROL_PORT", "PREFECT__CONTROL_TOKEN"}
_RUN_OWN = _NOT_FORWARDED | {"PREFECT__FLOW_RUN_ID"}  # each run's, which the host takes from each request
_START_S = 120  # for a host to answer: a cold Python with torch and vLLM on its path imports nothing before it does


def host_dir() -> Path:
    """Where the hosts' sockets and logs are. A client sends its run's environment (the Prefect API key with it) to
    the socket it finds here, so the directory must be this user's and writable by no one else."""
    path = Path(os.environ.get("EPS_JOB_HOST_DIR") or Path(tempfile.gettempdir()) / f"eps-job-host-{os.getuid()}")
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise SystemExit(f"job host: {path} is another user's or writable by others; remove it, or set "
                         "EPS_JOB_HOST_DIR to a directory of your own")
    return path


def address(worker: int | None = None) -> Path:
    """The host socket of `worker` (default: this process's parent, the worker that started this flow run's
    process) on this process's GPU. Not named by the working directory: a process worker gives each run its own."""
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "all").replace(",", "-") or "none"
    return host_dir() / f"gpu{gpu}-worker{worker or os.getppid()}.sock"


def idle_seconds() -> float:
    raw = os.environ.get("EPS_JOB_HOST_IDLE_S", "120")
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"EPS_JOB_HOST_IDLE_S={raw!r}: give the seconds a job host waits for its next job") from None


# --- the client: the worker's flow-run process ---------------------------------------------------------------

def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        return sock
    except OSError:
        sock.close()
        return None


def _start_host(path: Path) -> None:
    log = path.with_suffix(".log")
    env = {k: v for k, v in os.environ.items() if k not in _RUN_OWN}  # the host's start reads no run's own
    with open(log, "a") as out:
        subprocess.Popen([sys.executable, "-m", "flows.runtime.job_host", "--serve", str(path),
                          "--worker", str(os.getppid())], env=env, stdout=out, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL)
    print(f"job host: started for {path.name} (log {log})", flush=True)


def connect_or_start(path: Path, start: Callable[[Path], None] = _start_host) -> socket.socket:
    """A connection to the host at `path`, started by `start` if none answers (under a lock: one start per host)."""
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sock = _connect(path)
        if sock is None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a socket file left by a host that died
            start(path)
            deadline = time.monotonic() + _START_S
            while sock is None and time.monotonic() < deadline:
                time.sleep(0.2)
                sock = _connect(path)
        if sock is None:
            raise SystemExit(f"job host: none answered at {path} within {_START_S} s (log {path.with_suffix('.log')})")
        return sock


def _send(stream, message: dict) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def _receive(stream) -> dict | None:
    """The next message, or None when the other end has gone (closed, or reset by a host that was ending)."""
    try:
        line = stream.readline()
    except ConnectionResetError:
        return None
    return json.loads(line) if line else None


def client(flow_run_id: str, path: Path | None = None, start: Callable[[Path], None] = _start_host) -> int:
    """Run the flow run in the worker's host (`start` starts one); its exit code (1 when the host ended before it
    replied)."""
    path = path or address()
    for _ in range(3):
        stream = connect_or_start(path, start).makefile("rw")
        hello = _receive(stream)  # None from a host that was ending when this connected
        if hello is not None:
            break
        time.sleep(0.5)
    else:
        print(f"job host: none took the run at {path} (log {path.with_suffix('.log')})", flush=True)
        return 1
    host = int(hello["pid"])

    def cancelled(signum, _frame):
        # The worker kills a cancelled run's process: the run is in the host, so the host goes too.
        with contextlib.suppress(ProcessLookupError):
            os.kill(host, signal.SIGTERM)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, cancelled)
    env = {k: v for k, v in os.environ.items() if k not in _NOT_FORWARDED}
    _send(stream, {"flow_run": flow_run_id, "env": env})
    print(f"job host: flow run {flow_run_id} in host pid {host} (log {path.with_suffix('.log')})", flush=True)
    reply = _receive(stream)
    if reply is None:
        print(f"job host: pid {host} ended during the run (log {path.with_suffix('.log')})", flush=True)
        return 1
    return int(reply["code"])


# --- the host -------------------------------------------------------------------------------------------------

def run_flow_run(flow_run_id: str) -> int:
    """One flow run in this process, as `python -m prefect.engine` runs it; its exit code."""
    from uuid import UUID

    from prefect.engine import handle_engine_signals
    from prefect.flow_engine import flow_run_logger, load_flow, load_flow_run, run_flow

    try:
        with handle_engine_signals(UUID(flow_run_id)):
            flow_run = load_flow_run(flow_run_id=UUID(flow_run_id))
            logger = flow_run_logger(flow_run=flow_run)
            try:
                flow = load_flow(flow_run)
            except Exception:
                logger.error("Unexpected exception encountered when trying to load flow", exc_info=True)
                raise
            run_flow(flow, flow_run=flow_run, error_logger=logger)
        return 0
    except SystemExit as stop:  # handle_engine_signals ends an aborted or paused run with exit()
        return stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
        return 1


def _watch(worker: int) -> None:
    """End the host when its worker has gone (a stopped worker leaves no host behind)."""
    while True:
        time.sleep(2)
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            print("job host: the worker has gone; ending", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            return


def _end(signum, _frame):
    # An exit, not the default death: multiprocessing's finalizers then end the engines' and trainers' processes.
    raise SystemExit(128 + signum)


def serve(path: Path, idle_s: float, run: Callable[[str], int] = run_flow_run, worker: int | None = None) -> int:
    """Take flow runs at `path` one at a time until idle_s pass without one or a run does not complete."""
    from eps_screen.run.warm import HOSTED

    os.environ[HOSTED] = "1"  # the job code keeps what it loads for the next job
    for key in _RUN_OWN:  # a host started with them has the starting client's
        os.environ.pop(key, None)
    signal.signal(signal.SIGTERM, _end)
    signal.signal(signal.SIGINT, _end)  # a worker stopped with Ctrl-C signals its whole process group
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.chmod(path, 0o600)
    server.listen(1)
    server.settimeout(idle_s)
    if worker:
        threading.Thread(target=_watch, args=(worker,), daemon=True).start()
    print(f"job host: pid {os.getpid()} at {path}, ending after {idle_s:g} s without a job", flush=True)
    served, code = 0, 0

    def stop_listening() -> None:
        server.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    try:
        while code == 0:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                print(f"job host: {idle_s:g} s without a job; ending after {served} runs", flush=True)
                break
            conn.settimeout(None)
            with conn, conn.makefile("rw") as stream:
                _send(stream, {"pid": os.getpid()})
                request = _receive(stream)
                if request is None:
                    continue
                os.environ.update(request["env"])
                served += 1
                started = time.monotonic()
                print(f"job host: run {served} in this process: flow run {request['flow_run']}", flush=True)
                code = run(request["flow_run"])
                print(f"job host: run {served} ended with code {code} after {time.monotonic() - started:.1f} s",
                      flush=True)
                if code:  # before the reply: the worker's next run must find no socket here, not this ending host
                    stop_listening()
                with contextlib.suppress(OSError):
                    _send(stream, {"code": code})
        if code:
            print(f"job host: a run ended with code {code}; ending, so that the next job starts afresh", flush=True)
    finally:
        stop_listening()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--serve"]:
        worker = int(args[3]) if args[2:3] == ["--worker"] else None
        return serve(Path(args[1]), idle_seconds(), worker=worker)
    flow_run_id = args[0] if args else os.environ.get("PREFECT__FLOW_RUN_ID")
    if not flow_run_id:
        raise SystemExit("job host: no flow run (PREFECT__FLOW_RUN_ID is unset); the worker starts this per run")
    return client(flow_run_id)


if __name__ == "__main__":
    sys.exit(main())
