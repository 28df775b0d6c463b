"""GPU tier: the real `job` flow runs one GPU job of four cells on a 7B-shaped model with the vllm backend.

The job covers two regimes (A0 and A1 prompts) and both loss masks. In one process it generates the answer sets
with vLLM, trains each LoRA (engine asleep), evaluates every adapter in one multi-LoRA call and writes each cell.
Random weights, no download: benchmarks/gpu_common.seven_b_dir (tiny tokenizer, vocabulary sized to it).
Run on the H200 test machine: `python -m pytest -m gpu tests/gpu/test_gpu_job.py`. Writes gpu_job_test.json
($OUT there, else test-output/) with each cell's timings and the engine's start, sleep and wake times, and
gpu_job_test_80gb.json for the same job with A1B1 cells on the H200 made an 80 GB card by a ballast process, and
gpu_job_test_off_policy.json for a job that releases a second model's engine.
"""

from __future__ import annotations

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


EIGHTY_GB_GIB = 79.6  # what an H100 80GB or A100 80GB reports (eps_screen.plan.memory)


def _run_job(tmp_path, cells, card_gib: float | None = None, execution: dict | None = None,
             off_policy: dict | None = None) -> dict:
    """One GPU job of `cells` through the `job` flow; with `card_gib`, on a card made that small by a ballast
    process holding the rest (so the engine sizes itself to what is free, and what the sleeping engine releases is
    really free: a per-process memory fraction still counts it, and training then fails at the cap)."""
    from prefect.testing.utilities import prefect_test_harness

    from benchmarks.gpu_common import DevicePeak, environment, job_config, seven_b_dir
    from eps_screen.plan.memory import memory_plan
    from eps_screen.run import engines
    from eps_screen.store.result_store import ResultStore
    from flows.job import job

    ballast = _Ballast(card_gib) if card_gib else None
    started = time.perf_counter()
    model_dir = seven_b_dir(Path(os.environ.get("EPS_GPU_MODEL_DIR", "/tmp/eps-7b-tinyvocab")))
    build_s = time.perf_counter() - started
    cache = Path(os.environ.get("EPS_ENGINE_CACHE", "/tmp/eps-engine-cache"))
    # per_job, the default: the flow's job task (all trainings, then one multi-LoRA evaluation); the per_cell path
    # runs through the same pipeline functions in benchmarks/gpu_job_bench.py.
    config = job_config(model_dir, tmp_path / "store", engine_cache=cache,
                        execution={"job_eval": "per_job", **(execution or {})}, **({"off_policy": off_policy} if off_policy else {}))
    try:
        with prefect_test_harness(server_startup_timeout=120), DevicePeak() as device:
            t = time.perf_counter()
            summaries = job(config, [c.id for c in cells])
            flow_s = time.perf_counter() - t
    finally:
        held_gib = ballast.stop() if ballast else 0.0
    store = ResultStore.for_config(config)
    train_peaks, allocated_peaks, written = {}, {}, {}
    for c in cells:
        assert store.is_finished(config, c), f"{c.id}: no metrics in the store"
        m = store.cell_metrics(config, c)
        assert m["answers"] == (24 * 20 + 20) * 2
        assert m["train"]["steps"] > 0 and m["train"]["final_loss"] == m["train"]["final_loss"]
        assert (store.cell_dir(config, c) / "adapter" / "adapter_model.safetensors").exists()
        train_peaks[c.id] = m["train"]["peak_memory_gb"]
        allocated_peaks[c.id] = m["train"]["peak_allocated_gb"]
        cell_dir = store.cell_dir(config, c)
        written[c.id] = {"adapter": (cell_dir / "adapter" / "adapter_model.safetensors").stat().st_mtime,
                         "metrics": (cell_dir / "metrics.json").stat().st_mtime,
                         "trained_with": m["train"]["options"].get("trained_with", [])}
    stats = engines.stats()[str(model_dir)]
    assert stats["sleep_s"], "the engine must sleep while the job trains"
    return {
        "environment": environment(),
        "card_gib": card_gib,
        "ballast_gib": held_gib,
        "model_build_s": build_s,
        "flow_s": flow_s,
        "engine": stats,
        "device_peak_gib": device.gib,  # the driver's figure, sampled every 0.2 s: the awake engine fills the card
        "job_peak_gib": device.gib - held_gib if device.gib else None,  # less the ballast: the job's own
        "training_peak_gib": train_peaks,  # engine asleep: what an 80 GB card must hold
        "training_peak_allocated_gib": allocated_peaks,  # the same, counting allocated instead of reserved memory
        "planned_training_peak_gib": memory_plan(config).train_peak_gib,
        "written_at": written,  # each cell's adapter and metrics files, as the store's clock saw them
        "cells": summaries,
    }


class _Ballast:
    """A process holding all of the GPU but `card_gib`: this card then behaves as one of that size."""

    def __init__(self, card_gib: float):
        import subprocess
        import sys

        free, total = torch.cuda.mem_get_info()
        self.gib = total / 2**30 - card_gib
        hold = ("import sys, torch; x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device='cuda');"
                " print('held', flush=True); sys.stdin.read()")
        self.proc = subprocess.Popen([sys.executable, "-c", hold, str(self.gib)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held", "the ballast process could not take its share"

    def stop(self) -> float:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        return self.gib


def _write(name: str, result: dict) -> None:
    from benchmarks.gpu_common import out_dir, write

    write(out_dir("test-output") / name, result)


def test_cell_flow_runs_a_job_of_four_7b_cells_through_vllm(tmp_path):
    from benchmarks.gpu_common import job_cells

    result = _run_job(tmp_path, job_cells())
    _write("gpu_job_test.json", result)
    # The memory plan that decides before renting whether a job fits a card must not under-count what training,
    # beside the sleeping engine, needs. That is the allocated figure: the allocator's cache beyond it (the device
    # figure) is handed back and the allocation retried before a CUDA out-of-memory error.
    allocated = result["training_peak_allocated_gib"]
    assert max(allocated.values()) <= result["planned_training_peak_gib"], result


def test_a_job_in_stages_stores_each_stage_before_the_next_trains(tmp_path):
    """The same four cells in stages of two (execution.cells_per_stage): the A0 pair trained together, evaluated
    and stored, then the A1 pair trained alone and evaluated; the engine sleeps and wakes once a stage."""
    from benchmarks.gpu_common import job_cells

    cells = job_cells()
    result = _run_job(tmp_path, cells, execution={"cells_per_stage": 2})
    _write("gpu_job_test_stages.json", result)
    written = result["written_at"]
    first, second = [c.id for c in cells if c.level("A") == 0], [c.id for c in cells if c.level("A") == 1]
    assert written[first[0]]["trained_with"] == [first[1]] and not written[second[0]]["trained_with"], written
    assert max(written[c]["metrics"] for c in first) < min(written[c]["adapter"] for c in second), written
    assert len(result["engine"]["sleep_s"]) >= 2 and len(result["engine"]["wake_s"]) >= 2, result["engine"]


def test_a_job_releases_the_off_policy_engine_before_it_trains(tmp_path):
    """Two cells on on-policy answers (D0) and two on off-policy answers (D1): the job makes the base model's set,
    then the off-policy model's in that engine's own process (the base engine asleep: two engines that sleep cannot
    share a process), then ends that process before any training; the base engine wakes to evaluate. The off-policy
    model is the tiny shape with the same tokenizer: what is tested is the second engine's process, not its speed
    (gpu_full_size_bench.py measures the 32B shape), and a small model's cold start keeps the test in one device call."""
    from benchmarks.gpu_common import seven_b_dir
    from eps_screen.run import engines
    from eps_screen.spec.design import Cell

    if engines.stats():
        pytest.skip("an earlier test's engine, sized to the whole card, is still up: run this one alone (-k off_policy)")
    off_dir = seven_b_dir(tmp_path / "off-policy-model", tiny=True)
    cells = [Cell("librarian", (0, 0, 0, d, e), 42) for d in (0, 1) for e in (0, 1)]
    result = _run_job(tmp_path, cells, off_policy={"kind": "model", "model": str(off_dir)})
    off = engines.stats()[str(off_dir)]
    result["off_policy_engine"] = off
    _write("gpu_job_test_off_policy.json", result)
    assert off["release_s"] > 0 and off["process_start_s"] > off["start_s"] and not off["sleep_s"], off
    assert [key for key in engines._RELEASED] == [("vllm", str(off_dir))]
    assert result["engine"]["sleep_s"] and result["engine"]["wake_s"], result["engine"]
    # the training base waited in host memory while the off-policy engine ran, so that engine was sized to the card
    # less the sleeping base engine: more than the base engine, which the resident training base left less
    moves = engines.stats()["training base"]
    assert len(moves["to_host_s"]) == 1 == len(moves["back_s"]) and moves["to_host_gib"][0] > 10, moves
    assert off["gpu_memory_share"] > result["engine"]["gpu_memory_share"] + 0.5 * moves["to_host_gib"][0] / (torch.cuda.mem_get_info()[1] / 2**30), (
        off, result["engine"])


def test_a_job_with_long_cells_fits_an_80gb_card(tmp_path):
    """The whole job (engine start, answer sets, A0B0 cells trained together, A1B1 cells alone, one evaluation)
    on the H200 made an 80 GB card: beside the ballast, the job never holds more than that card has."""
    from eps_screen.run import engines
    from eps_screen.spec.design import Cell

    if engines.stats():
        pytest.skip("an earlier test's engine, sized to the whole card, is still up: run this one alone (-k 80gb)")
    cells = [Cell("librarian", (a, a, 0, 0, e), 42) for a in (0, 1) for e in (0, 1)]
    result = _run_job(tmp_path, cells, card_gib=EIGHTY_GB_GIB)
    _write("gpu_job_test_80gb.json", result)
    assert result["job_peak_gib"] <= EIGHTY_GB_GIB, result
