"""The TL;DR paragraph, written from the numbers (so it can never disagree with the tables below it)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from eps_screen.config import ScreenConfig
from eps_screen.schemas import EffectEstimate

if TYPE_CHECKING:
    from eps_screen.aggregate import AggregateResult

_NAMES = {"SR": "source rate", "LR": "leakage"}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _signed(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}"


def _excludes_zero(e: EffectEstimate) -> bool:
    lo, hi = e.d_ci.low, e.d_ci.high
    return lo is not None and hi is not None and (lo > 0 or hi < 0)


def _describe(config: ScreenConfig, e: EffectEstimate) -> str:
    f = config.factors[e.term]
    return (
        f"{f.label.lower()} ({e.term}; d = {_signed(e.d)}, {config.bootstrap.ci:.0%} CI [{_signed(e.d_ci.low)}, {_signed(e.d_ci.high)}]: "
        f"{_NAMES[e.response]} {_pct(e.mean_low)} with {f.low} vs {_pct(e.mean_high)} with {f.high})"
    )


def _ranked(result: AggregateResult, response: str) -> list[EffectEstimate]:
    pooled = [e for e in result.main_effects.effects if e.source == "pooled" and e.response == response and e.d is not None]
    return sorted(pooled, key=lambda e: -abs(e.d or 0.0))


def tldr(config: ScreenConfig, result: AggregateResult) -> str:
    cov = result.metrics.coverage
    sources = result.estimates.sources
    parts: list[str] = []
    if cov.partial:
        parts.append(f"Partial screen: {len(cov.missing_cells)} of {cov.expected} expected cells are missing, "
                     "so every number here is provisional.")
    if not sources:
        parts.append("No factorial cell results yet, so nothing can be ranked.")
    else:
        parts.append(f"Over {len(sources)} source persona{'s' if len(sources) > 1 else ''} ({', '.join(sources)}) and "
                     f"{cov.factorial_cells} primary-seed cells:")
        for response in ("SR", "LR"):
            ranked = _ranked(result, response)
            if not ranked:
                parts.append(f"{_NAMES[response].capitalize()} could not be estimated.")
                continue
            clear = [e for e in ranked if _excludes_zero(e)]
            text = f"{_NAMES[response]} moves most with {_describe(config, ranked[0])}"
            if len(ranked) > 1:
                text += f", then {_describe(config, ranked[1])}"
            parts.append(text[0].upper() + text[1:] + f"; {len(clear)} of {len(ranked)} factors have CIs that exclude zero.")
        ab = result.estimates.find("SR", "A:B")
        if ab is not None and ab.d is not None:
            parts.append(f"The pre-registered A x B interaction on source rate has d = {_signed(ab.d)} "
                         f"[{_signed(ab.d_ci.low)}, {_signed(ab.d_ci.high)}].")
    verdicts = Counter(p.verdict for p in result.metrics.predictions)
    if verdicts:
        order = ("confirmed", "not confirmed", "inconclusive", "not evaluable")
        parts.append("Predictions: " + ", ".join(f"{verdicts[v]} {v}" for v in order if verdicts[v]) + ".")
    fired = [g for g in result.metrics.gates if g.fired]
    if fired:
        parts.append("Kill criteria FIRED: " + "; ".join(f"{g.number} {g.name} ({g.reason})" for g in fired) + ".")
    else:
        recorded = sorted(g.number for g in result.metrics.gates if g.evaluated)
        parts.append(f"No kill criterion fired (evaluated: {', '.join(map(str, recorded)) or 'none'}).")
    return " ".join(parts)
