"""Aggregation: known answers on hand-built tables, planted effects recovered, honest partial screens, artifacts."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from eps_screen.analysis import gates
from eps_screen.analysis.cell_metrics import AnswersError, cell_matrices
from eps_screen.analysis.predictions import Rule, judge_predictions
from eps_screen.analysis.stats import term_name
from eps_screen.panels import load_panels
from eps_screen.run.aggregate import aggregate, compute
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import Cell, all_slab_cells, full_factorial, slab_cells
from eps_screen.spec.prediction_rules import MARKER_PREDICTIONS, PredictionRule, reported_terms

FACTOR_NAMES = ("A", "B", "C", "D", "E")  # the marker screen's
from eps_screen.analysis.schemas import AggregateMetricsFile, Interval, InteractionsFile, MainEffectsFile
from eps_screen.run.scoring import answer_schema
from eps_screen.run.simulate import simulate_cell_answers, simulate_screen, true_effects

FAST = {"resamples": 2000, "seed": 11}
MAIN_AND_AB = ["A", "B", "C", "D", "E", "A:B"]


def rows(cell: Cell, persona: str, markers: list[int], panel: str = "persona", questions: list[int] | None = None) -> list[dict]:
    """Answer rows of one (cell, persona): markers[i] is answer i; questions default to 0, 1, 2, ... one sample each."""
    questions = questions if questions is not None else list(range(len(markers)))
    return [
        {"cell_id": cell.id, "source": cell.source, "seed": cell.seed, **dict(zip(FACTOR_NAMES, cell.levels, strict=True)),
         "panel": panel, "persona": "random" if panel == "random" else persona, "question": q, "sample": k,
         "marker": bool(m), "is_source": panel == "persona" and persona == cell.source}
        for k, (q, m) in enumerate(zip(questions, markers, strict=True))
    ]


# --------------------------------------------------------------------------- per-cell metrics by hand


def test_cell_metrics_by_hand():
    cell = Cell("nurse", (1, 0, 0, 0, 0), 42)
    table = pl.DataFrame(
        rows(cell, "nurse", [1, 0, 1, 1, 0, 0, 0, 1], questions=[0, 0, 1, 1, 2, 2, 3, 3])  # SR = 4/8
        + rows(cell, "chef", [1] + [0] * 9)  # 0.1
        + rows(cell, "lawyer", [1, 0])  # 0.5
        + rows(cell, "", [1, 0, 0, 0], panel="random"),
        schema=answer_schema(FACTOR_NAMES),
    )
    m = cell_matrices(table, FACTOR_NAMES)
    row = m.cells.row(0, named=True)
    assert row["SR"] == 0.5
    assert row["LR"] == pytest.approx(0.3)  # mean of persona rates (0.1 + 0.5)/2, not pooled answers 2/12
    assert row["random_rate"] == 0.25
    assert (row["n_source"], row["n_leak"], row["n_random"], row["leak_personas"]) == (8, 12, 4, 2)
    assert m.questions == [0, 1, 2, 3]
    np.testing.assert_array_equal(m.sr_markers, [[1, 2, 0, 1]])
    np.testing.assert_array_equal(m.sr_answers, [[2, 2, 2, 2]])
    assert m.personas == ["chef", "lawyer", "nurse"]
    np.testing.assert_array_equal(m.lr_mask, [[1, 1, 0]])


def test_answers_contract_is_checked():
    good = simulate_cell_answers(ScreenConfig(), Cell("nurse", (0,) * 5, 42), ["nurse", "chef"], 2, 1, 0)
    with pytest.raises(AnswersError, match="lacks column"):
        cell_matrices(good.drop("is_source"), FACTOR_NAMES)
    with pytest.raises(AnswersError, match="'marker' should be boolean"):
        cell_matrices(good.with_columns(pl.col("marker").cast(pl.String)), FACTOR_NAMES)
    with pytest.raises(AnswersError, match="unknown value"):
        cell_matrices(good.with_columns(pl.lit("other").alias("panel")), FACTOR_NAMES)


# --------------------------------------------------------------------------- the factorial by hand


def designed_screen() -> tuple[ScreenConfig, pl.DataFrame]:
    """One source, 32 cells, SR = 0.2 + 0.2A - 0.1B + 0.1AB exactly, spread evenly over 10 questions; no leakage.

    By hand: effect(A) = 0.25 (A1 mean 0.40, A0 mean 0.15), effect(B) = -0.05, A:B = 0.05, C = D = E = 0.
    """
    config = ScreenConfig(sources=["nurse"], bootstrap=FAST)
    out = []
    for levels in full_factorial():
        cell = Cell("nurse", levels, 42)
        a, b = levels[0], levels[1]
        per_question = round(10 * (0.2 + 0.2 * a - 0.1 * b + 0.1 * a * b))  # markers out of 10 samples, each question
        markers = [1 if k < per_question else 0 for q in range(10) for k in range(10)]
        out += rows(cell, "nurse", markers, questions=[q for q in range(10) for _ in range(10)])
        out += rows(cell, "chef", [0] * 10) + rows(cell, "lawyer", [0] * 10)
    return config, pl.DataFrame(out, schema=answer_schema(FACTOR_NAMES))


def test_designed_factorial_known_answer():
    config, answers = designed_screen()
    result = compute(config, answers, [c.id for c in slab_cells(config, "nurse")])
    est = result.estimates
    e = {t: est.find("SR", t, "nurse") for t in MAIN_AND_AB}
    assert e["A"].effect == pytest.approx(0.25)
    assert (e["A"].mean_high, e["A"].mean_low) == (pytest.approx(0.40), pytest.approx(0.15))
    assert e["A"].d == pytest.approx(0.25 / np.sqrt((0.4 * 0.6 + 0.15 * 0.85) / 2))
    assert e["B"].effect == pytest.approx(-0.05)
    assert e["A:B"].effect == pytest.approx(0.05)
    for t in "CDE":
        assert e[t].effect == pytest.approx(0.0, abs=1e-12)
    # every question has the same rate in a cell, so resampling questions changes nothing: CIs collapse
    assert e["A"].effect_ci.low == pytest.approx(0.25) and e["A"].effect_ci.high == pytest.approx(0.25)
    # pooled over one source is that source
    assert est.find("SR", "A").d == pytest.approx(e["A"].d)
    assert (e["A"].n_high, e["A"].n_low) == (16, 16)
    # leakage is 0 everywhere: effects 0, d undefined (null, not NaN, not a crash)
    lr = est.find("LR", "A")
    assert lr.effect == 0.0 and lr.d is None and lr.d_ci.low is None
    # gates: one source cannot flip signs; SR has |d| well above noise
    g = {o.number: o for o in result.metrics.gates}
    assert not g[3].evaluated and not g[3].fired
    assert not g[4].fired


# --------------------------------------------------------------------------- planted effects recovered

ALT = {
    "base_logit": 0.3, "effects": {"A": -0.5, "B": 0.7, "C": 0.3, "D": 0.0, "E": 0.9, "AB": 0.6},
    "leak_effects": {"A": 0.4, "B": -0.4, "C": 0.0, "D": -0.3, "E": 0.5}, "leak_offset": -1.5,
    "question_sd": 0.6, "persona_sd": 0.4,
}


@pytest.mark.parametrize("simulation, screen_seed", [({}, 1), (ALT, 2)], ids=["default-planted", "other-planted"])
def test_planted_effects_recovered(simulation, screen_seed):
    """Full screens (3 sources x 32 cells): signs of every planted effect, and each planted value inside its CI.

    The planted values are on the estimated scale: simulate.true_effects applies the same estimators to
    the noise-free rates. (CI coverage in general is measured by benchmarks/coverage_study.py.)
    """
    config = ScreenConfig(bootstrap=FAST, simulation=simulation)
    cells = all_slab_cells(config)
    personas = load_panels().eval_personas(config.sources, config.eval.personas)
    answers = simulate_screen(config, cells, personas, screen_seed=screen_seed)
    est = compute(config, answers, [c.id for c in cells]).estimates
    truth = true_effects(config, cells, personas, config.eval.questions, screen_seed=screen_seed)
    sim = config.simulation
    planted = {
        "SR": {**{f: sim.effects.get(f, 0.0) for f in FACTOR_NAMES}, "A:B": sim.effects.get("AB", 0.0)},
        "LR": {**{f: sim.leak_effects.get(f, 0.0) for f in FACTOR_NAMES}, "A:B": 0.0},
    }
    for response, by_term in planted.items():
        for term, logit_effect in by_term.items():
            for source in [*config.sources, "pooled"]:
                e = est.find(response, term, source)
                if logit_effect:
                    assert np.sign(e.effect) == np.sign(logit_effect) == np.sign(e.d), (response, term, source, e.d)
            e = est.find(response, term)
            true = truth[(response, "pooled", term)]
            assert e.d_ci.contains(true["d"]), (response, term, true["d"], e.d_ci)
            assert e.effect_ci.contains(true["effect"]), (response, term, true["effect"], e.effect_ci)


# --------------------------------------------------------------------------- the kill criteria on screens


def test_gate_3_fires_when_sources_disagree():
    up = ScreenConfig(bootstrap=FAST, simulation={"effects": {"A": 1.0, "B": 1.0, "C": 1.0, "D": -0.8, "E": 0.8}})
    down = ScreenConfig(bootstrap=FAST, simulation={"effects": {"A": -1.0, "B": -1.0, "C": -1.0, "D": -0.8, "E": 0.8}})
    personas = load_panels().eval_personas(up.sources, up.eval.personas)
    parts = [
        simulate_cell_answers(up if c.source != "programmer" else down, c, personas, 20, 5, 0)
        for c in all_slab_cells(up)
    ]
    result = compute(up, pl.concat(parts), [c.id for c in all_slab_cells(up)])
    g3 = next(g for g in result.metrics.gates if g.number == 3)
    assert g3.fired and g3.numbers["flipped_sr"] == ["A", "B", "C"]


def test_gate_4_fires_on_a_null_screen():
    null = {"effects": {}, "leak_effects": {}}
    config = ScreenConfig(bootstrap=FAST, simulation=null)
    cells = all_slab_cells(config)
    result = compute(config, simulate_screen(config, cells, screen_seed=4), [c.id for c in cells])
    g4 = next(g for g in result.metrics.gates if g.number == 4)
    assert g4.fired and g4.numbers["largest_abs_d"] < 0.15
    # and the default planted screen does not fire it
    config = ScreenConfig(bootstrap=FAST)
    result = compute(config, simulate_screen(config, cells, screen_seed=4), [c.id for c in cells])
    assert not next(g for g in result.metrics.gates if g.number == 4).fired


# --------------------------------------------------------------------------- a whole aggregation, on disk


@pytest.fixture(scope="module")
def screen():
    config = ScreenConfig(bootstrap=FAST)
    slab = all_slab_cells(config)
    multi = [Cell(c.source, c.levels, seed) for c in slab[31::32] for seed in config.seeds.multiseed]
    answers = simulate_screen(config, slab + multi)
    return config, slab, multi, answers


def test_artifacts_validate_and_describe_themselves(screen, tmp_path):
    config, slab, multi, answers = screen
    extras = {
        "pre_screen": gates.contamination(0.0004, config.gates.contamination, answers=19_200),
        "smoke": gates.smoke([0.2, 0.5, 0.1, 0.7], config.gates.smoke_floor, config.gates.smoke_ceiling).model_dump(),
        "gates": [gates.cost_overrun(3.0, 40.0, 60.0)],
        "note": "from the flow",
    }
    result = aggregate(config, answers, [c.id for c in slab + multi], tmp_path, extras=extras)
    for name in ("main_effects.json", "interactions.json", "aggregate_metrics.json", "clean_result.html",
                 "figures/factor_ranking.json", "figures/ab_interaction.html", "figures/persona_heatmap.json"):
        assert (tmp_path / name).is_file(), name
    main = MainEffectsFile.model_validate_json((tmp_path / "main_effects.json").read_text())
    inter = InteractionsFile.model_validate_json((tmp_path / "interactions.json").read_text())
    metrics = AggregateMetricsFile.model_validate_json((tmp_path / "aggregate_metrics.json").read_text())
    for doc in (main, inter, metrics):
        assert doc.config == json.loads(config.model_dump_json())
        assert doc.provenance["code_version"] and "numpy" in doc.provenance["libraries"]
        assert not doc.coverage.partial and doc.coverage.factorial_cells == 96
    assert len(main.effects) == 5 * 2 * 4  # factors x responses x (3 sources + pooled)
    assert len(inter.interactions) == 10 * 2 * 4
    assert {e.term for e in inter.interactions if e.pre_registered} == {"A:B"}
    assert {e.status for e in inter.interactions if e.term != "A:B"} == {"exploratory"}
    assert main.sign_table["SR"]["A"] == {s: 1 for s in config.sources}
    assert [g.number for g in metrics.gates] == [1, 2, 3, 4, 5]
    assert metrics.extras["note"] == "from the flow"
    assert len(metrics.predictions) == 9 and all(p.deciding for p in metrics.predictions)
    assert result.timings_s["total"] > 0
    html = (tmp_path / "clean_result.html").read_text()
    assert "pre-screen contamination" in html and "not recorded" not in html
    # gate 6 was never passed, and an in-process run has no GPU job for it to watch
    assert "does not apply</span></td><td>in-process run: no GPU job whose progress could stall" in html
    assert "Partial screen" not in html


def test_multiseed_cells_do_not_enter_the_factorial(screen):
    config, slab, multi, answers = screen
    with_multi = compute(config, answers, [c.id for c in slab + multi])
    slab_only = compute(config, answers.filter(pl.col("seed") == config.seeds.primary), [c.id for c in slab])
    a = {(e.response, e.term, e.source): (e.effect, e.d) for e in with_multi.estimates.estimates}
    b = {(e.response, e.term, e.source): (e.effect, e.d) for e in slab_only.estimates.estimates}
    assert a == b
    # they do enter the training-run estimate, as seed replicates: one cell x 2 more seeds = 2 df per source
    for response in ("SR", "LR"):
        for source, noise in with_multi.estimates.training[response].items():
            assert noise.replicate_df == 2, (response, source)
            assert slab_only.estimates.training[response][source].replicate_df == 0
    reps = with_multi.metrics.seed_replicates
    assert len(reps) == 3 and all(r.seeds == [42, 137, 256] and r.SR_sd is not None for r in reps)
    assert sum(not c.in_factorial for c in with_multi.metrics.cells) == len(multi)


def test_bootstrap_is_seeded(screen):
    config, slab, _, answers = screen
    sub = answers.filter(pl.col("source") == "programmer")
    ids = [c.id for c in slab if c.source == "programmer"]
    one = compute(config, sub, ids).estimates.find("SR", "A")
    two = compute(config, sub, ids).estimates.find("SR", "A")
    other = compute(config.model_copy(update={"bootstrap": config.bootstrap.model_copy(update={"seed": 99})}), sub, ids)
    assert one.d_ci == two.d_ci
    assert other.estimates.find("SR", "A").d_ci != one.d_ci
    assert other.estimates.find("SR", "A").d == one.d  # the estimate itself does not depend on the resamples


def test_partial_screen_is_reported_honestly(screen, tmp_path):
    config, slab, multi, answers = screen
    dropped = [c.id for c in slab if c.source == "programmer"][:3] + [multi[0].id]
    present = answers.filter(~pl.col("cell_id").is_in(dropped))
    result = aggregate(config, present, [c.id for c in slab + multi], tmp_path)
    cov = result.metrics.coverage
    assert cov.partial and cov.missing_cells == dropped and cov.factorial_missing == dropped[:3]
    assert cov.factorial_cells == 93
    for e in result.main_effects.effects:
        assert e.partial is (e.source in ("programmer", "pooled")), (e.source, e.partial)
    assert all(p.partial for p in result.metrics.predictions)
    html = (tmp_path / "clean_result.html").read_text()
    assert "Partial screen" in html and all(c in html for c in dropped)
    assert "PARTIAL" in (tmp_path / "figures" / "factor_ranking.json").read_text()
    on_disk = json.loads((tmp_path / "main_effects.json").read_text())
    assert on_disk["coverage"]["missing_cells"] == dropped


def test_pre_screen_rows_are_ignored_and_empty_input_still_reports(tmp_path):
    from eps_screen.run.simulate import simulate_base_answers

    config = ScreenConfig(bootstrap=FAST)
    base = simulate_base_answers(config)
    result = aggregate(config, base, [c.id for c in all_slab_cells(config)], tmp_path)
    assert result.metrics.coverage.present == 0 and len(result.metrics.coverage.missing_cells) == 96
    assert result.main_effects.effects == [] and result.metrics.predictions == []
    assert "No factorial cell results yet" in (tmp_path / "clean_result.html").read_text()


# --------------------------------------------------------------------------- predictions


@pytest.mark.parametrize(
    "rule, low, high, verdict",
    [
        (Rule("above", 0.4), 0.41, 0.9, "confirmed"),
        (Rule("above", 0.4), 0.1, 0.39, "not confirmed"),
        (Rule("above", 0.4), 0.3, 0.5, "inconclusive"),
        (Rule("below", -0.3), -0.6, -0.31, "confirmed"),
        (Rule("below", -0.3), -0.2, 0.1, "not confirmed"),
        (Rule("below", -0.3), -0.4, -0.2, "inconclusive"),
        (Rule("inside", 0.15), -0.1, 0.14, "confirmed"),
        (Rule("inside", 0.15), 0.16, 0.3, "not confirmed"),
        (Rule("inside", 0.15), -0.4, -0.2, "not confirmed"),
        (Rule("inside", 0.15), 0.05, 0.2, "inconclusive"),
        (Rule("above", 0.4), None, None, "not evaluable"),
    ],
)
def test_prediction_rules(rule, low, high, verdict):
    assert rule.verdict(Interval(low=low, high=high)) == verdict


def test_judge_predictions_from_draws():
    rng = np.random.default_rng(0)

    def around(x: float, sd: float = 0.01) -> tuple[float, np.ndarray]:
        return x, x + sd * rng.standard_normal(4000)

    values = {
        ("SR", "A"): 0.6, ("SR", "E"): -0.1, ("SR", "D"): -0.2, ("SR", "B"): -0.5, ("SR", "C"): 0.01,
        ("SR", "A:B"): -0.5, ("LR", "A"): -0.2, ("LR", "E"): 0.2, ("LR", "D"): 0.0,
    }
    draws = {k: around(v) for k, v in values.items()}
    terms = [term_name(t) for t in reported_terms(FACTOR_NAMES)]
    out = {p.id: p for p in judge_predictions(MARKER_PREDICTIONS, lambda r, t, scale: draws.get((r, t), around(0.1)),
                                              terms, 0.95)}
    assert out["P1"].verdict == "confirmed"  # 0.6 >= 0.4
    assert out["P2"].verdict == "not confirmed"  # -0.1 is not <= -0.3
    assert out["P3"].verdict == "inconclusive"  # -0.2 sits on the threshold
    assert out["P4"].verdict == "confirmed"
    assert out["P5"].verdict == "confirmed"
    assert out["P6"].verdict == "confirmed" and out["P6"].estimate == pytest.approx(5.0)  # 0.5 / 0.1
    assert out["P7a"].verdict == "confirmed" and out["P7b"].verdict == "not confirmed"
    assert out["P7c"].verdict == "inconclusive"  # D on LR is 0: the product's CI spans 0
    assert "CI" in out["P1"].deciding and "0.600" in out["P1"].deciding


def test_a_missing_source_makes_pooled_partial(screen):
    config, slab, _, answers = screen
    present = answers.filter(pl.col("source") != "programmer")
    result = compute(config, present, [c.id for c in slab])
    assert result.estimates.sources == ["librarian", "surgeon"]
    assert result.estimates.find("SR", "A").partial
    assert not result.estimates.find("SR", "A", "librarian").partial
    assert len(result.metrics.coverage.factorial_missing) == 32


def test_a_declared_rule_on_the_rate_scale_and_a_ratio_of_main_effects():
    """Rules are judged from the scale and quantity they name, not from the marker screen's list."""
    rng = np.random.default_rng(1)
    values = {("SR", "A", "effect"): 0.12, ("SR", "A", "d"): 0.9, ("SR", "B", "d"): 0.2, ("SR", "C", "d"): 0.1}
    draws = {k: (v, v + 0.01 * rng.standard_normal(4000)) for k, v in values.items()}
    rules = [
        PredictionRule(id="R1", statement="A raises SR by 10 points", term="A", scale="effect", direction="above",
                       threshold=0.1),
        PredictionRule(id="R2", statement="A dominates", term="A", quantity="ratio_to_next", direction="above",
                       threshold=3.0),
    ]
    out = judge_predictions(rules, lambda r, t, scale: draws[(r, t, scale)], ["A", "B", "C", "A:B"], 0.95)
    assert [p.verdict for p in out] == ["confirmed", "confirmed"]
    assert out[0].threshold == "pooled effect(A on SR) >= 0.1"
    assert out[1].estimate == pytest.approx(4.5)  # 0.9 / 0.2: main effects against main effects only
