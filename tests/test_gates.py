"""The kill criteria: each fires exactly when docs/experiment.md says, and says why with its numbers."""

from __future__ import annotations

import math

import pytest

from eps_screen.analysis import gates
from eps_screen.analysis.gates import GateOutcome
from eps_screen.spec.config import GatesConfig


def test_defaults_are_the_spec_values():
    g = GatesConfig()
    assert (g.sign_flips, g.noise_d, g.max_job_hours, g.spend_factor, g.bootstrap_silence_s) == (3, 0.15, 24, 1.5, 300)
    assert gates.cost_overrun(24.5, 0, 100).fired  # default 24 h limit applies
    assert gates.bootstrap_silence(300, False).fired  # default 300 s


@pytest.mark.parametrize("rate, fired", [(0.0, False), (0.02, False), (0.0201, True), (0.5, True)])
def test_contamination(rate, fired):
    out = gates.contamination(rate, threshold=0.02, answers=19200)
    assert (out.number, out.name, out.fired) == (1, "pre-screen contamination", fired)
    assert out.numbers == {"base_rate": rate, "threshold": 0.02, "answers": 19200}
    assert f"{rate:.4f}" in out.reason


def test_contamination_judges_the_worst_prompt_condition():
    by = {f"base-A{a}B{b}C0": 0.0 for a in (0, 1) for b in (0, 1)} | {"base-A1B1C1": 0.16}
    out = gates.contamination(0.02, threshold=0.02, answers=19200, by_condition=by)  # pooled 2%: within
    assert out.fired and out.numbers["worst_condition"] == "base-A1B1C1" and out.numbers["worst_rate"] == 0.16
    assert "worst prompt condition base-A1B1C1 at 0.1600 exceeds" in out.reason
    calm = gates.contamination(0.005, threshold=0.02, by_condition={"base-A0B0C0": 0.01, "base-A1B0C0": float("nan")})
    assert not calm.fired and "worst prompt condition base-A0B0C0 at 0.0100 is within" in calm.reason
    assert calm.numbers["by_condition"] == {"base-A0B0C0": 0.01}  # NaN (no answers) is left out


@pytest.mark.parametrize(
    "rates, verdict",
    [
        ([0.0, 0.01, 0.05, 0.02], "fail:all_near_zero"),  # 0.05 == floor counts as near zero
        ([0.0, 0.01, 0.051, 0.02], "pass"),
        ([0.95, 0.99, 1.0], "fail:all_saturated"),
        ([0.94, 0.99, 1.0], "pass"),
        ([0.0, 1.0], "pass"),
        ([0.3], "pass"),
    ],
)
def test_smoke_verdict(rates, verdict):
    assert gates.smoke_verdict(rates, 0.05, 0.95) == verdict
    out = gates.smoke(rates, 0.05, 0.95)
    assert out.number == 2 and out.fired is (verdict != "pass")
    assert out.numbers["verdict"] == verdict and out.numbers["source_rates"] == rates


def test_smoke_needs_rates():
    with pytest.raises(ValueError, match="at least one"):
        gates.smoke_verdict([])


def _d(signs: dict[str, str]) -> dict[str, dict[str, float]]:
    """{source: "+-+0-"} -> {source: {A: +0.3, B: -0.3, ...}}."""
    value = {"+": 0.3, "-": -0.3, "0": 0.0, "n": math.nan}
    return {s: {f: value[c] for f, c in zip("ABCDE", code, strict=True)} for s, code in signs.items()}


def test_sign_instability_counts_flips_on_either_response():
    stable = _d({"s1": "+-+-+", "s2": "+-+-+", "s3": "+-0-n"})
    two = _d({"s1": "+-+-+", "s2": "-++-+", "s3": "+-+-+"})
    three = _d({"s1": "+-+-+", "s2": "-+--+", "s3": "+-+-+"})
    assert not gates.sign_instability(stable, stable).fired
    out = gates.sign_instability(stable, two, flips=3)
    assert not out.fired and out.numbers["flipped_lr"] == ["A", "B"]
    out = gates.sign_instability(stable, three, flips=3)
    assert out.fired and out.numbers["flipped_lr"] == ["A", "B", "C"] and out.numbers["flipped_sr"] == []
    assert gates.sign_instability(three, stable, flips=3).fired
    assert gates.sign_instability(stable, two, flips=2).fired
    assert "LR: 3 (A, B, C)" in gates.sign_instability(stable, three).reason


def test_sign_instability_needs_two_sources():
    one = _d({"s1": "+-+-+"})
    out = gates.sign_instability(one, one)
    assert not out.fired and not out.evaluated and "not evaluated" in out.reason


def test_all_below_noise():
    small = {"s1": {"A": 0.1, "B": -0.149}, "s2": {"A": 0.02, "B": math.nan}}
    assert gates.all_below_noise(small, small, noise_d=0.15).fired
    one_big = {"s1": {"A": 0.1, "B": -0.15}, "s2": {"A": 0.02, "B": 0.0}}
    out = gates.all_below_noise(small, one_big, noise_d=0.15)
    assert not out.fired and out.numbers["largest_abs_d"] == 0.15
    out = gates.all_below_noise({}, {}, noise_d=0.15)
    assert not out.fired and not out.evaluated


@pytest.mark.parametrize(
    "hours, spend, estimate, fired, too_long, over",
    [
        (10, 100, 100, False, False, False),
        (24.01, 100, 100, True, True, False),
        (10, 150, 100, False, False, False),  # exactly 1.5x is not over
        (10, 150.01, 100, True, False, True),
        (30, 400, 100, True, True, True),
    ],
)
def test_cost_overrun(hours, spend, estimate, fired, too_long, over):
    out = gates.cost_overrun(hours, spend, estimate, max_job_hours=24, spend_factor=1.5)
    assert out.number == 5 and out.fired is fired
    assert out.numbers["job_too_long"] is too_long and out.numbers["over_budget"] is over
    assert "$150.00" in out.reason  # the budget it was held to


@pytest.mark.parametrize(
    "seconds, progress, fired", [(299, False, False), (300, False, True), (3600, True, False), (0, False, False)]
)
def test_bootstrap_silence(seconds, progress, fired):
    out = gates.bootstrap_silence(seconds, progress, limit_s=300)
    assert out.number == 6 and out.fired is fired


def test_outcome_round_trips_through_json():
    out = gates.smoke([0.1, 0.2], 0.05, 0.95)
    again = GateOutcome.model_validate_json(out.model_dump_json())
    assert again == out
    with pytest.raises(ValueError):
        GateOutcome(name="x", number=7, fired=False, reason="")
