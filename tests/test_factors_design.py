"""Designs over declared factors: the textbook 2^(6-2), minimum aberration, fold-over, phases for any k."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from eps_screen.analysis.screen_stats import declarations, declared_factors
from eps_screen.analysis.stats import term_name
from eps_screen.spec import design
from eps_screen.spec.config import load_config, parse_config
from eps_screen.spec.design import DesignError, Fraction, fraction, min_aberration
from eps_screen.spec.prediction_rules import reported_terms

CONFIGS = Path(__file__).resolve().parents[1] / "deployments" / "configs"


def _factor(short: str, path: str, lo, hi) -> dict:
    return {"short": short, "label": f"factor {short}",
            "levels": [{"description": str(lo), "sets": {path: lo}}, {"description": str(hi), "sets": {path: hi}}]}


RECIPE_PATHS = [("training.learning_rate", 1e-4, 1e-3), ("lora.rank", 8, 32), ("training.epochs", 1, 3),
                ("data.positives", 100, 200), ("lora.alpha", 16, 64), ("lora.dropout", 0.0, 0.1),
                ("eval.temperature", 0.7, 1.0), ("training.batch_size", 4, 8)]


def recipe_config(k: int, **design_block) -> dict:
    factors = [_factor(s, *RECIPE_PATHS[i]) for i, s in enumerate("ABCDEFGH"[:k])]
    return {"design": {"factors": factors, **design_block}}


# Montgomery, Design and Analysis of Experiments, the 2^(6-2) resolution IV design with E = ABC, F = BCD:
# I = ABCE = BCDF = ADEF, and its complete alias structure (each chain's letters sorted, chains by first member).
TEXTBOOK_6_2 = """\
2^(6-2), E=ABC, F=BCD, resolution IV: 16 runs of 6 factors (A, B, C, D, E, F)
defining relation: I = ABCE = BCDF = ADEF
alias structure:
  A = BCE = DEF = ABCDF
  B = ACE = CDF = ABDEF
  C = ABE = BDF = ACDEF
  D = AEF = BCF = ABCDE
  E = ABC = ADF = BCDEF
  F = ADE = BCD = ABCEF
  AB = CE = ACDF = BDEF
  AC = BE = ABDF = CDEF
  AD = EF = ABCF = BCDE
  AE = BC = DF = ABCDEF
  AF = DE = ABCD = BCEF
  BD = CF = ABEF = ACDE
  BF = CD = ABDE = ACEF
  ABD = ACF = BEF = CDE
  ABF = ACD = BDE = CEF"""


def test_the_textbook_2_6_2_alias_structure():
    frac = fraction("ABCDEF", ["E=ABC", "F=BCD"], "test")
    assert [w for w, _ in frac.relation()] == ["ABCE", "BCDF", "ADEF"]
    assert frac.resolution == 4
    assert "\n".join(frac.render()) == TEXTBOOK_6_2
    # Every word of the relation is a column of +1s in the runs: that is what I = word means.
    x = 2 * np.array(frac.runs()) - 1
    col = dict(zip("ABCDEF", x.T, strict=True))
    for word in ("ABCE", "BCDF", "ADEF"):
        assert (np.prod([col[f] for f in word], axis=0) == 1).all()
    # Resolution IV: main effects orthogonal to every two-factor interaction column; AB and CE identical.
    for f in "ABCDEF":
        for a, b in itertools.combinations("ABCDEF", 2):
            assert (col[f] * col[a] * col[b]).sum() == 0
    assert (col["A"] * col["B"] == col["C"] * col["E"]).all()
    assert len(set(frac.runs())) == 16


def test_min_aberration_picks_the_textbook_designs():
    assert [str(g) for g in min_aberration(Fraction("ABCDE"), 3).generators] == ["D=AB", "E=AC"]
    four = min_aberration(Fraction("ABCD"), 3)  # no 4-run fraction of resolution III: the 2^(4-1) IV
    assert [str(g) for g in four.generators] == ["D=ABC"] and four.resolution == 4
    six = min_aberration(Fraction("ABCDEF"), 4)
    assert len(six.runs()) == 16 and six.word_length_pattern() == (0, 3, 0, 0)  # the minimum-aberration 2^(6-2)
    seven = min_aberration(Fraction("ABCDEFG"), 4)
    assert len(seven.runs()) == 16 and seven.resolution == 4 and seven.word_length_pattern()[:2] == (0, 7)
    assert min_aberration(Fraction("AB"), 3).generators == ()  # two factors: only the full 2^2 has resolution >= III


@pytest.mark.parametrize("k", range(2, 8))
def test_phases_for_any_number_of_factors(k):
    config = parse_config(recipe_config(k))
    slab = design.all_slab_cells(config)
    assert len(slab) == 3 * 2**k and len({c.id for c in slab}) == len(slab)
    smoke = design.smoke_cells(config)
    assert set(smoke) <= set(slab) and {c.source for c in smoke} == {config.smoke}
    frac = design.phases(config).smoke
    assert frac.resolution is None or frac.resolution >= 3
    rates = {c: i / len(slab) for i, c in enumerate(slab)}
    top = {s: design.pick_top(rates, s, 3) for s in config.sources}
    multi = design.multiseed_cells(config, top)
    assert len(multi) == 3 * 3 * 2 and all(len(c.levels) == k for c in multi)
    for cell in slab[:3]:
        assert design.Cell.parse(cell.id) == cell


def test_a_fractional_slab_and_its_smoke_within_it():
    config = parse_config(recipe_config(6, slab={"generators": ["E=ABC", "F=BCD"]}))
    phases = design.phases(config)
    assert phases.slab.resolution == 4 and len(phases.slab.runs()) == 16
    assert set(phases.smoke.runs()) <= set(phases.slab.runs()) and len(phases.smoke.runs()) == 8
    assert phases.smoke.resolution == 3
    assert len(design.slab_cells(config, "librarian")) == 16


def test_fold_over_de_aliases_the_smoke_main_effects():
    config = parse_config(recipe_config(5, smoke={"generators": ["D=AB", "E=AC"]}, fold_over=True))
    smoke, folded = design.smoke_cells(config), design.fold_over_cells(config)
    assert len(folded) == 8 and not {c.id for c in smoke} & {c.id for c in folded}
    x = 2 * np.array([c.levels for c in smoke + folded]) - 1
    for i in range(5):  # in the 16 runs together, every main effect is orthogonal to every 2fi
        for a, b in itertools.combinations(range(5), 2):
            assert (x[:, i] * x[:, a] * x[:, b]).sum() == 0
    alone = 2 * np.array([c.levels for c in smoke]) - 1
    assert (alone[:, 0] * alone[:, 1] == alone[:, 3]).all()  # in the smoke alone, D = AB


def test_generator_errors():
    with pytest.raises(DesignError, match="names G, which is not a declared factor"):
        fraction("ABCDE", ["G=AB"], "design.smoke.generators")
    with pytest.raises(DesignError, match="not a generator"):
        fraction("ABCDE", ["D=AB*C"], "design.smoke.generators")


def _chain_sets(frac: Fraction) -> set[frozenset[str]]:
    return {frozenset(chain) for chain in frac.alias_chains()}


def test_words_are_spelled_one_way_when_factors_are_declared_out_of_alphabetical_order():
    # tiny-recipe's smoke: L, R, N, M declared in that order, M = LNR
    frac = design.phases(load_config(CONFIGS / "tiny-recipe.yaml")).smoke
    assert frac.factors == "LRNM"
    chains = frac.alias_chains()
    assert chains == [["L", "MNR"], ["R", "LMN"], ["N", "LMR"], ["M", "LNR"], ["LR", "MN"], ["LN", "MR"],
                      ["LM", "NR"]]
    members = [m for chain in chains for m in chain]
    assert len(members) == len(set(members)) == 2**4 - 2  # every effect once, none the mean (I = LMNR)
    assert [w for w, _ in frac.relation()] == ["LMNR"]
    # the same design declared alphabetically has the same chains, relation and two-factor aliases
    same = fraction("LMNR", ["M=LNR"], "test")
    assert _chain_sets(same) == _chain_sets(frac) and same.relation() == frac.relation()
    assert {k: set(v) for k, v in same.aliases().items()} == {k: set(v) for k, v in frac.aliases().items()}
    assert not any(line.lstrip().startswith("=") for line in frac.render())


def test_design_words_and_statistics_terms_name_an_interaction_alike():
    config = load_config(CONFIGS / "tiny-recipe.yaml")
    terms = [term_name(t) for t in reported_terms(declared_factors(config))]
    assert terms == ["L", "R", "N", "M", "L:R", "L:N", "L:M", "N:R", "M:R", "M:N"]
    # every two-factor word the design writes is a term the statistics report, as the report joins it
    frac = design.phases(config).smoke
    words = {w for k, v in frac.aliases().items() for w in [k, *v] if len(w) == 2}
    assert {":".join(w) for w in words} <= set(terms)
    # a pre-registered term or a prediction written the other way round names the same reported term
    config = parse_config({**config.model_dump(mode="json"), "design": {
        **config.design.model_dump(mode="json"), "pre_registered": ["R:L"],
        "predictions": [{"id": "Q", "statement": "s", "term": "RN", "direction": "above", "threshold": 0}]}})
    pre, rules = declarations(config)
    assert pre == ("L:R",) and rules[0].term == "N:R" and {*pre, rules[0].term} <= set(terms)
