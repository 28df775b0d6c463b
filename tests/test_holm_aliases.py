"""The Holm family of a fraction counts each contrast once: in a 2^(6-2) of resolution IV the 15 two-factor
interactions share 7 contrasts (AB = CE, ...), and an estimate that appears under three names is one test, not three."""

from __future__ import annotations

import itertools

import numpy as np

from eps_screen.analysis.stats import holm, holm_exploratory, same_contrast, term_name
from eps_screen.spec.design import fraction
from eps_screen.spec.prediction_rules import reported_terms


def _coded(shorts: str, generators: list[str]) -> np.ndarray:
    return 2.0 * np.array(fraction(shorts, generators, "test").runs(), dtype=float) - 1.0


def test_aliased_interactions_are_one_test_in_the_family():
    factors = list("ABCDEF")
    coded = _coded("ABCDEF", ["E=ABC", "F=BCD"])
    terms = reported_terms(factors)
    aliased = same_contrast(coded, factors, terms)
    two = [i for i, t in enumerate(terms) if len(t) == 2]
    chains = {aliased[i] for i in two}
    assert len(coded) == 16 and len(chains) == 7  # 15 interactions, 7 contrasts (resolution IV: none with a main effect)
    assert aliased[terms.index(("A", "B"))] == aliased[terms.index(("C", "E"))]  # I = ABCE
    assert all(aliased[i] == i for i in range(len(factors)))
    # the same estimate under several names: the same p under each
    rng = np.random.default_rng(0)
    p_chain = {c: rng.uniform(0.001, 0.2) for c in chains}
    p = np.array([p_chain[aliased[i]] if i in two else 0.5 for i in range(len(terms))])
    adjusted = holm_exploratory(terms, ("A:B",), p, aliased)
    # the family: one test per chain; A:B is pre-registered (no Holm), C:E, its alias, is exploratory: that chain's
    # test is in the family once
    want = dict(zip(sorted(chains), holm([p_chain[c] for c in sorted(chains)]), strict=True))
    for i in two:
        if term_name(terms[i]) == "A:B":
            assert np.isnan(adjusted[i])
        else:
            assert adjusted[i] == want[aliased[i]], term_name(terms[i])
    # counted once per name, as before, the adjustment is larger for every chain
    naive = holm_exploratory(terms, ("A:B",), p)
    assert all(naive[i] >= adjusted[i] for i in two if term_name(terms[i]) != "A:B")
    assert any(naive[i] > adjusted[i] for i in two if term_name(terms[i]) != "A:B")


def test_a_full_factorial_has_no_aliases_and_the_family_is_unchanged():
    factors = list("ABCDE")
    coded = 2.0 * np.array(list(itertools.product([0, 1], repeat=5)), dtype=float) - 1.0
    terms = reported_terms(factors)
    aliased = same_contrast(coded, factors, terms)
    assert aliased == tuple(range(len(terms)))
    p = np.linspace(0.001, 0.3, len(terms))
    np.testing.assert_array_equal(holm_exploratory(terms, ("A:B",), p, aliased), holm_exploratory(terms, ("A:B",), p))
