"""The screen's report: its plotly figures (the half-normal plot one per response) and clean_result.html.

write_report is the one entry point (aggregate.aggregate calls it). Each figure is also written on its
own, as plotly JSON (to re-open or restyle) and as an HTML fragment without plotly.js (to embed, e.g.
in a Prefect artifact); clean_result.html carries plotly.js once and works offline.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from eps_screen.report import half_normal
from eps_screen.report.labels import with_level_labels
from eps_screen.report.page import render
from eps_screen.report.plots import ab_interaction, factor_ranking, persona_heatmap
from eps_screen.report.tables import PLOTLY_CONFIG
from eps_screen.spec.config import ScreenConfig
from eps_screen.store.files import write_text

if TYPE_CHECKING:
    from eps_screen.run.aggregate import AggregateResult

__all__ = ["build_figures", "write_report"]


def heatmap_personas(config: ScreenConfig, result: AggregateResult) -> list[str]:
    """Eval personas in panel order (sources first), keeping only those some cell was scored on."""
    from eps_screen.panels import load_panels

    seen = {p for c in result.metrics.cells for p in c.persona_rates}
    ordered = load_panels().eval_personas(config.sources, len(load_panels().personas))
    return [p for p in ordered if p in seen] + sorted(seen - set(ordered))


def build_figures(config: ScreenConfig, result: AggregateResult) -> dict[str, go.Figure]:
    note = " (PARTIAL)" if result.partial else ""
    found = half_normal.panels(config, result)
    return {
        "factor_ranking": factor_ranking(config, result.main_effects.effects, note),
        "ab_interaction": ab_interaction(config, result.metrics.ab_means, note, _pair(result)),
        "persona_heatmap": persona_heatmap(config, result.metrics.cells, heatmap_personas(config, result), note),
        **{f"half_normal_{r}": half_normal.figure(config, found, r, note) for r in ("SR", "LR")},
    }


def _pair(result: AggregateResult) -> tuple[str, ...]:
    """The pre-registered interaction the figure shows (the first declared): (X, Y), or () when none."""
    pre = result.estimates.pre_registered
    return tuple(pre[0].split(":")) if pre else ()


def write_report(config: ScreenConfig, result: AggregateResult, out_dir: Path) -> dict[str, Path]:
    config = with_level_labels(config)  # the levels as this config ran them (texts, off_policy, data)
    figures = build_figures(config, result)
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for name, fig in figures.items():
        write_text(fig_dir / f"{name}.json", fig.to_json())
        write_text(fig_dir / f"{name}.html",
                   fig.to_html(full_html=False, include_plotlyjs=False, div_id=name, config=PLOTLY_CONFIG))
        paths[f"figures/{name}.json"] = fig_dir / f"{name}.json"
        paths[f"figures/{name}.html"] = fig_dir / f"{name}.html"
    page = out_dir / "clean_result.html"
    write_text(page, render(config, result, figures))
    paths["clean_result.html"] = page
    return paths
