"""The recipe screen end to end, as a user runs it: `eps-screen run` on deployments/configs/tiny-recipe.yaml (a 2^4
of learning rate, LoRA rank, epochs and loss mask on the tiny model), then what it wrote: a report labelled from
the config, and cells that trained with the values their levels declare.

Reduced to one source and one multi-seed cell: the shipped config's 44 cells took 615 s on a shared 2-core machine
(load ~7), these 17 cells 430 s at load ~11. Every one of the 16 recipes is still trained."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import CONFIGS, ROOT

# As the tiny screen's test (tests/test_screen_flow.py): minutes of CPU, in the default suite.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(2700)]

EPS_SCREEN = str(Path(sys.executable).parent / "eps-screen")


@pytest.fixture(scope="module")
def screen(tmp_path_factory):
    from eps_screen.spec.config import load_config

    tmp = tmp_path_factory.mktemp("recipe")
    data = yaml.safe_load((CONFIGS / "tiny-recipe.yaml").read_text())
    data.update(sources=["librarian"], store=str(tmp / "store"), seeds={**data["seeds"], "top_k": 1,
                                                                        "multiseed": [137]})
    path = tmp / "tiny-recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    # No Prefect settings from outside: the command starts its own temporary server, as on a fresh machine.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    out = subprocess.run([EPS_SCREEN, "run", str(path)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=2400, check=False)
    config = load_config(path)
    return config, out, Path(data["store"]) / config.name


def test_it_runs_to_its_report(screen):
    _, out, screen_dir = screen
    assert out.returncode == 0, out.stderr[-3000:]
    report = Path(out.stdout.strip().splitlines()[-1])
    assert report == screen_dir / "report" / "clean_result.html" and report.is_file()
    metrics = json.loads((report.parent / "aggregate_metrics.json").read_text())
    assert metrics["coverage"]["present"] == 17 and not metrics["coverage"]["partial"]


def test_the_report_is_labelled_from_the_config(screen):
    *_, screen_dir = screen
    page = (screen_dir / "report" / "clean_result.html").read_text()
    for label in ("Learning rate", "LoRA rank", "Epochs", "Loss mask"):
        assert label in page
    for value in ("training.learning_rate = 0.003", "training.learning_rate = 0.01", "lora.rank = 4",
                  "lora.rank = 16", "training.epochs = 4", "training.epochs = 8"):
        assert value in page, value  # the factor table shows what each level sets
    assert "System-prompt length" not in page  # nothing of the marker screen's factors


def test_its_cells_trained_with_the_declared_values(screen):
    from eps_screen.spec.design import Cell

    config, _, screen_dir = screen
    lr, rank, epochs = (3e-3, 1e-2), (4, 16), (4, 8)
    examples = config.data.positives + config.data.negatives
    seen = set()
    for path in screen_dir.glob("cells/*/*/metrics.json"):
        m = json.loads(path.read_text())
        cell = Cell.parse(m["cell_id"])
        adapter = Path(m["adapter"])
        assert adapter.is_relative_to(screen_dir), adapter
        assert json.loads((adapter / "adapter_config.json").read_text())["r"] == rank[cell.level("R")]
        assert _lora_rank(adapter) == rank[cell.level("R")]  # the saved tensors' shapes, not only the config
        assert m["recipe"]["training"]["learning_rate"] == lr[cell.level("L")]
        assert m["recipe"]["training"]["epochs"] == epochs[cell.level("N")]
        assert m["recipe"]["treatments"]["whole_answer_loss"] is bool(cell.level("M"))
        report = json.loads((adapter / "train_report.json").read_text())
        steps_per_epoch = math.ceil(examples / config.training.batch_size)
        assert report["examples"] == examples and report["steps"] == steps_per_epoch * epochs[cell.level("N")]
        seen.add(cell.levels)
    assert len(seen) == 16  # every recipe of the 2^4


def _lora_rank(adapter: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        ranks = {f.get_slice(k).get_shape()[0] for k in f.keys() if "lora_A" in k}
    assert len(ranks) == 1, ranks
    return ranks.pop()
