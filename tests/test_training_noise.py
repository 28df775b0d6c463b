"""The CIs' training-run component (screen_stats + stats.cell_noise) on simulated screens of one source."""

from __future__ import annotations

import numpy as np
import pytest

from eps_screen.aggregate import compute
from eps_screen.config import ScreenConfig
from eps_screen.design import all_slab_cells
from eps_screen.panels import load_panels
from eps_screen.simulate import simulate_screen

FAST = {"resamples": 1000, "seed": 11}


def one_source_screen(cell_sd: float, training_noise: bool = True, screen_seed: int = 3):
    config = ScreenConfig(bootstrap={**FAST, "training_noise": training_noise}, simulation={"cell_sd": cell_sd})
    source = config.sources[0]
    cells = [c for c in all_slab_cells(config) if c.source == source]
    personas = load_panels().eval_personas(config.sources, config.eval.personas)
    answers = simulate_screen(config, cells, personas, screen_seed=screen_seed)
    return config, answers, [c.id for c in cells]


@pytest.fixture(scope="module")
def noisy():
    config, answers, ids = one_source_screen(0.6)
    off = config.model_copy(update={"bootstrap": config.bootstrap.model_copy(update={"training_noise": False})})
    return compute(config, answers, ids).estimates, compute(off, answers, ids).estimates


def test_training_sd_is_estimated_and_widens_every_ci(noisy):
    on, off = noisy
    for response in ("SR", "LR"):
        noise = on.training[response]
        assert noise.df == 16  # one full 2^5: the 16 contrasts of order 3-5
        assert 0.3 < noise.logit_sd < 1.0, (response, noise)
        for term in ("A", "B", "A:B"):
            a, b = on.find(response, term), off.find(response, term)
            assert a.effect == b.effect and a.d == b.d  # the estimates do not depend on the resamples
            assert a.effect_ci.high - a.effect_ci.low > 1.3 * (b.effect_ci.high - b.effect_ci.low), (response, term)
    assert not off.training and "cluster bootstrap only" in off.scheme.method
    assert "training-run noise" in on.scheme.method and "log-odds SD" in on.scheme.sr_clusters


def test_cluster_draws_are_unchanged_by_the_training_component():
    """Without training noise in the data the component is near 0, and the cluster resamples are the same draws."""
    config, answers, ids = one_source_screen(0.0)
    on = compute(config, answers, ids).estimates
    off_config = config.model_copy(update={"bootstrap": config.bootstrap.model_copy(update={"training_noise": False})})
    off = compute(off_config, answers, ids).estimates
    assert on.training["SR"].logit_sd < 0.3 and on.training["LR"].logit_sd < 0.3
    # here SR's residuals are no larger than the bootstrap's own sampling share: s = 0, and every SR interval is
    # exactly the cluster-only one (the training noise has its own random stream)
    assert on.training["SR"].logit_sd == 0
    for e, o in zip(on.estimates, off.estimates, strict=True):
        if e.response == "SR":
            assert (e.effect_ci, e.d_ci) == (o.effect_ci, o.d_ci)
    widths = [
        (e.effect_ci.high - e.effect_ci.low) / (o.effect_ci.high - o.effect_ci.low)
        for e, o in zip(on.estimates, off.estimates, strict=True) if e.response == "SR"
    ]
    assert 0.98 < np.median(widths) < 1.3
