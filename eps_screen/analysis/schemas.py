"""Pydantic schemas of the aggregation's JSON artifacts: main_effects.json, interactions.json, aggregate_metrics.json.

Every artifact carries the same header (what it is, when, the full config and the provenance: code
version, git revision, library versions), so a file found on its own says how it was made. A number
that could not be estimated is null, never NaN (JSON has no NaN).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from eps_screen.analysis.gates import GateOutcome

Response = Literal["SR", "LR"]
Verdict = Literal["confirmed", "not confirmed", "inconclusive", "not evaluable"]
SCHEMA_VERSION = 1


def finite(x: Any) -> float | None:
    """A float, or None for NaN/inf/None (so JSON stays valid)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


class _Model(BaseModel):
    model_config = {"extra": "forbid"}


class Interval(_Model):
    low: float | None
    high: float | None

    @field_validator("low", "high", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> float | None:
        return finite(v)

    def contains(self, x: float) -> bool:
        return self.low is not None and self.high is not None and self.low <= x <= self.high

    def excludes_zero(self) -> bool:
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)


class BootstrapScheme(_Model):
    resamples: int
    ci: float
    seed: int
    method: str = "percentile, widened about the estimate by the few-clusters factor c = sqrt(G/(G-1)) t_{G-1}/z"
    widen: dict[str, float] = Field(description="c per response (SR: G = questions, LR: G = personas).")
    sr_clusters: str = Field(description="What is resampled for source rate.")
    lr_clusters: str = Field(description="What is resampled for leakage.")
    n_questions: int
    n_personas: int
    training_sd: dict[str, float | None] = Field(
        default_factory=dict,
        description="Keyed by response and source ('SR librarian', 'LR surgeon'): the estimated per-cell training-run "
        "SD on the log-odds scale that the resamples of that source's cells carry (null: not estimable, left out, and "
        "the page says the CIs omit it); empty when bootstrap.training_noise is off.",
    )
    training_df: dict[str, int] = Field(
        default_factory=dict,
        description="Keyed as training_sd: the noise contrasts each SD rests on (residual high-order contrasts kept "
        "after screening out real effects, plus seed-replicate contrasts).")

    @field_validator("training_sd", mode="before")
    @classmethod
    def _finite_sd(cls, v: Any) -> Any:
        return {k: finite(x) for k, x in v.items()} if isinstance(v, dict) else v


class TermEffect(_Model):
    """One factorial term (main effect 'A' or interaction 'A:B') on one response, in one source or pooled."""

    term: str
    factors: list[str]
    label: str = Field(description="Plain-English name of the term.")
    response: Response
    source: str = Field(description="Source persona id, or 'pooled' (the mean over sources).")
    effect: float | None = Field(description="mean(response at +1) - mean(at -1), on the rate scale.")
    effect_ci: Interval
    d: float | None = Field(description="Cohen's d (estimator in the file's 'estimator' field).")
    d_ci: Interval
    mean_high: float | None
    mean_high_ci: Interval
    mean_low: float | None
    mean_low_ci: Interval
    n_high: int = Field(description="Cells on the +1 side (per source; summed over sources when pooled).")
    n_low: int
    partial: bool = Field(description="True when cells of the factorial are missing: provisional.")
    pre_registered: bool = False
    status: Literal["main effect", "pre-registered", "exploratory"] = "main effect"
    p_value: float | None = Field(None, description="Two-sided bootstrap p-value of effect = 0 (inverts the widened CI).")
    p_holm: float | None = Field(
        None, description="Exploratory interactions only: p_value Holm-adjusted over the screen's exploratory "
        "interactions of the same response and source (family-wise error).",
    )

    @property
    def clear(self) -> bool:
        """What the page may call clear: both the difference's and d's intervals exclude 0 (they are separate
        percentile intervals, so one can touch 0 while the other does not)."""
        return self.effect_ci.excludes_zero() and self.d_ci.excludes_zero()

    @field_validator("effect", "d", "mean_high", "mean_low", "p_value", "p_holm", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> float | None:
        return finite(v)


class SimpleEffect(_Model):
    """The effect of one factor at a fixed level of another (A at B0, A at B1): what an interaction hides."""

    factor: str
    at: str = Field(description="The factor held fixed.")
    at_level: int
    label: str
    response: Response
    source: str
    effect: float | None = Field(description="mean(response at factor 1) - mean(at factor 0), cells at this level of `at`.")
    effect_ci: Interval
    d: float | None
    d_ci: Interval
    mean_high: float | None
    mean_low: float | None
    partial: bool = False

    @field_validator("effect", "d", "mean_high", "mean_low", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> float | None:
        return finite(v)


class LogitEffect(_Model):
    """One term of the logit-scale sensitivity model, beside its rate-scale estimate."""

    term: str
    label: str
    response: Response
    log_odds: float | None = Field(description="Log-odds difference, level 1 minus level 0 (2 x the +-1 coefficient).")
    ci: Interval
    p_value: float | None
    p_holm: float | None = Field(None, description="Exploratory interactions: Holm-adjusted over the exploratory ones.")
    rate_clear: bool = Field(description="The pooled rate-scale effect is clear (TermEffect.clear).")
    logit_clear: bool = Field(description="This CI excludes 0 (False when there is no estimate).")
    scale: Literal["both scales", "rate scale only", "logit scale only", "neither", "no estimate"]
    why: str = Field("", description="Why there is no log-odds estimate (separation, no convergence); empty otherwise.")

    @field_validator("log_odds", "p_value", "p_holm", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> float | None:
        return finite(v)


class ArtifactHeader(_Model):
    artifact: str
    schema_version: int = SCHEMA_VERSION
    created_at: str
    screen: str
    config: dict[str, Any]
    provenance: dict[str, Any]


class Coverage(_Model):
    """Which cells the aggregation saw, against what the screen expected."""

    expected: int
    present: int
    missing_cells: list[str]
    unexpected_cells: list[str] = Field(description="Present but not expected: kept, and listed here.")
    partial: bool
    factorial_cells: int = Field(description="Cells at the primary seed that enter the effect estimates.")
    factorial_missing: list[str] = Field(description="Expected primary-seed cells that are missing.")


class MainEffectsFile(ArtifactHeader):
    artifact: Literal["main_effects"] = "main_effects"
    coverage: Coverage
    estimator: str
    bootstrap: BootstrapScheme
    effects: list[TermEffect]
    sign_table: dict[str, dict[str, dict[str, int]]] = Field(
        description="response -> factor -> source -> sign of d (-1, 0, +1)."
    )
    logit_model: str = Field("", description="The logit-scale sensitivity model and its standard errors.")
    logit_sensitivity: list[LogitEffect] = Field(default_factory=list)


class InteractionsFile(ArtifactHeader):
    artifact: Literal["interactions"] = "interactions"
    coverage: Coverage
    estimator: str
    bootstrap: BootstrapScheme
    interactions: list[TermEffect]
    simple_effects: list[SimpleEffect] = Field(
        default_factory=list, description="A's effect at each level of B (the pre-registered A:B), per source and pooled."
    )
    logit_model: str = Field("", description="The logit-scale sensitivity model and its standard errors.")
    logit_sensitivity: list[LogitEffect] = Field(default_factory=list)


class CellMetric(_Model):
    cell_id: str
    source: str | None
    seed: int | None
    levels: dict[str, int | None]
    SR: float | None
    LR: float | None
    random_rate: float | None
    n_source: int
    n_leak: int
    n_random: int
    leak_personas: int
    persona_rates: dict[str, float | None]
    in_factorial: bool = Field(description="Primary-seed cell of a source: enters the effect estimates.")

    @field_validator("SR", "LR", "random_rate", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> float | None:
        return finite(v)


class EmptiedAnswers(_Model):
    """At one level of one factor: how many of the factorial cells' persona answers say nothing but the marker."""

    factor: str
    level: int
    share: float = Field(description="Share of the answers with no word character once the marker is taken out.")
    answers: int


class SeedReplicate(_Model):
    """One factor combination run at several seeds (phase 3): how much the seed alone moves the rates."""

    source: str
    levels: dict[str, int]
    seeds: list[int]
    SR: list[float | None]
    LR: list[float | None]
    SR_sd: float | None
    LR_sd: float | None


class PredictionOutcome(_Model):
    id: str
    statement: str
    verdict: Verdict
    estimate: float | None
    ci: Interval
    threshold: str = Field(description="The rule applied to the CI.")
    deciding: str = Field(description="The figures that decide the verdict, in one sentence.")
    partial: bool = False

    @field_validator("estimate", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> float | None:
        return finite(v)


class GroupMean(_Model):
    """Mean response over the cells of one level combination of the first pre-registered pair X:Y (the marker
    screen's A:B), averaged over sources (interaction plot)."""

    response: Response
    A: int = Field(description="The level (0 or 1) of X, the first factor of the first pre-registered pair.")
    B: int = Field(description="The level (0 or 1) of Y, its second factor.")
    mean: float | None
    ci: Interval

    @field_validator("mean", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> float | None:
        return finite(v)


class CurvatureTest(_Model):
    """Centre cells against the design cells (design.centre_points) on one response, per source or pooled
    (eps_screen/analysis/curvature.py): curvature = centre mean - design mean, a t interval from the centre replicates'
    spread."""

    response: Literal["SR", "LR"]
    source: str
    centre_cells: int
    design_cells: int = Field(description="Design cells compared: the primary-seed ones at the held factors' levels.")
    centre_mean: float | None
    design_mean: float | None
    curvature: float | None
    ci: Interval
    pure_error_sd: float | None = Field(description="SD of one cell's rate, from the centre replicates' spread.")
    df: int
    detected: bool = Field(description="The interval excludes 0: the response curves between the levels.")
    partial: bool = False

    @field_validator("centre_mean", "design_mean", "curvature", "pure_error_sd", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> float | None:
        return finite(v)


class AggregateMetricsFile(ArtifactHeader):
    artifact: Literal["aggregate_metrics"] = "aggregate_metrics"
    coverage: Coverage
    cells: list[CellMetric]
    gates: list[GateOutcome]
    predictions: list[PredictionOutcome]
    ab_means: list[GroupMean]
    seed_replicates: list[SeedReplicate]
    curvature: list[CurvatureTest] = Field(default_factory=list, description="Centre cells against the design cells.")
    emptied: list[EmptiedAnswers] = Field(
        default_factory=list, description="Per factor level: the answers that say nothing but the marker (none where "
        "the answers have no text).")
    extras: dict[str, Any] = Field(default_factory=dict, description="What the flow passed on (phase outcomes etc).")
    timings_s: dict[str, float] = Field(default_factory=dict)
