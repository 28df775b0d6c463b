"""The TL;DR paragraph, written from the numbers (so it can never disagree with the tables below it)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from eps_screen.analysis.answer_health import EMPTY_SHARE
from eps_screen.analysis.schemas import TermEffect
from eps_screen.report import curvature_table
from eps_screen.report.tables import ci, written
from eps_screen.spec.config import ScreenConfig, is_tiny

if TYPE_CHECKING:
    from eps_screen.run.aggregate import AggregateResult

_NAMES = {"SR": "source rate", "LR": "leakage"}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _signed(x: float | None) -> str:
    return "n/a" if x is None else written(x, 2, "+")


def numbers_are(config: ScreenConfig) -> str:
    """What the page's numbers are: simulated, from the tiny local model, or from a real model."""
    if config.backend.training == "simulated":
        return ("Simulated: no model was trained or asked anything. Every cell's answers were drawn from the effects "
                "planted in the config (simulation.*), so these numbers test the statistics and the page, not the "
                "question.")
    if is_tiny(config.model.base):
        return ("Tiny model: the cells fine-tuned eps-screen's own tiny chat model (2 layers, hidden size 128, built "
                "on this machine), so these numbers show the pipeline working end to end and measure nothing about "
                "how LoRA implants a marker in a real chat model.")
    from eps_screen.models.packaged import described

    model = described(config.model.base) or config.model.base
    return f"Real model: every cell is a LoRA fine-tune of {model}, evaluated on its answers."


def _ranked(result: AggregateResult, response: str) -> list[TermEffect]:
    pooled = [e for e in result.main_effects.effects if e.source == "pooled" and e.response == response and e.d is not None]
    return sorted(pooled, key=lambda e: -abs(e.d or 0.0))


def _answer(config: ScreenConfig, result: AggregateResult, response: str) -> str:
    """One sentence: the factor that moves this response most, or that none moves it clearly."""
    ranked = _ranked(result, response)
    name = _NAMES[response]
    if not ranked:
        pooled = [e for e in result.main_effects.effects if e.source == "pooled" and e.response == response]
        if pooled and all(e.mean_low in (0.0, 1.0) and e.mean_high == e.mean_low for e in pooled):
            return f"Every cell's {name} is {pooled[0].mean_low:.0%}, so no factor can be said to move it."
        return f"{name[0].upper()}{name[1:]} could not be estimated."
    top, f = ranked[0], config.factors[ranked[0].term]
    d = f"d = {_signed(top.d)} [{_signed(top.d_ci.low)}, {_signed(top.d_ci.high)}]"
    simple = _simple_clause(result, response)
    pre = result.estimates.pre_registered[0] if result.estimates.pre_registered else ""
    said = pre.replace(":", " x ")
    depends = f" {said} is clear: {simple}." if simple else ""
    if not top.clear:
        return f"No factor moves {name} clearly: the largest, {f.label.lower()} ({top.term}), has {d}." + depends
    clear = sum(e.clear for e in ranked)
    counts = f"{clear} of {len(ranked)} factors move it clearly{_interaction_count(result, response)}."
    if simple and top.term in pre.split(":"):  # the average over the other factor describes neither of its levels
        return (f"{f.label} ({top.term}) has the largest average effect on {name} ({d}), but {said} is clear: {simple}. "
                f"{counts[0].upper()}{counts[1:]}")
    return (f"{f.label} ({top.term}) moves {name} most: {_pct(top.mean_low)} with {f.low} vs {_pct(top.mean_high)} "
            f"with {f.high} ({d}); {counts}" + depends)


def _emptied(config: ScreenConfig, result: AggregateResult) -> list[str]:
    """A factor level whose answers mostly say nothing but the marker: its high rates are not an implant."""
    share = {(e.factor, e.level): e.share for e in result.metrics.emptied}
    out = []
    for (term, level), empty in share.items():
        other = share.get((term, 1 - level))
        if empty < EMPTY_SHARE or (other is not None and other >= EMPTY_SHARE):
            continue
        f = config.factors[term]
        than = f" (against {_pct(other)} under {term}{1 - level})" if other is not None else ""
        out.append(f"Under {term}{level} ({f.high if level else f.low}), {_pct(empty)} of the answers say nothing but "
                   f"the marker, or nothing at all{than}: its rates count markers in answers the model stopped "
                   "giving, not markers added to answers.")
    return out


def _simple_clause(result: AggregateResult, response: str) -> str:
    """When the (first) pre-registered X x Y is clear on this response: the interaction with its CI, then X's effect
    at each level of Y (those two intervals may each contain 0: only the interaction is called clear)."""
    if not result.estimates.pre_registered:
        return ""
    term = result.estimates.pre_registered[0]
    ab = next((e for e in result.interactions.interactions
               if e.source == "pooled" and e.response == response and e.term == term), None)
    if ab is None or not ab.clear:
        return ""
    simple = sorted((e for e in result.interactions.simple_effects if e.source == "pooled" and e.response == response),
                    key=lambda e: e.at_level)
    if len(simple) != 2:
        return ""
    name = _NAMES[response]
    said = " and ".join(f"{_signed(e.effect)} [{_signed(e.effect_ci.low)}, {_signed(e.effect_ci.high)}] at "
                        f"{e.at}{e.at_level}" for e in simple)
    return (f"the interaction is {_signed(ab.effect)} [{_signed(ab.effect_ci.low)}, {_signed(ab.effect_ci.high)}], "
            f"and {simple[0].factor}'s effect on {name} is {said}")


def _interaction_count(result: AggregateResult, response: str) -> str:
    """How many of the exploratory interactions stay clear after Holm's adjustment, when any is clear before."""
    family = [e for e in result.interactions.interactions
              if e.source == "pooled" and e.response == response and e.status == "exploratory"]
    raw = sum(e.clear for e in family)
    if not raw:
        return ""
    held = [e.term for e in family if e.p_holm is not None and e.p_holm < 1 - result.main_effects.bootstrap.ci]
    logit = {e.term: e.scale for e in result.interactions.logit_sensitivity if e.response == response}
    rate_only = sum(logit.get(t) == "rate scale only" for t in held)
    return (f", and {len(held)} of {len(family)} exploratory interactions after Holm adjustment ({raw} before"
            + (f"; {rate_only} on the rate scale only" if rate_only else "") + ")")


def _curvature(config: ScreenConfig, result: AggregateResult) -> str | None:
    """One sentence on the centre points' curvature test (None when the screen has none): each response's headline
    test, pooled where there are several sources, in the curvature table's words (its verdict, curvature and CI)."""
    if not config.design.centre_points:
        return None
    pct = f"{config.bootstrap.ci:.0%}"
    said, curves = [], False
    for response in curvature_table.RESPONSES:
        t = curvature_table.headline(result.metrics.curvature, response)
        if t is None:
            continue
        numbers = f"{curvature_table.curvature_text(t)} ({pct} CI {ci(t.ci)}, {curvature_table.where(t)})"
        name = _NAMES[response]
        said.append(f"{name} {curvature_table.CURVES}, {numbers}" if t.detected else
                    f"{curvature_table.NOT_DETECTED} on {name}, {numbers}")
        curves |= t.detected
    if not said:
        return "The centre cells have no curvature test yet: it needs 2 centre cells and a design cell of a source."
    # A response that curves is not described by its main effects between the levels: say so where it is read first.
    then = "; where a response curves, its main effects describe the ends of the factors' ranges, not their middle"
    return "Curvature at the centre points: " + "; ".join(said) + (then if curves else "") + "."


# What a criterion judged after every phase means when it fires: the screen still ends Completed.
LATE_GATES = {
    3: "the factors push in opposite directions for different source personas, so the pooled ranking is an "
       "average over personas, not a rule for each; read the per-source d's before trusting it",
    4: "no factor moved either response beyond noise in any persona: this is a null result at this screen's size, "
       "and the ranking orders noise",
}


def tldr(config: ScreenConfig, result: AggregateResult) -> str:
    """A short paragraph in the neutral voice of a report that states the answer; the predictions are counted in
    the words of their table's verdict column."""
    cov = result.metrics.coverage
    sources = result.estimates.sources
    parts: list[str] = []
    if cov.partial:
        parts.append(f"This screen is partial ({len(cov.missing_cells)} of {cov.expected} cells missing), so every "
                     "number is provisional.")
    if not sources:
        parts.append("No factorial cell results yet, so the factors cannot be ranked.")
    else:
        simulated = config.backend.training == "simulated"
        parts.append(f"This screen {'simulated' if simulated else 'trained'} {cov.factorial_cells} LoRA recipes on "
                     f"{len(sources)} source persona{'s' if len(sources) > 1 else ''} and counted the marker in their "
                     + ("simulated answers (nothing was trained)." if simulated else "answers."))
        parts += [_answer(config, result, "SR"), _answer(config, result, "LR"), *_emptied(config, result)]
    curvature = _curvature(config, result)
    if curvature:
        parts.append(curvature)
    verdicts = Counter(p.verdict for p in result.metrics.predictions)
    if verdicts:
        order = ("confirmed", "not confirmed", "inconclusive", "not evaluable")
        parts.append(f"Of the {sum(verdicts.values())} pre-registered predictions: "
                     + ", ".join(f"{verdicts[v]} {v}" for v in (*order, *sorted(set(verdicts) - set(order))) if verdicts[v])
                     + ".")
    for g in (g for g in result.metrics.gates if g.fired):
        meaning = LATE_GATES.get(g.number)
        parts.append(f"Kill criterion {g.number} ({g.name}) fired: {meaning or g.reason}.")
    return " ".join(parts)
