"""The simulated backend: the answers-table schema, what 'planted' means, reproducibility, and speed."""

from __future__ import annotations

import time

import numpy as np
import polars as pl
import pytest

from eps_screen.panels import load_panels
from eps_screen.run.scoring import answer_schema
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import Cell, all_slab_cells
from eps_screen.run.simulate import (
    _mean_sigmoid,
    cell_effect,
    expected_rates,
    leak_logit,
    simulate_base_answers,
    simulate_cell_answers,
    simulate_screen,
    source_logit,
    true_effects,
)

CONFIG = ScreenConfig()
FACTORS = tuple(CONFIG.factors)  # the marker screen's A-E
PERSONAS = load_panels().eval_personas(CONFIG.sources, CONFIG.eval.personas)


def quiet(**simulation) -> ScreenConfig:
    """A config whose only randomness is the answer draws (no question or persona effects)."""
    return ScreenConfig(simulation={"question_sd": 0.0, "persona_sd": 0.0, **simulation})


def test_schema_and_sizes():
    cell = Cell("nurse", (1, 0, 1, 0, 1), 42)
    df = simulate_cell_answers(CONFIG, cell, PERSONAS, n_questions=20, n_samples=5, n_random=20)
    assert df.schema == pl.Schema(answer_schema(FACTORS))
    persona = df.filter(pl.col("panel") == "persona")
    assert persona.height == 24 * 20 * 5 and df.height == 24 * 20 * 5 + 20 * 5
    assert persona.filter(pl.col("is_source")).get_column("persona").unique().to_list() == ["nurse"]
    assert persona.filter(pl.col("is_source")).height == 100
    random = df.filter(pl.col("panel") == "random")
    assert set(random.get_column("persona").to_list()) == {"random"} and not random.get_column("is_source").any()
    assert df.select(FACTORS).unique().rows() == [(1, 0, 1, 0, 1)]
    assert set(df.get_column("cell_id").to_list()) == {cell.id}


def test_source_must_be_a_persona():
    with pytest.raises(ValueError, match="not among the eval personas"):
        simulate_cell_answers(CONFIG, Cell("nurse", (0,) * 5, 42), ["librarian", "chef"], 2, 1, 0)


def test_planted_effects_are_logit_differences():
    """effects[F] is the log-odds difference F high - F low; effects[AB] is half the change in A's effect across B."""
    sim = ScreenConfig(simulation={"base_logit": -0.5,
                                   "effects": {"A": 0.8, "B": -0.6, "C": 0.0, "D": -0.4, "E": -0.6, "AB": -0.8}}).simulation

    def logit(levels):
        return source_logit(sim, Cell("nurse", levels, 42), FACTORS)

    a_at_b0 = logit((1, 0, 0, 0, 0)) - logit((0, 0, 0, 0, 0))
    a_at_b1 = logit((1, 1, 0, 0, 0)) - logit((0, 1, 0, 0, 0))
    assert (a_at_b0 + a_at_b1) / 2 == pytest.approx(0.8)  # A's effect, averaged over B
    assert (a_at_b1 - a_at_b0) / 2 == pytest.approx(-0.8)  # the A x B interaction effect
    assert logit((0, 0, 0, 1, 1)) - logit((0, 0, 0, 0, 1)) == pytest.approx(-0.4)
    # the grand mean of the logit over all 32 cells is the base logit
    assert np.mean([logit(c.levels) for c in all_slab_cells(CONFIG)[:32]]) == pytest.approx(-0.5)
    leak = [leak_logit(sim, Cell("nurse", lv, 42), FACTORS) for lv in ((0, 0, 0, 0, 0), (1, 0, 0, 0, 0))]
    assert leak[1] - leak[0] == pytest.approx(sim.leak_effects["A"])
    assert np.mean([leak_logit(sim, c, FACTORS) for c in all_slab_cells(CONFIG)[:32]]) == pytest.approx(-0.5 + sim.leak_offset)


def test_rates_follow_the_planted_logits():
    config = quiet(base_logit=0.0, effects={"A": 2.0}, leak_effects={}, leak_offset=-1.0)
    hi = simulate_cell_answers(config, Cell("nurse", (1, 0, 0, 0, 0), 42), PERSONAS, 20, 250, 20)
    lo = simulate_cell_answers(config, Cell("nurse", (0, 0, 0, 0, 0), 42), PERSONAS, 20, 250, 20)

    def sr(df):
        return df.filter(pl.col("is_source")).get_column("marker").mean()

    def lr(df):
        return df.filter((pl.col("panel") == "persona") & ~pl.col("is_source")).get_column("marker").mean()

    sigmoid = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    assert sr(hi) == pytest.approx(sigmoid(1.0), abs=0.02)  # 5,000 answers: SE 0.006
    assert sr(lo) == pytest.approx(sigmoid(-1.0), abs=0.02)
    assert lr(hi) == pytest.approx(sigmoid(-1.0), abs=0.01)
    assert lr(lo) == pytest.approx(sigmoid(-1.0), abs=0.01)


def test_random_effects_shared_across_cells_and_draws_reproducible():
    config = ScreenConfig(simulation={"question_sd": 2.0, "persona_sd": 0.0})
    a = simulate_cell_answers(config, Cell("nurse", (0,) * 5, 42), PERSONAS, 20, 40, 0)
    again = simulate_cell_answers(config, Cell("nurse", (0,) * 5, 42), PERSONAS, 20, 40, 0)
    other_seed = simulate_cell_answers(config, Cell("nurse", (0,) * 5, 137), PERSONAS, 20, 40, 0)
    assert a.equals(again)
    assert not a.get_column("marker").equals(other_seed.get_column("marker"))
    # the same questions are easy / hard in both cells: per-question rates correlate strongly
    per_q = [d.group_by("question").agg(pl.col("marker").mean()).sort("question").get_column("marker").to_numpy() for d in (a, other_seed)]
    assert np.corrcoef(*per_q)[0, 1] > 0.8
    # a different screen seed draws different question effects
    fresh = simulate_cell_answers(config, Cell("nurse", (0,) * 5, 42), PERSONAS, 20, 40, 0, screen_seed=9)
    per_q_fresh = fresh.group_by("question").agg(pl.col("marker").mean()).sort("question").get_column("marker").to_numpy()
    assert np.corrcoef(per_q[0], per_q_fresh)[0, 1] < 0.8


def test_base_answers():
    df = simulate_base_answers(CONFIG, {"A": 1, "B": 0, "C": 1})
    assert set(df.get_column("cell_id").to_list()) == {"base-A1B0C1"}
    assert df.get_column("source").null_count() == df.height
    assert all(df.get_column(f).null_count() == df.height for f in FACTORS)
    assert not df.get_column("is_source").any()
    assert df.height == 24 * 20 * 5 + 20 * 5
    assert df.get_column("marker").mean() < 0.01
    assert not simulate_base_answers(CONFIG, {"A": 0, "B": 0, "C": 0}).equals(df)


def test_expected_rates_quadrature():
    rng = np.random.default_rng(0)
    z = rng.standard_normal(2_000_000)
    for eta, sd in ((0.3, 0.5), (-2.5, 1.2)):
        assert _mean_sigmoid(eta, sd) == pytest.approx(np.mean(1 / (1 + np.exp(-(eta + sd * z)))), abs=1e-3)


def test_expected_rates_match_a_huge_simulation():
    """expected_rates is what the simulator produces on average (questions averaged for SR, personas for LR)."""
    config = ScreenConfig(simulation={"question_sd": 0.0, "persona_sd": 0.7})
    cells = [Cell("nurse", (1, 0, 0, 1, 0), 42)]
    truth = expected_rates(config, cells, PERSONAS, 20).row(0, named=True)
    df = simulate_cell_answers(config, cells[0], PERSONAS, 20, 400, 0)
    sr = df.filter(pl.col("is_source")).get_column("marker").mean()
    # SR has no question noise here, so it is sigmoid(fixed + v_nurse) exactly, in expectation
    assert sr == pytest.approx(truth["SR"], abs=0.02)
    # LR's truth averages over the persona population; 23 drawn personas are close to it
    lr = df.filter((pl.col("panel") == "persona") & ~pl.col("is_source")).group_by("persona").agg(pl.col("marker").mean())
    assert lr.get_column("marker").mean() == pytest.approx(truth["LR"], abs=0.03)


def test_true_effects_have_the_planted_signs():
    truth = true_effects(CONFIG, all_slab_cells(CONFIG), PERSONAS, 20)
    planted = CONFIG.simulation
    for f, v in planted.effects.items():
        f = ":".join(f)  # a term by its letters, as the estimates name it: AB -> A:B
        if v:
            assert np.sign(truth[("SR", "pooled", f)]["d"]) == np.sign(v)
        else:
            assert truth[("SR", "pooled", f)]["d"] == pytest.approx(0.0, abs=1e-12)
    for f, v in planted.leak_effects.items():
        effect = truth[("LR", "pooled", f)]["effect"]
        assert np.sign(effect) == np.sign(v) if v else effect == pytest.approx(0.0, abs=1e-12)


def test_training_noise_is_one_shift_per_adapter():
    """cell_sd: one log-odds shift per cell id, shared by every persona and control prompt of that adapter."""
    source = CONFIG.sources[0]
    noisy = ScreenConfig(simulation={"cell_sd": 0.7})
    cell = Cell(source, (1, 0, 1, 0, 0), 42)
    e = cell_effect(noisy.simulation, cell, 5)
    assert e != 0 and e == cell_effect(noisy.simulation, cell, 5)
    assert cell_effect(noisy.simulation, Cell(source, cell.levels, 137), 5) != e  # another training seed, another run
    assert cell_effect(CONFIG.simulation, cell, 5) == 0.0  # the default plants none
    # the answers equal those of a noise-free simulator whose base log-odds is shifted by e (same answer draws)
    shifted = ScreenConfig(simulation={"base_logit": CONFIG.simulation.base_logit + e})
    with_noise = simulate_cell_answers(noisy, cell, PERSONAS, 6, 3, 4, screen_seed=5)
    assert with_noise.equals(simulate_cell_answers(shifted, cell, PERSONAS, 6, 3, 4, screen_seed=5))


def test_truth_averages_over_training_runs():
    """With cell_sd, the planted rates are the mean over training runs (seeds) of the same cell."""
    source = CONFIG.sources[0]
    config = quiet(cell_sd=0.9, base_logit=1.0, leak_offset=-2.0)
    personas = [source, *[p for p in PERSONAS if p != source][:2]]
    truth = expected_rates(config, [Cell(source, (0,) * 5, 42)], personas, 2).row(0, named=True)
    sr, lr = [], []
    for seed in range(400):
        df = simulate_cell_answers(config, Cell(source, (0,) * 5, seed), personas, 2, 10, 0)
        sr.append(df.filter(pl.col("is_source")).get_column("marker").mean())
        lr.append(df.filter(~pl.col("is_source")).get_column("marker").mean())
    assert np.mean(sr) == pytest.approx(truth["SR"], abs=0.02)
    assert np.mean(lr) == pytest.approx(truth["LR"], abs=0.02)
    # attenuated towards 1/2 against a single run without noise: the truth is not sigmoid(fixed logit)
    assert truth["SR"] < 1 / (1 + np.exp(-1.0)) - 0.02


def test_qwen7b_size_screen_is_fast():
    slab = all_slab_cells(CONFIG)
    multiseed = [Cell(c.source, c.levels, seed) for c in slab[29::32] + slab[30::32] + slab[31::32] for seed in (137, 256)]
    smoke_at_own_seed = [Cell("librarian", c.levels, 43) for c in slab[:8]]
    cells = slab + multiseed + smoke_at_own_seed
    assert len({c.id for c in cells}) == 122
    # This process's CPU time (all its threads), not the wall clock: other work on a loaded 2-core box stretches the
    # wall clock, not the CPU this simulation burns (about 0.25 s here).
    cpu = time.process_time()
    df = simulate_screen(CONFIG, cells)
    cpu_s = time.process_time() - cpu
    assert df.filter(pl.col("panel") == "persona").height == 122 * 2400
    assert cpu_s < 5.0, f"simulating 122 cells took {cpu_s:.1f} s of CPU"


# --------------------------------------------------------------------------- a screen of other factors


RECIPE = [("A", "lora.rank", 8, 32), ("B", "training.learning_rate", 1e-5, 1e-4), ("C", "training.epochs", 1, 3),
          ("D", "data.positives", 100, 200), ("E", "lora.alpha", 16, 64), ("F", "eval.temperature", 0.7, 1.0)]


def test_a_fractional_six_factor_screen_recovers_its_planted_effects():
    """A 2^(6-2) (E = ABC, F = BCD, resolution IV) of six fields, effects planted on A, B, D, F and an A x B
    interaction: every main effect's CI covers the planted value (per source and pooled), and each planted effect
    is found with its sign."""
    from eps_screen.run.aggregate import compute

    factors = [{"short": s, "label": path, "levels": [{"description": f"{path} {lo}", "sets": {path: lo}},
                                                      {"description": f"{path} {hi}", "sets": {path: hi}}]}
               for s, path, lo, hi in RECIPE]
    config = ScreenConfig(
        design={"factors": factors, "slab": {"generators": ["E=ABC", "F=BCD"]}},
        bootstrap={"resamples": 2000, "seed": 3},
        simulation={"effects": {"A": 1.0, "B": -0.8, "D": 0.5, "F": -0.6, "AB": 0.4}, "leak_effects": {"A": -0.6, "F": 0.5},
                    "cell_sd": 0.3},
    )
    cells = all_slab_cells(config)
    assert len(cells) == 16 * 3 and cells[0].id == "librarian-A0B0C0D0E0F0-s42"
    answers = simulate_screen(config, cells, PERSONAS, screen_seed=1)
    truth = true_effects(config, cells, PERSONAS, config.eval.questions, screen_seed=1)
    est = compute(config, answers, [c.id for c in cells]).estimates
    assert est.factors == tuple("ABCDEF") and est.pre_registered == ()  # not the marker screen: nothing by default
    mains = [e for e in est.estimates if len(e.factors) == 1]
    assert len(mains) == 6 * 2 * 4
    missed = [(e.response, e.term, e.source) for e in mains if not e.effect_ci.contains(truth[(e.response, e.source, e.term)]["effect"])]
    assert not missed
    for response, planted in (("SR", {"A": 1, "B": -1, "D": 1, "F": -1}), ("LR", {"A": -1, "F": 1})):
        for term, sign in planted.items():
            iv = est.find(response, term).effect_ci
            assert (iv.low > 0) if sign > 0 else (iv.high < 0), (response, term, iv)
    # resolution IV: A:B is aliased with C:E; their shared contrast carries the planted A x B, and its CI covers it
    ab = est.find("SR", "A:B")
    assert ab.effect == est.find("SR", "C:E").effect and ab.effect > 0
    assert ab.effect_ci.contains(truth[("SR", "pooled", "A:B")]["effect"])
