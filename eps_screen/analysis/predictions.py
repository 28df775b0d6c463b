"""The pre-registered predictions (config `predictions`, eps_screen/spec/prediction_rules.py), each judged from the
pooled estimates and their bootstrap CIs.

The rule is the same for all: a prediction is a statement that a quantity is above (or below, or
inside) a threshold. It is *confirmed* when the whole CI is on the predicted side, *not confirmed* when
the whole CI is on the other side, and *inconclusive* when the CI spans the threshold. Quantities
that combine estimates (a ratio to the next-largest term, the product of a term on both responses) are
computed on every bootstrap resample, so their CIs come from the same draws as everything else.

Signs follow the factor coding (level 1 minus level 0): "marker-only loss above whole-answer loss"
means d(E) <= -0.3, because E1 is whole-answer loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from eps_screen.analysis.schemas import Interval, PredictionOutcome
from eps_screen.analysis.stats import percentile_ci
from eps_screen.spec.prediction_rules import PredictionRule

# (response, term, scale) -> (observed pooled value, resampled pooled values)
DrawsOf = Callable[[str, str, str], tuple[float, np.ndarray]]


@dataclass(frozen=True)
class Rule:
    kind: str  # "above": quantity >= t; "below": quantity <= t; "inside": -t < quantity < t
    t: float

    def text(self, name: str) -> str:
        return {"above": f"{name} >= {self.t:g}", "below": f"{name} <= {self.t:g}", "inside": f"|{name}| < {self.t:g}"}[self.kind]

    def verdict(self, ci: Interval) -> str:
        lo, hi = ci.low, ci.high
        if lo is None or hi is None:
            return "not evaluable"
        if self.kind == "above":
            return "confirmed" if lo >= self.t else "not confirmed" if hi < self.t else "inconclusive"
        if self.kind == "below":
            return "confirmed" if hi <= self.t else "not confirmed" if lo > self.t else "inconclusive"
        if -self.t < lo and hi < self.t:
            return "confirmed"
        return "not confirmed" if lo >= self.t or hi <= -self.t else "inconclusive"


def _judge(
    pid: str, statement: str, name: str, obs: float, boot: np.ndarray, rule: Rule, ci: float, widen: float, partial: bool,
) -> PredictionOutcome:
    finite = boot[np.isfinite(boot)]
    if not np.isfinite(obs) or finite.size == 0:
        interval = Interval(low=None, high=None)
    else:
        lo, hi = percentile_ci(finite, ci, obs, widen)
        interval = Interval(low=float(lo), high=float(hi))
    verdict = rule.verdict(interval)
    if verdict == "not evaluable":
        deciding = f"{name} could not be estimated from the cells present"
    else:
        side = {
            "confirmed": "entirely on the predicted side of",
            "not confirmed": "entirely on the other side of",
            "inconclusive": "straddling",
        }[verdict]
        deciding = (f"{name} = {obs:.3f}, {ci:.0%} CI [{interval.low:.3f}, {interval.high:.3f}]: "
                    f"the CI is {side} the threshold ({rule.text(name)})")
    return PredictionOutcome(
        id=pid, statement=statement, verdict=verdict, estimate=obs, ci=interval,
        threshold=rule.text(name), deciding=deciding, partial=partial,
    )


def _quantity(rule: PredictionRule, draws_of: DrawsOf, terms: Sequence[str]) -> tuple[float, np.ndarray]:
    """The rule's quantity, observed and on every resample."""
    if rule.response == "SR x LR":
        sr_obs, sr_boot = draws_of("SR", rule.term, rule.scale)
        lr_obs, lr_boot = draws_of("LR", rule.term, rule.scale)
        return sr_obs * lr_obs, sr_boot * lr_boot
    obs, boot = draws_of(rule.response, rule.term, rule.scale)
    if rule.quantity == "value":
        return obs, boot
    order = rule.term.count(":")
    others = [t for t in terms if t != rule.term and t.count(":") == order]
    other_obs = np.array([draws_of(rule.response, t, rule.scale)[0] for t in others])
    other_boot = np.stack([draws_of(rule.response, t, rule.scale)[1] for t in others])
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio_obs = abs(obs) / np.nanmax(np.abs(other_obs)) if np.isfinite(other_obs).any() else np.nan
        ratio_boot = np.abs(boot) / np.max(np.abs(other_boot), axis=0)
    return float(ratio_obs), ratio_boot


def judge_predictions(
    rules: Sequence[PredictionRule], draws_of: DrawsOf, terms: Sequence[str], ci: float = 0.95,
    widen: dict[str, float] | None = None, partial: bool = False,
) -> list[PredictionOutcome]:
    """Every declared prediction, from pooled estimates: draws_of(response, term, scale) -> (observed, resamples).

    terms: the reported terms' names (a ratio compares with the others of the same order). widen: the
    few-clusters factor per response (stats.few_cluster_factor), as for every other CI; a quantity built
    from both responses uses the larger.
    """
    w = {"SR": 1.0, "LR": 1.0, **(widen or {})}
    out = []
    for rule in rules:
        obs, boot = _quantity(rule, draws_of, terms)
        widen_by = max(w["SR"], w["LR"]) if rule.response == "SR x LR" else w[rule.response]
        out.append(_judge(rule.id, rule.statement, rule.name, float(obs), boot,
                          Rule(rule.direction, rule.threshold), ci, widen_by, partial))
    return out
