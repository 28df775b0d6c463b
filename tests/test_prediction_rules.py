"""Pre-registration and predictions declared in the config (eps_screen/spec/prediction_rules.py)."""

from __future__ import annotations

import pytest

from eps_screen.spec.config import (
    ConfigError,
    ScreenConfig,
    load_config,
    marker_factors,
    parse_config,
)
from eps_screen.spec.prediction_rules import (
    MARKER_PREDICTIONS,
    PredictionRule,
    canonical_term,
    declared,
)
from eps_screen.analysis.screen_stats import declarations
from tests.conftest import CONFIGS


def three_factors() -> list[dict]:
    return [f.model_dump() for f in marker_factors() if f.short in "ABE"]


def test_the_marker_screen_keeps_its_nine_predictions_and_a_b():
    pre, rules = declarations(ScreenConfig())
    assert pre == ("A:B",) and rules == MARKER_PREDICTIONS
    assert [r.id for r in rules] == ["P1", "P2", "P3", "P4", "P5", "P6", "P7a", "P7b", "P7c"]
    # another set of factors declares its own, or has none
    config = parse_config({"design": {"factors": three_factors()}})
    assert declarations(config) == ((), ())


def _recipe_factor(short: str, path: str, lo, hi) -> dict:
    return {"short": short, "label": path, "levels": [{"description": str(lo), "sets": {path: lo}},
                                                      {"description": str(hi), "sets": {path: hi}}]}


def test_the_marker_defaults_go_to_its_five_treatments_not_to_any_factors_lettered_a_to_e():
    # five recipe factors that happen to be lettered A-E: nothing pre-registered, no predictions
    recipe = [_recipe_factor(s, *spec) for s, spec in zip("ABCDE", [
        ("training.learning_rate", 1e-4, 1e-3), ("lora.rank", 8, 32), ("training.epochs", 1, 3),
        ("data.positives", 100, 200), ("lora.alpha", 16, 64)], strict=True)]
    assert declarations(parse_config({"design": {"factors": recipe}})) == ((), ())
    # the five treatments, relabelled in a team's own words: still the marker screen
    marker = [f.model_dump(mode="json") for f in marker_factors()]
    relabelled = [{**f, "label": f"our {f['label']}",
                   "levels": [{**lv, "description": f"side {i}"} for i, lv in enumerate(f["levels"])]} for f in marker]
    assert declarations(parse_config({"design": {"factors": relabelled}})) == (("A:B",), MARKER_PREDICTIONS)
    # a treatment's sides swapped (the predictions' signs would be read backwards), or the letters moved: not it
    swapped = [*marker[:4], {**marker[4], "levels": marker[4]["levels"][::-1]}]
    moved = [{**f, "short": s} for f, s in zip(marker, "ABCED", strict=True)]
    for factors in (swapped, moved):
        assert declarations(parse_config({"design": {"factors": factors}})) == ((), ())
    # what is declared is in force, an empty list included
    none = parse_config({"design": {"factors": marker, "pre_registered": [], "predictions": []}})
    assert declarations(none) == ((), ())
    # shipped configs of the marker screen that leave the block out get its nine; tiny-recipe gets none
    for name in ("simulated", "tiny-ping", "tiny", "qwen7b"):
        assert declarations(load_config(CONFIGS / f"{name}.yaml")) == (("A:B",), MARKER_PREDICTIONS), name
    assert declarations(load_config(CONFIGS / "tiny-recipe.yaml")) == ((), ())


def test_terms_are_named_by_sorted_letters():
    assert canonical_term("BA") == canonical_term("B:A") == canonical_term("A:B") == "A:B"
    with pytest.raises(ValueError, match="not a main effect or interaction"):
        canonical_term("a:b")
    rule = PredictionRule(id="X", statement="s", term="EA", direction="above", threshold=0)
    assert rule.term == "A:E"
    assert declared(["BA"], [rule], [(f, (None, None)) for f in "ABE"]) == (("A:B",), (rule,))


@pytest.mark.parametrize(("design", "expected"), [
    ({"predictions": [{"id": "P3", "statement": "on-policy implants more", "term": "D", "direction": "below",
                       "threshold": -0.2}]},
     ("design: predictions[0] (P3): term 'D' names factor D, which is not declared (factors: A, B, E); fix the term or "
     "declare the factor")),
    ({"pre_registered": ["A:C"]},
     ("design: pre_registered[0]: term 'A:C' names factor C, which is not declared (factors: A, B, E); name an "
     "interaction of declared factors, e.g. 'A:B'")),
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
