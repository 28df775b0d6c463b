"""The screen's estimates: main effects, the 10 two-factor interactions and Cohen's d on SR and LR,
per source and pooled, each with a clustered-bootstrap CI.

Which cells: the primary-seed cells of each source (the balanced 2^5 slab). Extra seeds of the
multi-seed phase re-run a few chosen cells; mixing them in would weight those cells twice and unbalance
the design, so they are summarised separately (aggregate.seed_replicates).

The bootstrap (one set of resamples for the whole screen, drawn from config.bootstrap.seed):
- SR: the eval questions are resampled (with replacement, as many as there are); every cell's source
  rate is recomputed from its answers to the drawn questions.
- LR: the eval personas are resampled; every cell's leakage is recomputed as the mean rate over the
  drawn personas that are not its source.
The same draw applies to every cell of every source, because all cells answer the same questions under
the same personas: the question and persona effects they share then move together in a resample, as
they do between real screens, and the effects (differences between cells) get honest CIs.
Training-run noise (config.bootstrap.training_noise): each cell is one trained adapter, and a second
training run would give other rates. That variance is estimated per response from the residuals of the
factorial model with the reported terms (in the full 2^5: the 16 unreported contrasts of order 3-5 of
each source, 48 degrees of freedom over 3 sources), net of the part the cluster bootstrap already
carries (stats.cell_noise), and every resample adds an independent draw of it to every cell's rate
(N(0, (s * p(1-p))^2), s on the log-odds scale, shared by the sources). So effects, d's, pooled values,
A x B means and predictions all carry question/persona sampling and training-run noise together.
Every statistic is computed on every resample. CIs are percentile intervals widened about the estimate
by the few-clusters factor c = sqrt(G/(G-1)) * t_{G-1}/z (stats.few_cluster_factor; G = 20 questions
for SR, 24 personas for LR): plain percentile intervals from 20 clusters cover about 92.5% instead of 95%.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from eps_screen.cell_metrics import CellMatrices
from eps_screen.config import FACTOR_NAMES, ScreenConfig
from eps_screen.schemas import BootstrapScheme, EffectEstimate, GroupMean, Interval, LogitEffect, SimpleEffect
from eps_screen.stats import (
    CellNoise,
    bootstrap_p,
    cell_noise,
    cohens_d_rates,
    few_cluster_factor,
    holm,
    interaction_pairs,
    level_mean_matrices,
    logistic_fe_clustered,
    percentile_ci,
    resample_counts,
    residual_projector,
    term_columns,
    term_name,
    weighted_ratio,
)

PRE_REGISTERED: frozenset[str] = frozenset({"A:B"})  # docs/experiment.md: the one pre-registered interaction
POOLED = "pooled"
RESPONSES = ("SR", "LR")
TERMS: list[tuple[str, ...]] = [(f,) for f in FACTOR_NAMES] + interaction_pairs(FACTOR_NAMES)
STATS = ("effect", "d", "m_hi", "m_lo")

ESTIMATOR = (
    "Effect = mean response over the cells at the high level (coded +1) minus over the cells at the low level "
    "(-1); an interaction X:Y uses the product of the coded columns. Cohen's d = effect / s, with "
    "s^2 = (n_hi*m_hi*(1-m_hi) + n_lo*m_lo*(1-m_lo)) / (n_hi + n_lo), where m_hi and m_lo are the two level means "
    "and n_hi, n_lo their cell counts: s is the pooled within-level standard deviation of the individual 0/1 answers "
    "(marker or not), which for a 0/1 outcome is sqrt(m(1-m)) at each level; it pools the two levels, weighting by "
    "cells (all cells have the same number of answers). It is not the SD between cells, which would contain the other "
    "factors' effects. Per source: the source's 32 primary-seed cells. Pooled: the unweighted mean of the per-source "
    "effects and d's (each source counts once; 'averaged over sources'), with its CI from the same resamples."
)


@dataclass
class ScreenEstimates:
    sources: list[str]
    estimates: list[EffectEstimate]
    ab_means: list[GroupMean]
    scheme: BootstrapScheme
    # (response, source, stat) -> (observed per term, resamples per term x B)
    draws: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    widen: dict[str, float] = field(default_factory=dict)  # response -> few-clusters factor of its CIs
    training: dict[str, CellNoise] = field(default_factory=dict)  # response -> training-run variance in the CIs
    simple_effects: list[SimpleEffect] = field(default_factory=list)  # A at B0 and at B1, per source and pooled
    logit: list[LogitEffect] = field(default_factory=list)  # the logit-scale sensitivity, pooled fit per response
    logit_model: str = ""

    def draws_of(self, response: str, term: str, stat: str = "d", source: str = POOLED) -> tuple[float, np.ndarray]:
        """(observed, resamples) of one statistic; NaN when it was not estimable (e.g. no answers of that kind)."""
        if (response, source, stat) not in self.draws:
            return float("nan"), np.full(self.scheme.resamples, np.nan)
        obs, boot = self.draws[(response, source, stat)]
        i = [term_name(t) for t in TERMS].index(term)
        return float(obs[i]), boot[i]

    def main_d(self, response: str) -> dict[str, dict[str, float]]:
        """{source: {factor: d}} of the main effects, per source (not pooled): the gates' input."""
        out: dict[str, dict[str, float]] = {}
        for s in self.sources:
            if (response, s, "d") not in self.draws:
                continue
            obs, _ = self.draws[(response, s, "d")]
            out[s] = {f: float(obs[i]) for i, f in enumerate(FACTOR_NAMES)}
        return out

    def find(self, response: str, term: str, source: str = POOLED) -> EffectEstimate | None:
        for e in self.estimates:
            if (e.response, e.term, e.source) == (response, term, source):
                return e
        return None


def term_label(config: ScreenConfig, term: tuple[str, ...]) -> str:
    return " x ".join(config.factors[f].label for f in term) + f" ({term_name(term)})"


def _nanmean(stack: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():  # a term no source can estimate stays NaN without a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(stack, axis=0)


def estimate_screen(
    config: ScreenConfig, mats: CellMatrices, factorial: list[str], partial_sources: set[str],
) -> ScreenEstimates:
    """Effects, d and CIs of every term on SR and LR, per source in `factorial` and pooled over them."""
    cells = mats.cells
    row_of = {c: i for i, c in enumerate(mats.cell_ids)}
    idx = np.array([row_of[c] for c in factorial], dtype=int)
    src = np.array(cells.get_column("source").to_list(), dtype=object)[idx] if idx.size else np.array([], dtype=object)
    levels = cells.select(FACTOR_NAMES).to_numpy()[idx] if idx.size else np.empty((0, 5))
    present = set(src.tolist())
    sources = [s for s in config.sources if s in present] + sorted(present - set(config.sources))

    resamples = config.bootstrap.resamples
    rng = np.random.default_rng(config.bootstrap.seed)
    n_q, n_p = len(mats.questions), len(mats.personas)
    weights = {
        "SR": resample_counts(n_q, resamples, rng) if n_q else np.zeros((resamples, 0)),
        "LR": resample_counts(n_p, resamples, rng) if n_p else np.zeros((resamples, 0)),
    }
    parts = {
        "SR": (mats.sr_markers[idx], mats.sr_answers[idx]),
        "LR": (mats.lr_rates[idx] * mats.lr_mask[idx], mats.lr_mask[idx]),
    }
    ci = config.bootstrap.ci
    widen = {"SR": few_cluster_factor(n_q, ci), "LR": few_cluster_factor(n_p, ci)}
    n_clusters = {"SR": n_q, "LR": n_p}
    train_rng = np.random.default_rng([config.bootstrap.seed, 1])  # its own stream: the cluster draws stay as they were
    # the scheme names the training-run SDs, known only after the loop: set at the end
    result = ScreenEstimates(sources=sources, estimates=[], ab_means=[], scheme=None, widen=widen)  # type: ignore[arg-type]
    coded = 2.0 * levels - 1.0

    for response in RESPONSES:
        numer, denom = parts[response]
        if numer.shape[1] == 0:
            continue
        obs_all = weighted_ratio(numer, denom, np.ones((1, numer.shape[1])))[:, 0]
        boot_all = weighted_ratio(numer, denom, weights[response])
        rows_of = {s: np.flatnonzero((src == s) & np.isfinite(obs_all)) for s in sources}
        columns = {s: term_columns(coded[rows], FACTOR_NAMES, TERMS) for s, rows in rows_of.items()}
        if config.bootstrap.training_noise:
            noise = cell_noise(
                [(residual_projector(columns[s]), obs_all[rows], boot_all[rows]) for s, rows in rows_of.items()],
                n_clusters[response],
            )
            result.training[response] = noise
            boot_all = boot_all + noise.rate_sd(obs_all)[:, None] * train_rng.standard_normal(boot_all.shape)
        per_source: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        counts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        ab: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        simple: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        for s in sources:
            rows = rows_of[s]
            hi, lo, n_hi, n_lo = level_mean_matrices(columns[s])
            y, yb = obs_all[rows], boot_all[rows]
            m_hi, m_lo, mb_hi, mb_lo = hi @ y, lo @ y, hi @ yb, lo @ yb
            per_source[s] = {
                "m_hi": (m_hi, mb_hi),
                "m_lo": (m_lo, mb_lo),
                "effect": (m_hi - m_lo, mb_hi - mb_lo),
                "d": (cohens_d_rates(m_hi, m_lo, n_hi, n_lo), cohens_d_rates(mb_hi, mb_lo, n_hi[:, None], n_lo[:, None])),
            }
            counts[s] = (n_hi, n_lo)
            ab[s] = _ab_group_means(coded[rows], y, yb)
            simple[s] = _simple_effects(coded[rows], y, yb)
        pooled = {
            stat: (_nanmean(np.stack([per_source[s][stat][0] for s in sources])),
                   _nanmean(np.stack([per_source[s][stat][1] for s in sources])))
            for stat in STATS
        } if sources else {}
        if sources:
            per_source[POOLED] = pooled
            counts[POOLED] = (sum(counts[s][0] for s in sources), sum(counts[s][1] for s in sources))
        for s, stats in per_source.items():
            # pooled is partial when any source is incomplete, including a source with no cells at all
            partial = bool(partial_sources) if s == POOLED else s in partial_sources
            for stat, pair in stats.items():
                result.draws[(response, s, stat)] = pair
            result.estimates.extend(_records(config, response, s, stats, counts[s], partial, widen[response]))
        if sources:
            result.ab_means.extend(_ab_records(response, ab, ci, widen[response]))
            simple[POOLED] = {stat: (_nanmean(np.stack([simple[s][stat][0] for s in sources])),
                                     _nanmean(np.stack([simple[s][stat][1] for s in sources]))) for stat in SIMPLE_STATS}
            for s, stats in simple.items():
                partial = bool(partial_sources) if s == POOLED else s in partial_sources
                result.simple_effects.extend(_simple_records(config, response, s, stats, partial, ci, widen[response]))
    result.scheme = BootstrapScheme(
        resamples=resamples, ci=ci, seed=config.bootstrap.seed, widen=widen, method=_method(result.training),
        sr_clusters="eval questions (same draw for every cell)" + _training_note(result.training.get("SR")),
        lr_clusters="eval personas (same draw for every cell)" + _training_note(result.training.get("LR")),
        n_questions=n_q, n_personas=n_p,
        training_sd={r: n.logit_sd for r, n in result.training.items()},
        training_df={r: n.df for r, n in result.training.items()},
    )
    if sources:
        result.logit_model, result.logit = logit_sensitivity(config, mats, idx, src, coded, sources, result)
    return result


def _training_note(noise: CellNoise | None) -> str:
    if noise is None:
        return ""
    if not np.isfinite(noise.logit_sd):
        return "; training-run noise not estimable (no residual degree of freedom), left out"
    return f"; plus per-cell training-run noise, log-odds SD {noise.logit_sd:.3f} ({noise.df} residual df)"


def _method(training: dict[str, CellNoise]) -> str:
    base = "percentile, widened about the estimate by the few-clusters factor c = sqrt(G/(G-1)) t_{G-1}/z"
    if not training:
        return base + "; cluster bootstrap only (no training-run variance)"
    return (
        base + "; each resample adds independent per-cell training-run noise N(0, (s p(1-p))^2) to every cell's rate, "
        "s (log-odds SD, shared by the sources) estimated from the residual contrasts of the factorial (order 3-5 in "
        "the full 2^5) net of the cluster bootstrap's own variance: "
        + ", ".join(
            f"{r} s = {n.logit_sd:.3f} ({n.df} df)" if np.isfinite(n.logit_sd) else f"{r} not estimable (0 df), left out"
            for r, n in training.items()
        )
    )


def _records(config, response, source, stats, counts, partial, widen) -> list[EffectEstimate]:
    ci = config.bootstrap.ci
    cis = {stat: percentile_ci(boot, ci, obs, widen) for stat, (obs, boot) in stats.items()}
    p_values = bootstrap_p(stats["effect"][1], stats["effect"][0], widen)
    p_holm = _holm_exploratory(p_values)
    out = []
    for i, term in enumerate(TERMS):
        name = term_name(term)
        main = len(term) == 1
        status = "main effect" if main else ("pre-registered" if name in PRE_REGISTERED else "exploratory")

        def iv(stat: str) -> Interval:
            return Interval(low=cis[stat][0][i], high=cis[stat][1][i])

        out.append(EffectEstimate(
            term=name, factors=list(term), label=term_label(config, term), response=response, source=source,
            effect=stats["effect"][0][i], effect_ci=iv("effect"), d=stats["d"][0][i], d_ci=iv("d"),
            mean_high=stats["m_hi"][0][i], mean_high_ci=iv("m_hi"), mean_low=stats["m_lo"][0][i], mean_low_ci=iv("m_lo"),
            n_high=int(counts[0][i]), n_low=int(counts[1][i]), partial=partial,
            pre_registered=name in PRE_REGISTERED, status=status,
            p_value=p_values[i], p_holm=p_holm[i] if status == "exploratory" else None,
        ))
    return out


def _exploratory_index() -> np.ndarray:
    return np.array([i for i, t in enumerate(TERMS) if len(t) == 2 and term_name(t) not in PRE_REGISTERED])


def _holm_exploratory(p_values: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values of the nine exploratory interactions (NaN at every other term)."""
    out = np.full(len(TERMS), np.nan)
    family = _exploratory_index()
    out[family] = holm(np.asarray(p_values)[family])
    return out


# --------------------------------------------------------------------------- simple effects of A at each level of B

SIMPLE_STATS = ("effect", "d", "m_hi", "m_lo")


def _simple_effects(coded: np.ndarray, y: np.ndarray, yb: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A's effect among the cells at B0 and among those at B1: per stat, (2,) observed and (2 x resamples)."""
    a, b = coded[:, 0], coded[:, 1]
    hi = np.array([(a > 0) & (b == lv) for lv in (-1, 1)], dtype=float)
    lo = np.array([(a < 0) & (b == lv) for lv in (-1, 1)], dtype=float)
    n_hi, n_lo = hi.sum(1), lo.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        hi, lo = hi / n_hi[:, None], lo / n_lo[:, None]
    hi[n_hi == 0], lo[n_lo == 0] = np.nan, np.nan
    m_hi, m_lo, mb_hi, mb_lo = hi @ y, lo @ y, hi @ yb, lo @ yb
    return {
        "effect": (m_hi - m_lo, mb_hi - mb_lo),
        "d": (cohens_d_rates(m_hi, m_lo, n_hi, n_lo), cohens_d_rates(mb_hi, mb_lo, n_hi[:, None], n_lo[:, None])),
        "m_hi": (m_hi, mb_hi),
        "m_lo": (m_lo, mb_lo),
    }


def _simple_records(config, response, source, stats, partial, ci, widen) -> list[SimpleEffect]:
    cis = {stat: percentile_ci(stats[stat][1], ci, stats[stat][0], widen) for stat in ("effect", "d")}
    fa, fb = config.factors["A"], config.factors["B"]
    return [
        SimpleEffect(
            factor="A", at="B", at_level=k, label=f"{fa.label} (A) with {fb.high if k else fb.low} (B{k})",
            response=response, source=source, effect=stats["effect"][0][k],
            effect_ci=Interval(low=cis["effect"][0][k], high=cis["effect"][1][k]), d=stats["d"][0][k],
            d_ci=Interval(low=cis["d"][0][k], high=cis["d"][1][k]), mean_high=stats["m_hi"][0][k],
            mean_low=stats["m_lo"][0][k], partial=partial,
        )
        for k in (0, 1)
    ]


# --------------------------------------------------------------------------- logit-scale sensitivity

LOGIT_MODEL = (
    "Binomial logistic regression of the answers, pooled over sources: logit P(marker) = fixed effect of "
    "(source, {cluster}) + the 15 coded terms (5 main effects, 10 two-factor interactions); a term's log-odds effect "
    "is 2 x its coefficient (level 1 minus level 0). Standard errors: cluster-robust sandwich by {cluster} (CR1, "
    "G = {g}), {training}; {ci:.0%} intervals and p-values from t with G-1 df. Groups in which every answer was alike "
    "carry no information and are left out ({dropped} left out)."
)


def logit_sensitivity(
    config: ScreenConfig, mats: CellMatrices, idx: np.ndarray, src: np.ndarray, coded: np.ndarray,
    sources: list[str], est: ScreenEstimates,
) -> tuple[str, list[LogitEffect]]:
    """The 15 terms on the log-odds scale, one pooled fit per response, beside the rate-scale pooled effects.

    SR: (cell, question) marker counts, fixed effects source x question, clusters = questions. LR: (cell, persona)
    rates of the non-source personas times their answer counts, fixed effects source x persona, clusters =
    personas. When the CIs carry training-run noise, its variance (log-odds SD s, the same s) is added to each
    log-odds effect's: 4 s^2 / cells (a balanced design's coefficient averages cells with weight 1/cells).
    """
    from scipy.special import stdtr, stdtrit  # Student t CDF and quantile (scipy.stats itself takes seconds to import)

    ci = config.bootstrap.ci
    src_i = np.array([sources.index(s) if s in sources else -1 for s in src])
    cols = term_columns(coded, FACTOR_NAMES, TERMS)
    design = np.column_stack([np.ones(int((src_i >= 0).sum())), cols[src_i >= 0]])
    if np.linalg.matrix_rank(design) < design.shape[1]:  # e.g. only the smoke fraction: D is A x B there
        return ("Not fitted: the cells present do not separate the 15 terms (some are aliased, as D and A x B are in "
                "the smoke fraction), so their log-odds effects are not estimable.", [])
    out: list[LogitEffect] = []
    texts = []
    for response in RESPONSES:
        if response == "SR":
            succ, trials, cluster_name = mats.sr_markers[idx], mats.sr_answers[idx], "question"
        else:
            per = (mats.cells.get_column("n_leak").to_numpy() / np.maximum(mats.cells.get_column("leak_personas").to_numpy(), 1))[idx]
            trials = mats.lr_mask[idx] * per[:, None]
            succ, cluster_name = mats.lr_rates[idx] * trials, "persona"
        n_cells, n_k = succ.shape
        if n_k == 0 or n_cells == 0:
            continue
        keep = np.repeat(src_i >= 0, n_k)
        k_idx = np.tile(np.arange(n_k), n_cells)
        fit = logistic_fe_clustered(
            succ.ravel()[keep], trials.ravel()[keep], np.repeat(cols, n_k, axis=0)[keep],
            (np.repeat(src_i, n_k) * n_k + k_idx)[keep], k_idx[keep],
        )
        noise = est.training.get(response)
        s = noise.logit_sd if noise is not None and np.isfinite(noise.logit_sd) else 0.0
        effect, se = 2 * fit.coef, np.sqrt((2 * fit.se) ** 2 + 4 * s**2 / max(int((src_i >= 0).sum()), 1))
        df = max(fit.clusters - 1, 1)
        with np.errstate(invalid="ignore", divide="ignore"):
            tstat = effect / se
        p = 2 * stdtr(df, -np.abs(tstat))
        half = stdtrit(df, 1 - (1 - ci) / 2) * se
        p_holm = _holm_exploratory(p)
        for i, term in enumerate(TERMS):
            name = term_name(term)
            rate = est.find(response, name)
            rate_clear = rate is not None and _excludes_zero(rate.effect_ci)
            iv = Interval(low=effect[i] - half[i], high=effect[i] + half[i])
            logit_clear = _excludes_zero(iv)
            scale = {(True, True): "both scales", (True, False): "rate scale only",
                     (False, True): "logit scale only", (False, False): "neither"}[(rate_clear, logit_clear)]
            out.append(LogitEffect(
                term=name, label=term_label(config, term), response=response, log_odds=effect[i], ci=iv,
                p_value=p[i], p_holm=p_holm[i] if len(term) == 2 and name not in PRE_REGISTERED else None,
                rate_clear=rate_clear, logit_clear=logit_clear, scale=scale,
            ))
        training = (f"plus the training-run variance 4 s^2 / cells (s = {s:.3f})" if s > 0 else
                    "without a training-run term (none estimated)")
        texts.append(f"{response}: " + LOGIT_MODEL.format(
            cluster=cluster_name, g=fit.clusters, training=training, ci=ci, dropped=fit.dropped,
        ) + ("" if fit.converged else " The fit did not converge; read it with care."))
    return " ".join(texts), out


def _excludes_zero(iv: Interval) -> bool:
    return iv.low is not None and iv.high is not None and (iv.low > 0 or iv.high < 0)


_AB = [(a, b) for a in (0, 1) for b in (0, 1)]


def _ab_group_means(coded: np.ndarray, y: np.ndarray, yb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean response of the cells at each (A, B) combination: (4,) observed and (4 x B) resampled."""
    groups = np.array([(coded[:, 0] == 2 * a - 1) & (coded[:, 1] == 2 * b - 1) for a, b in _AB], dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        g = groups / groups.sum(1, keepdims=True)
    return g @ y, g @ yb


def _ab_records(response: str, ab: dict[str, tuple[np.ndarray, np.ndarray]], ci: float, widen: float) -> list[GroupMean]:
    obs = _nanmean(np.stack([v[0] for v in ab.values()]))
    boot = _nanmean(np.stack([v[1] for v in ab.values()]))
    lo, hi = percentile_ci(boot, ci, obs, widen)
    return [
        GroupMean(response=response, A=a, B=b, mean=obs[k], ci=Interval(low=lo[k], high=hi[k]))
        for k, (a, b) in enumerate(_AB)
    ]
