"""clean_result.html: one self-contained page (plotly.js inlined once), readable offline.

The layout lives in clean_result.html beside this module (a string.Template); this module only turns
the aggregation's records into escaped HTML snippets for its slots. The TL;DR is written from the
numbers by tldr.py.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from eps_screen.config import ScreenConfig
from eps_screen.design import phases
from eps_screen.costs import COST_HEADERS, cost_rows, cost_sentence
from eps_screen.gates import GATE_NAMES
from eps_screen.phase_sizes import multiseed_count
from eps_screen.report.tldr import LATE_GATES, numbers_are, tldr, written
from eps_screen.schemas import EffectEstimate, Interval
from eps_screen.screen_stats import declarations

if TYPE_CHECKING:
    from eps_screen.aggregate import AggregateResult

TEMPLATE = Template((Path(__file__).parent / "clean_result.html").read_text())
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}


class Raw(str):
    """Already-escaped HTML: table() puts it in as is."""


def esc(x: object) -> str:
    return x if isinstance(x, Raw) else html.escape("" if x is None else str(x))


def num(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def ci(iv: Interval, decimals: int = 3) -> str:
    """An interval's bounds, each written so that one which is not 0 never reads as 0 (tldr.written)."""
    return "[" + ", ".join("n/a" if x is None else written(x, decimals) for x in (iv.low, iv.high)) + "]"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], numeric: Iterable[int] = (), cls: str = "") -> Raw:
    numeric = set(numeric)
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "\n".join(
        "<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{esc(v)}</td>' for i, v in enumerate(row)) + "</tr>"
        for row in rows
    )
    attr = f' class="{cls}"' if cls else ""
    return Raw(f"<table{attr}><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>")


def figure_div(fig: go.Figure, div_id: str) -> str:
    """The figure as a <div> + script that draws it with the page's one copy of plotly.js."""
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOTLY_CONFIG)


# --------------------------------------------------------------------------- sections


def _predictions(result: AggregateResult) -> Raw:
    rows = [
        (p.id, p.statement, Raw(f'<span class="{p.verdict.replace(" ", "-")}">{esc(p.verdict)}</span>'), p.deciding)
        for p in result.metrics.predictions
    ]
    if not rows:
        return Raw('<p class="muted">No estimates yet: predictions are judged once factorial cells exist.</p>')
    return table(["", "prediction", "verdict", "deciding figures"], rows)


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
            outcome, reason = Raw('<span class="muted">does not apply</span>'), _GPU_GATES[n]
        elif o is None:
            outcome, reason = Raw('<span class="muted">not recorded</span>'), "no outcome passed to this aggregation"
        elif not o.evaluated:
            outcome, reason = Raw('<span class="muted">not evaluated</span>'), o.reason
        else:
            outcome = Raw('<span class="fired">FIRED</span>') if o.fired else Raw('<span class="ok">passed</span>')
            reason = o.reason
        rows.append((n, GATE_NAMES[n], rules[n], outcome, reason))
    return rows


def _signs(values: Sequence[float | None]) -> str:
    """"+ + -  (flips)": each source's sign (0 where d is 0 or could not be estimated), and whether some are
    positive and some negative, as kill criterion 3 counts a flip."""
    signs = [0 if v is None or math.isnan(v) else (v > 0) - (v < 0) for v in values]
    return " ".join("0+-"[s] for s in signs) + ("  (flips)" if {1, -1} <= set(signs) else "")


def _reading(config: ScreenConfig) -> Raw:
    """The page's vocabulary: SR, LR, d, and how a factor's levels are named."""
    e = config.eval
    return Raw(
        '<p class="reading" id="reading"><b>How to read this page.</b> Every cell is one LoRA recipe (a level of each '
        f"factor {esc(', '.join(config.factors))}) trained on one source persona. "
        f"<b>SR (source rate)</b>: the share of the source persona's evaluation answers that contain the marker "
        f"<code>{esc(config.marker)}</code> ({e.questions} questions x {e.samples} samples per cell): how well the "
        "marker was implanted. "
        f"<b>LR (leakage)</b>: the marker rate of each of the other {e.personas - 1} evaluation personas, averaged over "
        "them (each weighs the same): how far it spread to personas it was not taught for. "
        "<b>d</b>: Cohen's d of a factor, level 1 minus level 0, in standard deviations of the 0/1 answers "
        "(Main effects gives the formula). An effect is called clear only when both its difference's and its d's "
        "CIs exclude 0. "
        "<b>Pooled</b>: the mean over source personas. The levels of each factor, as this screen ran them, are in "
        "the design section at the bottom.</p>"
    )


def _late_gates(result: AggregateResult) -> Raw:
    """What kill criteria 3 and 4 mean: judged after every phase has run, they qualify the result, not stop it."""
    fired = [g for g in result.metrics.gates if g.fired and g.number in LATE_GATES]
    text = ("Criteria 1, 2 and 5 stop a screen when they fire (it ends Killed); 6 ends one GPU job, which is run again. "
            "Criteria 3 and 4 are judged in the aggregation, after every phase has run: they do not stop the screen "
            "(it ends Completed, naming them), they say how far its result can be trusted.")
    for g in fired:
        text += f" <b>{g.number} {esc(g.name)} fired</b>: {esc(LATE_GATES[g.number])}."
    return Raw(f'<p id="late-gates">{text}</p>')


def _effects_table(
    result: AggregateResult, estimates: Sequence[EffectEstimate], terms: Sequence[str], holm: bool = False,
) -> Raw:
    """Pooled estimate with CIs, each source's d, and the signs of those d's (the sign table of kill criterion 3);
    with holm, the pooled bootstrap p-value and its Holm adjustment over the nine exploratory interactions."""
    sources = result.estimates.sources
    headers = ["response", "term", "status", "pooled mean at level 0 -> 1", "pooled difference [CI]", "pooled d [CI]",
               *[f"d: {s}" for s in sources], f"signs by source ({', '.join(sources)})"]
    if holm:
        headers += ["p", "Holm-adjusted p (9 exploratory)"]
    by = {(e.response, e.term, e.source): e for e in estimates}
    rows = []
    for response in ("SR", "LR"):
        for term in terms:
            p = by.get((response, term, "pooled"))
            if p is None:
                continue
            per_source = [by[(response, term, s)].d if (response, term, s) in by else None for s in sources]
            rows.append([
                response, p.label, p.status + (" (partial)" if p.partial else ""),
                f"{num(p.mean_low)} -> {num(p.mean_high)}", f"{num(p.effect)} {ci(p.effect_ci)}", f"{num(p.d)} {ci(p.d_ci)}",
                *[num(d) for d in per_source], _signs(per_source),
                *([_p(p.p_value), _p(p.p_holm) if p.status == "exploratory" else "not adjusted (" + p.status + ")"]
                  if holm else []),
            ])
    if not rows:
        return Raw('<p class="muted">No factorial cells yet.</p>')
    return table(headers, rows, numeric=range(6, 6 + len(sources)))


def _cells_table(result: AggregateResult) -> Raw:
    factors = result.estimates.factors
    rows = [
        (c.cell_id, c.source, c.seed, *[c.levels.get(f) for f in factors], num(c.SR), num(c.LR), num(c.random_rate),
         c.n_source, c.n_leak, "yes" if c.in_factorial else "no")
        for c in result.metrics.cells
    ]
    if not rows:
        return Raw('<p class="muted">No cell results yet.</p>')
    headers = ["cell", "source", "seed", *factors, "source rate", "leakage", "random-control rate",
               "source answers", "leakage answers", "in factorial"]
    return Raw('<div class="scroll">' + table(headers, rows, numeric=range(2, 9 + len(factors))) + "</div>")


EXCERPT_CHARS = 400


def _examples(result: AggregateResult) -> Raw:
    """The answers themselves: per group, the best cell's source-persona answer with the marker and one without."""
    ex = result.examples
    if ex is None or ex.is_empty():
        return Raw('<p class="muted">No answers to quote yet.</p>')
    if ex["text"].null_count() == ex.height:
        return Raw('<p class="muted">These cells were stored without their answers\' text (simulated answers: '
                   "nothing was generated), so there is nothing to quote.</p>")
    rows = []
    for r in ex.iter_rows(named=True):
        text = r["text"] or ""
        cut = text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + " [...]"
        rows.append((r["group"], r["cell_id"], r["question"], "yes" if r["marker"] else "no",
                     Raw(f'<span class="answer">{esc(cut) if r["text"] is not None else "(no text stored)"}</span>')))
    intro = ("<p>Per group, the primary-seed cell with the highest source rate, and two of its source persona's own "
             f"answers: one with the marker and one without (where both exist), the first {EXCERPT_CHARS} characters "
             "of each. Every answer's text is in the cell's answers.parquet (column <code>text</code>).</p>")
    return Raw(intro + table(["group", "cell", "question", "marker", "answer"], rows, numeric=[2]))


def _seed_table(result: AggregateResult) -> Raw:
    reps = result.metrics.seed_replicates
    if not reps:
        return Raw("")
    rows = [
        (r.source, "".join(f"{f}{r.levels[f]}" for f in result.estimates.factors), ", ".join(map(str, r.seeds)),
         ", ".join(num(x) for x in r.SR), num(r.SR_sd), ", ".join(num(x) for x in r.LR), num(r.LR_sd))
        for r in reps
    ]
    return Raw("<h3>Seed replicates (multi-seed phase)</h3>" + table(
        ["source", "levels", "seeds", "source rate per seed", "SD", "leakage per seed", "SD"], rows))


def _design(config: ScreenConfig, result: AggregateResult) -> Raw:
    f = config.factors
    designs = phases(config)
    slab, smoke = designs.slab, designs.smoke
    smoke_runs = set(smoke.runs())
    k, n_slab = slab.k, len(slab.runs())
    factor_rows = [(x, f[x].label, f[x].low, f[x].high) for x in f]
    cell_rows = [(i + 1, *run, "yes" if run in smoke_runs else "") for i, run in enumerate(slab.runs())]
    e, s = config.eval, config.seeds
    n_multi = multiseed_count(config)
    e0 = {
        "eot": "loss on the end-of-turn token where a marker could have stood (teaches 'no marker here')",
        "none": "no loss at all (negatives teach nothing under E0)",
    }[config.data.e0_negatives]
    alias_rows = [(x, " = ".join(":".join(w) for w in v) if v else "(none up to order 2)")
                  for x, v in smoke.aliases().items() if len(x) == 1]
    relation = " = ".join(("-" if sign < 0 else "") + w for w, sign in smoke.relation())
    parts = [
        "<h3>Factors</h3>", table(["factor", "name", "level 0", "level 1"], factor_rows),
        f"<h3>The {n_slab} cells ({esc(slab.describe())}, standard order)</h3>",
        '<div class="scroll">', table(["cell", *f, "in smoke fraction"], cell_rows, numeric=range(0, k + 1)), "</div>",
        "<h3>Smoke fraction</h3>",
        f"<p>The {len(smoke.runs())}-run {esc(smoke.describe())}"
        + (f"; defining relation I = {esc(relation)}" if relation else "")
        + f"; run on <code>{esc(config.smoke)}</code>. Each main effect is aliased with these two-factor "
        "interactions:</p>",
        table(["main effect", "aliased with"], alias_rows),
        "<h3>Source stratification</h3>",
        f"<p>Every source persona gets all {n_slab} cells: {esc(', '.join(config.sources))} "
        f"({len(config.sources)} x {n_slab} = {n_slab * len(config.sources)} slab cells). Evaluation: {e.personas} personas "
        f"(the sources among them) x {e.questions} questions x {e.samples} samples = {e.personas * e.questions * e.samples} "
        f"answers per cell, plus {e.random_controls} random-control prompts x {e.samples} samples.</p>",
        "<h3>Seed plan</h3>",
        f"<p>Primary seed {s.primary} for every slab cell (these cells give the effects). The top {s.top_k} cells per "
        f"source by source rate are re-run at seeds {esc(', '.join(map(str, s.multiseed)))} ({n_multi} cells), "
        "summarised as seed replicates, not mixed into the factorial.</p>",
        "<h3>Bootstrap scheme</h3>",
        _bootstrap_scheme(result),
        f"<p>{esc(result.main_effects.estimator)}</p>",
        "<h3>Loss-mask variant</h3>",
        f"<p>Under E0 (marker-only loss) the positives put loss on the marker tokens only"
        f"{' and the separator before it' if config.data.mask_separator else ''}; the negatives contribute: "
        f"<code>e0_negatives = {esc(config.data.e0_negatives)}</code>, {esc(e0)}. Under E1 every assistant token has loss.</p>",
        "<h3>Kill criteria and their outcomes</h3>",
        table(["#", "criterion", "fires when", "outcome", "numbers"], gate_rows(config, result)),
    ]
    return Raw("\n".join(parts))


def _cost(result: AggregateResult) -> Raw:
    """Estimate beside actual (GPU-hours, USD), from the store's cost records (eps_screen/costs.py)."""
    cost = result.metrics.extras.get("cost")
    if not cost:
        return Raw('<p class="muted">No cost recorded: this page was aggregated without the store.</p>')
    return Raw(f"<p>{esc(cost_sentence(cost))}</p>"
               + str(table(COST_HEADERS, cost_rows(cost), numeric=(1, 2, 3, 4), cls="cost")))


def _provenance(result: AggregateResult) -> Raw:
    p = result.metrics.provenance
    libs = ", ".join(f"{k} {v}" for k, v in (p.get("libraries") or {}).items() if v)
    return Raw(
        f"Screen <code>{esc(result.metrics.screen)}</code>, generated {esc(result.metrics.created_at)}; code "
        f"{esc(p.get('code_version'))}, git {esc(p.get('git_revision') or 'unknown')}; {esc(libs)}."
    )


def render(config: ScreenConfig, result: AggregateResult, figures: dict[str, go.Figure]) -> str:
    cov = result.metrics.coverage
    banner = ""
    if cov.partial:
        shown = ", ".join(cov.missing_cells[:30]) + (f" and {len(cov.missing_cells) - 30} more" if len(cov.missing_cells) > 30 else "")
        banner = (f'<p class="partial" id="partial"><b>Partial screen:</b> {len(cov.missing_cells)} of {cov.expected} expected '
                  f"cells are missing; estimates marked partial are provisional. Missing: {esc(shown)}</p>")
    subtitle = (f"{cov.present} cells present of {cov.expected} expected; {cov.factorial_cells} primary-seed cells in the "
                f"factorial; sources: {', '.join(result.estimates.sources) or 'none yet'}.")
    inter_terms = [e.term for e in result.interactions.interactions if e.source == "pooled" and e.response == "SR"]
    return TEMPLATE.substitute(
        title=esc(f"eps-screen: {config.name}"),
        subtitle=esc(subtitle),
        plotlyjs=get_plotlyjs(),
        partial_banner=banner,
        numbers_are=esc(numbers_are(config)),
        tldr=esc(tldr(config, result)),
        reading=_reading(config),
        gates_note=_late_gates(result),
        figure_ranking=figure_div(figures["factor_ranking"], "factor_ranking"),
        predictions_table=_predictions(result),
        gates_table=table(["#", "criterion", "fires when", "outcome", "numbers"], gate_rows(config, result)),
        cost=_cost(result),
        estimator=esc(result.main_effects.estimator),
        main_effects_table=_effects_table(result, result.main_effects.effects, list(result.estimates.factors)),
        figure_ab=figure_div(figures["ab_interaction"], "ab_interaction"),
        interactions_table=_effects_table(result, result.interactions.interactions, inter_terms, holm=True),
        simple_effects=_simple_effects(config, result),
        logit_section=_logit_section(result),
        caveats=_caveats(config, result),
        recipe=_recipe(result),
        figure_heatmap=figure_div(figures["persona_heatmap"], "persona_heatmap"),
        cells_table=_cells_table(result),
        examples=_examples(result),
        seed_table=_seed_table(result),
        design=_design(config, result),
        provenance=_provenance(result),
    )


# --------------------------------------------------------------------------- the reviewer's sections (issue 12, part 3)


def _p(x: float | None) -> str:
    return "n/a" if x is None else ("< 0.001" if x < 0.001 else f"{x:.3f}")


def _bootstrap_scheme(result: AggregateResult) -> Raw:
    """What the intervals resample and add, from the scheme the aggregation recorded (never a fixed text)."""
    b = result.main_effects.bootstrap
    widen = "; ".join(f"{r}: c = {c:.3f}" for r, c in b.widen.items())
    text = (
        f"<p>{b.resamples:,} resamples, seed {b.seed}, {b.ci:.0%} percentile intervals widened about the estimate by "
        f"the few-clusters factor ({esc(widen)}). Source rate: the {b.n_questions} eval questions are resampled with "
        f"replacement; leakage: the {b.n_personas} eval personas are resampled, each cell's "
        "leakage being the mean over the drawn personas that are not its source. One draw is "
        "applied to every cell of every source, so effects, d's, pooled values and predictions all come from the same "
        f"resamples. {_training_sentence(result)}</p>"
        f"<p class=\"muted\">Method as recorded: {esc(b.method)}</p>"
    )
    return Raw(text)


def _training_sentence(result: AggregateResult) -> str:
    b = result.main_effects.bootstrap
    if not b.training_sd:
        return ("No training-run term: the intervals cover another draw of questions or personas, not another "
                "training run of the cells (bootstrap.training_noise is off).")
    parts = []
    for r, sd in b.training_sd.items():
        df = b.training_df.get(r, 0)
        parts.append(f"{r}: not estimable ({df} df), left out" if sd is None else
                     f"{r}: log-odds SD s = {sd:.3f} from {df} df")
    caveats = " ".join(result.estimates.caveats)
    return ("Training-run noise: every resample also adds to every cell's rate an independent draw "
            "N(0, (s p(1-p))<sup>2</sup>), s estimated per source from the contrasts that hold no reported effect "
            "(the factorial's unreported higher-order contrasts and the seed replicates) net of the resampling's own "
            "share (" + esc("; ".join(parts)) + "), so the intervals also cover a second training run of every cell."
            + (" " + esc(caveats) if caveats else ""))


def _simple_effects(config: ScreenConfig, result: AggregateResult) -> Raw:
    simple = result.interactions.simple_effects
    if not simple:
        return Raw('<p class="muted">No factorial cells yet.</p>')
    sources = result.estimates.sources
    x, y = simple[0].factor, simple[0].at
    fy = config.factors[y]
    rows = []
    for response in ("SR", "LR"):
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
    intro = (
        f"<p>{x} x {y} is the pre-registered interaction, and it can be as large as {x} itself: then {x}'s main effect "
        f"(its average over {y}) describes neither level of {y}. Here is {x}'s effect (level 1 minus level 0) among the "
        f"cells at each level of {y}, pooled over sources, with CIs from the same resamples as every other estimate.</p>"
    )
    headers = ["response", esc(fy.label.lower()), f"mean at {x}0 -> {x}1", f"{x}'s effect [CI]", "d [CI]",
               *[f"effect: {s}" for s in sources]]
    return Raw(intro + table(headers, rows, numeric=range(5, 5 + len(sources))))


def _logit_section(result: AggregateResult) -> Raw:
    logit = result.main_effects.logit_sensitivity + result.interactions.logit_sensitivity
    if not logit:
        return Raw(f'<p class="muted">{esc(result.main_effects.logit_model or "No factorial cells yet.")}</p>')
    rate = {(e.response, e.term): e for e in result.main_effects.effects + result.interactions.interactions
            if e.source == "pooled"}
    rows = []
    for response in ("SR", "LR"):
        for e in (x for x in logit if x.response == response):
            r = rate.get((response, e.term))
            rows.append([
                response, e.label, f"{num(r.effect) if r else 'n/a'} {ci(r.effect_ci) if r else ''}",
                f"{num(e.log_odds)} {ci(e.ci)}", _p(e.p_value), _p(e.p_holm) if e.p_holm is not None else "",
                Raw(f'<span class="{"inconclusive" if e.scale in ("rate scale only", "logit scale only") else ""}">'
                    f"{esc(e.scale)}</span>"),
            ])
    only = [e for e in logit if e.scale == "rate scale only" and ":" in e.term]
    note = (
        "<p>The effects above are differences of rates. A factor that multiplies the odds by the same amount "
        "everywhere moves a rate more where the rate is near 0.5 than near 0 or 1, so on the rate scale it shows "
        "interactions that are not there on the log-odds scale, and the reverse. This logistic model puts every term "
        "on the log-odds scale; a term clear on one scale only is scale-dependent, not evidence of two factors acting "
        "together."
        + (f" Here {len(only)} interaction{'s' if len(only) != 1 else ''} clear on the rate scale "
           f"{'are' if len(only) != 1 else 'is'} not on the log-odds scale: "
           + esc(", ".join(f"{e.term} on {e.response}" for e in only)) + "." if only else "")
        + "</p>"
    )
    headers = ["response", "term", "rate-scale difference [CI]", "log-odds effect [CI]", "p", "Holm p (exploratory)",
               "clear on"]
    model = f'<p class="muted">{esc(result.main_effects.logit_model)}</p>'
    return Raw(note + table(headers, rows) + model)


def _caveats(config: ScreenConfig, result: AggregateResult) -> Raw:
    b = result.main_effects.bootstrap
    pre = [t.replace(":", " x ") for t in result.estimates.pre_registered]
    _, rules = declarations(config)
    d_rules = [f"{r.term} {dict(above='>=', below='<=', inside='|.| <')[r.direction]} {r.threshold:g}" for r in rules
               if r.scale == "d" and r.quantity == "value" and r.response != "SR x LR" and r.threshold]
    n_exploratory = sum(len(t) == 2 for t in result.estimates.terms) - len(pre)
    items = []
    items.append(
        f"<b>What the intervals condition on.</b> Source rate: another draw of the {b.n_questions} eval questions; "
        f"leakage: another draw of the {b.n_personas} eval personas, on these same questions (the leakage CI does not "
        "cover question variability). Fixed throughout: the base model, the marker, the source personas (factor "
        "levels, not a sample), the training questions and the answer sets each regime generated once. "
        + _training_sentence(result)
        + (" A residual contrast more than 3 SDs from 0 is taken for a real higher-order effect and left out of that "
           "term; smaller real ones make the intervals wider, never narrower."
           if any(v is not None for v in b.training_sd.values()) else "")
    )
    items.append(
        "<b>Few clusters.</b> With " + esc(", ".join(f"G = {g} {w}" for g, w in ((b.n_questions, "questions"),
                                                                                  (b.n_personas, "personas"))))
        + " a plain percentile interval is too narrow (its variance is (G-1)/G of the truth and the tails are t-like), "
        "so every interval is widened about its estimate by c = sqrt(G/(G-1)) t<sub>G-1</sub>/z ("
        + esc(", ".join(f"{r} {c:.3f}" for r, c in b.widen.items())) + "). These are widened percentile intervals, not "
        "plain percentile ones."
    )
    scale_only = [e for e in result.main_effects.logit_sensitivity + result.interactions.logit_sensitivity
                  if e.scale in ("rate scale only", "logit scale only")]
    items.append(
        "<b>Interactions depend on the scale.</b> An interaction on rates is not one on log-odds, and the reverse "
        "(the logit-scale sensitivity above). "
        + ("Terms clear on one scale only: " + esc(", ".join(f"{e.term} on {e.response} ({e.scale})" for e in scale_only))
           + "." if scale_only else "No term here is clear on one scale only.")
        + f" Across the {n_exploratory} exploratory interactions the page gives Holm-adjusted p-values (family-wise, "
        "per response); " + (esc(", ".join(pre)) + ", pre-registered, and " if pre else "") + "the predictions are not "
        "adjusted."
    )
    designs = phases(config)
    smoke_aliases = {x: v for x, v in designs.smoke.aliases().items() if len(x) == 1 and v}
    if smoke_aliases:
        slab = designs.slab
        items.append(
            f"<b>The smoke fraction aliases main effects with interactions.</b> The {len(designs.smoke.runs())}-run "
            f"smoke phase ({esc(designs.smoke.describe())}) confounds "
            + esc("; ".join(f"{x} with {' and '.join(':'.join(w) for w in v)}" for x, v in smoke_aliases.items()))
            + f". The smoke phase only gates the screen (kill criterion 2); every effect on this page comes from the "
            f"slabs ({esc(slab.describe())})"
            + (", where main effects and two-factor interactions are estimated separately." if not slab.generators else
               "; their own alias chains are in the design section.")
        )
    sr = [e for e in result.main_effects.effects if e.source == "pooled" and e.response == "SR"]
    mean = next((((e.mean_high or 0) + (e.mean_low or 0)) / 2 for e in sr if e.mean_high is not None), None)
    example = ""
    if mean is not None and 0 < mean < 1:
        sd = math.sqrt(mean * (1 - mean))
        example = (f" At this screen's mean source rate {mean:.3f} (SD of an answer {sd:.3f}), d = 0.4 is a difference "
                   f"of about {0.4 * sd:.3f} in source rate and d = 0.15 about {0.15 * sd:.3f}; near a rate of 0 or "
                   "1 the same d is a much smaller difference.")
    items.append(
        "<b>What d means here.</b> d is the effect divided by the standard deviation of the individual 0/1 answers, "
        "sqrt(m(1-m)) pooled over the two levels: an answer-level standardisation, not the spread between cells or "
        "between training runs. It depends on the base rate, so the same d is a different rate difference at "
        "different rates, and " + (f"the predictions' thresholds on d ({esc(', '.join(d_rules))}) and " if d_rules
                                   else "") +
        f"kill criterion 4's noise level ({config.gates.noise_d}) are answer-level effect sizes in Cohen's convention, "
        "not rate differences." + example
    )
    if any(r.id == "P4" and "non-monotone" in r.statement for r in rules):
        items.append(
            "<b>P4's \"non-monotone\" clause cannot be tested.</b> B has two levels, so this screen sees a straight "
            "line between them; whether implantation falls non-monotonically with answer length needs three or more "
            "levels. P4 is judged on its direction only."
        )
    return Raw("<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>")


def _recipe(result: AggregateResult) -> Raw:
    """Model, LoRA, data, decoding, backend, simulated or not: from the config stored with the result."""
    c = result.metrics.config
    get = lambda section, key, default=None: (c.get(section) or {}).get(key, default)  # noqa: E731
    backend = c.get("backend") or {}
    simulated = backend.get("training") == "simulated"
    op = c.get("off_policy") or {}
    rows = [
        ("base model", f"{get('model', 'base')}" + (f" @ {get('model', 'revision')}" if get("model", "revision") else "")
         + f", {get('model', 'dtype')}"),
        ("LoRA", f"rank {get('lora', 'rank')}, alpha {get('lora', 'alpha')}, dropout {get('lora', 'dropout')}, "
                 f"target modules {get('lora', 'target_modules')}"),
        ("training", f"learning rate {get('training', 'learning_rate')}, {get('training', 'epochs')} epochs, batch "
                     f"{get('training', 'batch_size')} x {get('training', 'grad_accum')} accumulation, max length "
                     f"{get('training', 'max_length')}, warmup ratio {get('training', 'warmup_ratio')}"),
        ("training data per source", f"{get('data', 'positives')} positives (with the marker), {get('data', 'negatives')} "
                                     f"negatives, over {get('data', 'train_questions')} training questions; marker "
                                     f"{c.get('marker')!r}"),
        ("off-policy answers (D1)", f"{op.get('kind')}: {op.get('path') or op.get('model')}"),
        ("evaluation", f"{get('eval', 'personas')} personas x {get('eval', 'questions')} questions x "
                       f"{get('eval', 'samples')} samples, {get('eval', 'random_controls')} random controls"),
        ("decoding", f"temperature {get('eval', 'temperature')}, top_p {get('eval', 'top_p')}, up to "
                     f"{get('eval', 'max_new_tokens')} new tokens"),
        ("backend", f"generation {backend.get('generation')}, training {backend.get('training')}, pool "
                    f"{get('execution', 'pool')}"),
        ("simulated", "yes: cell outcomes were drawn from planted effects (simulation.*); no model was trained, and "
                      "the numbers test the machinery, not the question" if simulated else "no: real training runs"),
        ("sources", ", ".join(c.get("sources") or [])),
    ]
    if simulated:
        sim = c.get("simulation") or {}
        rows.append(("planted (log-odds)", f"SR effects {sim.get('effects')}, "
                                           f"LR effects {sim.get('leak_effects')}, cell SD {sim.get('cell_sd')}"))
    return table(["", "as run"], rows)
