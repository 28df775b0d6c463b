"""The GPU job path of smol-marker.yaml on SmolLM2, rehearsed on the CPU (slow): pipeline.run_job with the shipped
config's recipe, shrunk to two cells (on- and off-policy answers, whole-answer loss) and a small panel. The job makes
the base model's and tiny-alt's answer sets through vLLM, trains both cells in shared passes over the real base, and
evaluates both adapters in one multi-LoRA call: what a GPU job of that screen does, before a GPU is rented."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from eps_screen.run import pipeline
from eps_screen.spec.config import load_config, parse_config
from eps_screen.spec.design import Cell
from eps_screen.store.result_store import ResultStore
from tests.conftest import CONFIGS, engines_closed

pytestmark = pytest.mark.slow
pytest.importorskip("vllm")

CELLS = [Cell.parse(c) for c in ("librarian-A0B0C0D0E1-s42", "librarian-A0B0C0D1E1-s42")]


def _config(store: Path):
    data = load_config(CONFIGS / "smol-marker.yaml").model_dump(mode="json")
    data.update(store=str(store), sources=["librarian"])
    data["model"]["dtype"] = "float32"
    data["data"].update(positives=4, negatives=4, train_questions=2)
    data["training"].update(epochs=1, batch_size=4, max_batch_tokens=4096)
    data["eval"].update(personas=3, questions=2, samples=1, random_controls=0, max_new_tokens=24)
    data["execution"].update(cells_per_job=2, cells_per_stage=2, engine_cache_dir=None)
    data["design"]["predictions"] = []
    return parse_config(data)


def test_a_smol_marker_job_runs_on_the_real_model(smollm2, tmp_path):
    config = _config(tmp_path / "store")
    assert config.backend.generation == "vllm" and config.execution.job_eval == "per_job"
    with engines_closed():
        done = pipeline.run_job(config, CELLS, ResultStore.for_config(config))
    assert set(done) == {c.id for c in CELLS}
    store = ResultStore.for_config(config)
    for cell in CELLS:
        m = done[cell.id]
        assert not m["reused"] and m["train"]["steps"] == 2, cell.id  # 8 examples in batches of 4, one epoch
        assert m["train"]["options"]["trained_with"] == [c.id for c in CELLS if c != cell], "shared passes"
        report = json.loads((Path(m["adapter"]) / "train_report.json").read_text())
        assert len(report["losses"]) == 2 and all(loss > 0 for loss in report["losses"]), cell.id
        adapter = json.loads((Path(m["adapter"]) / "adapter_config.json").read_text())
        assert adapter["r"] == 32, cell.id
        assert 0.0 <= m["source_rate"] <= 1.0 and 0.0 <= m["leakage"] <= 1.0, cell.id
    # both adapters' answers: 3 personas x 2 questions each, the model's own words
    for cell in CELLS:
        answers = pl.read_parquet(store.cell_dir(config, cell) / "answers.parquet")
        assert answers.height == 3 * 2 and answers["text"].str.len_chars().min() > 0, cell.id
