"""The pre-registered predictions of docs/experiment.md, each judged from the pooled estimates and their bootstrap CIs.

The rule is the same for all: a prediction is a statement that a quantity is above (or below, or
inside) a threshold. It is *confirmed* when the whole CI is on the predicted side, *not confirmed* when
the whole CI is on the other side, and *inconclusive* when the CI spans the threshold. Quantities
that combine estimates (the A x B ratio, the sign of D on both responses) are computed on every
bootstrap resample, so their CIs come from the same draws as everything else.

Signs follow the factor coding (level 1 minus level 0): "marker-only loss above whole-answer loss"
means d(E) <= -0.3, because E1 is whole-answer loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from eps_screen.config import FACTOR_NAMES
from eps_screen.schemas import Interval, PredictionOutcome
from eps_screen.stats import interaction_pairs, percentile_ci, term_name

_INTERACTIONS = [term_name(p) for p in interaction_pairs(FACTOR_NAMES)]

# (response, term) -> (observed pooled d, resampled pooled d)
DrawsOf = Callable[[str, str], tuple[float, np.ndarray]]


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


def judge_predictions(
    draws_of: DrawsOf, ci: float = 0.95, widen: dict[str, float] | None = None, partial: bool = False,
) -> list[PredictionOutcome]:
    """Every prediction of docs/experiment.md, from pooled d's: draws_of(response, term) -> (observed, resamples).

    widen: the few-clusters factor per response (stats.few_cluster_factor), as for every other CI;
    a quantity built from both responses uses the larger.
    """
    w = {"SR": 1.0, "LR": 1.0, **(widen or {})}
    out = []
    d = draws_of
    main_sr = [
        ("P1", "A", "Long system prompt implants more: d(A on SR) >= 0.4, averaged over sources", Rule("above", 0.4)),
        ("P2", "E", "Marker-only loss implants more than whole-answer loss: d(E on SR) <= -0.3", Rule("below", -0.3)),
        ("P3", "D", "On-policy implants more than off-policy: d(D on SR) <= -0.2", Rule("below", -0.2)),
        ("P4", "B", "Long answer format collapses implantation: d(B on SR) <= -0.3 (its 'non-monotone' clause cannot be "
               "tested with two levels of B: judged on the direction only)", Rule("below", -0.3)),
        ("P5", "C", "Framing does not matter once A is accounted for: |d(C on SR)| < 0.15", Rule("inside", 0.15)),
    ]
    for pid, factor, statement, rule in main_sr:
        obs, boot = d("SR", factor)
        out.append(_judge(pid, statement, f"pooled d({factor} on SR)", obs, boot, rule, ci, w["SR"], partial))

    # P6: |d(A:B)| more than twice the largest |d| among the other nine interactions (on SR), per resample.
    others = [t for t in _INTERACTIONS if t != "A:B"]
    ab_obs, ab_boot = d("SR", "A:B")
    other_obs = np.array([d("SR", t)[0] for t in others])
    other_boot = np.stack([d("SR", t)[1] for t in others])
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio_obs = abs(ab_obs) / np.nanmax(np.abs(other_obs)) if np.isfinite(other_obs).any() else np.nan
        ratio_boot = np.abs(ab_boot) / np.max(np.abs(other_boot), axis=0)
    out.append(_judge("P6", "The A x B interaction is more than twice the next-largest interaction (on SR)",
                      "|d(A:B)| / max other |d| on SR", float(ratio_obs), ratio_boot, Rule("above", 2.0), ci, w["SR"], partial))

    # P7: leakage. A1 and E1 both reduce it; D1 moves it opposite to its effect on SR.
    for pid, factor in (("P7a", "A"), ("P7b", "E")):
        obs, boot = d("LR", factor)
        label = {"A": "A long system prompt", "E": "Whole-answer loss"}[factor]
        out.append(_judge(pid, f"{label} reduces leakage: d({factor} on LR) < 0", f"pooled d({factor} on LR)",
                          obs, boot, Rule("below", 0.0), ci, w["LR"], partial))
    sr_obs, sr_boot = d("SR", "D")
    lr_obs, lr_boot = d("LR", "D")
    out.append(_judge("P7c", "Off-policy data moves leakage opposite to source rate: d(D on SR) x d(D on LR) < 0",
                      "d(D on SR) x d(D on LR)", sr_obs * lr_obs, sr_boot * lr_boot, Rule("below", 0.0), ci,
                      max(w["SR"], w["LR"]), partial))
    return out
