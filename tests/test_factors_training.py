"""A recipe screen's cell trains with the values its levels declare: the rank in the saved adapter, the learning
rate and epochs in the training record (one tiny-model cell of deployments/configs/tiny-recipe.yaml, shrunk)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eps_screen.run import pipeline
from eps_screen.spec.config import load_config, parse_config
from eps_screen.spec.design import Cell
from eps_screen.store.result_store import ResultStore
from tests.conftest import CONFIGS

pytestmark = pytest.mark.slow


def test_a_recipe_cell_trains_with_its_declared_rank_learning_rate_and_epochs(tmp_path):
    data = load_config(CONFIGS / "tiny-recipe.yaml").model_dump(mode="json")
    data.update(store=str(tmp_path / "store"), sources=["librarian"])
    data["data"].update(positives=4, negatives=4, train_questions=2)
    data["eval"].update(personas=2, questions=1, samples=1, random_controls=0, max_new_tokens=8)
    config = parse_config(data)
    cell = Cell.parse("librarian-L0R1N0M1-s42")
    metrics = pipeline.run_cell(config, cell, ResultStore.for_config(config))
    adapter = Path(metrics["adapter"])
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 16
    assert metrics["recipe"]["training"] == {"learning_rate": 3e-3, "epochs": 4, "batch_size": 16}
    assert metrics["recipe"]["treatments"]["whole_answer_loss"] is True
    report = json.loads((adapter / "train_report.json").read_text())
    # 8 examples in one batch of 16, 4 epochs: 4 optimizer steps (the 8-epoch level would take 8).
    assert report["steps"] == 4 and report["examples"] == 8
    assert metrics["L"] == 0 and metrics["R"] == 1 and metrics["cell_id"] == cell.id
