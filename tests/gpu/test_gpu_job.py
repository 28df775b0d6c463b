"""GPU tier: the real `cell` flow runs one GPU job of four cells on a 7B-shaped model with the vllm backend.

The job covers two regimes (A0 and A1 prompts) and both loss masks. In one process it generates the answer sets
with vLLM, trains each LoRA (engine asleep), evaluates every adapter in one multi-LoRA call and writes each cell.
Random weights, no download: benchmarks/gpu_common.seven_b_dir (tiny tokenizer, vocabulary sized to it).
Run on the H200 test machine: `python -m pytest -m gpu tests/gpu/test_gpu_job.py`. Writes gpu_job_test.json
($OUT there, else test-output/) with each cell's timings and the engine's start, sleep and wake times.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_cell_flow_runs_a_job_of_four_7b_cells_through_vllm(tmp_path):
    from prefect.testing.utilities import prefect_test_harness

    from benchmarks.gpu_common import DevicePeak, environment, job_cells, job_config, seven_b_dir
    from eps_screen.job import engines
    from eps_screen.job.memory import memory_plan
    from eps_screen.store import ResultStore
    from flows.cell import cell

    started = time.perf_counter()
    model_dir = seven_b_dir(Path(os.environ.get("EPS_GPU_MODEL_DIR", "/tmp/eps-7b-tinyvocab")))
    build_s = time.perf_counter() - started
    cache = Path(os.environ.get("EPS_ENGINE_CACHE", "/tmp/eps-engine-cache"))
    # per_job, the default: the flow's job task (all trainings, then one multi-LoRA evaluation); the per_cell path
    # runs through the same pipeline functions in benchmarks/gpu_job_bench.py.
    config = job_config(model_dir, tmp_path / "store", engine_cache=cache, execution={"job_eval": "per_job"})
    cells = job_cells()
    with prefect_test_harness(server_startup_timeout=120), DevicePeak() as device:
        t = time.perf_counter()
        summaries = cell(config, [c.id for c in cells])
        flow_s = time.perf_counter() - t
    store = ResultStore.for_config(config)
    train_peaks, allocated_peaks = {}, {}
    for c in cells:
        assert store.is_finished(config, c), f"{c.id}: no metrics in the store"
        m = store.cell_metrics(config, c)
        assert m["answers"] == (24 * 20 + 20) * 2
        assert m["train"]["steps"] > 0 and m["train"]["final_loss"] == m["train"]["final_loss"]
        assert (store.cell_dir(config, c) / "adapter" / "adapter_model.safetensors").exists()
        train_peaks[c.id] = m["train"]["peak_memory_gb"]
        allocated_peaks[c.id] = m["train"]["peak_allocated_gb"]
    stats = engines.stats()[str(model_dir)]
    assert stats["sleep_s"], "the engine must sleep while the job trains"
    plan = memory_plan(config)
    out = Path(os.environ.get("OUT") or "test-output")
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_job_test.json").write_text(json.dumps({
        "environment": environment(),
        "model_build_s": build_s,
        "flow_s": flow_s,
        "engine": stats,
        "device_peak_gib": device.gib,  # the driver's figure, sampled every 0.2 s: the awake engine fills the card
        "training_peak_gib": train_peaks,  # engine asleep: what an 80 GB card must hold
        "training_peak_allocated_gib": allocated_peaks,  # the same, counting allocated instead of reserved memory
        "planned_training_peak_gib": plan.train_peak_gib,
        "cells": summaries,
    }, indent=1, default=str))
    # The memory plan that decides before renting whether a job fits a card must not under-count what training,
    # beside the sleeping engine, needs. That is the allocated figure: the allocator's cache beyond it (the device
    # figure) is handed back and the allocation retried before a CUDA out-of-memory error.
    assert max(allocated_peaks.values()) <= plan.train_peak_gib, (allocated_peaks, plan)
