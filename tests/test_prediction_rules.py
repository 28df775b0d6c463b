"""Pre-registration and predictions declared in the config (eps_screen/prediction_rules.py)."""

from __future__ import annotations

import pytest

from eps_screen.config import ConfigError, ScreenConfig, marker_factors, parse_config
from eps_screen.prediction_rules import MARKER_PREDICTIONS, PredictionRule, canonical_term, declared
from eps_screen.screen_stats import declarations


def three_factors() -> list[dict]:
    return [f.model_dump() for f in marker_factors() if f.short in "ABE"]


def test_the_marker_screen_keeps_its_nine_predictions_and_a_b():
    pre, rules = declarations(ScreenConfig())
    assert pre == ("A:B",) and rules == MARKER_PREDICTIONS
    assert [r.id for r in rules] == ["P1", "P2", "P3", "P4", "P5", "P6", "P7a", "P7b", "P7c"]
    # another set of factors declares its own, or has none
    config = parse_config({"design": {"factors": three_factors()}})
    assert declarations(config) == ((), ())


def test_terms_are_named_by_sorted_letters():
    assert canonical_term("BA") == canonical_term("B:A") == canonical_term("A:B") == "A:B"
    with pytest.raises(ValueError, match="not a main effect or interaction"):
        canonical_term("a:b")
    rule = PredictionRule(id="X", statement="s", term="EA", direction="above", threshold=0)
    assert rule.term == "A:E"
    assert declared(["BA"], [rule], "ABE") == (("A:B",), (rule,))


@pytest.mark.parametrize(("design", "expected"), [
    ({"predictions": [{"id": "P3", "statement": "on-policy implants more", "term": "D", "direction": "below",
                       "threshold": -0.2}]},
     "design: predictions[0] (P3): term 'D' names factor D, which is not declared (factors: A, B, E); fix the term or "
     "declare the factor"),
    ({"pre_registered": ["A:C"]},
     "design: pre_registered[0]: term 'A:C' names factor C, which is not declared (factors: A, B, E); name an "
     "interaction of declared factors, e.g. 'A:B'"),
    ({"pre_registered": ["A"]}, "design: pre_registered[0]: 'A' is not a two-factor interaction"),
    ({"predictions": [{"id": "Q", "statement": "s", "term": "ABE", "direction": "above", "threshold": 0}]},
     "design: predictions[0] (Q): term 'A:B:E' is not reported"),
    ({"predictions": [{"id": "Q", "statement": "s", "term": "A", "direction": "above", "threshold": 0}] * 2},
     "design: predictions: id 'Q' is used twice"),
])
def test_a_bad_declaration_is_one_line_naming_it(design, expected):
    with pytest.raises(ConfigError) as err:
        parse_config({"design": {"factors": three_factors(), **design}})
    assert len(err.value.problems) == 1
    assert err.value.problems[0].startswith(expected), err.value.problems[0]
