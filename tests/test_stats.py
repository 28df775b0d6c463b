"""Known-answer tests of the generic factorial statistics and the vectorised clustered bootstrap."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest

from eps_screen.spec.design import fraction, full_factorial
from eps_screen.analysis.stats import (
    DesignError,
    cohens_d_rates,
    factorial_effects,
    few_cluster_factor,
    flipped_factors,
    percentile_ci,
    resample_counts,
    sign_table,
    t_critical,
    weighted_ratio,
)
from eps_screen.analysis.training_noise import (
    CellNoise,
    cell_noise,
    noise_contrasts,
    pooled_df,
    replicate_contrasts,
    residual_contrasts,
    residual_projector,
)


def table_from_runs(runs, names, y) -> pl.DataFrame:
    cols = {n: [r[i] for r in runs] for i, n in enumerate(names)}
    return pl.DataFrame({**cols, "y": y})


# --------------------------------------------------------------------------- effects


def test_two_by_two_by_hand():
    # y at (A,B) = (0,0) 1, (1,0) 3, (0,1) 2, (1,1) 8:
    # A = (3+8)/2 - (1+2)/2 = 4; B = (2+8)/2 - (1+3)/2 = 3; AB = (1+8)/2 - (3+2)/2 = 2
    t = pl.DataFrame({"A": [0, 1, 0, 1], "B": [0, 0, 1, 1], "y": [1.0, 3.0, 2.0, 8.0]})
    e = factorial_effects(t, "y")
    assert e.main_effects == {"A": 4.0, "B": 3.0}
    assert e.interactions == {"A:B": 2.0}
    assert e.mean == 3.5


def test_box_hunter_hunter_pilot_plant():
    # BHH (2nd ed.) Table 5.3: the 2^3 pilot-plant yields in standard order; published effects
    # T = 23.0, C = -5.0, K = 1.5, TC = 1.5, TK = 10.0, CK = 0.0.
    t = table_from_runs(full_factorial(3), ["T", "C", "K"], [60, 72, 54, 68, 52, 83, 45, 80])
    e = factorial_effects(t, "y")
    assert e.main_effects == pytest.approx({"T": 23.0, "C": -5.0, "K": 1.5})
    assert e.interactions == pytest.approx({"T:C": 1.5, "T:K": 10.0, "C:K": 0.0})
    assert e.mean == pytest.approx(64.25)


def test_any_two_numbers_smaller_is_low():
    base = factorial_effects(table_from_runs(full_factorial(3), ["T", "C", "K"], [60, 72, 54, 68, 52, 83, 45, 80]), "y")
    runs = full_factorial(3)
    recoded = pl.DataFrame({
        "T": [(-1, 1)[r[0]] for r in runs],  # -1/+1
        "C": [(150, 20)[r[1]] for r in runs],  # high level written first numerically reversed: 20 < 150
        "K": [(2.5, 7.0)[r[2]] for r in runs],
        "y": [60, 72, 54, 68, 52, 83, 45, 80],
    })
    e = factorial_effects(recoded, "y")
    assert e.levels["C"] == (20.0, 150.0)
    assert e.main_effects["T"] == pytest.approx(base.main_effects["T"])
    assert e.main_effects["C"] == pytest.approx(-base.main_effects["C"])  # 20 is now "low"
    assert e.main_effects["K"] == pytest.approx(base.main_effects["K"])
    assert e.interactions["T:C"] == pytest.approx(-base.interactions["T:C"])


def test_replicates_average():
    t = pl.DataFrame({"A": [0, 1, 0, 1] * 2, "B": [0, 0, 1, 1] * 2, "y": [1.0, 3, 2, 8, 3, 5, 4, 10]})
    e = factorial_effects(t, "y")
    assert e.main_effects == {"A": 4.0, "B": 3.0}
    assert e.interactions == {"A:B": 2.0}
    assert e.mean == 4.5


def test_regular_fraction_is_accepted_and_aliases_show():
    runs = fraction("ABCDE", ["D=AB", "E=AC"], "test").runs()  # D = AB, E = AC
    y = np.arange(8, dtype=float) ** 1.5
    e = factorial_effects(table_from_runs(runs, list("ABCDE"), y), "y")
    assert e.main_effects["D"] == pytest.approx(e.interactions["A:B"])
    assert e.main_effects["E"] == pytest.approx(e.interactions["A:C"])
    assert e.main_effects["A"] == pytest.approx(e.interactions["B:D"]) == pytest.approx(e.interactions["C:E"])


def test_factors_default_to_other_columns_and_can_be_chosen():
    t = pl.DataFrame({"A": [0, 1, 0, 1], "B": [0, 0, 1, 1], "y": [1.0, 3, 2, 8]})
    assert list(factorial_effects(t, "y", ["B"]).main_effects) == ["B"]
    assert factorial_effects(t, "y", ["B"]).interactions == {}


@pytest.mark.parametrize(
    "table, factors, fragment",
    [
        (pl.DataFrame({"A": [0, 1, 2, 0], "y": [1.0, 2, 3, 4]}), None, "'A' has 3 distinct"),
        (pl.DataFrame({"A": [1, 1, 1, 1], "y": [1.0, 2, 3, 4]}), None, "'A' has 1 distinct"),
        (pl.DataFrame({"A": [0, 1, 1, 1], "y": [1.0, 2, 3, 4]}), None, "'A' is unbalanced: 1 run(s) at 0, 3 at 1"),
        (pl.DataFrame({"A": [0, 0, 1, 1], "B": [0, 0, 1, 1], "y": [1.0, 2, 3, 4]}), None, "'A' and 'B' are not balanced"),
        (pl.DataFrame({"A": ["lo", "hi", "lo", "hi"], "y": [1.0, 2, 3, 4]}), None, "'A' holds String"),
        (pl.DataFrame({"A": [0, 1, None, 1], "y": [1.0, 2, 3, 4]}), None, "'A' has 1 empty"),
        (pl.DataFrame({"A": [0, 1, 0, 1], "y": [1.0, 2, 3, 4]}), ["Z"], "'Z' is not in the table"),
        (pl.DataFrame({"A": [0, 1, 0, 1], "y": ["a", "b", "c", "d"]}), None, "response column 'y' holds String"),
        (pl.DataFrame({"A": [0, 1, 0, 1], "y": [1.0, None, 3, 4]}), None, "'y' has 1 empty"),
        (pl.DataFrame({"A": [0, 1, 0, 1], "y": [1.0, 2, 3, 4]}), ["y"], "both the response and a factor"),
    ],
)
def test_bad_tables_name_the_column(table, factors, fragment):
    with pytest.raises(DesignError) as err:
        factorial_effects(table, "y", factors)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_unbalanced_allowed_when_asked():
    t = pl.DataFrame({"A": [0, 1, 1], "y": [1.0, 2, 4]})
    assert factorial_effects(t, "y", require_balance=False).main_effects["A"] == pytest.approx(2.0)


# --------------------------------------------------------------------------- Cohen's d


def test_cohens_d_formula():
    assert cohens_d_rates(0.6, 0.4) == pytest.approx(0.2 / np.sqrt(0.24))
    assert cohens_d_rates(0.4, 0.6) == pytest.approx(-0.2 / np.sqrt(0.24))
    assert np.isnan(cohens_d_rates(0.0, 0.0))  # every answer identical: no SD, no d
    assert np.isnan(cohens_d_rates(1.0, 0.0))


def test_cohens_d_is_the_two_group_d_of_the_answers():
    """The docstring's claim: d from level means equals Cohen's d of the individual 0/1 answers."""
    rng = np.random.default_rng(3)
    answers_per_cell = 100
    hi_counts = rng.integers(20, 90, size=16)
    lo_counts = rng.integers(5, 60, size=16)
    hi = np.concatenate([np.r_[np.ones(k), np.zeros(answers_per_cell - k)] for k in hi_counts])
    lo = np.concatenate([np.r_[np.ones(k), np.zeros(answers_per_cell - k)] for k in lo_counts])
    pooled_sd = np.sqrt((hi.size * hi.var() + lo.size * lo.var()) / (hi.size + lo.size))
    classical = (hi.mean() - lo.mean()) / pooled_sd
    m_hi, m_lo = (hi_counts / answers_per_cell).mean(), (lo_counts / answers_per_cell).mean()
    assert cohens_d_rates(m_hi, m_lo, 16, 16) == pytest.approx(classical, rel=1e-12)


def test_cohens_d_broadcasts_over_resamples():
    m_hi = np.array([[0.5, 0.6], [0.3, 0.2]])
    m_lo = np.array([[0.4, 0.4], [0.3, 0.1]])
    d = cohens_d_rates(m_hi, m_lo, np.array([[16], [8]]), np.array([[16], [8]]))
    assert d.shape == (2, 2)
    assert d[0, 1] == pytest.approx(cohens_d_rates(0.6, 0.4))
    assert d[1, 0] == 0.0


# --------------------------------------------------------------------------- the clustered bootstrap


def test_resample_counts_are_draws_with_replacement():
    rng = np.random.default_rng(0)
    w = resample_counts(20, 5000, rng)
    assert w.shape == (5000, 20)
    assert (w.sum(axis=1) == 20).all()
    assert w.mean() == pytest.approx(1.0)
    # each cluster's count is Binomial(20, 1/20): variance 20 * (1/20) * (19/20)
    assert w[:, 0].var() == pytest.approx(0.95, rel=0.08)
    assert (resample_counts(20, 10, np.random.default_rng(5)) == resample_counts(20, 10, np.random.default_rng(5))).all()


def test_weighted_ratio_matches_an_explicit_resampling_loop():
    """The matrix product gives exactly what resampling clusters one by one gives."""
    rng = np.random.default_rng(1)
    n_cells, n_clusters = 6, 20
    markers = rng.integers(0, 6, size=(n_cells, n_clusters)).astype(float)
    answers = np.full((n_cells, n_clusters), 5.0)
    answers[0, 3] = 0.0  # a cell with no answers to one question
    weights = resample_counts(n_clusters, 50, rng)
    fast = weighted_ratio(markers, answers, weights)
    for b in range(weights.shape[0]):
        drawn = np.repeat(np.arange(n_clusters), weights[b])  # the indices a loop would have drawn
        slow = markers[:, drawn].sum(axis=1) / answers[:, drawn].sum(axis=1)
        np.testing.assert_allclose(fast[:, b], slow, rtol=1e-12)
    observed = weighted_ratio(markers, answers, np.ones((1, n_clusters)))[:, 0]
    np.testing.assert_allclose(observed, markers.sum(1) / answers.sum(1))


def test_weighted_ratio_mean_of_masked_rates():
    rates = np.array([[0.1, 0.5, 0.9], [0.2, 0.4, 0.0]])
    mask = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])  # e.g. each row's own source persona left out
    w = np.array([[2, 1, 0], [0, 0, 3]])
    out = weighted_ratio(rates * mask, mask, w)
    assert out[0, 0] == pytest.approx((2 * 0.1 + 0.5) / 3)
    assert np.isnan(out[0, 1])  # only the masked-out cluster was drawn
    assert out[1, 1] == pytest.approx(0.0)


def test_percentile_ci_and_widening():
    samples = np.arange(1, 10001, dtype=float)[None, :]
    lo, hi = percentile_ci(samples, 0.95)
    assert lo[0] == pytest.approx(250.975) and hi[0] == pytest.approx(9750.025)
    wlo, whi = percentile_ci(samples, 0.95, center=5000.0, widen=1.1)
    assert wlo[0] == pytest.approx(5000 + 1.1 * (250.975 - 5000))
    assert whi[0] == pytest.approx(5000 + 1.1 * (9750.025 - 5000))
    with_nan = np.array([[np.nan, 1.0, 2.0, 3.0], [np.nan] * 4])
    lo, hi = percentile_ci(with_nan, 0.5)
    assert lo[0] == pytest.approx(1.5) and np.isnan(lo[1])


def test_t_quantiles_and_few_cluster_factor():
    # published two-sided 95% t critical values
    for df, t in ((5, 2.5706), (10, 2.2281), (19, 2.0930), (23, 2.0687), (60, 2.0003)):
        assert t_critical(0.975, df) == pytest.approx(t, abs=5e-5)
    assert few_cluster_factor(20, 0.95) == pytest.approx(np.sqrt(20 / 19) * 2.0930 / 1.95996, abs=1e-3)
    assert few_cluster_factor(24, 0.95) < few_cluster_factor(20, 0.95)
    assert few_cluster_factor(100_000, 0.95) == pytest.approx(1.0, abs=1e-3)


# --------------------------------------------------------------------------- training-run variance


def _reported_columns(runs: np.ndarray) -> np.ndarray:
    """The screen's 15 reported terms (5 main effects, 10 two-factor interactions) of -1/+1 runs."""
    k = runs.shape[1]
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
    return np.column_stack([runs, *[runs[:, i] * runs[:, j] for i, j in pairs]])


FULL = 2.0 * np.array(full_factorial(), dtype=float) - 1.0  # 32 x 5


def test_residual_projector_is_the_unreported_contrasts():
    r = residual_projector(_reported_columns(FULL))
    assert np.trace(r) == pytest.approx(16)  # 31 contrasts - 15 reported = the 10 + 5 + 1 of order 3-5
    np.testing.assert_allclose(r @ _reported_columns(FULL), 0, atol=1e-10)
    abc = FULL[:, 0] * FULL[:, 1] * FULL[:, 2]
    np.testing.assert_allclose(r @ abc, abc, atol=1e-10)  # a three-factor contrast is left whole
    smoke = 2.0 * np.array(fraction("ABCDE", ["D=AB", "E=AC"], "test").runs(), dtype=float) - 1.0
    assert np.trace(residual_projector(_reported_columns(smoke))) == pytest.approx(0, abs=1e-9)  # no df left


def _higher_columns(runs: np.ndarray) -> np.ndarray:
    """The unreported effects of order 3 to k, lowest order first."""
    k = runs.shape[1]
    words = [w for r in range(3, k + 1) for w in itertools.combinations(range(k), r)]
    return np.column_stack([np.prod(runs[:, list(w)], axis=1) for w in words])


RESIDUAL = residual_contrasts(_reported_columns(FULL), _higher_columns(FULL))


def test_residual_contrasts_are_the_unreported_effects_one_each():
    assert RESIDUAL.shape == (16, 32)
    np.testing.assert_allclose(RESIDUAL @ RESIDUAL.T, np.eye(16), atol=1e-10)
    np.testing.assert_allclose(RESIDUAL @ _reported_columns(FULL), 0, atol=1e-10)
    # in a full factorial each contrast is one effect word: A:B:C is the first, exactly
    abc = FULL[:, 0] * FULL[:, 1] * FULL[:, 2]
    np.testing.assert_allclose(RESIDUAL[0], abc / np.sqrt(32), atol=1e-10)
    assert (np.abs(RESIDUAL @ abc) > 1e-8).sum() == 1
    smoke = 2.0 * np.array(fraction("ABCDE", ["D=AB", "E=AC"], "test").runs(), dtype=float) - 1.0
    assert residual_contrasts(_reported_columns(smoke), _higher_columns(smoke)).shape == (0, 8)


def test_replicate_contrasts_hold_no_effect():
    w = replicate_contrasts([[0, 3, 4], [1, 5]], 6)
    assert w.shape == (3, 6)  # (3 - 1) + (2 - 1)
    np.testing.assert_allclose(w @ w.T, np.eye(3), atol=1e-12)
    np.testing.assert_allclose(w @ np.array([2.0, 7.0, 1.0, 2.0, 2.0, 7.0]), 0, atol=1e-12)  # equal within a group


def _additive_rates(rng, groups, s, sampling_sd=0.0, resamples=400, abc=0.0):
    """Noise contrasts of full 2^5 groups of rates sigmoid(additive logit + abc/2 x_ABC + s e_c), plus
    bootstrap-like sampling noise."""
    out = []
    for _ in range(groups):
        eta = -0.3 + FULL @ rng.normal(0, 0.4, 5) + 0.3 * FULL[:, 0] * FULL[:, 1] + abc / 2 * np.prod(FULL[:, :3], axis=1)
        p = 1 / (1 + np.exp(-(eta + s * rng.standard_normal(32))))
        y = p + sampling_sd * rng.standard_normal(32)
        yb = y[:, None] + sampling_sd * rng.standard_normal((32, resamples))
        out.append(noise_contrasts(RESIDUAL, y, yb, clusters=10**6))
    return out


def test_cell_noise_recovers_the_planted_training_sd():
    rng = np.random.default_rng(3)
    noise = cell_noise(_additive_rates(rng, 30, 0.5))
    assert noise.df + noise.trimmed == 30 * 16 and noise.trimmed < 15
    assert noise.logit_sd == pytest.approx(0.5, rel=0.15)
    # with answer-sampling noise on top, the part the bootstrap carries is netted out
    both = cell_noise(_additive_rates(rng, 30, 0.5, sampling_sd=0.05))
    assert both.sampling_ss == pytest.approx(0.05**2 * both.df, rel=0.1)
    assert both.logit_sd == pytest.approx(0.5, rel=0.2)
    none = cell_noise(_additive_rates(rng, 30, 0.0, sampling_sd=0.05))
    assert none.logit_sd < 0.15
    # rate_sd is the delta-method scale on the rate scale; with a CI level it carries t_df / z
    np.testing.assert_allclose(noise.rate_sd(np.array([0.5, 0.1, 0.0])), noise.logit_sd * np.array([0.25, 0.09, 0.0]))
    assert noise.ci_sd(0.95) == pytest.approx(noise.logit_sd * t_critical(0.975, noise.df) / 1.959964, rel=1e-6)


def test_a_real_three_factor_interaction_is_screened_out():
    """An unreported A:B:C would inflate s (and every CI) if it counted as noise; it sits in one contrast, set apart."""
    rng = np.random.default_rng(5)
    groups = _additive_rates(rng, 1, 0.3, abc=3.0)
    naive = float(sum((g.values**2).sum() for g in groups) / sum(g.scale.sum() for g in groups)) ** 0.5
    noise = cell_noise(groups)
    assert noise.trimmed >= 1 and noise.df <= 15
    assert naive > 0.6  # counted as noise, A:B:C doubles the SD
    assert noise.logit_sd == pytest.approx(0.3, rel=0.45)


def test_seed_replicates_alone_estimate_the_sd():
    """A design with no residual df: the seed replicates still give s, and nothing is trimmed from them."""
    rng = np.random.default_rng(8)
    truth = rng.uniform(0.2, 0.8, 40)
    logit = np.log(truth / (1 - truth))
    y = 1 / (1 + np.exp(-(np.repeat(logit, 3) + 0.6 * rng.standard_normal(120))))
    w = replicate_contrasts([[3 * i, 3 * i + 1, 3 * i + 2] for i in range(40)], 120)
    noise = cell_noise([noise_contrasts(w, y, np.repeat(y[:, None], 10, axis=1), clusters=20, pure=np.ones(80, bool))])
    assert noise.df == noise.replicate_df == 80 and noise.trimmed == 0
    assert noise.logit_sd == pytest.approx(0.6, rel=0.2)


def test_cell_noise_without_any_contrast_is_not_estimable():
    noise = cell_noise([noise_contrasts(np.zeros((0, 8)), np.full(8, 0.3), np.full((8, 10), 0.3), clusters=20)])
    assert noise.df == 0 and np.isnan(noise.logit_sd)
    assert (noise.rate_sd(np.full(8, 0.3), 0.95) == 0).all()  # no component added rather than a NaN interval
    assert np.isnan(cell_noise([]).logit_sd)


def test_t_critical_small_df():
    for df, t in ((1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (16, 2.1199)):
        assert t_critical(0.975, df) == pytest.approx(t, abs=5e-5), df
    # a Satterthwaite df between whole ones lies between their quantiles; below 1 it is held at 1
    assert t_critical(0.975, 2) > t_critical(0.975, 2.5) > t_critical(0.975, 3)
    assert t_critical(0.975, 0.4) == t_critical(0.975, 1)


# --------------------------------------------------------------------------- signs across sources


def test_sign_table_and_flips():
    values = {
        "s1": {"A": 0.5, "B": -0.2, "C": 0.1, "D": float("nan")},
        "s2": {"A": 0.4, "B": 0.3, "C": 0.0, "D": -0.1},
        "s3": {"A": 0.3, "B": -0.1, "C": 0.2, "D": -0.2},
    }
    signs = sign_table(values)
    assert signs["A"] == {"s1": 1, "s2": 1, "s3": 1}
    assert signs["C"]["s2"] == 0 and signs["D"]["s1"] == 0
    assert flipped_factors(signs) == ["B"]  # 0 and NaN agree with any sign


def test_pooled_df_adds_independent_sources_and_counts_a_shared_estimate_once():
    own = [CellNoise(logit_sd=0.5, df=16, residual_ss=0, sampling_ss=0) for _ in range(3)]
    assert pooled_df(own) == pytest.approx(48)  # equal SDs: the df add up
    uneven = [CellNoise(logit_sd=sd, df=16, residual_ss=0, sampling_ss=0) for sd in (0.2, 0.5, 0.8)]
    assert 16 < pooled_df(uneven) < 48  # the noisiest source dominates the pooled variance
    shared = CellNoise(logit_sd=0.5, df=6, residual_ss=0, sampling_ss=0, shared=True)
    assert pooled_df([shared, shared, shared]) == pytest.approx(6)
