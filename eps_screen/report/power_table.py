"""The page's power statement: the smallest effect this design detects with 80% power, at this screen's own mean
rates and estimated training-run noise (eps_screen/analysis/power.py; `eps-screen validate` states it before the
run)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from eps_screen.analysis.power import Assumptions, detectable
from eps_screen.report.tables import Table

if TYPE_CHECKING:
    from eps_screen.run.aggregate import AggregateResult
    from eps_screen.spec.config import ScreenConfig

KINDS = {"main effects and pre-registered": "main effects and pre-registered interactions",
         "exploratory": "exploratory interactions (Holm)"}


def context(config: ScreenConfig, result: AggregateResult) -> dict | None:
    """None before any pooled estimate exists (nothing to take the rates from)."""
    try:
        a = Assumptions.like(config, result.main_effects.model_dump(mode="json"), config.name)
    except ValueError:
        return None
    found = detectable(config, a)
    sources = list(config.sources)
    by = {(x.response, x.kind, x.source): x for x in found}
    rows = []
    for (response, kind, source), x in by.items():
        if source != "pooled":
            continue
        rows.append([response, KINDS[kind], f"{x.alpha:.2g}", f"{100 * x.effect:.1f} (d {x.d:.2f})",
                     *[f"{100 * by[(response, kind, s)].effect:.1f}" for s in sources if (response, kind, s) in by]])
    rates = ", ".join(f"{r} {a.rate[r]:.3f}" for r in a.rate)
    sd = ", ".join(f"{r} {a.training_sd[r]:.2f}" for r in a.training_sd)
    return {"rates": rates, "sd": sd, "power": f"{a.power:.0%}",
            "table": Table.of(["response", "terms", "alpha", "pooled, rate points (d)", *[f"{s}, rate points" for s in sources]],
                              rows, range(2, 4 + len(sources)))}
