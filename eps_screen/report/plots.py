"""The ranking, interaction and heatmap figures of a screen, as plotly figures built from the aggregation's records
(not from raw answers); the half-normal plots are report/half_normal.py's.

- factor ranking: pooled Cohen's d of each main effect with its CI, largest |d| on top, one panel per
  response; per-source d as markers of a colour and shape per source, side by side in the bar, so a factor
  whose sources disagree is visible at a glance.
- the pre-registered interaction X x Y (the marker screen's A x B): mean rate at each (X, Y) combination,
  one line per Y level; non-parallel lines are the interaction.
- persona x cell heatmap: every cell's marker rate under every eval persona; the source persona of
  each cell is marked (in the legend too), each cell's levels label its column, each source's block is named.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from eps_screen.analysis.schemas import CellMetric, GroupMean, TermEffect
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import level_symbol

RESPONSE_NAMES = {"SR": "Source rate", "LR": "Leakage"}
_BAR = {"SR": "#1f77b4", "LR": "#d62728"}
_SOURCE_SYMBOLS = ["circle", "diamond", "square", "triangle-up", "x", "star"]
_SOURCE_COLORS = ["#ff7f0e", "#2ca02c", "#9467bd", "#e377c2", "#17becf", "#bcbd22"]  # none is a bar's colour


def _wrap(text: str, width: int = 24) -> str:
    """A tick label in lines of at most `width` characters (plotly breaks lines at <br> only)."""
    return "<br>".join(textwrap.wrap(text, width)) or text


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def factor_label(config: ScreenConfig, factor: str) -> str:
    return f"{config.factors[factor].label} ({factor})"


def factor_ranking(config: ScreenConfig, effects: Sequence[TermEffect], title_note: str = "") -> go.Figure:
    """Bars of pooled d with CI whiskers, sorted by |d| (largest on top), one panel per response."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=[RESPONSE_NAMES[r] for r in ("SR", "LR")], horizontal_spacing=0.22)
    sources = sorted({e.source for e in effects if e.source != "pooled"}, key=lambda s: (s not in config.sources, s))
    for col, response in enumerate(("SR", "LR"), start=1):
        pooled = [e for e in effects if e.response == response and e.source == "pooled" and len(e.factors) == 1]
        ranked = sorted(pooled, key=lambda e: -abs(e.d) if e.d is not None else 0.0)
        labels = [factor_label(config, e.term) for e in ranked]
        rows = [len(ranked) - 1 - i for i in range(len(ranked))]  # largest |d| on top
        d = [e.d if e.d is not None else 0.0 for e in ranked]
        hover = [
            f"<b>{factor_label(config, e.term)}</b><br>"
            f"d = {_fmt(e.d)} [{_fmt(e.d_ci.low)}, {_fmt(e.d_ci.high)}]<br>"
            f"{RESPONSE_NAMES[response]} at {config.factors[e.term].high}: {_fmt(e.mean_high)} "
            f"[{_fmt(e.mean_high_ci.low)}, {_fmt(e.mean_high_ci.high)}]<br>"
            f"{RESPONSE_NAMES[response]} at {config.factors[e.term].low}: {_fmt(e.mean_low)} "
            f"[{_fmt(e.mean_low_ci.low)}, {_fmt(e.mean_low_ci.high)}]<br>"
            f"difference {_fmt(e.effect)} [{_fmt(e.effect_ci.low)}, {_fmt(e.effect_ci.high)}]"
            + (" (partial)" if e.partial else "")
            for e in ranked
        ]
        fig.add_trace(go.Bar(
            x=d, y=rows, orientation="h", name=f"{RESPONSE_NAMES[response]}: pooled d", width=0.8,
            marker_color=_BAR[response], hovertext=hover, hoverinfo="text",
            error_x={
                "type": "data", "symmetric": False,
                "array": [max(0.0, (e.d_ci.high or 0.0) - (e.d or 0.0)) if e.d_ci.high is not None else 0.0 for e in ranked],
                "arrayminus": [max(0.0, (e.d or 0.0) - (e.d_ci.low or 0.0)) if e.d_ci.low is not None else 0.0 for e in ranked],
                "color": "#333",
            },
        ), row=1, col=col)
        for k, source in enumerate(sources):  # each source its own colour and shape, on its own line in the bar
            per = {e.term: e for e in effects if e.response == response and e.source == source and len(e.factors) == 1}
            offset = (k - (len(sources) - 1) / 2) * min(0.25, 0.7 / max(1, len(sources)))
            fig.add_trace(go.Scatter(
                x=[per[e.term].d if e.term in per else None for e in ranked], y=[r + offset for r in rows],
                mode="markers", name=f"d in source {source}", legendgroup=source, showlegend=col == 1,
                marker={"symbol": _SOURCE_SYMBOLS[k % len(_SOURCE_SYMBOLS)], "size": 10,
                        "color": _SOURCE_COLORS[k % len(_SOURCE_COLORS)], "line": {"color": "#222", "width": 1}},
                hovertemplate=f"{source}: d = %{{x:.3f}}<extra></extra>",
            ), row=1, col=col)
        fig.update_yaxes(tickvals=rows, ticktext=labels, range=[-0.6, len(rows) - 0.4], row=1, col=col)
        fig.update_xaxes(title_text="Cohen's d (level 1 vs level 0)", zeroline=True, zerolinecolor="#888", row=1, col=col)
    fig.update_layout(
        title=f"Which factors move source rate and leakage: pooled Cohen's d with {config.bootstrap.ci:.0%} CIs{title_note}",
        barmode="overlay", height=460, margin={"l": 10, "r": 10, "t": 80, "b": 50},
    )
    return fig


def ab_interaction(config: ScreenConfig, ab_means: Sequence[GroupMean], title_note: str = "",
                   pair: Sequence[str] = ()) -> go.Figure:
    """Mean rate at each (X, Y) combination of the pre-registered pair (pooled over sources and the other factors),
    one line per Y level. GroupMean.A and .B hold X's and Y's levels; an empty pair gives an empty figure."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=[RESPONSE_NAMES[r] for r in ("SR", "LR")])
    if len(pair) != 2:
        fig.update_layout(title=f"No pre-registered interaction declared{title_note}", height=420)
        return fig
    x, y = pair
    fa, fb = config.factors[x], config.factors[y]
    x_labels = [f"{x}0: {_wrap(fa.low)}", f"{x}1: {_wrap(fa.high)}"]  # a level's words fill a line otherwise
    for col, response in enumerate(("SR", "LR"), start=1):
        for b, color, dash in ((0, "#2ca02c", "solid"), (1, "#9467bd", "dash")):
            pts = sorted((g for g in ab_means if g.response == response and g.B == b), key=lambda g: g.A)
            fig.add_trace(go.Scatter(
                x=[x_labels[g.A] for g in pts], y=[g.mean for g in pts], mode="lines+markers",
                name=f"{y}{b}: {fb.high if b else fb.low}", legendgroup=f"{y}{b}", showlegend=col == 1,
                line={"color": color, "dash": dash},
                error_y={
                    "type": "data", "symmetric": False,
                    "array": [(g.ci.high - g.mean) if g.ci.high is not None and g.mean is not None else 0 for g in pts],
                    "arrayminus": [(g.mean - g.ci.low) if g.ci.low is not None and g.mean is not None else 0 for g in pts],
                },
                hovertext=[
                    f"{x_labels[g.A]}, {y}{b}: {fb.high if b else fb.low}<br>mean {_fmt(g.mean)} [{_fmt(g.ci.low)}, {_fmt(g.ci.high)}]"
                    for g in pts
                ],
                hoverinfo="text",
            ), row=1, col=col)
        fig.update_yaxes(title_text=f"mean {RESPONSE_NAMES[response].lower()}", rangemode="tozero", row=1, col=col)
        # the two levels a quarter in from each side: a level's words never reach the y axis's labels
        fig.update_xaxes(range=[-0.5, 1.5], row=1, col=col)
    fig.update_layout(
        title=f"{fa.label} x {fb.label} (the pre-registered interaction){title_note}",
        height=460, margin={"l": 10, "r": 10, "t": 80, "b": 40}, legend_title_text=fb.label.lower(),
    )
    return fig


def persona_heatmap(config: ScreenConfig, cells: Sequence[CellMetric], personas: Sequence[str], title_note: str = "") -> go.Figure:
    """Marker rate of every (cell, persona): one row per cell, so every cell's label is written level and legible
    however many cells there are (the figure grows downwards); a white frame marks each source's own column."""
    order = {s: i for i, s in enumerate(config.sources)}
    factors = list(config.factors)
    ordered = sorted(cells, key=lambda c: (order.get(c.source or "", len(order)), c.source or "", c.seed or 0,
                                         tuple(c.levels.get(f) or 0 for f in reversed(factors))))
    y = [c.cell_id for c in ordered]
    z = [[c.persona_rates.get(p) for p in personas] for c in ordered]
    hover = [
        [f"cell {c.cell_id}<br>persona {p}{' (source)' if p == c.source else ''}<br>marker rate {_fmt(c.persona_rates.get(p))}"
         for p in personas]
        for c in ordered
    ]
    fig = go.Figure(go.Heatmap(
        z=z, x=list(personas), y=y, colorscale="Viridis", zmin=0, zmax=1, hovertext=hover, hoverinfo="text",
        colorbar={"title": {"text": "marker rate"}, "len": min(1.0, 600 / (16 * len(y) + 1))}, showlegend=False,
    ))
    # Each cell's levels (and its seed when it is not the primary one) beside it; each source's block named on
    # the right and framed in its own column (a frame, not a mark on every cell, so the colour stays readable).
    ticks = ["".join(f"{f}{level_symbol(c.levels.get(f))}" for f in factors)
             + (f" s{c.seed}" if c.seed != config.seeds.primary else "") for c in ordered]
    blocks: dict[str, list[int]] = {}
    for i, c in enumerate(ordered):
        blocks.setdefault(c.source or "?", []).append(i)
    column = {p: i for i, p in enumerate(personas)}
    for source, idx in blocks.items():
        fig.add_annotation(x=1.0, y=(idx[0] + idx[-1]) / 2, xref="paper", yref="y", xanchor="left", showarrow=False,
                           text=f"source: {source}", textangle=90)
        if idx[0] > 0:
            fig.add_hline(y=idx[0] - 0.5, line={"color": "white", "width": 3})
        if source in column:
            fig.add_shape(type="rect", x0=column[source] - 0.5, x1=column[source] + 0.5, y0=idx[0] - 0.5,
                          y1=idx[-1] + 0.5, xref="x", yref="y", line={"color": "white", "width": 2})
    fig.update_yaxes(tickmode="array", tickvals=y, ticktext=ticks, tickfont={"size": 10}, autorange="reversed",
                     title_text=f"cell ({len(y)}): its levels of {', '.join(factors)}, and its seed when not "
                                f"{config.seeds.primary}")
    fig.update_xaxes(title_text="eval persona (framed: the block's source persona)", side="top", tickangle=-90,
                     automargin=True)
    fig.update_layout(
        title=f"Marker rate by persona and cell{title_note}", height=16 * len(y) + 260,
        margin={"l": 10, "r": 40, "t": 150, "b": 20},
    )
    return fig
