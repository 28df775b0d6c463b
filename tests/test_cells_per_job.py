"""validate's suggestion of execution.cells_per_job is always a value the config accepts."""

from __future__ import annotations

from eps_screen.plan.phase_sizes import fewest_jobs_cells_per_job
from eps_screen.spec.config import MAX_CELLS_PER_JOB, load_config
from tests.conftest import ROOT


def test_the_fewest_jobs_suggestion_stays_within_the_configs_bound():
    config = load_config(ROOT / "deployments" / "configs" / "smol-marker.yaml")  # one GPU: a slab dispatch of 88
    assert config.execution.max_parallel_cells == 1
    best = fewest_jobs_cells_per_job(config)
    assert best == 88  # the slab's cells besides the smoke's: one job
    config.model_validate({**config.model_dump(), "execution": {**config.execution.model_dump(), "cells_per_job": best}})
    five = config.model_validate({**config.model_dump(), "sources": [*config.sources, "nurse", "chef"]})  # 152 cells
    assert fewest_jobs_cells_per_job(five) == MAX_CELLS_PER_JOB


def test_validate_suggests_a_bigger_job_only_where_it_saves_a_job():
    from eps_screen.plan.cost_estimate import estimate

    config = load_config(ROOT / "deployments" / "configs" / "smol-marker.yaml")
    at = {n: config.model_validate({**config.model_dump(), "execution": {**config.execution.model_dump(),
                                                                         "cells_per_job": n}}) for n in (48, 64, 88)}
    suggestion = [[n for n in estimate(c).notes if "gives the fewest jobs" in n] for c in at.values()]
    assert suggestion[0] and "88" in suggestion[0][0]  # 48: the slab in two jobs, 88 in one
    assert suggestion[1] and "88" in suggestion[1][0]
    assert not suggestion[2]
