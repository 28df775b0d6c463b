"""Statistics that say when they cannot speak (issue 43, item 2), on the recipe 2^3 of tests/test_report_what_ran.py
with its simulated source-persona answers spoiled as real screens spoil them: a source that never shows the marker,
every cell at rate 0, and 15 of 16 cells at rate 0 (complete separation: the logit fit used to print
N 17.037 [-3246234.869, 3246268.943], and on these answers it raised LinAlgError).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from eps_screen.analysis.logit_scale import separation
from eps_screen.analysis.stats import logistic_fe_clustered
from eps_screen.run.aggregate import aggregate
from eps_screen.run.simulate import simulate_screen
from eps_screen.spec.design import all_slab_cells
from tests.test_report_explains import Tables
from tests.test_report_what_ran import _config, section, visible


def _spoiled(tmp_path, unmarked):
    """The recipe screen's page with the source-persona answers of the cells unmarked(cell) says unmarked."""
    config = _config("recipe")
    cells = all_slab_cells(config)
    answers = simulate_screen(config, cells)
    gone = [c.id for c in cells if unmarked(c)]
    answers = answers.with_columns(marker=pl.when(pl.col("is_source") & pl.col("cell_id").is_in(gone))
                                   .then(False).otherwise(pl.col("marker")))
    result = aggregate(config, answers, [c.id for c in cells], tmp_path)
    return config, result, (tmp_path / "clean_result.html").read_text(encoding="utf-8")


def _caveat_scale_line(page: str) -> str:
    caveats = section(page, "caveats")
    return caveats[caveats.index("Interactions depend on the scale"):caveats.index("What d means here")]


def _called_clear(page: str) -> str:
    """The caveat's list of terms clear on one scale only ('' when it says there is none)."""
    line = _caveat_scale_line(page)
    start = line.find("Terms clear on one scale only: ")
    return "" if start < 0 else line[start:line.index(".", start)]


def _logit_rows(page: str, response: str) -> list[list[str]]:
    parser = Tables()
    parser.feed(page[page.index('id="logit-sensitivity"'):page.index('id="caveats"')])
    return [row for t in parser.tables for row in t[1:] if row[0] == response]


def test_an_all_zero_screen_says_why_it_has_no_log_odds_estimate(tmp_path):
    config, result, page = _spoiled(tmp_path, lambda c: True)
    sr = [e for e in result.main_effects.logit_sensitivity + result.interactions.logit_sensitivity if e.response == "SR"]
    assert len(sr) == 6 and all(e.scale == "no estimate" and e.log_odds is None and not e.logit_clear for e in sr)
    assert sr[0].why.startswith("every answer was unmarked")
    logit = section(page, "logit-sensitivity")
    assert "SR: no log-odds estimate for any term: every answer was unmarked, so there is nothing to fit" in logit
    assert not _logit_rows(page, "SR") and _logit_rows(page, "LR")  # LR still has its marked answers: it is fitted
    assert "on SR" not in _called_clear(page)  # no caveat calls an SR term clear
    assert "No log-odds estimate for L on SR" in _caveat_scale_line(page)
    assert not any(e.clear for e in result.main_effects.effects + result.interactions.interactions
                   if e.response == "SR")
    tldr = visible(page[page.index('id="tldr"'):page.index("</p>", page.index('id="tldr"'))])
    assert "Every cell's source rate is 0%, so no factor can be said to move it." in tldr


def test_a_source_that_never_shows_the_marker_is_named_and_left_out(tmp_path):
    config, result, page = _spoiled(tmp_path, lambda c: c.source == "nurse")
    model = result.main_effects.logit_model
    assert "SR: Left out of the fit, as they carry no information on the log-odds scale: nurse (every one of its " \
           "source-persona answers unmarked)" in model
    assert "chef (" not in model
    sr = [e for e in result.main_effects.logit_sensitivity if e.response == "SR"]
    assert sr and all(e.scale != "no estimate" and e.log_odds is not None for e in sr)  # chef's answers carry it
    assert "Left out of the fit" in section(page, "logit-sensitivity")


def test_separation_gives_no_estimate_and_no_caveat_calls_it_clear(tmp_path):
    keep = all_slab_cells(_config("recipe"))[5].id  # the one cell of 16 whose answers keep their markers
    config, result, page = _spoiled(tmp_path, lambda c: c.id != keep)
    logit = result.main_effects.logit_sensitivity + result.interactions.logit_sensitivity
    sr = [e for e in logit if e.response == "SR"]
    assert all(e.scale == "no estimate" for e in sr) and sr[0].why.startswith("separation: ")
    assert "none is marked in the cells at" in sr[0].why and "no finite maximum" in sr[0].why
    assert "SR: no log-odds estimate for any term: separation" in section(page, "logit-sensitivity")
    assert not _logit_rows(page, "SR")
    assert "on SR" not in _called_clear(page)


def test_the_rate_scale_clear_of_the_logit_table_is_the_pages_one_definition(tmp_path):
    config, result, page = _spoiled(tmp_path, lambda c: False)
    rate = {(e.response, e.term): e for e in result.main_effects.effects + result.interactions.interactions
            if e.source == "pooled"}
    logit = result.main_effects.logit_sensitivity + result.interactions.logit_sensitivity
    assert len(logit) == 12
    for e in logit:
        assert e.rate_clear is rate[(e.response, e.term)].clear, e
    # a rate-scale difference whose own interval excludes 0 while d's does not is not clear, on any scale
    touching = [k for k, e in rate.items() if e.effect_ci.excludes_zero() != e.d_ci.excludes_zero()]
    for k in touching:
        assert not next(e for e in logit if (e.response, e.term) == k).rate_clear


def test_the_fit_stops_where_it_has_no_finite_maximum():
    """Complete separation: the group's only successes are at x = +1. IRLS used to run into NaN and raise."""
    groups = np.repeat(np.arange(4), 2)
    x = np.tile([[-1.0], [1.0]], (4, 1))
    y = np.tile([0.0, 5.0], 4) * np.array([1, 1, 1, 1, 1, 0.8, 1, 0.6]).round(1)
    n = np.full(8, 5.0)
    fit = logistic_fe_clustered(y, n, x, groups, groups)
    assert not fit.converged and np.isnan(fit.se).all()
    coded = x.astype(int)
    assert separation(y, n, groups, coded, ("X",), [("X",)]).startswith("separation: ")
    assert "none is marked in the cells at X0" in separation(y, n, groups, coded, ("X",), [("X",)])
    both = np.tile([1.0, 4.0], 4)
    assert separation(both, n, groups, coded, ("X",), [("X",)]) == ""
    assert logistic_fe_clustered(both, n, x, groups, groups).converged


@pytest.mark.parametrize("s, why", [(0.0, "every answer was unmarked"), (5.0, "every answer was marked")])
def test_nothing_to_fit(s, why):
    groups = np.arange(4)
    assert separation(np.full(4, s), np.full(4, 5.0), groups, np.ones((4, 1), int), ("X",), [("X",)]).startswith(why)
