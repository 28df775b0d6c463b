"""The `local-gpu` pool puts one cell on one GPU (deployments/pools/local-gpu.yaml).

`eps-screen deploy --pool local-gpu --gpus 2` creates the pool (concurrency limit 2) and the `cell-local-gpu`
deployment; deployments/pools/start-local-gpu-workers.sh starts one worker per "GPU" (0 and 1: the mechanism
is only CUDA_VISIBLE_DEVICES, so no GPU is needed); the screen's dispatcher sends 4 simulated cells. A
sitecustomize hook records each flow-run process's CUDA_VISIBLE_DEVICES and its lifetime: every run saw
exactly one device, both devices were used, and no device ever ran two cells at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT
from tests.integration.servers import EPS_SCREEN, PREFECT, client_env, prefect_server, server_errors

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


def test_one_cell_per_gpu(tmp_path: Path):
    from prefect.settings import PREFECT_API_URL, PREFECT_RESULTS_LOCAL_STORAGE_PATH, temporary_settings

    from eps_screen import design
    from eps_screen.config import ScreenConfig
    from tasks.dispatch import dispatch_cells

    hook, log, results = tmp_path / "hook", tmp_path / "gpu-runs.txt", tmp_path / "results"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    with prefect_server(tmp_path / "server") as (api, server_log):
        env = client_env(tmp_path / "cli", api)
        deployed = subprocess.run([EPS_SCREEN, "deploy", "--pool", "local-gpu", "--gpus", "2"], env=env, cwd=ROOT,
                                  capture_output=True, text=True, timeout=300)
        assert deployed.returncode == 0 and "concurrency limit 2" in deployed.stdout, deployed.stdout + deployed.stderr
        worker_env = client_env(tmp_path / "workers", api, PREFECT_BIN=PREFECT, PYTHONPATH=str(hook),
                                EPS_TEST_GPU_LOG=str(log), PREFECT_WORKER_QUERY_SECONDS="1",
                                PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(results))
        starter = subprocess.Popen([str(ROOT / "deployments/pools/start-local-gpu-workers.sh"), "0", "1"],
                                   env=worker_env, cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                                   start_new_session=True)  # the workers stay in this process group
        try:
            assert "worker for GPU 1: pid" in starter.communicate(timeout=60)[0]
            config = ScreenConfig(name="gpus", store=str(tmp_path / "store"),
                                  backend={"generation": "simulated", "training": "simulated"},
                                  execution={"pool": "local-gpu", "max_parallel_cells": 4})
            cells = [c.id for c in design.slab_cells(config, "librarian")][:4]
            with temporary_settings({PREFECT_API_URL: api, PREFECT_RESULTS_LOCAL_STORAGE_PATH: results}):
                summaries = dispatch_cells(config, cells, "cell/cell-local-gpu", poll_s=1.0)
        finally:
            os.killpg(starter.pid, signal.SIGINT)
            deadline = time.time() + 30
            while time.time() < deadline and subprocess.run(["pgrep", "-g", str(starter.pid)],
                                                            capture_output=True).returncode == 0:
                time.sleep(0.5)
            subprocess.run(["pkill", "-KILL", "-g", str(starter.pid)], capture_output=True)
        assert sorted(summaries) == sorted(cells) and all("source_rate" in s for s in summaries.values())
        runs = [line.split() for line in log.read_text().splitlines()]
        assert len(runs) == len(cells)
        by_gpu: dict[str, list[tuple[float, float]]] = {}
        for _, gpu, start, end in runs:
            by_gpu.setdefault(gpu, []).append((float(start), float(end)))
        assert set(by_gpu) == {"0", "1"}, runs
        for spans in by_gpu.values():
            spans.sort()
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans  # one cell at a time per GPU
        assert server_errors(server_log) == []
