"""A GPU job's cells trained together by default (pipeline.run_job, job_eval per_job, training.together): on the
tiny model on the CPU, four cells of one job whose factors give each its own learning rate, LoRA rank, epochs and
loss mask share passes over the base, and each cell's loss curve and adapter equal training it alone
(training.together: false, the same job) within tests/test_training_together.py's tolerance. The estimate and the
memory plan count shared passes exactly where the job runs them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eps_screen.run import pipeline
from eps_screen.spec.config import load_config, parse_config
from eps_screen.spec.design import Cell
from eps_screen.store.result_store import ResultStore, cell_key
from eps_screen.train.stages import trains_together
from tests.conftest import CONFIGS, engines_closed, qwen7b_config
from tests.test_training_together import ADAPTER_TOL, LOSS_RTOL, _adapter

pytestmark = pytest.mark.slow

# tiny-recipe.yaml's factors: L learning rate 3e-3/1e-2, R rank 4/16, N epochs 4/8, M loss mask. One source and
# seed: every cell trains on the one regime's answers.
CELLS = [Cell.parse(c) for c in ("librarian-L0R0N0M0-s42", "librarian-L1R1N0M1-s42", "librarian-L0R1N1M0-s42",
                                 "librarian-L1R0N0M1-s42")]
RANKS = [4, 16, 16, 4]
STEPS = [8, 8, 16, 8]  # 8 examples in micro-batches of 4 (2 steps an epoch), 4 or 8 epochs


def _config(store: Path, together: bool, per_stage: int = 8):
    data = load_config(CONFIGS / "tiny-recipe.yaml").model_dump(mode="json")
    data.update(store=str(store), sources=["librarian"])
    data["data"].update(positives=4, negatives=4, train_questions=2)
    # packing and a pass budget several cells' micro-batches fit in: what makes cells shareable (train.stages.plan)
    data["training"].update(batch_size=4, packing=True, max_batch_tokens=4096, together=together)
    data["eval"].update(personas=2, questions=1, samples=1, random_controls=0, max_new_tokens=8, temperature=0.0)
    # job_eval left to its default: per_job
    data["execution"] = {"pool": "local-gpu", "cells_per_job": 4, "cells_per_stage": per_stage}
    return parse_config(data)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("job_together")
    out = {}
    with engines_closed():
        for together in (True, False):
            config = _config(root / str(together), together)
            out[together] = config, pipeline.run_job(config, CELLS, ResultStore.for_config(config))
    return out


def _distance(a: dict, b: dict) -> float:
    """The largest relative difference of two adapters, tensor by tensor, in norm: ||b - a|| / ||a||.

    tests/test_training_together.py states ADAPTER_TOL against each tensor's largest element instead. Here that
    measure reads a single element: in layer 1's k_proj B of the rank-16, whole-answer, lr 1e-2 cell, 1 of 1,024
    weights ends 4.9e-5 apart (2.2e-3 of the tensor's largest weight; every other weight within 1e-5), and 1.5e-3
    even when that cell goes through the shared-pass code alone, no other cell in its passes: attention's keys get
    gradients that cancel to near zero in some directions, and AdamW scales float32 rounding there up to a whole
    step. In norm the cells are within 1.3e-4 of training alone; another cell's adapter is 2.1 away."""
    assert a.keys() == b.keys(), "the saved adapters name different tensors"
    return max(float((b[k] - a[k]).norm() / a[k].norm()) for k in a if a[k].norm() > 0)


def _report(metrics: dict) -> dict:
    return json.loads((Path(metrics["adapter"]) / "train_report.json").read_text())


def test_the_job_trains_its_cells_together_by_default(jobs):
    config, done = jobs[True]
    assert config.execution.job_eval == "per_job" and config.training.together
    for i, cell in enumerate(CELLS):
        m = done[cell.id]
        assert not m["reused"] and m["train"]["steps"] == STEPS[i], cell.id
        options = m["train"]["options"]
        assert options["together"] == len(CELLS) and options["cells_per_pass"] > 1.5, "the cells must share passes"
        assert options["trained_with"] == [c.id for c in CELLS if c != cell]
        assert {"answers_s", "train_s", "job_train_s", "eval_s", "job_eval_s"} <= set(m["timings"])
        assert m["timings"]["train_s"] < m["timings"]["job_train_s"]
        # each cell trained under its own resolved recipe
        adapter = json.loads((Path(m["adapter"]) / "adapter_config.json").read_text())
        assert adapter["r"] == RANKS[i], cell.id
        assert m["recipe"]["training"]["learning_rate"] == (3e-3 if cell.level("L") == 0 else 1e-2)


def test_together_false_trains_each_cell_alone(jobs):
    _, done = jobs[False]
    for i, cell in enumerate(CELLS):
        options = done[cell.id]["train"]["options"]
        assert "together" not in options and "trained_with" not in options, cell.id
        assert done[cell.id]["train"]["steps"] == STEPS[i]


def test_each_cell_trained_together_equals_it_trained_alone(jobs):
    (together_config, together), (alone_config, alone) = jobs[True], jobs[False]
    for cell in CELLS:
        assert cell_key(together_config, cell) == cell_key(alone_config, cell), "training.together is speed only"
        t, a = _report(together[cell.id]), _report(alone[cell.id])
        assert len(t["losses"]) == len(a["losses"]) == a["steps"]
        assert t["losses"] == pytest.approx(a["losses"], rel=LOSS_RTOL), f"{cell.id}: the loss curve differs"
        assert _distance(_adapter(Path(alone[cell.id]["adapter"])), _adapter(Path(together[cell.id]["adapter"]))) \
            < ADAPTER_TOL, cell.id
    # the comparison can fail: two cells of the same rank and epochs, other learning rate and mask, are far apart
    first, last = CELLS[0].id, CELLS[3].id
    assert _distance(_adapter(Path(alone[first]["adapter"])), _adapter(Path(together[last]["adapter"]))) \
        > 100 * ADAPTER_TOL


def test_a_job_trains_and_stores_its_cells_stage_by_stage(jobs, tmp_path, monkeypatch):
    """Stages of two: each stage's cells share passes with each other only, and are evaluated and stored before
    the next stage trains; a job that fails in its second stage keeps the first stage's cells, and its rerun
    trains only the other two. Each cell's loss curve is its curve trained alone."""
    config = _config(tmp_path / "store", together=True, per_stage=2)
    store = ResultStore.for_config(config)
    trained: list[list[str]] = []
    real = pipeline.train_cells

    def second_stage_fails(base, cells, stage=None):
        trained.append([c.name for c in cells])
        if len(trained) == 2:
            raise RuntimeError("the pod vanished")
        return real(base, cells, stage)

    monkeypatch.setattr(pipeline, "train_cells", second_stage_fails)
    with engines_closed():
        with pytest.raises(RuntimeError, match="vanished"):
            pipeline.run_job(config, CELLS, store)
        first = trained[0]
        assert len(first) == 2 and len(trained[1]) == 2 and not set(first) & set(trained[1])
        stored = {c.id for c in CELLS if store.cell_metrics(config, c) is not None}
        assert stored == set(first), "the first stage's cells are stored before the second stage trains"
        monkeypatch.setattr(pipeline, "train_cells", real)
        done = pipeline.run_job(config, CELLS, store)
    assert {c for c, m in done.items() if m["reused"]} == set(first)
    _, alone = jobs[False]
    for cell in CELLS:
        options = done[cell.id]["train"]["options"] if not done[cell.id]["reused"] else \
            store.cell_metrics(config, cell)["train"]["options"]
        assert options["together"] == 2 and len(options["trained_with"]) == 1, cell.id
        assert options["trained_with"][0] in (first if cell.id in first else trained[1])
        t, a = _report(store.cell_metrics(config, cell)), _report(alone[cell.id])
        assert t["losses"] == pytest.approx(a["losses"], rel=LOSS_RTOL), f"{cell.id}: the loss curve differs"


def test_estimate_and_memory_plan_count_shared_passes_where_the_job_runs_them():
    from eps_screen.plan.cost_estimate import estimate
    from eps_screen.plan.memory import memory_plan

    shipped = qwen7b_config()
    per_cell = qwen7b_config(execution={"job_eval": "per_cell"})
    off = qwen7b_config(training={"together": False})
    assert shipped.execution.job_eval == "per_job" and trains_together(shipped)
    assert not trains_together(per_cell) and not trains_together(off)
    assert not trains_together(qwen7b_config(execution={"cells_per_job": 1}))
    assert "train A0B0 (together)" in estimate(shipped).figures
    for alone in (per_cell, off):
        assert "train A0B0 (together)" not in estimate(alone).figures
        assert memory_plan(alone).train_peak_gib == memory_plan(qwen7b_config(execution={"cells_per_job": 1})).train_peak_gib
    assert not trains_together(parse_config({**shipped.model_dump(mode="json"),
                                             "training": {**shipped.training.model_dump(), "packing": False}}))
