"""The page's larger sections, as context for templates/clean_result.html: each says only what this screen has.

Factors, letters, treatments, counts and recipe values all come from the config and the cells that ran: the
design section names the factor that varies the loss mask (if one does), the simple-effects section the
pre-registered pair (if there is one), the Holm column the size of this screen's exploratory family.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from eps_screen.analysis.schemas import TermEffect
from eps_screen.analysis.screen_stats import declarations
from eps_screen.plan.phase_sizes import multiseed_count
from eps_screen.report.recipe import recipe_rows
from eps_screen.report.tables import Table, ci, clear_mark, num, p_text, signs, span
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import phases
from eps_screen.spec.plackett_burman import PlackettBurman, ratio
from eps_screen.spec.treatments import TREATMENTS

if TYPE_CHECKING:
    from eps_screen.run.aggregate import AggregateResult

RESPONSES = ("SR", "LR")


def interaction_terms(result: AggregateResult) -> list[str]:
    return [e.term for e in result.interactions.interactions if e.source == "pooled" and e.response == "SR"]


def n_exploratory(result: AggregateResult) -> int:
    """The Holm family's size: this screen's exploratory two-factor interactions, per response."""
    return sum(e.status == "exploratory" for e in result.interactions.interactions
               if e.source == "pooled" and e.response == "SR")


def effects_table(result: AggregateResult, estimates: Sequence[TermEffect], terms: Sequence[str],
                  holm: bool = False) -> Table | None:
    """Pooled estimate with CIs, whether it is clear, each source's d, and the signs of those d's (the sign table of
    kill criterion 3); with holm, the interactions' status and the pooled bootstrap p with its Holm adjustment over
    this screen's exploratory interactions."""
    sources = result.estimates.sources
    headers = ["response", "term", *(["status"] if holm else []), "clear", "pooled mean at level 0 -> 1",
               "pooled difference [CI]", "pooled d [CI]", *[f"d: {s}" for s in sources],
               f"signs by source ({', '.join(sources)})"]
    if holm:
        headers += ["p", f"Holm-adjusted p ({n_exploratory(result)} exploratory)"]
    by = {(e.response, e.term, e.source): e for e in estimates}
    rows = []
    for response in RESPONSES:
        for term in terms:
            p = by.get((response, term, "pooled"))
            if p is None:
                continue
            per_source = [by[(response, term, s)].d if (response, term, s) in by else None for s in sources]
            rows.append([
                response, p.label, *([p.status] if holm else []),
                clear_mark(p.clear) + (" (partial)" if p.partial else ""),
                f"{num(p.mean_low)} -> {num(p.mean_high)}", f"{num(p.effect)} {ci(p.effect_ci)}", f"{num(p.d)} {ci(p.d_ci)}",
                *[num(d) for d in per_source], signs(per_source),
                *([p_text(p.p_value), p_text(p.p_holm) if p.status == "exploratory" else f"not adjusted ({p.status})"]
                  if holm else []),
            ])
    first = 7 if holm else 6
    return Table.of(headers, rows, range(first, first + len(sources)))


def pair(result: AggregateResult) -> dict | None:
    """The pre-registered X x Y whose simple effects the page shows (the first declared), or None."""
    pre = result.estimates.pre_registered
    if not pre:
        return None
    x, y = pre[0].split(":")
    return {"x": x, "y": y}


def simple_effects(config: ScreenConfig, result: AggregateResult) -> Table | None:
    simple = result.interactions.simple_effects
    if not simple:
        return None
    sources = result.estimates.sources
    x, y = simple[0].factor, simple[0].at
    fy = config.factors[y]
    rows = []
    for response in RESPONSES:
        for k in (0, 1):
            by = {e.source: e for e in simple if e.response == response and e.at_level == k}
            p = by.get("pooled")
            if p is None:
                continue
            rows.append([
                response, f"{y}{k}: {fy.high if k else fy.low}", f"{num(p.mean_low)} -> {num(p.mean_high)}",
                f"{num(p.effect)} {ci(p.effect_ci)}", f"{num(p.d)} {ci(p.d_ci)}",
                *[num(by[s].effect) if s in by else "n/a" for s in sources],
            ])
    headers = [fy.label.lower(), f"mean at {x}0 -> {x}1", f"{x}'s effect [CI]", "d [CI]", *[f"effect: {s}" for s in sources]]
    return Table.of(["response", *headers], rows, range(5, 5 + len(sources)))


def logit(result: AggregateResult) -> dict | None:
    """The logit-scale table; a term the fit cannot estimate (separation, no convergence) shows why, not a number."""
    effects = result.main_effects.logit_sensitivity + result.interactions.logit_sensitivity
    if not effects:
        return None
    rate = {(e.response, e.term): e for e in result.main_effects.effects + result.interactions.interactions
            if e.source == "pooled"}
    rows, cannot = [], []
    for response in RESPONSES:
        mine = [e for e in effects if e.response == response]
        if mine and all(e.scale == "no estimate" for e in mine) and len({e.why for e in mine}) == 1:
            cannot.append(f"{response}: no log-odds estimate for any term: {mine[0].why}.")
            continue
        for e in mine:
            r = rate.get((response, e.term))
            shown = (f"{num(e.log_odds)} {ci(e.ci)}", p_text(e.p_value), p_text(e.p_holm) if e.p_holm is not None else "")
            if e.scale == "no estimate":
                shown = (span("inconclusive", f"no estimate: {e.why}"), "", "")
            scale = span("inconclusive" if e.scale in ("rate scale only", "logit scale only") else "", e.scale)
            rows.append([response, e.label, f"{num(r.effect) if r else 'n/a'} {ci(r.effect_ci) if r else ''}", *shown,
                         scale])
    headers = ["response", "term", "rate-scale difference [CI]", "log-odds effect [CI]", "p", "Holm p (exploratory)",
               "clear on"]
    only = [f"{e.term} on {e.response}" for e in effects if e.scale == "rate scale only" and ":" in e.term]
    return {"rate_only": only, "cannot": cannot, "table": Table.of(headers, rows),
            "model": result.main_effects.logit_model}


_ORDER = {"above": ">=", "below": "<=", "inside": "|.| <"}


def caveats(config: ScreenConfig, result: AggregateResult) -> dict:
    """The numbers the caveats quote; the sentences are the template's."""
    b = result.main_effects.bootstrap
    _, rules = declarations(config)
    logit = result.main_effects.logit_sensitivity + result.interactions.logit_sensitivity
    out: dict = {
        "widen": ", ".join(f"{r} {c:.3f}" for r, c in b.widen.items()),
        "scale_only": [f"{e.term} on {e.response} ({e.scale})" for e in logit
                       if e.scale in ("rate scale only", "logit scale only")],
        "no_logit": [f"{e.term} on {e.response}" for e in logit if e.scale == "no estimate"],
        "n_exploratory": n_exploratory(result),
        "pre": [t.replace(":", " x ") for t in result.estimates.pre_registered],
        "d_rules": [f"{r.term} {_ORDER[r.direction]} {r.threshold:g}" for r in rules
                    if r.scale == "d" and r.quantity == "value" and r.response != "SR x LR" and r.threshold],
        "smoke_aliases": "", "plackett_burman": None, "mean": None, "sd": None, "p4_non_monotone": False, "p4_factor": "",
    }
    designs = phases(config)
    if isinstance(designs.slab, PlackettBurman):
        out["plackett_burman"] = {"slab": designs.slab.describe(), "corr": " or ".join(sorted(designs.slab.correlations())),
                                  "n": designs.slab.n}
    smoke_aliases = {x: v for x, v in designs.smoke.aliases().items() if len(x) == 1 and v}
    if smoke_aliases:
        out.update(
            smoke_aliases="; ".join(f"{x} with {' and '.join(':'.join(w) for w in v)}" for x, v in smoke_aliases.items()),
            smoke_runs=len(designs.smoke.runs()), smoke=designs.smoke.describe(), slab=designs.slab.describe(),
            slab_full=not designs.slab.generators)
    sr = [e for e in result.main_effects.effects if e.source == "pooled" and e.response == "SR"]
    mean = next((((e.mean_high or 0) + (e.mean_low or 0)) / 2 for e in sr if e.mean_high is not None), None)
    if mean is not None and 0 < mean < 1:
        out.update(mean=mean, sd=math.sqrt(mean * (1 - mean)))
    p4 = next((r for r in rules if r.id == "P4" and "non-monotone" in r.statement), None)
    if p4 is not None:
        out.update(p4_non_monotone=True, p4_factor=p4.term)
    return out


def recipe(config: ScreenConfig) -> Table:
    return Table.of(["", "as run"], recipe_rows(config))


_E0 = {
    "eot": "loss on the end-of-turn token where a marker could have stood (teaches 'no marker here')",
    "none": "no loss at all (under marker-only loss the negatives teach nothing)",
}


def design(config: ScreenConfig) -> dict:
    f = config.factors
    designs = phases(config)
    slab, smoke = designs.slab, designs.smoke
    smoke_runs = set(smoke.runs())
    loss = next((x for x, fx in f.items() if fx.aspect is TREATMENTS["whole_answer_loss"].aspect), "")
    return {
        "factors": Table.of(["factor", "name", "level 0", "level 1"], ((x, f[x].label, f[x].low, f[x].high) for x in f)),
        "n_slab": len(slab.runs()), "slab": slab.describe(), "n_smoke": len(smoke.runs()), "smoke": smoke.describe(),
        "cells": Table.of(["cell", *f, "in smoke fraction"],
                          ((i + 1, *run, "yes" if run in smoke_runs else "") for i, run in enumerate(slab.runs())),
                          range(0, slab.k + 1)),
        "relation": " = ".join(("-" if sign < 0 else "") + w for w, sign in smoke.relation()),
        "aliases": Table.of(["main effect", "aliased with"], _alias_rows(smoke)),
        "n_multi": multiseed_count(config),
        "loss": loss, "separator": " and the separator before it" if config.data.mask_separator else "",
        "e0": _E0[config.data.e0_negatives],
    }


def _alias_rows(smoke) -> list[tuple[str, str]]:
    """Each main effect's exact aliases of order 2, or a Plackett-Burman design's partial ones with their correlations."""
    if isinstance(smoke, PlackettBurman):
        return [(x, "partially, with these correlations: " + ", ".join(f"{ratio(c, smoke.n)} {w[0]}:{w[1]}" for w, c in pairs))
                for x, pairs in smoke.partial_aliases().items()]
    return [(x, " = ".join(":".join(w) for w in v) if v else "(none up to order 2)")
            for x, v in smoke.aliases().items() if len(x) == 1]
