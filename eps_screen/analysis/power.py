"""Power before renting: the smallest effect each reported term is detected at, with 80% power, by this design.

A term's effect is the difference of two level means over a source's n factorial cells (n/2 at each level), so

    Var(effect) = (4/n) * (c^2 v_sampling + (t_df/z)^2 v_training),    pooled over S sources: / S

- v_sampling: a cell's rate from its answers, p(1-p) / answers (SR: questions x samples of the source persona;
  LR: the same for each of the personas - 1 others). What the questions or personas share with every cell
  cancels in a difference of cells, as it does in the cluster bootstrap.
- v_training: a cell's training-run noise, a log-odds SD s carried to the rate scale, (s p(1-p))^2.
- c and t_df/z: how the screen widens its intervals (few clusters; a training SD resting on df contrasts: the
  design's residual contrasts and the seed replicates), so the margin is the one its CIs will have.

The effect detected with power 1 - beta by a two-sided test at alpha is (z_{1-alpha/2} + z_{1-beta}) SE; alpha is
1 - bootstrap.ci for the main effects and the pre-registered interactions, and alpha / m for the m exploratory
interactions (the first step of Holm's adjustment, which the page applies to them). As d: effect / sqrt(p(1-p)),
the answers' SD that the page's d divides by. The assumed rates and training SD come from design.power, or from an
earlier screen's results (`eps-screen validate CONFIG --like SCREEN`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from eps_screen.spec.power_config import RESPONSES, PowerConfig

if TYPE_CHECKING:
    from eps_screen.spec.config import ScreenConfig

MAX_SAMPLES = 20


@dataclass(frozen=True)
class Assumptions:
    rate: dict[str, float]  # response -> assumed mean rate
    training_sd: dict[str, float]  # response -> log-odds SD
    power: float
    where: str

    @classmethod
    def of(cls, config: ScreenConfig) -> Assumptions:
        p = config.design.power or PowerConfig()
        return cls({"SR": p.source_rate, "LR": p.leakage}, {"SR": p.training_sd, "LR": p.training_sd}, p.power,
                   "design.power" if config.design.power else "design.power's defaults")

    @classmethod
    def like(cls, config: ScreenConfig, main_effects: dict, screen: str) -> Assumptions:
        """From an earlier screen's main_effects.json: its pooled mean rates and median training SD per response."""
        rate, sd = {}, {}
        for r in RESPONSES:
            means = [x for e in main_effects["effects"] if e["response"] == r and e["source"] == "pooled"
                     for x in (e["mean_high"], e["mean_low"]) if x is not None]
            sds = [v for k, v in (main_effects["bootstrap"].get("training_sd") or {}).items()
                   if k.startswith(f"{r} ") and v is not None]
            if not means:
                raise ValueError(f"--like {screen}: its results have no pooled {r} estimates to take a rate from")
            rate[r] = min(max(float(np.mean(means)), 1e-4), 1 - 1e-4)
            sd[r] = float(np.median(sds)) if sds else Assumptions.of(config).training_sd[r]
        return cls(rate, sd, (config.design.power or PowerConfig()).power, f"screen {screen}'s results")


@dataclass(frozen=True)
class Detectable:
    response: str
    source: str  # a source, or "pooled"
    kind: str  # "main effects and pre-registered" or "exploratory"
    alpha: float
    effect: float  # rate points as a share (0.05)
    d: float


def _df(config: ScreenConfig, runs: list[tuple[int, ...]]) -> int:
    """The training SD's df in one source: the design's residual contrasts plus the seed replicates."""
    from eps_screen.spec.prediction_rules import reported_terms

    coded = 2 * np.array(runs) - 1
    idx = {f: i for i, f in enumerate(config.design.shorts)}
    cols = [np.ones(len(runs))] + [np.prod(coded[:, [idx[f] for f in t]], axis=1)
                                   for t in reported_terms(config.design.shorts)]
    resid = len(runs) - int(np.linalg.matrix_rank(np.column_stack(cols)))
    return resid + min(config.seeds.top_k, len(runs)) * len(config.seeds.multiseed)


@lru_cache(maxsize=4096)
def _widening(clusters: int, df: int, ci: float) -> tuple[float, float]:
    """The screen's widening of the sampling part (few clusters) and of the training part (t_df / z)."""
    from scipy.special import ndtri, stdtrit

    from eps_screen.analysis.stats import few_cluster_factor

    z = float(ndtri(1 - (1 - ci) / 2))
    return few_cluster_factor(clusters, ci), float(stdtrit(df, 1 - (1 - ci) / 2)) / z if df > 0 else 1.0


def _se(config: ScreenConfig, a: Assumptions, response: str, n: float, df: int, sources: int,
        panel: tuple[int, int, int]) -> float:
    personas, questions, samples = panel
    p = a.rate[response]
    answers = questions * samples * (1 if response == "SR" else personas - 1)
    c, t = _widening(min(questions if response == "SR" else personas, 10**6), df, config.bootstrap.ci)
    v = c**2 * p * (1 - p) / answers + (t * a.training_sd[response] * p * (1 - p)) ** 2
    return math.sqrt(4 / n * v / sources)


@dataclass(frozen=True)
class Layout:
    """What the design fixes: each source's factorial cells and training-noise df, the tests' alphas."""

    cells: dict[str, int]
    df: dict[str, int]  # as the screen estimates it: a source with few df takes the estimate over all sources
    pooled_df: int
    kinds: tuple[tuple[str, float], ...]  # (kind, alpha)

    @classmethod
    def of(cls, config: ScreenConfig) -> Layout:
        from eps_screen.analysis.screen_stats import MIN_SOURCE_DF, declarations
        from eps_screen.spec import design

        d = design.phases(config)
        slab = d.slab.runs()
        extra = d.fold_over.runs() if d.fold_over is not None and not set(d.fold_over.runs()) <= set(slab) else []
        runs = {s: slab + (extra if s == config.smoke else []) for s in config.sources}
        own = {s: _df(config, r) for s, r in runs.items()}
        pre, _ = declarations(config)
        k = len(config.design.shorts)
        explore = k * (k - 1) // 2 - len(pre)
        alpha = 1 - config.bootstrap.ci
        kinds = (("main effects and pre-registered", alpha),) + ((("exploratory", alpha / explore),) if explore else ())
        return cls({s: len(r) for s, r in runs.items()},
                   {s: x if x >= MIN_SOURCE_DF else sum(own.values()) for s, x in own.items()}, sum(own.values()), kinds)


def detectable(config: ScreenConfig, a: Assumptions, panel: tuple[int, int, int] | None = None,
               lay: Layout | None = None) -> list[Detectable]:
    """The smallest effect detected with power a.power, per response, pooled and per source, for the main effects
    and pre-registered interactions, and for the exploratory interactions (Holm)."""
    from scipy.special import ndtri

    e = config.eval
    panel = panel or (e.personas, e.questions, e.samples)
    lay = lay or Layout.of(config)
    out = []
    for response, (kind, al) in itertools.product(RESPONSES, lay.kinds):
        p = a.rate[response]
        mult = float(ndtri(1 - al / 2) + ndtri(a.power))
        rows = [("pooled", _se(config, a, response, float(np.mean(list(lay.cells.values()))), lay.pooled_df,
                               len(lay.cells), panel))]
        rows += [(s, _se(config, a, response, n, lay.df[s], 1, panel)) for s, n in lay.cells.items()]
        for source, se in rows:
            out.append(Detectable(response, source, kind, al, mult * se, mult * se / math.sqrt(p * (1 - p))))
    return out


def _kind(config: ScreenConfig, term: str) -> str:
    from eps_screen.analysis.screen_stats import declarations

    pre, _ = declarations(config)
    return "exploratory" if ":" in term and term not in pre else "main effects and pre-registered"


def reaches(config: ScreenConfig, a: Assumptions, panel: tuple[int, int, int] | None,
            lay: Layout | None = None) -> bool:
    """Whether the panel detects design.power.target's effect on every term and response it names, pooled; panel
    None: with infinitely many answers (the training-run noise alone)."""
    from eps_screen.spec.prediction_rules import canonical_term

    target = config.design.power.target
    kinds = {_kind(config, canonical_term(t)) for t in target.terms}
    if panel is None:
        panel = (10**9, 10**9, 10**9)
    found = {(x.response, x.kind): x.effect for x in detectable(config, a, panel, lay) if x.source == "pooled"}
    return all(found[(r, k)] <= target.points / 100 for r in target.responses for k in kinds)


def smallest_panel(config: ScreenConfig, a: Assumptions) -> tuple[int, int, int] | None:
    """The (personas, questions, samples) with the fewest answers per cell that reaches the target, None if none
    does (training-run noise alone is then above it: only more cells, not more answers, would help). The personas
    stay at least eval.personas: they are what leakage is measured over, a choice and not only a sample size."""
    from eps_screen.panels import panels_of

    lay = Layout.of(config)
    if not reaches(config, a, None, lay):
        return None
    panels = panels_of(config)
    r = config.eval.random_controls
    grid = itertools.product(range(config.eval.personas, len(panels.personas) + 1),
                             range(1, len(panels.eval_questions) + 1), range(1, MAX_SAMPLES + 1))
    return next((p for p in sorted(grid, key=lambda x: ((x[0] * x[1] + r) * x[2], x)) if reaches(config, a, p, lay)),
                None)


def lines(config: ScreenConfig, a: Assumptions) -> list[str]:
    """What `validate` prints: the detectable effects, and the target's panel with its GPU-hours."""
    from eps_screen.analysis.screen_stats import declarations

    found = detectable(config, a)
    rates = ", ".join(f"{r} {a.rate[r]:.3g}" for r in RESPONSES)
    sd = ", ".join(f"{r} {a.training_sd[r]:.2g}" for r in RESPONSES)
    out = [f"power: the smallest effect detected with {a.power:.0%} power, in rate points (d), assuming mean rates "
           f"{rates} and a training-run log-odds SD of {sd} ({a.where}):"]
    pre, _ = declarations(config)
    for kind in dict.fromkeys(x.kind for x in found):
        mine = [x for x in found if x.kind == kind]
        label = (f"main effects{''.join(f', {t}' for t in pre)} (alpha {mine[0].alpha:.2g})" if kind != "exploratory"
                 else f"{'the other ' if pre else ''}interactions (Holm: alpha {mine[0].alpha:.2g})")
        for r in RESPONSES:
            pooled = next(x for x in mine if x.response == r and x.source == "pooled")
            per = [x for x in mine if x.response == r and x.source != "pooled"]
            each = (f"each source {100 * per[0].effect:.1f}" if len({round(x.effect, 6) for x in per}) == 1
                    else "per source " + ", ".join(f"{x.source} {100 * x.effect:.1f}" for x in per))
            out.append(f"  {label}, {r}: pooled {100 * pooled.effect:.1f} (d {pooled.d:.2f}), {each}")
    target = config.design.power.target if config.design.power else None
    if target is not None:
        want = f"{target.points:g} rate points on {', '.join(target.terms)} ({', '.join(target.responses)}, pooled)"
        e = config.eval
        panel = smallest_panel(config, a)
        if panel is None:
            out.append(f"  target {want}: no panel reaches it; the training-run noise alone is above it: add cells "
                       "(a larger design) or sources")
        else:
            from eps_screen.plan.cost_estimate import estimate

            p, q, s = panel
            est = estimate(config.with_sets({"eval.personas": p, "eval.questions": q, "eval.samples": s}))
            now = "met by this panel" if reaches(config, a, (e.personas, e.questions, e.samples)) else "not met by this panel"
            out.append(f"  target {want}: {now}; the smallest panel that meets it: eval.personas {p}, eval.questions "
                       f"{q}, eval.samples {s} ({est.gpu_hours:.1f} {est.hardware}-hours, ${est.cost_usd:,.0f})")
    return out
