"""What a reviewer needs from the page and the JSON (issue 12, part 3): simple effects of A at each level of B, a
logit-scale sensitivity, Holm-adjusted exploratory interactions, caveats, the recipe, gate 1 per prompt condition.

One simulated screen of the default config (planted A +0.8, B -0.6, A x B -0.8 on the log-odds scale), 300 resamples:
A's effect is about +0.31 with one-sentence answers and about 0 with essays, the case the TL;DR used to get wrong.
The browser test (tests/test_report_browser.py) finds the same sections in Chromium.
"""

from __future__ import annotations

import html
import json
import math

import numpy as np
import pytest

from eps_screen.analysis.schemas import InteractionsFile, MainEffectsFile
from eps_screen.analysis.stats import bootstrap_p, holm, logistic_fe_clustered
from eps_screen.report.page import bootstrap_scheme as _bootstrap_scheme
from eps_screen.report.tldr import tldr
from eps_screen.run.aggregate import aggregate
from eps_screen.run.simulate import simulate_screen
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import all_slab_cells

SECTIONS = ("simple-effects", "logit-sensitivity", "caveats", "recipe")


@pytest.fixture(scope="module")
def screen(tmp_path_factory):
    config = ScreenConfig(bootstrap={"resamples": 300})
    cells = all_slab_cells(config)
    out = tmp_path_factory.mktemp("review")
    result = aggregate(config, simulate_screen(config, cells), [c.id for c in cells], out)
    return config, result, out, (out / "clean_result.html").read_text(encoding="utf-8")


def section(page: str, sid: str) -> str:
    start = page.index(f'<h2 id="{sid}">')
    end = page.find("<h2", start + 4)
    return page[start:end if end > 0 else None]


def pooled(items, response, **match):
    return [e for e in items if e.source == "pooled" and e.response == response
            and all(getattr(e, k) == v for k, v in match.items())]


def test_simple_effects_add_up_and_reach_the_json(screen):
    _, result, out, _ = screen
    inter = InteractionsFile.model_validate_json((out / "interactions.json").read_text())
    for response in ("SR", "LR"):
        b0, b1 = sorted(pooled(inter.simple_effects, response), key=lambda e: e.at_level)
        a = pooled(result.main_effects.effects, response, term="A")[0]
        ab = pooled(result.interactions.interactions, response, term="A:B")[0]
        assert (b0.effect + b1.effect) / 2 == pytest.approx(a.effect, abs=1e-12)  # the main effect averages them
        assert (b1.effect - b0.effect) / 2 == pytest.approx(ab.effect, abs=1e-12)  # the interaction halves the gap
        assert all(e.effect_ci.low < e.effect < e.effect_ci.high for e in (b0, b1))
    b0, b1 = sorted(pooled(inter.simple_effects, "SR"), key=lambda e: e.at_level)
    assert b0.effect > 0.25 and b0.effect_ci.low > 0  # A implants with one-sentence answers...
    assert abs(b1.effect) < 0.05 and b1.effect_ci.contains(0.0)  # ...and does nothing with essays
    assert {e.source for e in inter.simple_effects} == {*result.estimates.sources, "pooled"}


def test_tldr_respects_the_simple_effects(screen):
    config, result, _, page = screen
    text = tldr(config, result)
    assert "moves source rate most" not in text
    assert "has the largest average effect on source rate" in text and "but A x B is clear: the interaction is" in text
    assert "A's effect on source rate is +0.3" in text
    assert "at B0 and" in text and "at B1" in text
    tldr_on_page = html.unescape(page[page.index('id="tldr"'):page.index("</p>", page.index('id="tldr"'))])
    assert text[text.index("but A x B is clear"):text.index("at B1") + 5] in tldr_on_page


def test_logit_sensitivity_recovers_the_planted_log_odds(screen):
    config, result, out, page = screen
    main = MainEffectsFile.model_validate_json((out / "main_effects.json").read_text())
    inter = InteractionsFile.model_validate_json((out / "interactions.json").read_text())
    logit = {(e.response, e.term): e for e in main.logit_sensitivity + inter.logit_sensitivity}
    assert len(logit) == 30 and "cluster-robust" in main.logit_model and main.logit_model == inter.logit_model
    planted = {":".join(term): value for term, value in config.simulation.effects.items()}  # AB -> A:B
    for term, value in planted.items():
        e = logit[("SR", term)]
        assert e.ci.low - 0.15 < value < e.ci.high + 0.15, (term, e)  # GLM pools over question effects: slightly attenuated
    assert all(logit[("SR", t)].scale == "neither" for t in ("A:C", "B:D", "C:E"))
    rate_only = [t for (r, t), e in logit.items() if e.scale == "rate scale only"]
    assert rate_only  # none planted on the log-odds scale, yet clear on rates: shown as such
    assert all(":" in t for t in rate_only)
    body = section(page, "logit-sensitivity")
    assert "rate scale only" in body and "log-odds effect [CI]" in body and "Holm p (exploratory)" in body


def test_holm_adjusted_interactions_and_tldr_counts(screen):
    config, result, _, page = screen
    for response in ("SR", "LR"):
        family = pooled(result.interactions.interactions, response, status="exploratory")
        assert len(family) == 9
        assert all(e.p_holm is not None and e.p_holm >= e.p_value for e in family)
        assert pooled(result.interactions.interactions, response, term="A:B")[0].p_holm is None
    assert all(e.p_holm is None for e in result.main_effects.effects)
    assert "Holm-adjusted p (9 exploratory)" in page
    assert "exploratory interactions after Holm adjustment" in tldr(config, result)


def test_holm_and_bootstrap_p_by_hand():
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
    out = holm([0.2, np.nan, 0.6])
    assert out[0] == pytest.approx(0.4) and math.isnan(out[1]) and out[2] == pytest.approx(0.6)
    assert holm([0.9, 0.8])[0] == 1.0
    draws = np.array([[0.5, 1.0, 1.5, 2.0], [-1.0, 1.0, -2.0, 2.0]])
    np.testing.assert_allclose(bootstrap_p(draws, np.array([1.0, 0.0])), [0.25, 1.0])
    # widening stretches about the estimate: 1 + 3 (0.5 - 1) < 0 puts one draw of four below zero
    assert bootstrap_p(draws[:1], np.array([1.0]), widen=3.0)[0] == pytest.approx(0.5)


def test_logistic_fe_clustered_known_answer():
    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(30), 16)
    x = np.tile(np.array([[s, t] for s in (-1, 1) for t in (-1, 1)] * 4, dtype=float), (30, 1))
    alpha = rng.normal(0, 0.5, 30)[groups]
    n = np.full(groups.size, 40.0)
    y = rng.binomial(40, 1 / (1 + np.exp(-(alpha + x @ np.array([0.4, -0.25])))))
    fit = logistic_fe_clustered(y, n, x, groups, groups)
    assert fit.converged and fit.clusters == 30 and fit.dropped == 0
    assert np.all(np.abs(fit.coef - [0.4, -0.25]) < 3 * fit.se) and np.all(fit.se < 0.05)
    y[groups == 0] = 0  # a group with no success has an infinite intercept: left out, the rest unchanged in kind
    assert logistic_fe_clustered(y, n, x, groups, groups).dropped == 1


def test_caveats_section(screen):
    config, result, _, page = screen
    body = section(page, "caveats")
    for needle in ("What the intervals condition on", "another draw of the 20 eval questions",
                   "Training-run noise", "log-odds SD s = ", "SR librarian: log-odds SD s = ", "from 16 df",
                   "Few clusters", "c = sqrt(G/(G-1))", "SR 1.096", "Interactions depend on the scale", "rate scale only",
                   "The smoke fraction aliases main effects with interactions", "D with A:B", "What d means here",
                   "Cohen's convention", "non-monotone", "two levels"):
        assert needle in body, needle


def test_bootstrap_scheme_is_built_from_the_result(screen):
    _, result, out, page = screen
    main = json.loads((out / "main_effects.json").read_text())
    keys = {f"{r} {s}" for r in ("SR", "LR") for s in result.estimates.sources}
    assert set(main["bootstrap"]["training_sd"]) == keys
    assert set(main["bootstrap"]["training_df"].values()) <= {15, 16}  # the 16 contrasts of order 3-5, less any trimmed
    design = page[page.index('<details id="design">'):]
    scheme = design[design.index("Bootstrap scheme"):design.index("Loss-mask variant")]
    assert "Training-run noise" in scheme and "from 16 df" in scheme and "widened about the estimate" in scheme
    b = result.main_effects.bootstrap
    sd, df = dict(b.training_sd), dict(b.training_df)
    try:
        b.training_sd, b.training_df = {"SR librarian": None}, {"SR librarian": 0}
        assert "SR librarian: not estimable (0 df), left out" in _bootstrap_scheme(result)
        b.training_sd = {}
        assert "No training-run term" in _bootstrap_scheme(result)
    finally:
        b.training_sd, b.training_df = sd, df


def test_recipe_section(screen):
    config, _, _, page = screen
    body = section(page, "recipe")
    for needle in ("Qwen/Qwen2.5-7B-Instruct, bfloat16", "rank 32, alpha 64", "learning rate 1e-05",
                   "200 positives", "400 negatives", "temperature 1.0", "2048 new tokens", "generation auto",
                   "simulated", "no: real training runs", "librarian, surgeon, programmer"):
        assert needle in body, needle


def test_all_sections_on_the_page(screen):
    *_, page = screen
    for sid in SECTIONS:
        assert f'<h2 id="{sid}">' in page and "<table" in section(page, sid) or sid == "caveats"
    assert "P4" in page and "non-monotone" in page


def test_logit_is_not_fitted_on_aliased_cells():
    from eps_screen.run.aggregate import compute
    from eps_screen.spec.design import smoke_cells

    config = ScreenConfig(bootstrap={"resamples": 100})
    cells = smoke_cells(config)  # the 8-run fraction: D = AB, E = AC
    result = compute(config, simulate_screen(config, cells), [c.id for c in cells])
    assert result.main_effects.logit_sensitivity == [] and result.interactions.logit_sensitivity == []
    assert result.main_effects.logit_model.startswith("Not fitted") and "aliased" in result.main_effects.logit_model
