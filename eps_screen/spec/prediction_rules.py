"""Pre-registered interactions and predictions, as a config declares them (judged in predictions.py).

A prediction is a rule on one term of the factorial (a main effect "A" or an interaction "A:B", named by
the factors' short letters), on one response, on one scale:

    quantity  value            the term's pooled estimate (d or rate difference)
              ratio_to_next    |term| / the largest |other term of the same order| (e.g. A:B against the
                               other two-factor interactions)
    response  SR, LR, or "SR x LR": the product of the term's values on both responses (negative when the
              factor moves them in opposite directions)
    direction above (>= threshold), below (<= threshold) or inside (|quantity| < threshold)

Kept free of config.py (which imports this module) so the two cannot import each other; the config's
validator calls `check_declarations` with the declared factor names.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from eps_screen.spec.treatments import ASPECTS


class PredictionRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=16, description="Short name shown on the page, e.g. P1.")
    statement: str = Field(min_length=1, description="The prediction in plain words.")
    term: str = Field(description="Main effect 'A' or interaction 'A:B' (also written AB), by the factors' short letters.")
    response: Literal["SR", "LR", "SR x LR"] = "SR"
    scale: Literal["d", "effect"] = Field("d", description="Cohen's d, or the rate difference (level 1 minus level 0).")
    quantity: Literal["value", "ratio_to_next"] = "value"
    direction: Literal["above", "below", "inside"]
    threshold: float

    @field_validator("term")
    @classmethod
    def _term_letters(cls, term: str) -> str:
        return canonical_term(term)

    @property
    def name(self) -> str:
        """The quantity as the page writes it, e.g. 'pooled d(A on SR)'."""
        if self.response == "SR x LR":
            return f"{self.scale}({self.term} on SR) x {self.scale}({self.term} on LR)"
        if self.quantity == "ratio_to_next":
            return f"|{self.scale}({self.term})| / max other |{self.scale}| on {self.response}"
        return f"pooled {self.scale}({self.term} on {self.response})"


def canonical_term(term: str) -> str:
    """'AB', 'A:B' and 'B:A' are one term: its letters, sorted and joined by ':' (as every artifact names it)."""
    letters = [c for c in term.replace(":", "").replace(" ", "")]
    if not letters or not all("A" <= c <= "Z" for c in letters) or len(set(letters)) != len(letters):
        raise ValueError(f"term {term!r} is not a main effect or interaction of factor letters (e.g. 'A' or 'A:B')")
    return ":".join(sorted(letters))


def _marker_predictions() -> list[PredictionRule]:
    """The marker screen's predictions, written down before any data (docs/experiment.md, 'The pre-registered predictions')."""
    rows = [
        ("P1", "Long system prompt implants more: d(A on SR) >= 0.4, averaged over sources", "A", "SR", "value", "above", 0.4),
        ("P2", "Marker-only loss implants more than whole-answer loss: d(E on SR) <= -0.3", "E", "SR", "value", "below", -0.3),
        ("P3", "On-policy implants more than off-policy: d(D on SR) <= -0.2", "D", "SR", "value", "below", -0.2),
        ("P4", ("Long answer format collapses implantation: d(B on SR) <= -0.3 (its 'non-monotone' clause cannot be "
                "tested with two levels of B: judged on the direction only)"), "B", "SR", "value", "below", -0.3),
        ("P5", "Framing does not matter once A is accounted for: |d(C on SR)| < 0.15", "C", "SR", "value", "inside", 0.15),
        ("P6", "The A x B interaction is more than twice the next-largest interaction (on SR)", "A:B", "SR",
               "ratio_to_next", "above", 2.0),
        ("P7a", "A long system prompt reduces leakage: d(A on LR) < 0", "A", "LR", "value", "below", 0.0),
        ("P7b", "Whole-answer loss reduces leakage: d(E on LR) < 0", "E", "LR", "value", "below", 0.0),
        ("P7c", "Off-policy data moves leakage opposite to source rate: d(D on SR) x d(D on LR) < 0", "D", "SR x LR",
                "value", "below", 0.0),
    ]
    return [PredictionRule(id=i, statement=s, term=t, response=r, quantity=q, direction=d, threshold=th)
            for i, s, t, r, q, d, th in rows]


MARKER_PREDICTIONS: tuple[PredictionRule, ...] = tuple(_marker_predictions())
MARKER_PRE_REGISTERED: tuple[str, ...] = ("A:B",)


def is_marker_screen(factors: Sequence[tuple[str, Sequence[str | None]]]) -> bool:
    """Whether the factors, each as (short name, the treatment each level names), are the marker screen's: its five
    built-in treatments under their letters A-E, the first side at level 0 (the signs its predictions are written
    in). A screen that merely letters its own factors A-E is not."""
    return [(short, tuple(sides)) for short, sides in factors] == [(a.marker_letter, a.sides) for a in ASPECTS]


def declared(
    pre_registered: Sequence[str] | None, predictions: Sequence[PredictionRule] | None,
    factors: Sequence[tuple[str, Sequence[str | None]]],
) -> tuple[tuple[str, ...], tuple[PredictionRule, ...]]:
    """The pre-registered interactions and predictions in force: as declared, or, left out (None), the marker
    screen's where the factors are its five treatments (is_marker_screen; a config without a design block), none
    otherwise."""
    marker = is_marker_screen(factors)
    pre = tuple(canonical_term(t) for t in pre_registered) if pre_registered is not None else (
        MARKER_PRE_REGISTERED if marker else ())
    rules = tuple(predictions) if predictions is not None else (MARKER_PREDICTIONS if marker else ())
    return pre, rules


def reported_terms(factors: Sequence[str]) -> list[tuple[str, ...]]:
    """The terms a screen reports: every main effect, then every two-factor interaction (A:B, A:C, ..., in factor
    order), each named by its letters in alphabetical order as canonical_term names it."""
    return [(f,) for f in factors] + [tuple(sorted(p)) for p in itertools.combinations(factors, 2)]


def check_declarations(
    pre_registered: Sequence[str] | None, predictions: Sequence[PredictionRule] | None, factors: Sequence[str],
) -> None:
    """Refuse a pre-registered interaction or a prediction on a term the screen does not report, in one line."""
    names = ", ".join(factors)
    order = {f: i for i, f in enumerate(factors)}

    def unknown(term: str) -> list[str]:
        return [f for f in term.split(":") if f not in order]

    for i, term in enumerate(pre_registered or []):
        term = canonical_term(term)
        if bad := unknown(term):
            raise ValueError(f"pre_registered[{i}]: term {term!r} names factor {bad[0]}, which is not declared "
                             f"(factors: {names}); name an interaction of declared factors, e.g. "
                             f"'{':'.join(factors[:2])}'")
        if term.count(":") != 1:
            raise ValueError(f"pre_registered[{i}]: {term!r} is not a two-factor interaction; pre-register an "
                             f"interaction of two declared factors, e.g. '{':'.join(factors[:2])}'")
    for i, rule in enumerate(predictions or []):
        where = f"predictions[{i}] ({rule.id})"
        if bad := unknown(rule.term):
            raise ValueError(f"{where}: term {rule.term!r} names factor {bad[0]}, which is not declared "
                             f"(factors: {names}); fix the term or declare the factor")
        if rule.term.count(":") > 1:
            raise ValueError(f"{where}: term {rule.term!r} is not reported (the screen reports main effects and "
                             "two-factor interactions); predict a main effect or a two-factor interaction")
        if rule.quantity == "ratio_to_next" and (rule.term.count(":") == 0 and len(factors) < 2
                                                 or rule.term.count(":") == 1 and len(factors) < 3):
            raise ValueError(f"{where}: ratio_to_next needs another term of the same order to compare with; "
                             "with these factors there is none")
        if rule.quantity == "ratio_to_next" and rule.response == "SR x LR":
            raise ValueError(f"{where}: ratio_to_next is judged on one response; set response to SR or LR")
    ids = [r.id for r in predictions or []]
    if dup := sorted({x for x in ids if ids.count(x) > 1}):
        raise ValueError(f"predictions: id {dup[0]!r} is used twice; give each prediction its own id")
