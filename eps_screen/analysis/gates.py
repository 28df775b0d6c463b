"""The six kill criteria of docs/experiment.md as pure functions: plain numbers in, a GateOutcome out.

Pure so that every caller evaluates the same rule: the screen flow (1, 2), the aggregation (3, 4) and the
dispatch (5, 6) import these and never re-implement a threshold. The RunPod worker, a distribution of its own
that cannot import this package, decides 6 and 5's pod-clock backstop in eps_screen_runpod/kills.py, in this
module's format; tests/test_runpod_kills.py holds the two to the same rule. Defaults are the values of
docs/experiment.md (the same as GatesConfig's); callers with a config pass its fields.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, Field

from eps_screen.analysis.stats import flipped_factors, sign_table
from eps_screen.spec.config import GatesConfig

_DEFAULTS = GatesConfig()

GATE_NAMES: dict[int, str] = {
    1: "pre-screen contamination",
    2: "smoke verdict",
    3: "sign instability",
    4: "all below noise",
    5: "cost overrun",
    6: "bootstrap silence",
}

SMOKE_VERDICTS = ("pass", "fail:all_near_zero", "fail:all_saturated")


class GateOutcome(BaseModel):
    """One evaluated kill criterion. `fired` means: stop (or flag) the screen."""

    name: str
    number: int = Field(ge=1, le=6)
    fired: bool
    reason: str = Field(description="One sentence with the deciding numbers.")
    numbers: dict[str, Any] = Field(default_factory=dict, description="The inputs and thresholds that decided it.")
    evaluated: bool = Field(True, description="False when the data could not decide (e.g. one source only).")


def _outcome(number: int, fired: bool, reason: str, evaluated: bool = True, **numbers: Any) -> GateOutcome:
    return GateOutcome(name=GATE_NAMES[number], number=number, fired=fired, reason=reason, numbers=numbers, evaluated=evaluated)


def contamination(
    base_rate: float, threshold: float = _DEFAULTS.contamination, answers: int | None = None,
    by_condition: Mapping[str, float] | None = None,
) -> GateOutcome:
    """Kill 1: the base model (no adapter) already writes the marker more often than the threshold, pooled or under
    any one prompt condition.

    by_condition: the pre-screen's rate per prompt condition (A x B x C, its `by_condition`). A single condition far
    above the threshold can hide in a pooled rate below it (one condition at 16% of eight pools to 2%), and a cell
    trained under that condition would start contaminated; so the worst condition is judged too.
    """
    rates = {str(k): float(v) for k, v in (by_condition or {}).items() if v is not None and not _nan(float(v))}
    worst = max(rates, key=rates.__getitem__) if rates else None
    worst_rate = rates[worst] if worst is not None else None
    pooled_fired = base_rate > threshold
    worst_fired = worst_rate is not None and worst_rate > threshold
    fired = pooled_fired or worst_fired
    verb = "exceeds" if pooled_fired else "is within"
    reason = f"base-model marker rate {base_rate:.4f} {verb} the threshold {threshold:.4f}"
    extra: dict[str, Any] = {}
    if worst is not None:
        verb = "exceeds" if worst_fired else "is within"
        reason += f"; worst prompt condition {worst} at {worst_rate:.4f} {verb} it"
        extra = {"worst_condition": worst, "worst_rate": worst_rate, "by_condition": rates}
    return _outcome(1, fired, reason, base_rate=base_rate, threshold=threshold, answers=answers, **extra)


def smoke_verdict(source_rates: Iterable[float], floor: float = _DEFAULTS.smoke_floor, ceiling: float = _DEFAULTS.smoke_ceiling) -> str:
    """'pass' unless every smoke cell's source rate is <= floor (nothing implants) or >= ceiling (all saturate)."""
    rates = list(source_rates)
    if not rates:
        raise ValueError("smoke verdict needs at least one source rate")
    if all(r <= floor for r in rates):
        return "fail:all_near_zero"
    if all(r >= ceiling for r in rates):
        return "fail:all_saturated"
    return "pass"


def smoke(source_rates: Iterable[float], floor: float = _DEFAULTS.smoke_floor, ceiling: float = _DEFAULTS.smoke_ceiling) -> GateOutcome:
    """Kill 2: the smoke fraction's verdict is not 'pass' (a screen with no contrast to rank)."""
    rates = [float(r) for r in source_rates]
    verdict = smoke_verdict(rates, floor, ceiling)
    span = f"source rates {min(rates):.3f}-{max(rates):.3f} over {len(rates)} cells"
    reason = {
        "pass": f"{span}: not all <= {floor} and not all >= {ceiling}",
        "fail:all_near_zero": f"{span}: every one <= floor {floor}",
        "fail:all_saturated": f"{span}: every one >= ceiling {ceiling}",
    }[verdict]
    return _outcome(2, verdict != "pass", reason, verdict=verdict, source_rates=rates, floor=floor, ceiling=ceiling)


def sign_instability(
    d_sr: Mapping[str, Mapping[str, float]],
    d_lr: Mapping[str, Mapping[str, float]],
    flips: int = _DEFAULTS.sign_flips,
) -> GateOutcome:
    """Kill 3: `flips` or more main effects change sign across the sources, on source rate or on leakage.

    Inputs are {source: {factor: d}}. A factor flips when it is positive in one source and negative in
    another; an estimate of exactly 0 or NaN has no sign. Needs at least two sources to decide.
    """
    sources = sorted(set(d_sr) | set(d_lr))
    flipped = {resp: flipped_factors(sign_table(d)) for resp, d in (("SR", d_sr), ("LR", d_lr))}
    if len(sources) < 2:
        return _outcome(3, False, f"not evaluated: {len(sources)} source(s), at least 2 are needed", evaluated=False,
                        sources=sources, flips_threshold=flips)
    worst = max(flipped, key=lambda r: len(flipped[r]))
    fired = len(flipped[worst]) >= flips
    detail = "; ".join(f"{r}: {len(f)} ({', '.join(f) or 'none'})" for r, f in flipped.items())
    reason = f"main effects flipping sign across {len(sources)} sources: {detail}; threshold {flips}"
    return _outcome(3, fired, reason, flipped_sr=flipped["SR"], flipped_lr=flipped["LR"], flips_threshold=flips, sources=sources)


def all_below_noise(
    d_sr: Mapping[str, Mapping[str, float]],
    d_lr: Mapping[str, Mapping[str, float]],
    noise_d: float = _DEFAULTS.noise_d,
) -> GateOutcome:
    """Kill 4: every main effect's |d| < noise_d, on source rate and on leakage, in every source.

    A NaN d (no variation at all, e.g. every rate 0) counts as below noise: it carries no signal either.
    """
    values = [abs(v) for d in (d_sr, d_lr) for by_f in d.values() for v in by_f.values() if not _nan(v)]
    if not any(d for d in (d_sr, d_lr)):
        return _outcome(4, False, "not evaluated: no main effects estimated yet", evaluated=False, noise_d=noise_d)
    largest = max(values, default=0.0)
    fired = largest < noise_d
    reason = f"largest |d| over every source and both responses is {largest:.3f}; noise threshold {noise_d}"
    return _outcome(4, fired, reason, largest_abs_d=largest, noise_d=noise_d, estimates=len(values))


def cost_overrun(
    longest_job_hours: float,
    spend_usd: float,
    estimate_usd: float,
    max_job_hours: float = _DEFAULTS.max_job_hours,
    spend_factor: float = _DEFAULTS.spend_factor,
) -> GateOutcome:
    """Kill 5: any single GPU job ran longer than max_job_hours, or spend exceeds spend_factor x the estimate."""
    too_long = longest_job_hours > max_job_hours
    budget = spend_factor * estimate_usd
    too_costly = spend_usd > budget
    parts = [
        f"longest job in flight {longest_job_hours:.2f} h (limit {max_job_hours:g} h)",
        f"spend ${spend_usd:.2f} (limit {spend_factor:g} x ${estimate_usd:.2f} = ${budget:.2f})",
    ]
    return _outcome(
        5, too_long or too_costly, "; ".join(parts),
        longest_job_hours=longest_job_hours, spend_usd=spend_usd, estimate_usd=estimate_usd,
        max_job_hours=max_job_hours, spend_factor=spend_factor, job_too_long=too_long, over_budget=too_costly,
    )


def bootstrap_silence(seconds_since_running: float, progress_reported: bool, limit_s: float = _DEFAULTS.bootstrap_silence_s) -> GateOutcome:
    """Kill 6: a GPU job reached RUNNING and reported no progress within limit_s (a pod that never booted)."""
    fired = (not progress_reported) and seconds_since_running >= limit_s
    state = "progress reported" if progress_reported else "no progress yet"
    return _outcome(
        6, fired, f"{seconds_since_running:.0f} s since RUNNING, {state} (limit {limit_s:g} s)",
        seconds_since_running=seconds_since_running, progress_reported=progress_reported, limit_s=limit_s,
    )


def _nan(v: float | None) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))
