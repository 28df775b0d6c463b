"""The curvature test of centre points (design.centre_points; eps_screen/spec/centre_points.py declares them).

Per response (SR, LR) and source, the centre cells' mean rate against the design cells' (Montgomery, Design and
Analysis of Experiments, "Addition of center points to the 2^k design"):

    curvature = ybar_C - ybar_F
    SE        = s_C * sqrt(1/n_C + 1/n_F),      s_C the SD of the n_C centre cells' rates (pure error, n_C - 1 df)
    CI        = curvature -+ t_{1 - alpha/2, n_C - 1} * SE,   alpha = 1 - bootstrap.ci

F: the source's primary-seed design cells at the held factors' levels (every design cell when nothing is held), so a
held factor's own effect is no curvature. With every numeric factor linear, ybar_F estimates the response at the
centre and the difference is 0; its sign says which way the response bends (positive: the middle lies above the
straight line between the levels). It is the sum of the factors' curvatures: which factor curves it cannot say.

The centre cells are replicates of one recipe at other seeds, so s_C holds everything a second training run
changes and the answers' sampling, with no effect in it: the interval needs neither the bootstrap nor the design's
residual contrasts. Pooled: the mean of the sources' curvatures, its SE from the pooled pure error (sum of the
sources' n_C - 1 df). The rates are compared as rates: a response linear on the log-odds scale still curves on the
rate scale away from a rate of 0.5, and that is curvature too (docs/statistics.md, "Centre points").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from eps_screen.analysis.schemas import CurvatureTest, Interval
from eps_screen.analysis.stats import t_critical
from eps_screen.spec.centre_points import centre_levels, held_levels
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import Cell

POOLED = "pooled"


@dataclass(frozen=True)
class _Groups:
    centre: np.ndarray
    design: np.ndarray


def _is_centre(cell_id: str, levels: tuple) -> bool:
    try:
        cell = Cell.parse(cell_id)
    except ValueError:
        return False
    return cell.is_centre and cell.levels == levels


def _groups(config: ScreenConfig, cells: Sequence, response: str, source: str) -> _Groups:
    levels, held = centre_levels(config), held_levels(config)
    centre, design = [], []
    for c in cells:
        value = getattr(c, response)
        if c.source != source or value is None or not np.isfinite(value):
            continue
        if _is_centre(c.cell_id, levels):
            centre.append(value)
        elif c.in_factorial and all(c.levels.get(f) == lvl for f, lvl in held.items()):
            design.append(value)
    return _Groups(np.array(centre, dtype=float), np.array(design, dtype=float))


def _test(response: str, source: str, curvature: float, centre_mean: float, design_mean: float, var: float,
          sd: float, df: int, n_c: int, n_f: int, alpha: float, partial: bool) -> CurvatureTest:
    half = t_critical(1 - alpha / 2, df) * np.sqrt(var) if df >= 1 else float("nan")
    ci = Interval(low=curvature - half, high=curvature + half)
    return CurvatureTest(response=response, source=source, centre_cells=n_c, design_cells=n_f,
                         centre_mean=centre_mean, design_mean=design_mean, curvature=curvature, ci=ci,
                         pure_error_sd=sd, df=df, detected=ci.excludes_zero(), partial=partial)


def curvature_tests(config: ScreenConfig, cells: Sequence, sources: Sequence[str] | None = None) -> list[CurvatureTest]:
    """Per response, each source's test and the pooled one (more than one source); none without centre points.

    cells: schemas.CellMetric records (cell_id, source, levels, SR, LR, in_factorial), or anything with those fields.
    A source with fewer than 2 centre cells or no design cell has no test yet (and pools nothing)."""
    n = config.design.centre_points
    if not n:
        return []
    alpha = 1 - config.bootstrap.ci
    sources = list(config.sources if sources is None else sources)
    out = []
    for response in ("SR", "LR"):
        per: list[tuple[float, float, int, int, float, float]] = []  # curvature, variance of one cell, n_C, n_F, means
        for s in sources:
            g = _groups(config, cells, response, s)
            n_c, n_f = g.centre.size, g.design.size
            if n_c < 2 or n_f == 0:
                continue
            var = float(np.var(g.centre, ddof=1))
            c_mean, f_mean = float(g.centre.mean()), float(g.design.mean())
            out.append(_test(response, s, c_mean - f_mean, c_mean, f_mean, var * (1 / n_c + 1 / n_f), np.sqrt(var),
                             n_c - 1, n_c, n_f, alpha, n_c < n))
            per.append((c_mean - f_mean, var, n_c, n_f, c_mean, f_mean))
        if len(sources) > 1 and per:
            curv, var, n_c, n_f, c_mean, f_mean = (np.array(x, dtype=float) for x in zip(*per, strict=True))
            df = int((n_c - 1).sum())
            pooled_var = float(((n_c - 1) * var).sum() / df)  # the pure error of every source's centre cells
            se2 = pooled_var * float((1 / n_c + 1 / n_f).sum()) / len(per) ** 2
            out.append(_test(response, POOLED, float(curv.mean()), float(c_mean.mean()), float(f_mean.mean()), se2,
                             np.sqrt(pooled_var), df, int(n_c.sum()), int(n_f.sum()), alpha,
                             len(per) < len(sources) or bool((n_c < n).any())))
    return out


def centre_rows(cell_ids: Sequence[str]) -> np.ndarray:
    """True for each centre cell among these ids (the training-run estimate takes their spread as pure error)."""
    def centre(cell_id: str) -> bool:
        try:
            return Cell.parse(cell_id).is_centre
        except ValueError:
            return False

    return np.array([centre(c) for c in cell_ids], dtype=bool)
