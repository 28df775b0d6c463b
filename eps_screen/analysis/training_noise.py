"""Training-run noise: the per-cell variance component the screen's CIs carry, and what it is estimated from.

Each cell is one trained adapter; a second training run of the same recipe would give other rates. That
variance is estimated from contrasts of the cell rates that hold no reported effect, net of the part the
cluster bootstrap already carries:
- residual contrasts: what the reported terms (main effects, two-factor interactions) leave of a design, one
  unreported effect (or alias chain) each, so a real high-order effect can be set apart (TRIM_Z);
- seed-replicate contrasts: the same recipe at other seeds (the multi-seed phase, and a source's centre cells:
  design.centre_points), which hold no effect at all.
screen_stats.py decides per source which estimate a source's CIs use; stats.py holds the rest of the statistics.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from eps_screen.analysis.stats import t_critical, term_columns

# Fewer noise contrasts than this in one source and it takes the estimate over all sources: an SD from 5 df is
# off by a third or more half the time, and the t_df/z widening at so few df costs more than sharing does.
MIN_SOURCE_DF = 6


def higher_order_words(factors: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Every effect of order 3 up to k, lowest order first: what the screen does not report."""
    return [w for r in range(3, len(factors) + 1) for w in itertools.combinations(factors, r)]


def residual_projector(columns: np.ndarray) -> np.ndarray:
    """(runs x runs) I - X X^+, X = [1, columns]: what is left of a response after the modelled terms.

    In a full 2^5 with the 15 reported terms (5 main effects, 10 two-factor interactions) the residual
    space is spanned by the 16 contrasts of order 3 to 5, which the screen does not report; with cells
    missing it is whatever least squares leaves (rank-deficient designs handled by the pseudo-inverse).
    """
    x = np.column_stack([np.ones(columns.shape[0]), columns])
    return np.eye(x.shape[0]) - x @ np.linalg.pinv(x)


def residual_contrasts(reported: np.ndarray, unreported: np.ndarray) -> np.ndarray:
    """(m x runs) orthonormal contrasts spanning the residual space of the reported terms, m its rank.

    unreported: (runs x words) the coded columns of the effects the screen does not report (orders 3 and up),
    lowest order first. Each is projected on the residual space and kept when something is left of it
    (Gram-Schmidt): in a regular design (full or fractional) every residual contrast is then exactly one
    unreported effect, or one alias chain of them, so a real three-factor interaction sits in one contrast,
    where `cell_noise` can set it apart, instead of being smeared over all of them.
    """
    r = residual_projector(reported)
    rank = int(round(np.trace(r)))
    basis: list[np.ndarray] = []
    for v in (r @ unreported).T:
        for b in basis:
            v = v - (b @ v) * b
        norm = float(np.linalg.norm(v))
        if norm > 1e-8 * max(1.0, np.sqrt(v.size)):
            basis.append(v / norm)
        if len(basis) == rank:
            break
    if len(basis) < rank:  # the words given do not span it (a caller passing fewer): complete with R's eigenvectors
        vals, vecs = np.linalg.eigh(r)
        for v in vecs[:, vals > 0.5].T:
            for b in basis:
                v = v - (b @ v) * b
            if np.linalg.norm(v) > 1e-6:
                basis.append(v / np.linalg.norm(v))
            if len(basis) == rank:
                break
    return np.array(basis).reshape(len(basis), reported.shape[0])


def replicate_contrasts(groups: Sequence[Sequence[int]], runs: int) -> np.ndarray:
    """(m x runs) orthonormal within-group (Helmert) contrasts of rows that repeat one recipe at other seeds.

    Rows of one group share every factor level, so these contrasts hold no effect at all: only training-run
    and answer-sampling noise. m = sum over groups of (size - 1).
    """
    out = []
    for g in groups:
        for k in range(1, len(g)):
            w = np.zeros(runs)
            w[list(g[:k])] = 1.0 / k
            w[g[k]] = -1.0
            out.append(w / np.linalg.norm(w))
    return np.array(out).reshape(len(out), runs)


# A residual contrast more than this many SDs from 0 is taken for a real effect (e.g. an unreported three-factor
# interaction) and left out of the noise estimate; the kept ones are rescaled by E[z^2 | |z| < TRIM] (a normal
# truncated there), so with no real effect the estimate stays unbiased. Lenth (1989) screens contrasts the same way.
# 3 SDs and at least TRIM_MIN residual contrasts: with fewer, or a lower cut, the screen feeds on its own estimate
# (a low s trims more, which lowers s) and the SD comes out too small.
TRIM_Z = 3.0
TRIM_MIN = 8
_TRIM_KEEP = 1 - 2 * TRIM_Z * float(np.exp(-TRIM_Z**2 / 2) / np.sqrt(2 * np.pi)) / (2 * NormalDist().cdf(TRIM_Z) - 1)


@dataclass(frozen=True)
class NoiseContrasts:
    """One source's noise contrasts: observed values, the part answer sampling explains, the training-run scale."""

    values: np.ndarray  # (m,) w_j . y
    sampling: np.ndarray  # (m,) w_j' Cov_sampling w_j, from the cluster bootstrap
    scale: np.ndarray  # (m,) sum_c w_jc^2 (p_c (1 - p_c))^2: the delta-method weight of s^2
    pure: np.ndarray  # (m,) True for seed-replicate contrasts (no effect can be in them)


def noise_contrasts(
    weights: np.ndarray, y: np.ndarray, y_boot: np.ndarray, clusters: int, pure: np.ndarray | None = None,
) -> NoiseContrasts:
    """The contrasts `weights` (m x cells) of the observed rates y and of their cluster-bootstrap resamples."""
    dev = np.nan_to_num(y_boot - np.nanmean(y_boot, axis=1, keepdims=True))
    inflate = clusters / (clusters - 1) if clusters > 1 else 1.0  # the bootstrap variance of G clusters is (G-1)/G of it
    wd = weights @ dev
    return NoiseContrasts(
        values=weights @ y,
        sampling=(wd**2).mean(axis=1) * inflate if dev.shape[1] else np.zeros(weights.shape[0]),
        scale=(weights**2) @ (y * (1 - y)) ** 2,
        pure=np.zeros(weights.shape[0], dtype=bool) if pure is None else np.asarray(pure, dtype=bool),
    )


@dataclass(frozen=True)
class CellNoise:
    """A per-cell variance component on the log-odds scale, estimated from noise contrasts.

    logit_sd: the SD of the per-cell log-odds shift (0 when the contrasts are no larger than the sampling
    noise the cluster bootstrap already carries; NaN when there is no degree of freedom). df: contrasts it
    rests on (residual ones kept plus seed-replicate ones); trimmed: residual contrasts set apart as real
    effects; replicate_df: how many of df are seed replicates; shared: estimated over every source together
    because this source alone had too few df; residual_ss and sampling_ss: the kept contrasts' sum of
    squares and the part of it the cluster bootstrap attributes to resampled answers.
    """

    logit_sd: float
    df: int
    residual_ss: float
    sampling_ss: float
    trimmed: int = 0
    replicate_df: int = 0
    shared: bool = False

    def ci_sd(self, ci: float, df: float | None = None) -> float:
        """The SD the resamples draw with: logit_sd x t_df / z at the CI's level, so an SD resting on few df
        gives the interval the width of a t interval (0 where not estimable: no component rather than NaN).
        df: the degrees of freedom of the estimate the interval rests on, when it is not this one's alone (a
        pooled interval rests on every source's, pooled_df)."""
        if not np.isfinite(self.logit_sd) or self.df < 1:
            return 0.0
        p = 1 - (1 - ci) / 2
        return self.logit_sd * t_critical(p, self.df if df is None else df) / NormalDist().inv_cdf(p)

    def rate_sd(self, rates: np.ndarray, ci: float | None = None, df: float | None = None) -> np.ndarray:
        """Per-cell SD on the rate scale: s * p(1 - p) (delta method), s = logit_sd, or ci_sd(ci, df) when ci is given."""
        sd = self.ci_sd(ci, df) if ci is not None else (self.logit_sd if np.isfinite(self.logit_sd) else 0.0)
        p = np.asarray(rates, dtype=float)
        return np.nan_to_num(sd * p * (1 - p))


def cell_noise(groups: Sequence[NoiseContrasts]) -> CellNoise:
    """Method-of-moments estimate of the training-run variance s^2, net of the cluster bootstrap's own variance.

    The model: each cell's rate carries, besides the answer sampling the bootstrap resamples, an independent
    shift e_c p_c(1 - p_c), e_c ~ N(0, s^2) on the log-odds scale (one training run). For an orthonormal
    contrast w_j that holds no effect, E (w_j y)^2 = s^2 scale_j + sampling_j, so

        s^2 = max(0, sum_j ((w_j y)^2 / k_j - sampling_j)) / sum_j scale_j   over the kept contrasts j,

    with k_j = 1 for a seed-replicate contrast (no effect can be in it) and E[z^2 | |z| < TRIM_Z] for a
    residual one: residual contrasts (the unreported orders) may hold a real effect, so one whose
    standardised value exceeds TRIM_Z is set apart, by iterating estimate and screen until they agree.
    """
    if not groups:
        return CellNoise(logit_sd=float("nan"), df=0, residual_ss=0.0, sampling_ss=0.0)
    c = np.concatenate([g.values for g in groups])
    samp = np.concatenate([g.sampling for g in groups])
    scale = np.concatenate([g.scale for g in groups])
    pure = np.concatenate([g.pure for g in groups])
    if c.size == 0 or scale.sum() <= 0:
        return CellNoise(logit_sd=float("nan"), df=int(c.size), residual_ss=float(c @ c), sampling_ss=float(samp.sum()),
                         replicate_df=int(pure.sum()))
    def moment(keep: np.ndarray, k: np.ndarray) -> float:
        return max(0.0, float((c[keep] ** 2 / k[keep] - samp[keep]).sum())) / max(float(scale[keep].sum()), 1e-300)

    keep, k = np.ones(c.size, dtype=bool), np.where(pure, 1.0, _TRIM_KEEP)
    s2 = moment(keep, np.ones(c.size))
    if (~pure).sum() < TRIM_MIN:
        return CellNoise(logit_sd=float(np.sqrt(s2)), df=int(c.size), residual_ss=float(c @ c),
                         sampling_ss=float(samp.sum()), replicate_df=int(pure.sum()))
    for _ in range(20):
        with np.errstate(invalid="ignore", divide="ignore"):
            z = np.abs(c) / np.sqrt(samp + s2 * scale)
        new = pure | ~(z > TRIM_Z)
        s2_new = moment(new, k)
        done = (new == keep).all() and abs(s2_new - s2) <= 1e-9 * max(s2, 1e-12)
        keep, s2 = new, s2_new
        if done:
            break
    return CellNoise(
        logit_sd=float(np.sqrt(s2)), df=int(keep.sum()), residual_ss=float(c[keep] @ c[keep]),
        sampling_ss=float(samp[keep].sum()), trimmed=int((~keep).sum()), replicate_df=int(pure.sum()),
    )


def pooled_df(noises: Sequence[CellNoise]) -> float:
    """Satterthwaite's df of a mean over sources of their training-run variances (each source's s^2 weighs as it is;
    sources sharing one estimate count it once): a pooled CI rests on all of them, not on one source's df."""
    terms: dict[int, tuple[float, int]] = {}
    for n in noises:
        if not (np.isfinite(n.logit_sd) and n.df > 0):
            continue
        key = id(n) if not n.shared else -1
        a, df = terms.get(key, (0.0, n.df))
        terms[key] = (a + n.logit_sd**2, df)
    total = sum(a for a, _ in terms.values())
    if not terms or total <= 0:
        return float(max((df for _, df in terms.values()), default=1))
    return total**2 / sum(a**2 / df for a, df in terms.values() if a > 0)


def source_noise(
    factors: tuple[str, ...], terms: list[tuple[str, ...]], idx: np.ndarray, rows_of: dict[str, np.ndarray],
    coded: np.ndarray, src_full: np.ndarray, levels_full: np.ndarray, obs_full: np.ndarray, boot_full: np.ndarray,
    clusters: int, centre: np.ndarray | None = None,
) -> dict[str, CellNoise]:
    """Per source, the training-run variance its cells carry: its own where it has MIN_SOURCE_DF noise contrasts,
    else the estimate over every source's contrasts together (shared=True). Arrays of the `_full` kind are over
    every cell (rows of cell_metrics), `idx` the design cells among them, `rows_of` each source's rows of `idx`;
    centre: True for the centre cells (design.centre_points), replicates of one recipe at other seeds."""
    words = higher_order_words(factors)
    usable = np.isfinite(obs_full) & np.isfinite(levels_full).all(axis=1)
    contrasts = {}
    for s, rows in rows_of.items():
        factorial_rows = idx[rows]
        in_factorial = set(factorial_rows.tolist())
        # seed replicates: the same recipe of this source at another seed (the multi-seed phase), with its primary cell
        primary_of = {tuple(levels_full[r]): int(r) for r in factorial_rows}
        extra: dict[int, list[int]] = {}
        for r in np.flatnonzero((src_full == s) & usable):
            if int(r) not in in_factorial and tuple(levels_full[r]) in primary_of:
                extra.setdefault(primary_of[tuple(levels_full[r])], []).append(int(r))
        # centre cells: one recipe at n seeds, n - 1 more replicate contrasts (their levels are empty: not `usable`)
        mid = np.flatnonzero((src_full == s) & np.isfinite(obs_full) & centre) if centre is not None else []
        all_rows = np.concatenate([factorial_rows, np.array([r for g in extra.values() for r in g], dtype=int),
                                   np.asarray(mid, dtype=int)])
        pos = {int(r): i for i, r in enumerate(all_rows)}
        n = all_rows.size
        resid = residual_contrasts(term_columns(coded[rows], factors, terms), term_columns(coded[rows], factors, words))
        resid = np.pad(resid, ((0, 0), (0, n - rows.size)))
        groups = [[pos[p], *(pos[r] for r in g)] for p, g in extra.items()] + [[pos[int(r)] for r in mid]]
        reps = replicate_contrasts(groups, n)
        pure = np.r_[np.zeros(resid.shape[0], dtype=bool), np.ones(reps.shape[0], dtype=bool)]
        contrasts[s] = noise_contrasts(np.vstack([resid, reps]), obs_full[all_rows], boot_full[all_rows], clusters, pure)
    shared = dataclasses.replace(cell_noise(list(contrasts.values())), shared=True)
    out = {}
    for s, c in contrasts.items():
        own = cell_noise([c])
        out[s] = own if own.df >= MIN_SOURCE_DF else shared
    return out
