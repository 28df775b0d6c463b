"""A GPU job's cells trained in worker processes (training.processes), each stage's beside the evaluation of the
stage before (pipeline._overlapped): on the tiny model on the CPU, the four cells of tests/test_job_together.py in
stages of two, trained by two workers. Each cell is trained in a worker, not in the job's process; each loss
curve and adapter equals the job that trains in its own process (the same tolerance as training together); the
optimizer steps reach the cell's tracking; and a worker's error fails the job with the first stage's cells
stored (out of memory: with the fields to lower named).
Trained alone here (training.together: false), each cell is a task of its own; cells that share passes go to a
worker as one task through the same train_cells (tests/test_job_together.py).
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from eps_screen.run import pipeline, trainers
from eps_screen.spec.config import parse_config
from eps_screen.store.result_store import ResultStore, cell_key
from tests.conftest import engines_closed
from tests.test_job_together import CELLS, STEPS, _config, _distance, _report
from tests.test_training_together import ADAPTER_TOL, LOSS_RTOL, _adapter

pytestmark = pytest.mark.slow


def _with_processes(store: Path, processes: int):
    # alone, each cell a task of its own: stages [0, 1] and [2, 3] in job order (the cells' examples are alike)
    data = _config(store, together=False, per_stage=2).model_dump(mode="json")
    data["training"]["processes"] = processes
    return parse_config(data)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("job_trainers")
    out = {}
    with engines_closed():
        for processes in (2, 1):
            config = _with_processes(root / str(processes), processes)
            out[processes] = config, pipeline.run_job(config, CELLS, ResultStore.for_config(config))
    return out


def test_workers_train_every_cell_outside_the_job_process(jobs):
    config, done = jobs[2]
    workers = set()
    for i, cell in enumerate(CELLS):
        m = done[cell.id]
        assert not m["reused"] and m["train"]["steps"] == STEPS[i], cell.id
        worker = m["train"]["options"]["worker"]
        assert worker != os.getpid(), f"{cell.id} trained in the job's process"
        workers.add(worker)
        assert m["timings"]["train_s"] > 0 and m["timings"]["job_train_s"] >= m["timings"]["train_s"]
    assert len(workers) <= 2
    # the one-process job records no worker
    assert all("worker" not in m["train"]["options"] for m in jobs[1][1].values())


def test_a_cell_trained_in_a_worker_equals_it_trained_in_the_job_process(jobs):
    (pool_config, pooled), (own_config, own) = jobs[2], jobs[1]
    for cell in CELLS:
        assert cell_key(pool_config, cell) == cell_key(own_config, cell), "training.processes is speed only"
        p, o = _report(pooled[cell.id]), _report(own[cell.id])
        assert len(p["losses"]) == len(o["losses"]) == o["steps"]
        assert p["losses"] == pytest.approx(o["losses"], rel=LOSS_RTOL), f"{cell.id}: the loss curve differs"
        assert _distance(_adapter(Path(own[cell.id]["adapter"])), _adapter(Path(pooled[cell.id]["adapter"]))) \
            < ADAPTER_TOL, cell.id


def test_the_workers_tokenize_the_stage_plan_as_the_job_process_would(jobs):
    """The job plans its stages from recipes its trainers tokenized (TrainerPool.recipes), in order."""
    from eps_screen.models.loading import load_tokenizer
    from eps_screen.train.stages import recipes_of

    config, _ = jobs[2]
    store = ResultStore.for_config(config)
    cells = [pipeline._cell_training(config, cell, store)[0] for cell in reversed(CELLS)]
    engine_config = pipeline._engine_config(config)
    with trainers.TrainerPool(engine_config, 2) as pool:
        made = pool.recipes(cells)
    assert made == recipes_of(load_tokenizer(engine_config.model.base), cells)
    assert [r.out_dir for r in made] == [c.out_dir for c in cells]


def test_the_steps_a_worker_trains_reach_the_cell_tracking(tmp_path, monkeypatch):
    config = _with_processes(tmp_path / "store", 2)
    seen: dict[str, list[int]] = {}
    real = pipeline._cell_training

    def recording(config, cell, store, on_step=None):
        return real(config, cell, store, lambda step, figures: seen.setdefault(cell.id, []).append(step))

    monkeypatch.setattr(pipeline, "_cell_training", recording)
    with engines_closed():
        pipeline.run_job(config, CELLS[:2], ResultStore.for_config(config))
    assert {cell_id: steps for cell_id, steps in seen.items()} == {
        c.id: list(range(1, STEPS[i] + 1)) for i, c in enumerate(CELLS[:2])}


def _fails_in_second_stage(cells, stage):
    if any(c.name in json.loads(os.environ["EPS_TEST_FAIL_CELLS"]) for c in cells):
        import torch

        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return _real_train(cells, stage)


_real_train = trainers._train


def test_a_worker_error_fails_the_job_and_keeps_the_stored_stages(tmp_path, monkeypatch):
    config = _with_processes(tmp_path / "store", 2)
    store = ResultStore.for_config(config)
    doomed = [c.id for c in CELLS[2:]]
    monkeypatch.setenv("EPS_TEST_FAIL_CELLS", json.dumps(doomed))
    monkeypatch.setattr(trainers, "_train", _fails_in_second_stage)
    with engines_closed():
        with pytest.raises(RuntimeError, match=r"out of GPU memory.*training.processes lower"):
            pipeline.run_job(config, CELLS, store)
    stored = {c.id for c in CELLS if store.cell_metrics(config, c) is not None}
    assert stored and not stored & set(doomed), "the stage before the failure is stored; the failed one is not"


def test_a_job_host_keeps_the_trainers_and_engines_for_the_next_job_of_the_same_config(tmp_path, monkeypatch):
    """In a job host (flows/runtime/job_host.py) the second job of a config trains in the first one's trainer
    processes and evaluates with its engine; a job of another config starts its own."""
    from eps_screen.run import engines, warm

    monkeypatch.setenv(warm.HOSTED, "1")
    config = _with_processes(tmp_path / "store", 2)
    store = ResultStore.for_config(config)
    other = config.with_sets({"store": str(tmp_path / "other")})  # any field: the whole config is compared

    def workers(done):
        return {m["train"]["options"]["worker"] for m in done.values()}

    try:
        assert not warm.begin_job(config)
        first = pipeline.run_job(config, CELLS[:2], store)
        # The pool's processes, whichever of them trained: the first job's cells may all go to one of them.
        kept_processes = {child.pid for child in multiprocessing.active_children()}
        assert workers(first) <= kept_processes
        kept_engines = dict(engines._GENERATORS)
        assert kept_engines, "the first job's engine is up after it"
        assert warm.begin_job(config)
        second = pipeline.run_job(config, CELLS[2:], store)
        assert workers(second) <= kept_processes, "the second job trained in the first one's processes"
        assert all(engines._GENERATORS[k] is gen for k, gen in kept_engines.items())
        assert not warm.begin_job(other)
        assert not engines._GENERATORS, "another config's job closes the last one's engines"
        third = pipeline.run_job(other, CELLS[:1], ResultStore.for_config(other))
        assert not workers(third) & workers(first), "and trains in processes of its own"
    finally:
        warm.close()
    assert all(store.cell_metrics(config, c) is not None for c in CELLS)
