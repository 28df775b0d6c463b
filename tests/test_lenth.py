"""Lenth's margins and the half-normal plot: the textbook example, the contrasts of fractions and Plackett-Burman
designs, and the page's section (the browser checks its labels in tests/test_report_browser.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from eps_screen.analysis.lenth import contrasts, half_normal_scores, lenth
from eps_screen.spec.design import all_slab_cells, fraction, full_factorial
from eps_screen.spec.plackett_burman import matrix
from tests.conftest import CONFIGS

# Montgomery, Design and Analysis of Experiments, Example 6.2: the filtration rate of a 2^4 (A temperature,
# B pressure, C concentration, D stirring rate), standard order, and its effects as the book tabulates them.
FILTRATION = [45, 71, 48, 65, 68, 60, 80, 65, 43, 100, 45, 104, 75, 86, 70, 96]
EFFECTS = {"A": 21.625, "B": 3.125, "C": 9.875, "D": 14.625, "A:B": 0.125, "A:C": -18.125, "A:D": 16.625,
           "B:C": 2.375, "B:D": -0.375, "C:D": -1.125, "A:B:C": 1.875, "A:B:D": 4.125, "A:C:D": -1.625,
           "B:C:D": -2.625, "A:B:C:D": 1.375}


def test_lenths_margins_on_montgomerys_filtration_rate_example():
    """The book's Lenth analysis of this example: PSE = 2.625, ME = 6.75, SME = 13.70; A, C, D, AC and AD exceed the
    ME, and of those A, D, AC and AD the SME."""
    coded = 2 * np.array(full_factorial(4)) - 1
    names, w = contrasts(coded, "ABCD")
    effects = dict(zip(names, w @ np.array(FILTRATION, dtype=float), strict=True))
    assert effects == pytest.approx(EFFECTS)
    margins = lenth(list(effects.values()))
    assert (margins.pse, round(margins.me, 2), round(margins.sme, 2), margins.df) == (2.625, 6.75, 13.70, 5)
    assert {t for t, e in effects.items() if abs(e) > margins.me} == {"A", "C", "D", "A:C", "A:D"}
    assert {t for t, e in effects.items() if abs(e) > margins.sme} == {"A", "D", "A:C", "A:D"}


def test_a_fraction_gives_one_contrast_per_alias_chain():
    frac = fraction("ABCDEF", ["E=ABC", "F=BCD"], "test")
    coded = 2 * np.array(frac.runs()) - 1
    names, w = contrasts(coded, "ABCDEF")
    assert len(names) == 15 and names[:6] == list("ABCDEF")
    assert "A:B" in names and "C:E" not in names  # AB = CE: one contrast, named by its first word
    assert np.allclose(w @ w.T, np.eye(15) * 4 / 16)  # orthogonal, each with a word effect's variance


def test_unused_plackett_burman_columns_fill_in_as_error_contrasts():
    coded = matrix(12)[:, :8]
    names, w = contrasts(coded, "ABCDEFGH")
    assert names == [*"ABCDEFGH", "e1", "e2", "e3"]
    assert np.allclose(w @ w.T, np.eye(11) * 4 / 12) and np.allclose(w.sum(axis=1), 0)


def test_too_few_contrasts_have_no_margins_and_the_scores_are_half_normal():
    assert lenth([1.0, 2.0]) is None
    scores = half_normal_scores(31)
    assert scores[0] > 0 and np.all(np.diff(scores) > 0) and scores[-1] == pytest.approx(2.40, abs=0.01)


def _page(config, cells, out: Path) -> str:
    from eps_screen.run.aggregate import aggregate
    from eps_screen.run.simulate import simulate_screen

    aggregate(config, simulate_screen(config, cells), [c.id for c in cells], out)
    return (out / "clean_result.html").read_text(encoding="utf-8")


def test_the_page_draws_one_half_normal_plot_per_response_and_labels_what_passes_the_sme(tmp_path):
    from eps_screen.spec.config import ScreenConfig

    config = ScreenConfig(bootstrap={"resamples": 200})
    page = _page(config, all_slab_cells(config), tmp_path)
    section = page[page.index('id="half-normal"'):page.index('id="simple-effects"')]
    assert 'id="half_normal_SR"' in section and 'id="half_normal_LR"' in section
    assert "Read this first" not in section  # the 2^5 estimates its training noise
    for response in ("SR", "LR"):
        fig = json.loads((tmp_path / "figures" / f"half_normal_{response}.json").read_text())
        points = [t for t in fig["data"] if t["mode"] == "markers+text"]
        assert len(points) == 4  # pooled and each source
        for t in points:
            labelled = [name for name in t["text"] if name]
            assert labelled and len(t["x"]) == 31
            assert labelled == [t["text"][i] for i in np.argsort(t["x"]) if t["text"][i]]  # the largest ones
    pooled_sr = json.loads((tmp_path / "figures" / "half_normal_SR.json").read_text())["data"][0]
    assert {"A", "B", "A:B"} <= {n for n in pooled_sr["text"] if n}  # planted: A 0.8, B -0.6, AB -0.8


def test_the_half_normal_plot_is_the_primary_reading_where_no_training_noise_is_estimated(tmp_path):
    """sim-pb12's slab alone: 12 runs of 11 factors leave no noise contrast and no seed replicate; its page says
    the plot comes first, and states the Plackett-Burman caveat."""
    from eps_screen.spec.config import parse_config

    data = yaml.safe_load((CONFIGS / "sim-pb12.yaml").read_text())
    data["bootstrap"] = {"resamples": 200}
    config = parse_config(data)
    page = _page(config, all_slab_cells(config), tmp_path)
    section = page[page.index('id="half-normal"'):page.index('id="simple-effects"')]
    assert "Read this first here:" in section
    assert "The slab is a Plackett-Burman design: main effects are partially aliased with interactions." in page
    assert "partially, with these correlations: -1/3 B:C" in page
