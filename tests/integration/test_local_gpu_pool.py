"""The `local-gpu` pool puts one job on one GPU (deployments/pools/local-gpu.yaml), and a whole screen runs there.

`eps-screen deploy --pool local-gpu --gpus 2` creates the pool (concurrency limit 2) and the `job-local-gpu`
deployment; deployments/pools/start-local-gpu-workers.sh starts one worker per "GPU" (0 and 1: the mechanism
is only CUDA_VISIBLE_DEVICES, so no GPU is needed). The `screen` flow then runs a whole simulated screen with
`execution.pool: local-gpu`: the pre-screen and every cell go to the pool, in jobs of several cells. A
sitecustomize hook records each flow-run process's CUDA_VISIBLE_DEVICES and its lifetime: every run saw
exactly one device, both devices were used, and no device ever ran two jobs at once. Each worker's runs went to its
job host (flows/runtime/job_host.py), one process per GPU for the whole screen.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT
from tests.integration.servers import (
    EPS_SCREEN,
    PREFECT,
    client_env,
    count_retried_503s,
    gave_up,
    prefect_server,
    wait_for_workers,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

HOOK = """
import atexit, os, time
run, out = os.environ.get("PREFECT__FLOW_RUN_ID"), os.environ.get("EPS_TEST_GPU_LOG")
if run and out:
    start = time.time()
    def _record():
        with open(out, "a") as f:
            f.write(f"{run} {os.environ.get('CUDA_VISIBLE_DEVICES')} {start} {time.time()}\\n")
    atexit.register(_record)
"""


def test_a_whole_screen_on_the_gpu_pool_one_job_per_gpu(tmp_path: Path):
    from prefect.settings import PREFECT_API_URL, PREFECT_RESULTS_LOCAL_STORAGE_PATH, temporary_settings

    from eps_screen.plan.phase_sizes import gpu_jobs
    from eps_screen.plan.screen_plan import phase_cells
    from eps_screen.spec.config import ScreenConfig
    from eps_screen.store.result_store import ResultStore
    from flows.screen import screen

    hook, log, results = tmp_path / "hook", tmp_path / "gpu-runs.txt", tmp_path / "results"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    with prefect_server(tmp_path / "server") as (api, server_log):
        env = client_env(tmp_path / "cli", api)
        deployed = subprocess.run([EPS_SCREEN, "deploy", "--pool", "local-gpu", "--gpus", "2"], env=env, cwd=ROOT,
                                  capture_output=True, text=True, timeout=300)
        assert deployed.returncode == 0 and "concurrency limit 2" in deployed.stdout, deployed.stdout + deployed.stderr
        # The workers poll at Prefect's default (10 s), as the script starts them for a user. Each poll makes the
        # server write twice in the background (work queue and deployment "ready" marks); polling every second,
        # as this test once did, measured 3-5x the SQLite lock conflicts and a slower screen (docs/walkthroughs.md).
        hosts = tmp_path / "hosts"
        worker_env = client_env(tmp_path / "workers", api, PREFECT_BIN=PREFECT, PYTHONPATH=str(hook),
                                EPS_TEST_GPU_LOG=str(log), PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(results),
                                EPS_JOB_HOST_DIR=str(hosts))
        starter = subprocess.Popen([str(ROOT / "deployments/pools/start-local-gpu-workers.sh"), "0", "1"],
                                   env=worker_env, cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                                   start_new_session=True)  # the workers stay in this process group
        try:
            assert "worker for GPU 1: pid" in starter.communicate(timeout=60)[0]
            # as `eps-screen doctor` would: the screen fails at once on a pool with no worker online yet
            with temporary_settings({PREFECT_API_URL: api}):
                wait_for_workers("local-gpu", 2)
            config = ScreenConfig(name="gpus", store=str(tmp_path / "store"),
                                  backend={"generation": "simulated", "training": "simulated"},
                                  execution={"pool": "local-gpu", "max_parallel_cells": 2, "cells_per_job": 16})
            with temporary_settings({PREFECT_API_URL: api, PREFECT_RESULTS_LOCAL_STORAGE_PATH: results}):
                state = screen(config, return_state=True)
        finally:
            os.killpg(starter.pid, signal.SIGINT)
            deadline = time.time() + 30
            while time.time() < deadline and subprocess.run(["pgrep", "-g", str(starter.pid)],
                                                            capture_output=True).returncode == 0:
                time.sleep(0.5)
            subprocess.run(["pkill", "-KILL", "-g", str(starter.pid)], capture_output=True)
        assert state.is_completed(), state.message
        store = ResultStore.for_config(config)
        assert (store.report_dir / "clean_result.html").exists()
        cells = [c for phase in phase_cells(config, store).values() for c in phase]
        assert cells and all(store.is_finished(config, c) for c in cells)
        assert store.phase("pre_screen")["answers"] > 0
        # pre-screen 1, smoke 8 -> 2 jobs, slabs 24 + 32 + 32 -> 2 jobs each, multi-seed -> 2: 11 GPU jobs in all
        runs = [line.split() for line in log.read_text().splitlines()]
        expected = gpu_jobs(config, len(phase_cells(config, store)["multiseed"]))
        assert len(runs) == expected == 11, runs
        by_gpu: dict[str, list[tuple[float, float]]] = {}
        for _, gpu, start, end in runs:
            by_gpu.setdefault(gpu, []).append((float(start), float(end)))
        assert set(by_gpu) == {"0", "1"}, runs
        for spans in by_gpu.values():
            spans.sort()
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans  # one job at a time per GPU
        # SQLite under a whole screen of GPU jobs: nothing failed for good. No request answered 500, and no worker
        # or cell gave up on one (a client that runs out of retries logs an ERROR with its traceback, and the
        # cells' output is in the workers' logs). A write that meets the lock may answer 503 and be retried by the
        # client: those are counted and kept as a test output (docs/walkthroughs.md, "PostgreSQL for the server").
        # Each worker's runs ran in its one job host (deployments/pools/local-gpu.yaml's command): nothing failed, so
        # no host ended early, and every run's process above was the client that waited for its run there. The
        # runs' own output is in the hosts' logs.
        worker_logs = sorted(tmp_path.glob("worker-gpu-*.log"))
        host_logs = sorted(hosts.glob("gpu*-worker*.log"))
        assert len(worker_logs) == 2
        assert [p.name.split("-")[0] for p in host_logs] == ["gpu0", "gpu1"], host_logs
        served = [p.read_text(errors="replace") for p in host_logs]
        assert all(text.count("job host: pid ") == 1 for text in served), served
        assert sum(text.count("ended with code 0") for text in served) == len(runs)
        assert sum(text.count("Finished in state Completed()") for text in served) >= len(runs)
        assert not any("ended with code 1" in text for text in served)
        for path in worker_logs + host_logs:
            assert not gave_up(path), (path.name, gave_up(path)[:5])
        count_retried_503s(server_log, "local_gpu_pool_sqlite", gpu_jobs=len(runs), cells=len({c.id for c in cells}))
