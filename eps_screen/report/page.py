"""clean_result.html: one self-contained page (plotly.js inlined once), readable offline.

The layout and its prose live in templates/clean_result.html, a Jinja2 template with autoescape on: every value
put in is escaped unless it is Markup. This module builds the template's context from the aggregation's records
(tables as Table rows); sections.py holds the larger sections. The TL;DR is written from the numbers by tldr.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go
from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup
from plotly.offline import get_plotlyjs

from eps_screen.analysis.gates import GATE_NAMES
from eps_screen.analysis.screen_stats import declarations
from eps_screen.plan.costs import COST_HEADERS, cost_rows, cost_sentence
from eps_screen.report import curvature_table, half_normal, power_table, sections
from eps_screen.report.tables import Table, figure_div, num, span
from eps_screen.report.tldr import LATE_GATES, numbers_are, tldr
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import level_symbol

if TYPE_CHECKING:
    from eps_screen.run.aggregate import AggregateResult

ENV = Environment(loader=PackageLoader("eps_screen.report", "templates"), autoescape=True, undefined=StrictUndefined,
                  trim_blocks=True, lstrip_blocks=True)


# Criteria that only a GPU pool can trip, and why an in-process run has no outcome for them.
_GPU_GATES = {
    5: "in-process run: no GPU job and nothing rented, so no job time or spend to cap",
    6: "in-process run: no GPU job whose progress could stall",
}


def gate_rows(config: ScreenConfig, result: AggregateResult) -> list[tuple]:
    g = config.gates
    rules = {
        1: f"base-model marker rate > {g.contamination}, pooled or under any one prompt condition",
        2: f"smoke source rates all <= {g.smoke_floor} or all >= {g.smoke_ceiling}",
        3: f">= {g.sign_flips} of {len(config.factors)} main effects flip sign across sources (SR or LR)",
        4: f"every |d| < {g.noise_d}, SR and LR, every source",
        5: f"a GPU job > {g.max_job_hours:g} h, or spend > {g.spend_factor:g} x estimate",
        6: f"RUNNING with no progress for {g.bootstrap_silence_s:g} s",
    }
    recorded = {o.number: o for o in result.metrics.gates}
    rows = []
    for n in range(1, 7):
        o = recorded.get(n)
        if o is None and n in _GPU_GATES and config.execution.pool == "inprocess":
            outcome, reason = span("muted", "does not apply"), _GPU_GATES[n]
        elif o is None:
            outcome, reason = span("muted", "not recorded"), "no outcome passed to this aggregation"
        elif not o.evaluated:
            outcome, reason = span("muted", "not evaluated"), o.reason
        else:
            outcome, reason = (span("fired", "FIRED") if o.fired else span("ok", "passed")), o.reason
        rows.append((n, GATE_NAMES[n], rules[n], outcome, reason))
    return rows


def _predictions(result: AggregateResult) -> Table | None:
    return Table.of(["", "prediction", "verdict", "deciding figures"], (
        (p.id, p.statement, span(p.verdict.replace(" ", "-"), p.verdict), p.deciding) for p in result.metrics.predictions))


def _cost(result: AggregateResult) -> dict | None:
    """Estimate beside actual (GPU-hours, USD), from the store's cost records (eps_screen/plan/costs.py)."""
    cost = result.metrics.extras.get("cost")
    if not cost:
        return None
    return {"sentence": cost_sentence(cost), "table": Table.of(COST_HEADERS, cost_rows(cost), (1, 2, 3, 4), "cost")}


def _cells_table(result: AggregateResult) -> Table | None:
    factors = result.estimates.factors
    rows = [
        (c.cell_id, c.source, c.seed, *[level_symbol(c.levels.get(f)) for f in factors], num(c.SR), num(c.LR), num(c.random_rate),
         c.n_source, c.n_leak, "yes" if c.in_factorial else "no")
        for c in result.metrics.cells
    ]
    headers = ["cell", "source", "seed", *factors, "source rate", "leakage", "random-control rate",
               "source answers", "leakage answers", "in factorial"]
    return Table.of(headers, rows, range(2, 9 + len(factors)))


EXCERPT_CHARS = 400


def _examples(result: AggregateResult) -> Table | None:
    """The answers themselves: per group, the best cell's source-persona answer with the marker and one without.
    None when there is nothing to quote; a table with no rows when the answers were stored without text."""
    ex = result.examples
    if ex is None or ex.is_empty():
        return None
    headers = ["group", "cell", "question", "marker", "answer"]
    if ex["text"].null_count() == ex.height:
        return Table(headers, [])
    rows = []
    for r in ex.iter_rows(named=True):
        text = r["text"]
        cut = "(no text stored)" if text is None else text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + " [...]"
        rows.append((r["group"], r["cell_id"], r["question"], "yes" if r["marker"] else "no", span("answer", cut)))
    return Table(headers, rows, frozenset([2]))


def _seed_table(result: AggregateResult) -> Table | None:
    return Table.of(["source", "levels", "seeds", "source rate per seed", "SD", "leakage per seed", "SD"], (
        (r.source, "".join(f"{f}{r.levels[f]}" for f in result.estimates.factors), ", ".join(map(str, r.seeds)),
         ", ".join(num(x) for x in r.SR), num(r.SR_sd), ", ".join(num(x) for x in r.LR), num(r.LR_sd))
        for r in result.metrics.seed_replicates))


def training_context(result: AggregateResult) -> dict:
    """What the intervals add for a second training run, per response and source, for the template's sentence."""
    b = result.main_effects.bootstrap
    parts = [f"{r}: not estimable ({b.training_df.get(r, 0)} df), left out" if sd is None else
             f"{r}: log-odds SD s = {sd:.3f} from {b.training_df.get(r, 0)} df" for r, sd in b.training_sd.items()]
    return {"parts": parts, "caveats": " ".join(result.estimates.caveats),
            "estimated": any(v is not None for v in b.training_sd.values())}


def bootstrap_scheme(result: AggregateResult) -> str:
    """The design section's bootstrap paragraph (the template's macro), as HTML."""
    b = result.main_effects.bootstrap
    widen = "; ".join(f"{r}: c = {c:.3f}" for r, c in b.widen.items())
    return str(ENV.get_template("macros.html").module.bootstrap_scheme(b, widen, training_context(result)))


def render(config: ScreenConfig, result: AggregateResult, figures: dict[str, go.Figure]) -> str:
    cov = result.metrics.coverage
    missing = cov.missing_cells
    partial = {"missing": len(missing), "expected": cov.expected,
               "shown": ", ".join(missing[:30]) + (f" and {len(missing) - 30} more" if len(missing) > 30 else "")}
    fired = [{"number": g.number, "name": g.name, "meaning": LATE_GATES[g.number]}
             for g in result.metrics.gates if g.fired and g.number in LATE_GATES]
    p = result.metrics.provenance
    b = result.main_effects.bootstrap
    caveats = sections.caveats(config, result)
    caveats["widen_c"] = "; ".join(f"{r}: c = {c:.3f}" for r, c in b.widen.items())
    return ENV.get_template("clean_result.html").render(
        config=config, factors=list(config.factors), title=f"eps-screen: {config.name}",
        subtitle=(f"{cov.present} cells present of {cov.expected} expected; {cov.factorial_cells} primary-seed cells in "
                  f"the factorial; sources: {', '.join(result.estimates.sources) or 'none yet'}."),
        plotlyjs=Markup(get_plotlyjs()), partial=partial if cov.partial else None,
        numbers_are=numbers_are(config), tldr=tldr(config, result), ci_pct=f"{b.ci:.0%}",
        figures={name: figure_div(fig, name) for name, fig in figures.items()},
        predictions=_predictions(result), declared_predictions=bool(declarations(config)[1]),
        gates=Table.of(["#", "criterion", "fires when", "outcome", "numbers"], gate_rows(config, result)),
        late_gates=fired, cost=_cost(result), estimator=result.main_effects.estimator,
        main_effects=sections.effects_table(result, result.main_effects.effects, list(result.estimates.factors)),
        interactions=sections.effects_table(result, result.interactions.interactions, sections.interaction_terms(result),
                                            holm=True),
        pair=sections.pair(result), simple=sections.simple_effects(config, result),
        logit=sections.logit(result), logit_model=result.main_effects.logit_model,
        bootstrap=b, training=training_context(result), caveats=caveats,
        cells=_cells_table(result), seeds=_seed_table(result), examples=_examples(result), excerpt_chars=EXCERPT_CHARS,
        recipe=sections.recipe(config), design=sections.design(config),
        half_normal=half_normal.context(config, result, half_normal.panels(config, result)),
        power=power_table.context(config, result), curvature=curvature_table.context(config, result),
        screen=result.metrics.screen, created_at=result.metrics.created_at, provenance=p,
        libraries=", ".join(f"{k} {v}" for k, v in (p.get("libraries") or {}).items() if v),
    )
