"""The logit-scale sensitivity: every reported term on the log-odds scale, one pooled fit per response, beside the
rate-scale estimates, and when the fit cannot speak, why.

A logistic fit has no finite estimate under separation: when every answer of some cell group (the cells at one
level of a main effect, or at one combination of an interaction's two factors) is unmarked, or every one is
marked, among the groups that carry information, the likelihood keeps rising as that term runs off to infinity.
IRLS then "estimates" whatever it reached when it stopped (a screen with 15 of its 16 cells at rate 0 printed
N 17.037 [-3246234.869, 3246268.943]). So the data are checked first; a separated response, or a fit that did
not converge, gets no estimate for any of its terms (a quasi-separated term distorts the others as well), each
with the reason in `why`. A source with no informative group (none of its answers marked, say) is left out of
the fit, and the model text names it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from eps_screen.analysis.cell_metrics import CellMatrices
from eps_screen.analysis.schemas import Interval, LogitEffect
from eps_screen.spec.config import ScreenConfig
from eps_screen.analysis.stats import (
    holm_exploratory,
    logistic_fe_clustered,
    term_columns,
    term_name,
)

if TYPE_CHECKING:
    from eps_screen.analysis.screen_stats import ScreenEffects

LOGIT_MODEL = (
    "Binomial logistic regression of the answers, pooled over sources: logit P(marker) = fixed effect of "
    "(source, {cluster}) + the {n_terms} coded terms ({n_main} main effects, {n_pairs} two-factor interactions); a "
    "term's log-odds effect is 2 x its coefficient (level 1 minus level 0). Standard errors: cluster-robust sandwich by "
    "{cluster} (CR1, G = {g}), {training}; {ci:.0%} intervals and p-values from t with G-1 df. Groups in which every "
    "answer was alike carry no information and are left out ({dropped} left out)."
)
_NAMES = {"SR": "source-persona answers", "LR": "other personas' answers"}


def _alike(s: float, n: float) -> str:
    """'unmarked' or 'marked' when all of n answers with s markers are alike, else ''."""
    return "unmarked" if s <= 1e-9 else "marked" if s >= n - 1e-9 else ""


def separation(succ: np.ndarray, trials: np.ndarray, groups: np.ndarray, coded: np.ndarray,
               factors: tuple[str, ...], terms: list[tuple[str, ...]]) -> str:
    """Why the fit has no finite estimate, or '' when no cell group is separated.

    succ, trials, groups: per row (one cell's answers to one cluster); coded: per row, the factors' -1/+1 levels.
    Only the fixed-effect groups with both marked and unmarked answers count: the fit leaves the others out."""
    gs, gi = np.unique(groups, return_inverse=True)
    s, n = np.bincount(gi, succ, gs.size), np.bincount(gi, trials, gs.size)
    rows = ((s > 1e-9) & (s < n - 1e-9))[gi] & (trials > 0)
    if not rows.any():
        kinds = {_alike(a, b) for a, b in zip(s, n, strict=True) if b > 0}
        return ("every answer was " + kinds.pop() if len(kinds) == 1 else "no group has both marked and unmarked "
                "answers") + ", so there is nothing to fit on the log-odds scale"
    found = []
    for term in terms:
        cols = [factors.index(f) for f in term]
        levels = coded[rows][:, cols]
        for combo in {tuple(r) for r in levels.astype(int)}:
            at = np.all(levels == combo, axis=1)
            kind = _alike(succ[rows][at].sum(), trials[rows][at].sum())
            name = " ".join(f"{f}{int(c > 0)}" for f, c in zip(term, combo, strict=True))
            if kind and name not in {w for w, _ in found}:
                found.append((name, kind))
    if not found:
        return ""

    def at(kind: str) -> str:
        names = [name for name, k in found if k == kind]
        return ", ".join(names[:6]) + (" and more" if len(names) > 6 else "")

    said = [f"{'none is' if kind == 'unmarked' else 'every one is'} marked in the cells at {at(kind)}"
            for kind in ("unmarked", "marked") if at(kind)]
    return (f"separation: among the answers that carry information, {' and '.join(said)}, so the likelihood has no "
            "finite maximum")


def _left_out(succ: np.ndarray, trials: np.ndarray, src_rows: np.ndarray, sources: list[str], response: str) -> str:
    """A sentence naming the sources whose answers are all alike on this response: they carry nothing on the
    log-odds scale, so the fit leaves them out; '' when there is none."""
    out = []
    for i, s in enumerate(sources):
        at = src_rows == i
        kind = _alike(succ[at].sum(), trials[at].sum()) if trials[at].sum() > 0 else ""
        if kind:
            out.append(f"{s} (every one of its {_NAMES[response]} {kind})")
    return (f"Left out of the fit, as they carry no information on the log-odds scale: {'; '.join(out)}. "
            if out else "")


def _aliased(design: np.ndarray, terms: list[tuple[str, ...]]) -> str:
    """The first term the cells cannot tell from the terms before it, in words: 'D and A:B are aliased'."""
    for j in range(1, design.shape[1]):
        if np.linalg.matrix_rank(design[:, :j + 1]) <= j:
            col = design[:, j]
            twin = next((i for i in range(1, j) if np.allclose(col, design[:, i]) or np.allclose(col, -design[:, i])), None)
            name = term_name(terms[j - 1])
            if twin is not None:
                return f"{term_name(terms[twin - 1])} and {name} are aliased"
            return f"{name} is a combination of the terms before it"
    return "some are aliased"


def logit_sensitivity(
    config: ScreenConfig, mats: CellMatrices, idx: np.ndarray, src: np.ndarray, coded: np.ndarray,
    sources: list[str], est: ScreenEffects,
) -> tuple[str, list[LogitEffect]]:
    """The reported terms on the log-odds scale, one pooled fit per response, beside the rate-scale pooled effects.

    SR: (cell, question) marker counts, fixed effects source x question, clusters = questions. LR: (cell, persona)
    rates of the non-source personas times their answer counts, fixed effects source x persona, clusters =
    personas. When the CIs carry training-run noise, its variance is added to each log-odds effect's: 4 s^2 / cells
    (a balanced design's coefficient averages cells with weight 1/cells), s^2 the cells' mean of their source's.
    """
    from scipy.special import (  # Student t CDF and quantile (scipy.stats itself takes seconds to import)
        stdtr,
        stdtrit,
    )

    ci = config.bootstrap.ci
    src_i = np.array([sources.index(s) if s in sources else -1 for s in src])
    cols = term_columns(coded, est.factors, est.terms)
    design = np.column_stack([np.ones(int((src_i >= 0).sum())), cols[src_i >= 0]])
    if np.linalg.matrix_rank(design) < design.shape[1]:  # e.g. only the smoke fraction: D is A x B there
        return (f"Not fitted: the cells present do not separate the {len(est.terms)} terms ({_aliased(design, est.terms)}"
                "), so their log-odds effects are not estimable.", [])
    out: list[LogitEffect] = []
    texts = []
    for response in ("SR", "LR"):
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
        y, tr = succ.ravel()[keep], trials.ravel()[keep]
        groups, row_src = (np.repeat(src_i, n_k) * n_k + k_idx)[keep], np.repeat(src_i, n_k)[keep]
        left_out = _left_out(y, tr, row_src, sources, response)
        why = separation(y, tr, groups, np.repeat(coded, n_k, axis=0)[keep], est.factors, est.terms)
        fit = None
        if not why:
            fit = logistic_fe_clustered(y, tr, np.repeat(cols, n_k, axis=0)[keep], groups, k_idx[keep])
            if not fit.converged:
                why = "the fit did not converge (IRLS, 50 iterations), so its numbers are not estimates"
        said = f"{response}: {left_out}"
        if why:
            out += [_no_estimate(est, response, term, why) for term in est.terms]
            texts.append(said + f"No log-odds estimate: {why}.")
            continue
        by_source = est.training.get(response, {})
        cells_of = {x: int((src == x).sum()) for x in sources}
        s = float(np.sqrt(sum(cells_of[x] * n.ci_sd(ci) ** 2 for x, n in by_source.items()) / max(sum(cells_of.values()), 1)))
        effect, se = 2 * fit.coef, np.sqrt((2 * fit.se) ** 2 + 4 * s**2 / max(int((src_i >= 0).sum()), 1))
        df = max(fit.clusters - 1, 1)
        with np.errstate(invalid="ignore", divide="ignore"):
            tstat = effect / se
        p = 2 * stdtr(df, -np.abs(tstat))
        half = stdtrit(df, 1 - (1 - ci) / 2) * se
        p_holm = holm_exploratory(est.terms, est.pre_registered, p, est.aliased)
        for i, term in enumerate(est.terms):
            name = term_name(term)
            rate = est.find(response, name)
            rate_clear = rate is not None and rate.clear  # the page's one definition of clear on the rate scale
            iv = Interval(low=effect[i] - half[i], high=effect[i] + half[i])
            logit_clear = iv.excludes_zero()
            scale = {(True, True): "both scales", (True, False): "rate scale only",
                     (False, True): "logit scale only", (False, False): "neither"}[(rate_clear, logit_clear)]
            out.append(LogitEffect(
                term=name, label=rate.label if rate else name, response=response, log_odds=effect[i], ci=iv,
                p_value=p[i], p_holm=p_holm[i] if len(term) == 2 and name not in est.pre_registered else None,
                rate_clear=rate_clear, logit_clear=logit_clear, scale=scale,
            ))
        training = (f"plus the training-run variance 4 s^2 / cells (s = {s:.3f}, the cells' root mean square)" if s > 0 else
                    "without a training-run term (none estimated)")
        texts.append(said + LOGIT_MODEL.format(
            cluster=cluster_name, g=fit.clusters, training=training, ci=ci, dropped=fit.dropped, n_terms=len(est.terms),
            n_main=len(est.factors), n_pairs=len(est.terms) - len(est.factors),
        ))
    return " ".join(texts), out


def _no_estimate(est: ScreenEffects, response: str, term: tuple[str, ...], why: str) -> LogitEffect:
    name = term_name(term)
    rate = est.find(response, name)
    return LogitEffect(term=name, label=rate.label if rate else name, response=response, log_odds=None,
                       ci=Interval(low=None, high=None), p_value=None, rate_clear=rate is not None and rate.clear,
                       logit_clear=False, scale="no estimate", why=why)
