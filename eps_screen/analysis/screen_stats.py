"""The screen's estimates: main effects, every two-factor interaction and Cohen's d on SR and LR, per
source and pooled, each with a clustered-bootstrap CI. The terms are those of the declared factors
(config.design.factors, named by their letters: "A", "A:B"); which interactions are pre-registered comes
from config.design (prediction_rules.declared), the others are exploratory and Holm-adjusted.

Which cells: the primary-seed cells of each source (the balanced slab: the marker screen's 2^5, or the
declared full or fractional design). Extra seeds of the multi-seed phase re-run a few chosen cells;
mixing them in would weight those cells twice and unbalance the design, so they are summarised
separately (aggregate.seed_replicates) and enter only the training-run estimate, as seed replicates.

The bootstrap (one set of resamples for the whole screen, drawn from config.bootstrap.seed):
- SR: the eval questions are resampled (with replacement, as many as there are); every cell's source
  rate is recomputed from its answers to the drawn questions.
- LR: the eval personas are resampled; every cell's leakage is recomputed as the mean rate over the
  drawn personas that are not its source.
The same draw applies to every cell of every source, because all cells answer the same questions under
the same personas: the question and persona effects they share then move together in a resample, as
they do between real screens, and the effects (differences between cells) get honest CIs.
Training-run noise (config.bootstrap.training_noise): each cell is one trained adapter, and a second
training run would give other rates. That variance is estimated per response and per source
(training_noise.cell_noise) from the contrasts that hold no reported effect: the residual contrasts of the
factorial model with the reported terms (in the full 2^5: the 16 unreported contrasts of order 3-5; a
real high-order effect among them is screened out) and the seed replicates of the multi-seed phase,
net of the part the cluster bootstrap already carries. A source with fewer than MIN_SOURCE_DF such
contrasts uses the estimate over every source together; with none at all the CIs omit training noise,
and `caveats` says so in a sentence for the page. Every resample adds an independent draw of it to every
cell's rate (N(0, (s * p(1-p))^2), s on the log-odds scale, times t_df/z so that an s resting on few df
gives t-width intervals; pooled values take t at the sources' pooled df). So effects, d's, pooled values, the pre-registered interaction's means and
predictions all carry question/persona sampling and training-run noise together.
Every statistic is computed on every resample. CIs are percentile intervals widened about the estimate
by the few-clusters factor c = sqrt(G/(G-1)) * t_{G-1}/z (stats.few_cluster_factor; G = 20 questions
for SR, 24 personas for LR): plain percentile intervals from 20 clusters cover about 92.5% instead of 95%.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from eps_screen.analysis.cell_metrics import CellMatrices
from eps_screen.analysis.logit_scale import logit_sensitivity
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.prediction_rules import declared, reported_terms
from eps_screen.analysis.schemas import (
    BootstrapScheme,
    GroupMean,
    Interval,
    LogitEffect,
    SimpleEffect,
    TermEffect,
)
from eps_screen.analysis.stats import (
    bootstrap_p,
    cohens_d_rates,
    few_cluster_factor,
    holm_exploratory,
    level_mean_matrices,
    percentile_ci,
    rate_ci,
    resample_counts,
    same_contrast,
    term_columns,
    term_name,
    weighted_ratio,
)
from eps_screen.analysis.curvature import centre_rows
from eps_screen.analysis.training_noise import MIN_SOURCE_DF, CellNoise, pooled_df, source_noise

POOLED = "pooled"
RESPONSES = ("SR", "LR")
STATS = ("effect", "d", "m_hi", "m_lo")
RATE_STATS = ("m_hi", "m_lo")  # level means: their intervals stay inside [0, 1]


def declared_factors(config: ScreenConfig) -> tuple[str, ...]:
    """The short names of the config's declared factors, in config order: what every statistic keys on."""
    return tuple(config.factors)


def declarations(config: ScreenConfig):
    """The pre-registered interactions and the predictions in force (prediction_rules.declared)."""
    factors = [(f.short, [lv.treatment for lv in f.levels]) for f in config.design.factors]
    return declared(config.design.pre_registered, config.design.predictions, factors)


def factor_spec(config: ScreenConfig, short: str):
    """A declared factor's label and level words (label, low, high)."""
    return config.factors[short]



ESTIMATOR = (
    "Effect = mean response over the cells at the high level (coded +1) minus over the cells at the low level "
    "(-1); an interaction of two factors uses the product of their coded columns. Cohen's d = effect / s, with "
    "s^2 = (n_hi*m_hi*(1-m_hi) + n_lo*m_lo*(1-m_lo)) / (n_hi + n_lo), where m_hi and m_lo are the two level means "
    "and n_hi, n_lo their cell counts: s is the pooled within-level standard deviation of the individual 0/1 answers "
    "(marker or not), which for a 0/1 outcome is sqrt(m(1-m)) at each level; it pools the two levels, weighting by "
    "cells (all cells have the same number of answers). It is not the SD between cells, which would contain the other "
    "factors' effects. Per source: the source's primary-seed cells of the factorial. Pooled: the unweighted mean of the per-source "
    "effects and d's (each source counts once; 'averaged over sources'), with its CI from the same resamples."
)


@dataclass
class ScreenEffects:
    sources: list[str]
    estimates: list[TermEffect]
    ab_means: list[GroupMean]
    scheme: BootstrapScheme
    factors: tuple[str, ...] = ()
    terms: list[tuple[str, ...]] = field(default_factory=list)  # the reported terms, mains first
    pre_registered: tuple[str, ...] = ()  # the pre-registered interactions ("A:B")
    aliased: tuple[int, ...] = ()  # per term, the first term of the same contrast (stats.same_contrast)
    # (response, source, stat) -> (observed per term, resamples per term x B)
    draws: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    widen: dict[str, float] = field(default_factory=dict)  # response -> few-clusters factor of its CIs
    # response -> source -> the training-run variance its CIs carry
    training: dict[str, dict[str, CellNoise]] = field(default_factory=dict)
    caveats: list[str] = field(default_factory=list)  # sentences the page prints above the estimates
    simple_effects: list[SimpleEffect] = field(default_factory=list)  # X at Y0 and Y1 of the pre-registered X:Y
    logit: list[LogitEffect] = field(default_factory=list)  # the logit-scale sensitivity, pooled fit per response
    logit_model: str = ""

    @property
    def term_names(self) -> list[str]:
        return [term_name(t) for t in self.terms]

    def draws_of(self, response: str, term: str, stat: str = "d", source: str = POOLED) -> tuple[float, np.ndarray]:
        """(observed, resamples) of one statistic; NaN when it was not estimable (e.g. no answers of that kind)."""
        if (response, source, stat) not in self.draws or term not in self.term_names:
            return float("nan"), np.full(self.scheme.resamples, np.nan)
        obs, boot = self.draws[(response, source, stat)]
        i = self.term_names.index(term)
        return float(obs[i]), boot[i]

    def main_d(self, response: str) -> dict[str, dict[str, float]]:
        """{source: {factor: d}} of the main effects, per source (not pooled): the gates' input."""
        out: dict[str, dict[str, float]] = {}
        for s in self.sources:
            if (response, s, "d") not in self.draws:
                continue
            obs, _ = self.draws[(response, s, "d")]
            out[s] = {f: float(obs[i]) for i, f in enumerate(self.factors)}
        return out

    def find(self, response: str, term: str, source: str = POOLED) -> TermEffect | None:
        for e in self.estimates:
            if (e.response, e.term, e.source) == (response, term, source):
                return e
        return None


def term_label(config: ScreenConfig, term: tuple[str, ...]) -> str:
    return " x ".join(factor_spec(config, f).label for f in term) + f" ({term_name(term)})"


def _nanmean(stack: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():  # a term no source can estimate stays NaN without a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(stack, axis=0)


def screen_effects(
    config: ScreenConfig, mats: CellMatrices, factorial: list[str], partial_sources: set[str],
) -> ScreenEffects:
    """Effects, d and CIs of every reported term on SR and LR, per source in `factorial` and pooled over them."""
    factors = declared_factors(config)
    terms = reported_terms(factors)
    pre_registered, _ = declarations(config)
    cells = mats.cells
    row_of = {c: i for i, c in enumerate(mats.cell_ids)}
    idx = np.array([row_of[c] for c in factorial], dtype=int)
    src_full = np.array(cells.get_column("source").to_list(), dtype=object)
    src = src_full[idx] if idx.size else np.array([], dtype=object)
    levels_full = cells.select(factors).to_numpy().astype(float)
    levels = levels_full[idx] if idx.size else np.empty((0, len(factors)))
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
        "SR": (mats.sr_markers, mats.sr_answers),
        "LR": (mats.lr_rates * mats.lr_mask, mats.lr_mask),
    }
    ci = config.bootstrap.ci
    widen = {"SR": few_cluster_factor(n_q, ci), "LR": few_cluster_factor(n_p, ci)}
    n_clusters = {"SR": n_q, "LR": n_p}
    train_rng = np.random.default_rng([config.bootstrap.seed, 1])  # its own stream: the cluster draws stay as they were
    # the scheme names the training-run SDs, known only after the loop: set at the end
    coded = 2.0 * levels - 1.0
    result = ScreenEffects(sources=sources, estimates=[], ab_means=[], scheme=None, widen=widen,  # type: ignore[arg-type]
                             factors=factors, terms=terms, pre_registered=pre_registered,
                             aliased=same_contrast(coded, factors, terms))
    pair = _pair(factors, pre_registered)

    for response in RESPONSES:
        numer, denom = parts[response]
        if numer.shape[1] == 0:
            continue
        obs_full = weighted_ratio(numer, denom, np.ones((1, numer.shape[1])))[:, 0]
        boot_full = weighted_ratio(numer, denom, weights[response])
        obs_all, boot_all = obs_full[idx], boot_full[idx]
        rows_of = {s: np.flatnonzero((src == s) & np.isfinite(obs_all)) for s in sources}
        columns = {s: term_columns(coded[rows], factors, terms) for s, rows in rows_of.items()}
        if config.bootstrap.training_noise:
            noise = source_noise(factors, terms, idx, rows_of, coded, src_full, levels_full, obs_full, boot_full,
                                 n_clusters[response], centre_rows(mats.cell_ids))
            result.training[response] = noise
            # The CIs stretch every resample about the estimate by the few-clusters factor, a correction owed to the
            # cluster part only; the training part gets its own (t_df/z, in ci_sd), so its draws are divided by it.
            # Pooled estimates rest on every source's SD: their draws take t at the sources' pooled df (same normals).
            df_pool = pooled_df(list(noise.values()))
            sd, sd_pool = np.zeros(obs_all.shape), np.zeros(obs_all.shape)
            for s, rows in rows_of.items():
                sd[rows] = noise[s].rate_sd(obs_all[rows], ci) / widen[response]
                sd_pool[rows] = noise[s].rate_sd(obs_all[rows], ci, df_pool) / widen[response]
            z = train_rng.standard_normal(boot_all.shape)
            boot_all, boot_pool = boot_all + sd[:, None] * z, boot_all + sd_pool[:, None] * z
        else:
            boot_pool = boot_all
        per_source: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        to_pool: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}  # per source, from the pooled draws
        counts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        ab: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        simple: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        simple_pool: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        for s in sources:
            rows = rows_of[s]
            means = level_mean_matrices(columns[s])
            y = obs_all[rows]
            per_source[s] = _term_stats(means, y, boot_all[rows])
            to_pool[s] = per_source[s] if boot_pool is boot_all else _term_stats(means, y, boot_pool[rows])
            counts[s] = (means[2], means[3])
            if pair:
                ab[s] = _ab_group_means(coded[rows][:, pair], y, boot_pool[rows])
                simple[s] = _simple_effects(coded[rows][:, pair], y, boot_all[rows])
                simple_pool[s] = _simple_effects(coded[rows][:, pair], y, boot_pool[rows])
        pooled = {
            stat: (_nanmean(np.stack([to_pool[s][stat][0] for s in sources])),
                   _nanmean(np.stack([to_pool[s][stat][1] for s in sources])))
            for stat in STATS
        } if sources else {}
        if sources:
            per_source[POOLED] = pooled
            counts[POOLED] = (sum(counts[s][0] for s in sources), sum(counts[s][1] for s in sources))
        for s, stats in per_source.items():
            # pooled is partial when any source is incomplete, including a source with no cells at all
            partial = bool(partial_sources) if s == POOLED else s in partial_sources
            for stat, draws in stats.items():
                result.draws[(response, s, stat)] = draws
            result.estimates.extend(_records(config, result, response, s, stats, counts[s], partial, widen[response]))
        if sources and pair:
            result.ab_means.extend(_ab_records(response, ab, ci, widen[response]))
            simple[POOLED] = {stat: (_nanmean(np.stack([simple_pool[s][stat][0] for s in sources])),
                                     _nanmean(np.stack([simple_pool[s][stat][1] for s in sources])))
                              for stat in SIMPLE_STATS}
            for s, stats in simple.items():
                partial = bool(partial_sources) if s == POOLED else s in partial_sources
                result.simple_effects.extend(
                    _simple_records(config, factors, pair, response, s, stats, partial, ci, widen[response]))
    result.caveats = _caveats(result.training, config.bootstrap.training_noise)
    result.scheme = BootstrapScheme(
        resamples=resamples, ci=ci, seed=config.bootstrap.seed, widen=widen, method=_method(result.training),
        sr_clusters="eval questions (same draw for every cell)" + _training_note(result.training.get("SR")),
        lr_clusters="eval personas (same draw for every cell)" + _training_note(result.training.get("LR")),
        n_questions=n_q, n_personas=n_p,
        training_sd={f"{r} {s}": n.logit_sd for r, by in result.training.items() for s, n in by.items()},
        training_df={f"{r} {s}": n.df for r, by in result.training.items() for s, n in by.items()},
    )
    if sources:
        result.logit_model, result.logit = logit_sensitivity(config, mats, idx, src, coded, sources, result)
    return result


def _term_stats(means: tuple[np.ndarray, ...], y: np.ndarray, yb: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every term's level means, effect and d: (observed, resamples), from level_mean_matrices of its columns."""
    hi, lo, n_hi, n_lo = means
    m_hi, m_lo, mb_hi, mb_lo = hi @ y, lo @ y, hi @ yb, lo @ yb
    return {
        "m_hi": (m_hi, mb_hi),
        "m_lo": (m_lo, mb_lo),
        "effect": (m_hi - m_lo, mb_hi - mb_lo),
        "d": (cohens_d_rates(m_hi, m_lo, n_hi, n_lo), cohens_d_rates(mb_hi, mb_lo, n_hi[:, None], n_lo[:, None])),
    }


def _pair(factors: tuple[str, ...], pre_registered: tuple[str, ...]) -> list[int]:
    """Column indices (X, Y) of the first pre-registered interaction X:Y, whose simple effects and means are shown."""
    for term in pre_registered:
        x, y = term.split(":")
        if x in factors and y in factors:
            return [factors.index(x), factors.index(y)]
    return []


def _caveats(training: dict[str, dict[str, CellNoise]], wanted: bool) -> list[str]:
    """The sentence the page prints when some CIs carry no training-run noise (none estimable from this design)."""
    if not wanted:
        return ["The CIs omit training-run noise (bootstrap.training_noise is off): a second training run of a cell "
                "would give other rates, and these intervals do not allow for it."]
    missing = [f"{r} in {s}" for r, by in training.items() for s, n in by.items() if not (np.isfinite(n.logit_sd) and n.df > 0)]
    if not missing:
        return []
    return [f"The CIs omit training-run noise ({', '.join(missing)}): this design leaves no contrast free of the "
            "reported effects and has no seed replicates, so what a second training run would change could not be "
            "estimated. Add seed replicates (seeds.multiseed) or a larger design."]


def _training_note(noise: dict[str, CellNoise] | None) -> str:
    if noise is None:
        return ""
    parts = []
    for s, n in noise.items():
        if not np.isfinite(n.logit_sd) or n.df == 0:
            parts.append(f"{s} not estimable (no noise contrast), left out")
        else:
            how = ("over all sources" if n.shared
                   else f"{n.df - n.replicate_df} residual, {n.replicate_df} seed-replicate")
            parts.append(f"{s} log-odds SD {n.logit_sd:.3f} ({n.df} df: {how})")
    return "; plus per-cell training-run noise: " + ", ".join(parts)


def _method(training: dict[str, dict[str, CellNoise]]) -> str:
    base = ("percentile, widened about the estimate by the few-clusters factor c = sqrt(G/(G-1)) t_{G-1}/z (a level "
            "mean's interval, a rate's, then held inside [0, 1])")
    if not training:
        return base + "; cluster bootstrap only (no training-run variance)"
    return (
        base + "; each resample adds independent per-cell training-run noise N(0, (s p(1-p))^2) to every cell's rate, "
        "s (log-odds SD, per source, times t_df/z) estimated from the contrasts that hold no reported effect (the "
        "unreported higher-order contrasts, a real effect among them screened out, and the seed replicates) net of "
        f"the cluster bootstrap's own variance; a source with fewer than {MIN_SOURCE_DF} such df uses the estimate "
        "over all sources"
    )


def _records(config, est: ScreenEffects, response, source, stats, counts, partial, widen) -> list[TermEffect]:
    ci = config.bootstrap.ci
    cis = {stat: (rate_ci if stat in RATE_STATS else percentile_ci)(boot, ci, obs, widen)
           for stat, (obs, boot) in stats.items()}
    p_values = bootstrap_p(stats["effect"][1], stats["effect"][0], widen)
    p_holm = holm_exploratory(est.terms, est.pre_registered, p_values, est.aliased)
    out = []
    for i, term in enumerate(est.terms):
        name = term_name(term)
        pre = name in est.pre_registered
        status = "main effect" if len(term) == 1 else ("pre-registered" if pre else "exploratory")

        def iv(stat: str) -> Interval:
            return Interval(low=cis[stat][0][i], high=cis[stat][1][i])

        out.append(TermEffect(
            term=name, factors=list(term), label=term_label(config, term), response=response, source=source,
            effect=stats["effect"][0][i], effect_ci=iv("effect"), d=stats["d"][0][i], d_ci=iv("d"),
            mean_high=stats["m_hi"][0][i], mean_high_ci=iv("m_hi"), mean_low=stats["m_lo"][0][i], mean_low_ci=iv("m_lo"),
            n_high=int(counts[0][i]), n_low=int(counts[1][i]), partial=partial,
            pre_registered=pre, status=status,
            p_value=p_values[i], p_holm=p_holm[i] if status == "exploratory" else None,
        ))
    return out


# --------------------------------------------------------------------------- simple effects of X at each level of Y (X:Y pre-registered)

SIMPLE_STATS = ("effect", "d", "m_hi", "m_lo")


def _simple_effects(coded: np.ndarray, y: np.ndarray, yb: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """X's effect among the cells at Y0 and among those at Y1 (coded: the X and Y columns): per stat, (2,) observed
    and (2 x resamples)."""
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


def _simple_records(config, factors, pair, response, source, stats, partial, ci, widen) -> list[SimpleEffect]:
    cis = {stat: percentile_ci(stats[stat][1], ci, stats[stat][0], widen) for stat in ("effect", "d")}
    x, y = factors[pair[0]], factors[pair[1]]
    fx, fy = factor_spec(config, x), factor_spec(config, y)
    return [
        SimpleEffect(
            factor=x, at=y, at_level=k, label=f"{fx.label} ({x}) with {fy.high if k else fy.low} ({y}{k})",
            response=response, source=source, effect=stats["effect"][0][k],
            effect_ci=Interval(low=cis["effect"][0][k], high=cis["effect"][1][k]), d=stats["d"][0][k],
            d_ci=Interval(low=cis["d"][0][k], high=cis["d"][1][k]), mean_high=stats["m_hi"][0][k],
            mean_low=stats["m_lo"][0][k], partial=partial,
        )
        for k in (0, 1)
    ]


_AB = [(a, b) for a in (0, 1) for b in (0, 1)]


def _ab_group_means(coded: np.ndarray, y: np.ndarray, yb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean response of the cells at each (X, Y) combination of the pre-registered pair (coded: its two columns):
    (4,) observed and (4 x B) resampled. GroupMean's A and B fields hold X's and Y's levels."""
    groups = np.array([(coded[:, 0] == 2 * a - 1) & (coded[:, 1] == 2 * b - 1) for a, b in _AB], dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        g = groups / groups.sum(1, keepdims=True)
    return g @ y, g @ yb


def _ab_records(response: str, ab: dict[str, tuple[np.ndarray, np.ndarray]], ci: float, widen: float) -> list[GroupMean]:
    obs = _nanmean(np.stack([v[0] for v in ab.values()]))
    boot = _nanmean(np.stack([v[1] for v in ab.values()]))
    lo, hi = rate_ci(boot, ci, obs, widen)
    return [
        GroupMean(response=response, A=a, B=b, mean=obs[k], ci=Interval(low=lo[k], high=hi[k]))
        for k, (a, b) in enumerate(_AB)
    ]
