"""The half-normal (Daniel) plot with Lenth's margins, one figure per response (pooled, then each source), and the
page's table of the margins (eps_screen/analysis/lenth.py computes them from the factorial cells' rates).

Each panel puts every contrast's |effect| against its half-normal score: null effects lie on a line through the
origin, active ones stand off to the right. The dashed lines are Lenth's ME (one effect at a time) and SME (all at
once); effects beyond the SME are labelled. Labels sit left of their points, so two labels can meet only if their
points' scores are close: the figure is made tall enough that the labelled scores are LABEL_PX apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from eps_screen.analysis.lenth import POOLED, HalfNormal, half_normal_scores, screen_half_normal
from eps_screen.report.plots import RESPONSE_NAMES
from eps_screen.report.tables import Table, num

if TYPE_CHECKING:
    from eps_screen.run.aggregate import AggregateResult
    from eps_screen.spec.config import ScreenConfig

LABEL_PX = 16  # a 11 px label's height and a margin
MARGIN_PX = (110, 60)  # top (title, subplot titles of two lines), bottom (axis title)
HEIGHT_PX = (420, 1000)
_COLOUR = {"sme": "#b00020", "me": "#e67e22", "": "#888"}


def panels(config: ScreenConfig, result: AggregateResult) -> list[HalfNormal]:
    order = [POOLED, *result.estimates.sources]
    found = screen_half_normal(result.metrics.cells, list(result.estimates.factors), result.estimates.sources,
                               1 - config.bootstrap.ci)
    return sorted(found, key=lambda h: (h.response != "SR", order.index(h.source) if h.source in order else len(order)))


def figure(config: ScreenConfig, found: list[HalfNormal], response: str, title_note: str = "") -> go.Figure:
    mine = [h for h in found if h.response == response and h.margins is not None]
    if not mine:
        fig = go.Figure()
        fig.update_layout(title=f"{RESPONSE_NAMES[response]}: no half-normal plot (fewer than 3 contrasts){title_note}",
                          height=HEIGHT_PX[0])
        return fig
    titles = [f"{h.source}<br>ME {h.margins.me:.3f}, SME {h.margins.sme:.3f}" for h in mine]
    fig = make_subplots(rows=1, cols=len(mine), subplot_titles=titles, horizontal_spacing=0.05)
    plot_px = HEIGHT_PX[0] - sum(MARGIN_PX)
    for col, h in enumerate(mine, start=1):
        order = np.argsort(np.abs(h.effects))
        x = np.abs(h.effects)[order]
        y = half_normal_scores(len(x))
        names = [h.names[i] for i in order]
        kind = ["sme" if n in h.beyond_sme else "me" if n in h.beyond_me else "" for n in names]
        fig.add_trace(go.Scatter(  # lists, not arrays: the figure file stays plain JSON
            x=x.tolist(), y=y.tolist(), mode="markers+text",
            text=[n if k == "sme" else "" for n, k in zip(names, kind, strict=True)],
            textposition="middle left", textfont={"size": 11}, cliponaxis=False, showlegend=False,
            marker={"size": 7, "color": [_COLOUR[k] for k in kind]},
            hovertext=[f"{n}: {h.effects[i]:+.4f}" for n, i in zip(names, order, strict=True)], hoverinfo="text",
        ), row=1, col=col)
        top = float(y[-1]) * 1.08
        for value, label, dash in ((h.margins.me, "ME", "dot"), (h.margins.sme, "SME", "dash")):
            fig.add_trace(go.Scatter(x=[value, value], y=[0, top], mode="lines", name=f"Lenth's {label}",
                                     legendgroup=label, showlegend=col == 1, hoverinfo="skip",
                                     line={"color": _COLOUR["sme" if label == "SME" else "me"], "dash": dash}),
                          row=1, col=col)
        labelled = sorted(float(s) for s, k in zip(y, kind, strict=True) if k == "sme")
        gaps = np.diff(labelled)
        if gaps.size and gaps.min() > 0:
            plot_px = max(plot_px, LABEL_PX * top / float(gaps.min()))
        fig.update_xaxes(title_text="|effect|" if col > 1 else f"|effect| on {RESPONSE_NAMES[response].lower()}",
                         rangemode="tozero", row=1, col=col)
        fig.update_yaxes(range=[0, top], title_text="half-normal score" if col == 1 else None, row=1, col=col)
    fig.update_layout(
        title=f"{RESPONSE_NAMES[response]}: half-normal plot of every contrast, Lenth's margins at "
              f"{config.bootstrap.ci:.0%}{title_note}",
        height=int(min(HEIGHT_PX[1], plot_px + sum(MARGIN_PX))),
        margin={"l": 10, "r": 10, "t": MARGIN_PX[0], "b": MARGIN_PX[1]},
        legend={"orientation": "h", "y": -0.18},
    )
    return fig


def table(found: list[HalfNormal]) -> Table:
    rows = [
        (h.response, h.source, h.runs, h.margins.m, num(h.margins.pse), num(h.margins.me), num(h.margins.sme),
         ", ".join(h.beyond_sme) or "none", ", ".join(h.beyond_me) or "none")
        for h in found if h.margins is not None
    ]
    return Table.of(["response", "source", "cells", "contrasts", "Lenth's PSE", "ME", "SME", "beyond the SME (active)",
                     "between ME and SME"], rows, range(2, 7))


def context(config: ScreenConfig, result: AggregateResult, found: list[HalfNormal]) -> dict:
    """The page's half-normal section: the margins' table, and whether this plot is the primary reading (no CI
    carries training-run noise where some source's noise could not be estimated, or where it was switched off)."""
    sd = result.main_effects.bootstrap.training_sd
    missing = not config.bootstrap.training_noise or not sd or any(v is None for v in sd.values())
    return {"table": table(found), "primary": missing, "responses": sorted({h.response for h in found}, reverse=True)}
