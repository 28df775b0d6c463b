"""Lenth's method and the half-normal (Daniel) plot: the standard reading of an unreplicated two-level design.

Every orthogonal contrast of the n runs of a design (n - 1 of them: in a full 2^k every effect, in a fraction one per
alias chain, in a Plackett-Burman design the columns) is estimated as level 1 minus level 0. If few of them are
real (effect sparsity), the small ones are noise, and Lenth (1989) estimates the noise from them:

    s0  = 1.5 * median |c_j|
    PSE = 1.5 * median { |c_j| : |c_j| < 2.5 s0 }       (pseudo standard error)
    ME  = t_{1 - alpha/2, m/3} * PSE                     (margin of error, one contrast at a time)
    SME = t_{gamma, m/3} * PSE, gamma = (1 + (1 - alpha)^(1/m)) / 2   (simultaneous: all m contrasts at once)

An effect beyond the SME is active even allowing for having looked at all m; between ME and SME it is a candidate.
The PSE holds every source of variation of a contrast at once (answer sampling, questions, training runs), so it
needs no training-noise estimate; what it needs is that most contrasts are null. docs/statistics.md says when to
read it before the bootstrap CIs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.special import ndtri, stdtrit

# A 2^k's every contrast is a word of the factors; a design with unused columns (a Plackett-Burman design of fewer
# than N-1 factors) leaves contrasts no short word spans. Words are tried up to this many, the rest is filled.
MAX_WORDS = 4096
TOL = 1e-9


@dataclass(frozen=True)
class Lenth:
    pse: float
    me: float
    sme: float
    df: float
    m: int


def lenth(effects: Sequence[float], alpha: float = 0.05) -> Lenth | None:
    """Lenth's PSE, ME and SME of m contrasts (None below 3: the t quantiles need df = m/3 of at least 1)."""
    c = np.abs(np.asarray(effects, dtype=float))
    c = c[np.isfinite(c)]
    m = c.size
    if m < 3:
        return None
    s0 = 1.5 * float(np.median(c))
    trimmed = c[c < 2.5 * s0]
    pse = 1.5 * float(np.median(trimmed)) if trimmed.size else 0.0
    df = m / 3
    gamma = (1 + (1 - alpha) ** (1 / m)) / 2
    return Lenth(pse=pse, me=float(stdtrit(df, 1 - alpha / 2)) * pse, sme=float(stdtrit(df, gamma)) * pse, df=df, m=m)


def half_normal_scores(m: int) -> np.ndarray:
    """The expected positions of m sorted |effects| under no effect: Phi^-1(0.5 + 0.5 (i - 0.5) / m), i = 1..m."""
    return ndtri(0.5 + 0.5 * (np.arange(1, m + 1) - 0.5) / m)


def contrasts(coded: np.ndarray, factors: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """(names, W): n - 1 orthogonal contrasts of the n runs (coded -1/+1, one column per factor), W @ y the effects
    (level 1 minus level 0 for a word's column). Words are taken shortest first and kept when balanced and orthogonal
    to those kept (an alias of a kept word is not); contrasts no word gives (unused columns) are filled in
    orthonormally, named e1, e2, ..., with the variance a word's effect has."""
    n = coded.shape[0]
    kept: list[np.ndarray] = []
    names: list[str] = []
    tried = 0
    for order in range(1, len(factors) + 1):
        for idx in itertools.combinations(range(len(factors)), order):
            tried += 1
            if len(kept) >= n - 1 or tried > MAX_WORDS:
                break
            col = np.prod(coded[:, list(idx)], axis=1)
            if abs(col.sum()) > TOL or any(abs(col @ k) > TOL for k in kept):
                continue
            kept.append(col)
            names.append(":".join(factors[i] for i in idx))
    w = [k / (n / 2) for k in kept]
    if len(kept) < n - 1:
        basis = np.column_stack([np.ones(n), *kept]) if kept else np.ones((n, 1))
        q, _ = np.linalg.qr(np.column_stack([basis, np.eye(n)]))
        rest = q[:, basis.shape[1]:n]
        w += [2 * u / math.sqrt(n) for u in rest.T]  # unit-norm u: 2 u.y / sqrt(n) has a word effect's variance
        names += [f"e{i + 1}" for i in range(rest.shape[1])]
    return names, np.array(w).reshape(len(w), n)


@dataclass
class HalfNormal:
    """One response of one source (or pooled): every contrast's effect, Lenth's margins, and which effects pass."""

    response: str
    source: str
    names: list[str]
    effects: np.ndarray
    margins: Lenth | None
    runs: int
    beyond_sme: list[str] = field(default_factory=list)
    beyond_me: list[str] = field(default_factory=list)  # beyond ME, not SME

    @classmethod
    def of(cls, response: str, source: str, coded: np.ndarray, factors: Sequence[str], y: np.ndarray,
           alpha: float) -> HalfNormal:
        names, w = contrasts(coded, factors)
        effects = w @ y if len(names) else np.zeros(0)
        margins = lenth(effects, alpha)
        out = cls(response, source, names, effects, margins, coded.shape[0])
        if margins is not None and margins.pse > 0:
            order = np.argsort(-np.abs(effects))
            out.beyond_sme = [names[i] for i in order if abs(effects[i]) > margins.sme]
            out.beyond_me = [names[i] for i in order if margins.me < abs(effects[i]) <= margins.sme]
        return out


POOLED = "pooled"


def screen_half_normal(cells: Sequence, factors: Sequence[str], sources: Sequence[str],
                       alpha: float) -> list[HalfNormal]:
    """Per response, each source's factorial cells and the pooled screen (each design point's rate averaged over
    the sources that all have it, as the pooled effects average the sources'); cells: schemas.CellMetric records."""
    out = []
    for response in ("SR", "LR"):
        by_source: dict[str, dict[tuple[int, ...], float]] = {}
        for c in cells:
            value = getattr(c, response)
            levels = tuple(c.levels.get(f) for f in factors)
            if c.in_factorial and value is not None and None not in levels and c.source in sources:
                by_source.setdefault(c.source, {})[levels] = value
        for source, rates in by_source.items():
            runs = sorted(rates)
            out.append(HalfNormal.of(response, source, 2 * np.array(runs) - 1, factors,
                                     np.array([rates[r] for r in runs]), alpha))
        common = sorted(set.intersection(*(set(r) for r in by_source.values()))) if by_source else []
        if len(by_source) > 1 and common:
            y = np.array([np.mean([rates[r] for rates in by_source.values()]) for r in common])
            out.append(HalfNormal.of(response, POOLED, 2 * np.array(common) - 1, factors, y, alpha))
    return out
