"""The report of a screen whose factors are not the marker screen's: labelled from the config, nothing hard-coded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eps_screen.run.aggregate import aggregate
from eps_screen.run.simulate import simulate_screen
from eps_screen.spec.config import ScreenConfig, load_config
from eps_screen.spec.design import all_slab_cells, smoke_cells

CONFIGS = Path(__file__).resolve().parents[1] / "deployments" / "configs"


@pytest.fixture(scope="module")
def sim62() -> ScreenConfig:
    config = load_config(CONFIGS / "sim-6-2.yaml")
    return config.model_copy(update={"bootstrap": config.bootstrap.model_copy(update={"resamples": 300})})


def test_a_2_6_2_page_is_labelled_from_its_factors(sim62, tmp_path):
    cells = all_slab_cells(sim62)
    result = aggregate(sim62, simulate_screen(sim62, cells), [c.id for c in cells], tmp_path)
    page = (tmp_path / "clean_result.html").read_text(encoding="utf-8")
    assert result.estimates.factors == tuple("ABCDEF") and len(result.main_effects.effects) == 6 * 2 * 4
    assert "Learning rate" in page and "1e-4 (training.learning_rate = 0.0001)" in page
    assert "2^(6-2), E=ABC, F=BCD, resolution IV" in page and "The 16 cells" in page
    assert "System-prompt length" not in page and "A x B is the pre-registered" not in page
    assert not result.metrics.predictions and not result.metrics.ab_means  # none declared
    ab = json.loads((tmp_path / "figures" / "ab_interaction.json").read_text())
    assert "No pre-registered interaction" in ab["layout"]["title"]["text"]
    heat = json.loads((tmp_path / "figures" / "persona_heatmap.json").read_text())
    assert "A, B, C, D, E, F" in heat["layout"]["yaxis"]["title"]["text"]


def test_the_page_says_when_the_cis_omit_training_noise(sim62, tmp_path):
    """The smoke fraction alone leaves no noise contrast and has no seed replicate: the page says so."""
    cells = smoke_cells(sim62)
    result = aggregate(sim62, simulate_screen(sim62, cells), [c.id for c in cells], tmp_path)
    page = (tmp_path / "clean_result.html").read_text(encoding="utf-8")
    assert result.estimates.caveats and "The CIs omit training-run noise" in result.estimates.caveats[0]
    assert "The CIs omit training-run noise" in page
