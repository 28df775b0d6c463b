"""The designs against the textbook: the full 2^5, and the 2^(5-2) smoke fraction with D = AB, E = AC."""

from __future__ import annotations

import itertools

import numpy as np

from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import (
    Cell,
    all_slab_cells,
    full_factorial,
    phases,
    multiseed_cells,
    pick_top,
    regimes,
    smoke_cells,
)

# The textbook 2^(5-2) resolution III design (e.g. Montgomery, Design and Analysis of Experiments,
# the 2^(5-2) fraction with generators D = AB, E = AC), in coded units, base factors A, B, C in
# standard order, D and E the products of the base columns:
#        A   B   C   D=AB E=AC
TEXTBOOK_SMOKE = [
    (-1, -1, -1, +1, +1),
    (+1, -1, -1, -1, -1),
    (-1, +1, -1, -1, +1),
    (+1, +1, -1, +1, -1),
    (-1, -1, +1, +1, -1),
    (+1, -1, +1, -1, +1),
    (-1, +1, +1, -1, -1),
    (+1, +1, +1, +1, +1),
]

# Its complete alias structure, I = ABD = ACE = BCDE, truncated to effects of order <= 2 (by hand:
# multiply each effect by ABD, ACE and BCDE and keep the words of one or two letters).
TEXTBOOK_ALIASES = {
    "A": ["BD", "CE"], "B": ["AD"], "C": ["AE"], "D": ["AB"], "E": ["AC"],
    "AB": ["D"], "AC": ["E"], "AD": ["B"], "AE": ["C"], "BC": ["DE"],
    "BD": ["A", "CE"], "BE": ["CD"], "CD": ["BE"], "CE": ["A", "BD"], "DE": ["BC"],
}


SMOKE = phases(ScreenConfig()).smoke  # the default (marker) screen's smoke fraction, found by the resolution III search


def coded(runs):
    return [tuple(2 * x - 1 for x in run) for run in runs]


def test_smoke_fraction_is_the_textbook_design():
    assert coded(SMOKE.runs()) == TEXTBOOK_SMOKE


def test_smoke_fraction_properties():
    x = np.array(TEXTBOOK_SMOKE)
    assert (x.sum(axis=0) == 0).all()  # every factor balanced
    assert (x.T @ x == 8 * np.eye(5)).all()  # main-effect columns orthogonal
    assert len(set(map(tuple, x))) == 8


def test_defining_relation_and_aliases():
    assert [w for w, _ in SMOKE.relation()] == ["ABD", "ACE", "BCDE"]
    assert SMOKE.aliases() == TEXTBOOK_ALIASES
    x = np.array(TEXTBOOK_SMOKE)
    col = dict(zip("ABCDE", x.T, strict=True))
    for word, _ in SMOKE.relation():  # each word of the relation is a column of +1s: that is what I = word means
        assert (np.prod([col[f] for f in word], axis=0) == 1).all()


def test_full_factorial_standard_order():
    runs = full_factorial()
    assert len(runs) == 32 and len(set(runs)) == 32
    assert runs[:4] == [(0, 0, 0, 0, 0), (1, 0, 0, 0, 0), (0, 1, 0, 0, 0), (1, 1, 0, 0, 0)]  # A changes fastest
    x = np.array(coded(runs))
    assert (x.T @ x == 32 * np.eye(5)).all()
    for i, j in itertools.combinations(range(5), 2):  # every two-factor interaction column is balanced too
        assert (x[:, i] * x[:, j]).sum() == 0


def test_cells_of_each_phase():
    config = ScreenConfig()
    smoke = smoke_cells(config)
    slab = all_slab_cells(config)
    assert len(smoke) == 8 and {c.source for c in smoke} == {"librarian"}
    assert len(slab) == 96 and set(smoke) <= set(slab)  # the smoke cells are slab cells: reused, not re-run
    rates = {c: (sum(c.levels) + 0.1 * i) / 10 for i, c in enumerate(slab)}
    top = {s: pick_top(rates, s, 3) for s in config.sources}
    multi = multiseed_cells(config, top)
    assert len(multi) == 18 and {c.seed for c in multi} == {137, 256}
    assert top["programmer"][0] == (1, 1, 1, 1, 1)
    on_policy = [r for r in regimes(config, slab) if not r.off_policy]
    assert len(on_policy) == 3 * 8  # docs/experiment.md: on-policy answers depend on (source, A, B, C) only


def test_cell_id_round_trip():
    cell = Cell("software_engineer", (1, 0, 1, 1, 0), 137)
    assert cell.id == "software_engineer-A1B0C1D1E0-s137"
    assert Cell.parse(cell.id) == cell
