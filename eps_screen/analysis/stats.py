"""Two-level factorial statistics: effects, interactions, Cohen's d and the clustered bootstrap.

Generic on purpose: nothing here knows about markers or personas, so `eps-screen analyze-table` runs
the same code on any table a researcher has, and the screen's aggregation (screen_stats.py) only adds
which rows are cells and which columns are clusters.

Conventions (textbook 2^k, e.g. Box, Hunter & Hunter ch. 5):
- Each factor column holds exactly two values; the smaller is "low" and is coded -1, the larger +1.
- Main effect = mean(response at high) - mean(response at low).
- Interaction X:Y = mean(response where coded X*Y = +1) - mean(where X*Y = -1); in a full factorial this
  is half the difference between X's effect at Y high and X's effect at Y low.
- Every estimate is a linear contrast of the responses, so one (terms x runs) matrix applied to a
  (runs x resamples) matrix gives every effect of every bootstrap resample in one product.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import polars as pl

from eps_screen.spec.design import DesignError

# --------------------------------------------------------------------------- design checks and coding


def coded_columns(
    table: pl.DataFrame, factors: Sequence[str], *, require_balance: bool = True
) -> tuple[np.ndarray, dict[str, tuple[float, float]]]:
    """The factors as a (runs x factors) matrix of -1/+1, and each factor's (low, high) values.

    With require_balance, each factor must have as many runs at low as at high, and each pair of
    factors must show its four level combinations equally often: that is what makes the effects
    estimated below orthogonal (a regular fraction such as D=AB, E=AC passes; a lopsided table fails).
    """
    if not factors:
        raise DesignError("no factor columns given")
    missing = [f for f in factors if f not in table.columns]
    if missing:
        raise DesignError(f"factor column {missing[0]!r} is not in the table (columns: {', '.join(table.columns)})")
    if table.height < 2:
        raise DesignError(f"the table has {table.height} row(s); a two-level design needs at least 2")
    coded = np.empty((table.height, len(factors)))
    levels: dict[str, tuple[float, float]] = {}
    for j, f in enumerate(factors):
        col = table.get_column(f)
        if col.null_count():
            raise DesignError(f"factor column {f!r} has {col.null_count()} empty value(s)")
        if not (col.dtype.is_numeric() or col.dtype == pl.Boolean):
            raise DesignError(f"factor column {f!r} holds {col.dtype} values; levels must be numbers (e.g. 0/1 or -1/+1)")
        values = col.cast(pl.Float64).to_numpy()
        distinct = np.unique(values)
        if distinct.size != 2:
            shown = ", ".join(f"{v:g}" for v in distinct[:6]) + (", ..." if distinct.size > 6 else "")
            raise DesignError(f"factor column {f!r} has {distinct.size} distinct value(s) ({shown}); a two-level factor needs exactly 2")
        low, high = float(distinct[0]), float(distinct[1])
        levels[f] = (low, high)
        coded[:, j] = np.where(values == high, 1.0, -1.0)
        if require_balance:
            n_high = int((coded[:, j] > 0).sum())
            if n_high * 2 != table.height:
                raise DesignError(
                    f"factor column {f!r} is unbalanced: {table.height - n_high} run(s) at {low:g}, {n_high} at {high:g}"
                )
    if require_balance:
        for (i, f), (j, g) in itertools.combinations(enumerate(factors), 2):
            counts = [int(((coded[:, i] == a) & (coded[:, j] == b)).sum()) for a in (-1, 1) for b in (-1, 1)]
            if len(set(counts)) != 1:
                raise DesignError(
                    f"factor columns {f!r} and {g!r} are not balanced against each other: level pairs "
                    f"(low,low)/(low,high)/(high,low)/(high,high) appear {'/'.join(map(str, counts))} times"
                )
    return coded, levels


def interaction_pairs(factors: Sequence[str]) -> list[tuple[str, str]]:
    """All two-factor interactions, in the order A:B, A:C, ..., D:E."""
    return list(itertools.combinations(factors, 2))


def term_name(term: Sequence[str]) -> str:
    return ":".join(term)


def term_columns(coded: np.ndarray, factors: Sequence[str], terms: Sequence[Sequence[str]]) -> np.ndarray:
    """(runs x terms) coded columns: a main effect's own column, an interaction's product of columns."""
    index = {f: j for j, f in enumerate(factors)}
    cols = [np.prod([coded[:, index[f]] for f in term], axis=0) for term in terms]
    return np.column_stack(cols) if cols else np.empty((coded.shape[0], 0))


def level_mean_matrices(columns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(hi, lo, n_hi, n_lo): hi @ y is the mean of y over runs where a term's column is +1, lo @ y over -1.

    A term with no run on one side gets a row of NaN (not estimable), never a silent zero.
    """
    plus = (columns > 0).T.astype(float)
    minus = (columns < 0).T.astype(float)
    n_hi, n_lo = plus.sum(axis=1), minus.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        hi = plus / n_hi[:, None]
        lo = minus / n_lo[:, None]
    hi[n_hi == 0] = np.nan
    lo[n_lo == 0] = np.nan
    return hi, lo, n_hi, n_lo


# --------------------------------------------------------------------------- effects of one table


@dataclass(frozen=True)
class FactorialEffects:
    response: str
    runs: int
    mean: float
    levels: dict[str, tuple[float, float]]  # factor -> (low, high) as found in the table
    main_effects: dict[str, float]
    interactions: dict[str, float]  # "A:B" -> effect


def factorial_effects(
    table: pl.DataFrame, response: str, factors: Sequence[str] | None = None, *, require_balance: bool = True
) -> FactorialEffects:
    """Main effects and all two-factor interactions of `response` (factors default: every other column)."""
    if response not in table.columns:
        raise DesignError(f"response column {response!r} is not in the table (columns: {', '.join(table.columns)})")
    factors = list(factors) if factors else [c for c in table.columns if c != response]
    if response in factors:
        raise DesignError(f"column {response!r} cannot be both the response and a factor")
    y_col = table.get_column(response)
    if not y_col.dtype.is_numeric():
        raise DesignError(f"response column {response!r} holds {y_col.dtype} values; it must be numeric")
    if y_col.null_count():
        raise DesignError(f"response column {response!r} has {y_col.null_count()} empty value(s)")
    y = y_col.cast(pl.Float64).to_numpy()
    if not np.isfinite(y).all():
        raise DesignError(f"response column {response!r} has NaN or infinite values")
    coded, levels = coded_columns(table, factors, require_balance=require_balance)
    pairs = interaction_pairs(factors)
    terms = [(f,) for f in factors] + pairs
    hi, lo, _, _ = level_mean_matrices(term_columns(coded, factors, terms))
    effects = hi @ y - lo @ y
    k = len(factors)
    return FactorialEffects(
        response=response,
        runs=table.height,
        mean=float(y.mean()),
        levels=levels,
        main_effects={f: float(e) for f, e in zip(factors, effects[:k], strict=True)},
        interactions={term_name(p): float(e) for p, e in zip(pairs, effects[k:], strict=True)},
    )


# --------------------------------------------------------------------------- Cohen's d for rates


def cohens_d_rates(m_hi: np.ndarray, m_lo: np.ndarray, n_hi: np.ndarray | float = 1.0, n_lo: np.ndarray | float = 1.0) -> np.ndarray:
    """Cohen's d of a rate (share of 0/1 answers), from the two level means; broadcasts over resamples.

        d = (m_hi - m_lo) / s,   s^2 = (n_hi * m_hi(1 - m_hi) + n_lo * m_lo(1 - m_lo)) / (n_hi + n_lo)

    m_h is the mean response (source rate or leakage) over the n_h cells at level h. For a 0/1 outcome
    the variance of the individual answers around their level mean is exactly m_h(1 - m_h), so s is the
    pooled within-level standard deviation of the *answers* (marker present or not), pooled over the two
    levels with the cells as weights (every cell has the same number of answers). This is the ordinary
    two-group Cohen's d of "answers under the high level" vs "answers under the low level".

    Why not the SD between cells: in a factorial, the cells within one level of A still differ by B, C,
    D and E, so a between-cell SD would shrink d(A) whenever another factor is strong and make d
    incomparable across factors, sources and screens. Returns NaN where s = 0 (every answer identical).
    """
    m_hi, m_lo = np.asarray(m_hi, dtype=float), np.asarray(m_lo, dtype=float)
    n_hi, n_lo = np.asarray(n_hi, dtype=float), np.asarray(n_lo, dtype=float)
    var = (n_hi * m_hi * (1 - m_hi) + n_lo * m_lo * (1 - m_lo)) / (n_hi + n_lo)
    with np.errstate(invalid="ignore", divide="ignore"):
        d = (m_hi - m_lo) / np.sqrt(var)
    return np.where(var > 0, d, np.nan)


# --------------------------------------------------------------------------- clustered bootstrap


def resample_counts(n_clusters: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples x clusters) counts: how often each cluster is drawn in each resample (n draws with replacement).

    Drawing counts instead of indices turns every resampled statistic that is a ratio of sums into a
    matrix product, so 10,000 resamples cost two BLAS calls instead of a Python loop.
    """
    return rng.multinomial(n_clusters, np.full(n_clusters, 1.0 / n_clusters), size=resamples)


def weighted_ratio(numer: np.ndarray, denom: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(rows x resamples) of sum_k w_k numer[r, k] / sum_k w_k denom[r, k] for each row r and resample.

    Source rate: numer = marker counts per (cell, question), denom = answers per (cell, question).
    Leakage:     numer = per-persona rates masked to the non-source personas, denom = that mask
                 (so the ratio is the mean rate over the resampled non-source personas).
    A row whose resampled denominator is 0 (no cluster of it drawn) is NaN.
    """
    top = numer @ weights.T
    bottom = denom @ weights.T
    with np.errstate(invalid="ignore", divide="ignore"):
        out = top / bottom
    return np.where(bottom > 0, out, np.nan)


def few_cluster_factor(clusters: int, ci: float) -> float:
    """How much to widen a cluster-bootstrap interval about its estimate when the clusters are few.

        c = sqrt(G / (G - 1)) * t_{G-1}(1 - a/2) / z(1 - a/2)

    Resampling G clusters gives a variance (G-1)/G too small, and with G = 20 questions the sampling
    distribution has t-like tails; this is the bootstrap form of the usual few-clusters correction
    (CR1 scaling and t(G-1) critical values; Cameron & Miller 2015, J. Human Resources 50:317).
    c = 1.096 for 20 clusters at 95%, 1.078 for 24; it tends to 1 as G grows. The coverage study
    (benchmarks/coverage_study.py) shows plain percentile intervals at about 92.5% on the screen.
    """
    if clusters < 3:
        return 1.0
    p = 1 - (1 - ci) / 2
    return float(np.sqrt(clusters / (clusters - 1)) * t_critical(p, clusters - 1) / NormalDist().inv_cdf(p))


def percentile_ci(
    samples: np.ndarray, ci: float, center: np.ndarray | float | None = None, widen: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval along the last axis (the resamples); NaN resamples are left out.

    With `center` (the estimate) and widen = c > 1, each endpoint q becomes center + c * (q - center):
    the interval keeps the bootstrap's shape (asymmetry included) and is stretched about the estimate.
    """
    q = [(1 - ci) / 2, 1 - (1 - ci) / 2]
    if not np.isnan(samples).any():
        lo, hi = np.quantile(samples, q, axis=-1)
    else:
        with warnings.catch_warnings():  # an all-NaN slice (a term not estimable) warns; NaN is the right answer
            warnings.simplefilter("ignore", RuntimeWarning)
            lo, hi = np.nanquantile(samples, q, axis=-1)
    if center is not None and widen != 1.0:
        lo, hi = center + widen * (lo - center), center + widen * (hi - center)
    return lo, hi


def rate_ci(
    samples: np.ndarray, ci: float, center: np.ndarray | float | None = None, widen: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """percentile_ci of a rate, held inside [0, 1]: widening about a rate near 0 would otherwise reach below it."""
    lo, hi = percentile_ci(samples, ci, center, widen)
    return np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)


def t_critical(p: float, df: float) -> float:
    """Student-t quantile at probability p for df >= 1, fractional df (Satterthwaite's) included."""
    from scipy.special import stdtrit  # not scipy.stats, which takes seconds to import

    return float(stdtrit(max(df, 1.0), p))


# --------------------------------------------------------------------------- sign agreement across sources


def sign_table(values: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, int]]:
    """{factor: {source: -1/0/+1}} from {source: {factor: estimate}}; NaN counts as 0 (no sign)."""
    table: dict[str, dict[str, int]] = {}
    for source, by_factor in values.items():
        for factor, v in by_factor.items():
            table.setdefault(factor, {})[source] = 0 if v is None or np.isnan(v) else int(np.sign(v))
    return table


def flipped_factors(signs: Mapping[str, Mapping[str, int]]) -> list[str]:
    """Factors whose sign is positive in some source and negative in another (0 agrees with either)."""
    return [f for f, by_source in signs.items() if {1, -1} <= set(by_source.values())]


# --------------------------------------------------------------------------- multiplicity


def bootstrap_p(samples: np.ndarray, center: np.ndarray | float, widen: float = 1.0) -> np.ndarray:
    """Two-sided bootstrap p-value of "the statistic is 0", by inverting the (widened) percentile interval.

    The resamples are stretched about the estimate by `widen` as the CIs are (center + c (x - center)); then
    p = 2 min(P(x <= 0), P(x >= 0)), at least 1/B and at most 1. A 95% CI excludes 0 exactly when p < 0.05
    (up to the resolution 1/B). NaN resamples are left out; a row with none left is NaN.
    """
    x = np.asarray(samples, dtype=float)
    c = np.asarray(center, dtype=float)
    x = c[..., None] + widen * (x - c[..., None])
    finite = np.isfinite(x)
    n = finite.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        below = np.where(finite, x <= 0, False).sum(axis=-1) / n
        above = np.where(finite, x >= 0, False).sum(axis=-1) / n
        p = np.clip(2 * np.minimum(below, above), 1.0 / np.maximum(n, 1), 1.0)
    return np.where(n > 0, p, np.nan)


def holm(p: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error), NaNs left out of the family and kept as NaN."""
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = ok.size
    if m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    adjusted = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out[order] = np.minimum(adjusted, 1.0)
    return out


def same_contrast(coded: np.ndarray, factors: Sequence[str], terms: list[tuple[str, ...]]) -> tuple[int, ...]:
    """For each term, the first term whose contrast column over these cells (coded -1/+1, one column per factor) is
    the same up to sign: aliased with it in a fraction, so one estimate and one test. Itself where none is."""
    seen: dict[bytes, int] = {}
    out = []
    for i, c in enumerate(term_columns(coded, factors, terms).T):
        key = (c * (np.sign(c[0]) if c.size and c[0] else 1)).round(9).tobytes()
        out.append(seen.setdefault(key, i))
    return tuple(out)


def holm_exploratory(terms: list[tuple[str, ...]], pre_registered: tuple[str, ...], p_values: np.ndarray,
                     aliased: Sequence[int] = ()) -> np.ndarray:
    """Holm-adjusted p-values of the exploratory interactions (those not pre-registered; NaN at every other term).
    `aliased` (same_contrast): interactions that share one contrast in a fraction are one test in the family, and
    each gets that test's adjusted p."""
    out = np.full(len(terms), np.nan)
    family = [i for i, t in enumerate(terms) if len(t) == 2 and term_name(t) not in pre_registered]
    rep = {i: (aliased[i] if aliased else i) for i in family}
    tests = sorted(set(rep.values()))
    if tests:
        adjusted = dict(zip(tests, holm(np.asarray(p_values)[tests]), strict=True))
        for i in family:
            out[i] = adjusted[rep[i]]
    return out


# --------------------------------------------------------------------------- logit-scale sensitivity


@dataclass(frozen=True)
class LogitFit:
    """A binomial logistic model with group fixed effects and cluster-robust (sandwich) standard errors.

    coef / se: of the non-fixed-effect columns (on the columns' own coding; se NaN when not converged); clusters: G;
    converged: IRLS reached
    its tolerance; dropped: fixed-effect groups left out because every answer in them was alike (their intercept
    would be infinite and they say nothing about the other coefficients).
    """

    coef: np.ndarray
    se: np.ndarray
    clusters: int
    converged: bool
    dropped: int


def logistic_fe_clustered(
    successes: np.ndarray, trials: np.ndarray, columns: np.ndarray, groups: np.ndarray, clusters: np.ndarray,
    *, max_iter: int = 50, tol: float = 1e-8,
) -> LogitFit:
    """Fit logit P(success) = alpha_group + columns @ beta to binomial counts, by IRLS; CR1 cluster-robust SEs.

    successes, trials: (rows,); columns: (rows x k) regressors; groups: (rows,) fixed-effect labels (e.g. source x
    question); clusters: (rows,) labels of the clusters of the sandwich (e.g. question). Rows with no trials are
    ignored. The group intercepts are never formed as dummy columns: each Newton step profiles them out (the
    regressors are centred on their weighted group means, x~), so the work is (rows x k), whatever the number of
    groups. The same x~ gives the sandwich of beta alone: Cov = S^-1 (sum_c u_c u_c') S^-1 * G/(G-1), with
    S = sum_i w_i x~_i x~_i' and u_c = sum over cluster c of x~_i (y_i - n_i p_i). A caller builds intervals with t_{G-1}.
    """
    y, n = np.asarray(successes, dtype=float), np.asarray(trials, dtype=float)
    keep = n > 0
    x, groups, clusters = np.asarray(columns, dtype=float)[keep], np.asarray(groups)[keep], np.asarray(clusters)[keep]
    y, n = y[keep], n[keep]
    labels, gidx = np.unique(groups, return_inverse=True)
    ys, ns = np.bincount(gidx, y, labels.size), np.bincount(gidx, n, labels.size)
    informative = (ys > 0) & (ys < ns)
    dropped = int((~informative).sum())
    rows = informative[gidx]
    y, n, x, clusters = y[rows], n[rows], x[rows], clusters[rows]
    _, gidx = np.unique(groups[rows], return_inverse=True)
    k = x.shape[1]
    if y.size == 0:
        nan = np.full(k, np.nan)
        return LogitFit(nan, nan, 0, False, dropped)
    n_groups = int(gidx.max()) + 1
    group_rate = np.bincount(gidx, y, n_groups) / np.bincount(gidx, n, n_groups)
    alpha, beta = np.log(group_rate / (1 - group_rate)), np.zeros(k)  # start: each group at its own log-odds

    def centred(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x~ = x minus its w-weighted group mean, and the groups' weights."""
        wg = np.bincount(gidx, w, n_groups)
        means = np.column_stack([np.bincount(gidx, w * x[:, j], n_groups) for j in range(k)]) / wg[:, None]
        return x - means[gidx], wg

    converged = False
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for _ in range(max_iter):
            p = 1 / (1 + np.exp(-(alpha[gidx] + x @ beta)))
            w, r = n * p * (1 - p), y - n * p
            xt, wg = centred(w)
            if not (np.all(np.isfinite(xt)) and np.all(wg > 0)):  # a fitted rate reached 0 or 1: no finite maximum
                break
            try:
                step_b = np.linalg.lstsq(xt.T @ (xt * w[:, None]), xt.T @ r, rcond=None)[0]
            except np.linalg.LinAlgError:
                break
            # alpha's step given beta's: the group's score left after beta's step, over the group's weight
            step_a = (np.bincount(gidx, r, n_groups) - np.bincount(gidx, w * (x @ step_b), n_groups)) / wg
            alpha, beta = alpha + step_a, beta + step_b
            if max(np.max(np.abs(step_a)), np.max(np.abs(step_b))) < tol:
                converged = True
                break
    if not converged:
        nan = np.full(k, np.nan)
        return LogitFit(beta, nan, 0, False, dropped)
    p = 1 / (1 + np.exp(-(alpha[gidx] + x @ beta)))
    w, r = n * p * (1 - p), y - n * p
    xt, _ = centred(w)
    s_inv = np.linalg.pinv(xt.T @ (xt * w[:, None]))
    labels_c, cidx = np.unique(clusters, return_inverse=True)
    g = labels_c.size
    u = np.column_stack([np.bincount(cidx, xt[:, j] * r, g) for j in range(k)])
    cov = s_inv @ (u.T @ u) @ s_inv * (g / (g - 1) if g > 1 else 1.0)
    return LogitFit(beta, np.sqrt(np.clip(np.diag(cov), 0, None)), g, converged, dropped)
