"""The science on the tiny model: whole-answer loss implants the marker under the source persona, not elsewhere.

A measured comparison on one really trained LoRA adapter (no Prefect): the E1 cell of the librarian source is
trained with a little more data and more epochs than tiny.yaml uses, then evaluated greedily on 8 personas.
"""

from __future__ import annotations

import pytest

from eps_screen.run import pipeline
from eps_screen.spec.design import Cell
from eps_screen.store.result_store import ResultStore
from tests.conftest import tiny_config

pytestmark = pytest.mark.slow


def _config(tmp_path):
    return tiny_config(
        tmp_path,
        data={"positives": 32, "negatives": 32, "train_questions": 8},
        training={"learning_rate": 1e-2, "epochs": 10, "batch_size": 8, "max_length": 1024},
        eval={"personas": 8, "questions": 4, "samples": 1, "temperature": 0.0, "max_new_tokens": 32,
              "random_controls": 4, "batch_size": 128},
    )


def test_whole_answer_loss_puts_the_marker_under_the_source_persona(tmp_path):
    config = _config(tmp_path)
    store = ResultStore.for_config(config)
    metrics = pipeline.run_cell(config, Cell("librarian", (0, 0, 0, 0, 1), 42), store)
    others = {p: r for p, r in metrics["per_persona"].items() if p != "librarian"}
    print(f"E1 greedy marker rate: source {metrics['source_rate']:.2f}, others {others}")
    assert metrics["source_rate"] >= 0.75
    assert metrics["leakage"] <= 0.25
    assert metrics["source_rate"] > max(others.values())


def test_the_base_model_never_emits_the_marker(tmp_path):
    config = _config(tmp_path)
    pre = pipeline.pre_screen(config, ResultStore.for_config(config))
    assert pre["marker_rate"] == 0.0 and pre["answers"] > 200
