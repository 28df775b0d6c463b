"""design.power: what `validate` assumes to state the design's power, and the target it suggests a panel for
(eps_screen/analysis/power.py computes both). A module of its own so that the config can hold it without importing the
computation."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

RESPONSES = ("SR", "LR")


class PowerTarget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    points: float = Field(gt=0, lt=100, description="The effect to detect, in rate points (5: 0.05), pooled over sources.")
    terms: list[str] = Field(min_length=1, description="The terms it must be detected on, e.g. [A, A:B].")
    responses: list[str] = Field(default_factory=lambda: list(RESPONSES), description="SR, LR or both (default).")


class PowerConfig(BaseModel):
    """What `validate` assumes to say which effects the design can see, and the target it should reach."""

    model_config = ConfigDict(extra="forbid")

    source_rate: float = Field(0.3, gt=0, lt=1, description="Assumed mean source rate (SR) over the cells.")
    leakage: float = Field(0.05, gt=0, lt=1, description="Assumed mean leakage (LR) over the cells.")
    training_sd: float = Field(0.3, ge=0, description="Assumed per-cell training-run noise, a log-odds SD.")
    power: float = Field(0.8, gt=0.5, lt=1, description="The power the smallest detectable effect is stated at.")
    target: PowerTarget | None = Field(
        None, description="Detect this many rate points on these terms: validate suggests the smallest panel that does.")


def check_target(power: PowerConfig | None, factors: str) -> None:
    """A target on a term the screen does not report, refused in one line."""
    from eps_screen.spec.prediction_rules import canonical_term

    if power is None or power.target is None:
        return
    for i, raw in enumerate(power.target.terms):
        where = f"design.power.target.terms[{i}]"
        try:
            term = canonical_term(raw)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        bad = [f for f in term.split(":") if f not in factors]
        if bad or term.count(":") > 1:
            why = f"names factor {bad[0]}, which is not declared" if bad else "is not reported"
            raise ValueError(f"{where}: term {raw!r} {why} (factors: {', '.join(factors)}); name a main effect or "
                             f"two-factor interaction of declared factors, e.g. {factors[0]} or {factors[0]}:{factors[1]}")
    wrong = [r for r in power.target.responses if r not in RESPONSES]
    if wrong:
        raise ValueError(f"design.power.target.responses: {wrong[0]!r} is not a response; use SR, LR or both")
