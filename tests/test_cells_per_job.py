"""validate's suggestion of execution.cells_per_job is always a value the config accepts."""

from __future__ import annotations

from eps_screen.plan.phase_sizes import fewest_jobs_cells_per_job
from eps_screen.spec.config import MAX_CELLS_PER_JOB, load_config
from tests.conftest import ROOT


def test_the_fewest_jobs_suggestion_stays_within_the_configs_bound():
    config = load_config(ROOT / "deployments" / "configs" / "smol-marker.yaml")  # one GPU: a slab dispatch of 88
    assert config.execution.max_parallel_cells == 1
    best = fewest_jobs_cells_per_job(config)
    assert best == MAX_CELLS_PER_JOB
    config.model_validate({**config.model_dump(), "execution": {**config.execution.model_dump(), "cells_per_job": best}})
