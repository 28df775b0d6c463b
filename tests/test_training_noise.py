"""The CIs' training-run component (screen_stats + training_noise) on simulated screens."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from eps_screen.analysis.screen_stats import MIN_SOURCE_DF
from eps_screen.panels import load_panels
from eps_screen.run.aggregate import compute
from eps_screen.run.simulate import simulate_screen
from eps_screen.spec.config import ScreenConfig, marker_factors
from eps_screen.spec.design import Cell, all_slab_cells, full_factorial

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
        noise = on.training[response]["librarian"]
        assert noise.df + noise.trimmed == 16 and not noise.shared  # one full 2^5: the 16 contrasts of order 3-5
        assert 0.3 < noise.logit_sd < 1.0, (response, noise)
        for term in ("A", "B", "A:B"):
            a, b = on.find(response, term), off.find(response, term)
            assert a.effect == b.effect and a.d == b.d  # the estimates do not depend on the resamples
            assert a.effect_ci.high - a.effect_ci.low > 1.3 * (b.effect_ci.high - b.effect_ci.low), (response, term)
    assert not off.training and "cluster bootstrap only" in off.scheme.method
    assert "training-run noise" in on.scheme.method and "log-odds SD" in on.scheme.sr_clusters
    assert not on.caveats and "omit training-run noise" in off.caveats[0]


def test_cluster_draws_are_unchanged_by_the_training_component():
    """Without training noise in the data the component is near 0, and the cluster resamples are the same draws."""
    config, answers, ids = one_source_screen(0.0)
    on = compute(config, answers, ids).estimates
    off_config = config.model_copy(update={"bootstrap": config.bootstrap.model_copy(update={"training_noise": False})})
    off = compute(off_config, answers, ids).estimates
    sr, lr = on.training["SR"]["librarian"], on.training["LR"]["librarian"]
    assert sr.logit_sd < 0.3 and lr.logit_sd < 0.3
    # here SR's residuals are no larger than the bootstrap's own sampling share: s = 0, and every SR interval is
    # exactly the cluster-only one (the training noise has its own random stream)
    assert sr.logit_sd == 0
    for e, o in zip(on.estimates, off.estimates, strict=True):
        if e.response == "SR":
            assert (e.effect_ci, e.d_ci) == (o.effect_ci, o.d_ci)


def _by_source_screen(config: ScreenConfig, sds: dict[str, float], cells: list[Cell], screen_seed: int) -> pl.DataFrame:
    personas = load_panels().eval_personas(config.sources, config.eval.personas)
    parts = []
    for source, sd in sds.items():
        cfg = config.model_copy(update={"simulation": config.simulation.model_copy(update={"cell_sd": sd})})
        parts.append(simulate_screen(cfg, [c for c in cells if c.source == source], personas, screen_seed=screen_seed))
    return pl.concat(parts)


def test_each_source_gets_its_own_training_sd():
    """Noise that differs by source (0.2 / 0.5 / 0.8): one shared SD was too small for the noisiest source's CIs."""
    config = ScreenConfig(bootstrap=FAST)
    cells = all_slab_cells(config)
    sds = dict(zip(config.sources, (0.2, 0.5, 0.8), strict=True))
    est = compute(config, _by_source_screen(config, sds, cells, 4), [c.id for c in cells]).estimates
    fitted = {s: est.training["SR"][s].logit_sd for s in config.sources}
    assert fitted["librarian"] < fitted["surgeon"] < fitted["programmer"], fitted
    assert fitted["programmer"] == pytest.approx(0.8, rel=0.4)
    width = {s: est.find("SR", "A", s).effect_ci for s in config.sources}
    assert width["programmer"].high - width["programmer"].low > 1.5 * (width["librarian"].high - width["librarian"].low)


def test_a_small_design_uses_seed_replicates_and_says_when_it_has_none():
    """A 2^3 leaves one residual contrast per source: too few alone, so the sources share an estimate; with no
    replicate and training noise wanted, what cannot be estimated is said in a sentence, never silently dropped."""
    config = ScreenConfig(bootstrap=FAST, design={"factors": [f for f in marker_factors() if f.short in "ABE"]},
                          simulation={"effects": {"A": 0.8, "B": -0.6, "E": -0.6}, "leak_effects": {"A": -0.5},
                                      "cell_sd": 0.5})
    slab = [Cell(s, run, 42, "ABE") for s in config.sources for run in full_factorial(3)]
    personas = load_panels().eval_personas(config.sources, config.eval.personas)
    answers = simulate_screen(config, slab, personas, screen_seed=2)
    est = compute(config, answers, [c.id for c in slab]).estimates
    noise = est.training["SR"]["librarian"]
    assert noise.shared and noise.df == 3 and noise.replicate_df == 0  # 1 residual contrast (A:B:E) x 3 sources
    # with seed replicates of every cell at two more seeds, each source has 1 + 16 df of its own
    extra = [Cell(c.source, c.levels, seed, "ABE") for c in slab for seed in (137, 256)]
    both = pl.concat([answers, simulate_screen(config, extra, personas, screen_seed=2)])
    est = compute(config, both, [c.id for c in slab + extra]).estimates
    for s in config.sources:
        noise = est.training["SR"][s]
        assert not noise.shared and noise.replicate_df == 16 and noise.df >= MIN_SOURCE_DF
        assert noise.logit_sd == pytest.approx(0.5, rel=0.5)
    # a 2^2 with nothing left over and no replicate: the CIs omit training noise, and say so
    two = ScreenConfig(bootstrap=FAST, design={"factors": [f for f in marker_factors() if f.short in "AE"],
                                               "smoke": {"generators": []}},
                       simulation={"effects": {"A": 0.8, "E": -0.6}, "leak_effects": {}, "cell_sd": 0.5})
    cells = [Cell(s, run, 42, "AE") for s in two.sources for run in full_factorial(2)]
    est = compute(two, simulate_screen(two, cells, personas, screen_seed=2), [c.id for c in cells]).estimates
    assert np.isnan(est.training["SR"]["librarian"].logit_sd)
    assert est.caveats and "omit training-run noise" in est.caveats[0] and "seeds.multiseed" in est.caveats[0]
