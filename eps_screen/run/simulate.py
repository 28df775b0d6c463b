"""The `simulated` backend: answers drawn from planted effects, so a whole screen runs in seconds with a known answer.

The model (all effects on the log-odds of "this answer ends with the marker"):

    source persona s, question q:   logit p = base_logit + sum_T effects[T]/2 * x_T + u_q + v_s + e_c
    other persona p, question q:    logit p = base_logit + leak_offset + sum_T leak_effects[T]/2 * x_T + u_q + v_p + e_c
    random-control prompt r:        logit p = base_logit + leak_offset + sum_T leak_effects[T]/2 * x_T + w_r + e_c

T runs over the planted terms, named by the letters of declared factors ("A", "AB", "ACE"), and x_T is the
product of the cell's coded levels (-1/+1) of T's factors. What "planted" means exactly: effects[F] is
the difference in log-odds between F high and F low with everything else (other factors, question,
persona) held fixed, i.e. the textbook factorial *effect* on the logit scale, so each level adds
+-effects[F]/2; effects["AB"] is the A x B interaction effect on the same scale: A's log-odds effect is
effects[A] + effects[AB] at B high and effects[A] - effects[AB] at B low. A term naming an undeclared
factor plants nothing (the defaults are the marker screen's A-E and its A x B). A random-control prompt
behaves like a non-source persona of average persona effect (leakage generic to any text).

Curvature (centre cells, design.centre_points): curvature[F] (leak_curvature[F] for the others) is added to the
log-odds times (1 - x_F^2): the full value where F is at its midpoint (x_F = 0), nothing at its levels (x_F = +-1).
So the planted effects above hold exactly at every design cell, and a centre cell's log-odds is the design's mean
plus the curvature of its factors at their midpoint: on the log-odds scale, the centre minus the mean of the design
cells (at the held factors' levels). The rates then also curve where the log-odds are linear (Jensen), a little near
a rate of 0.5 and more towards 0 or 1; `expected_rates` gives the true centre rate, and the curvature the screen
reports is on that rate scale.

u_q ~ N(0, question_sd^2), v_p ~ N(0, persona_sd^2) and w_r ~ N(0, question_sd^2) are drawn once per
screen from `screen_seed` (each keyed by question index or persona id, so the lists' lengths do not
change them): every cell sees the same questions and personas, which is what makes the answers of a
screen clustered and the clustered bootstrap necessary. Answer draws are seeded per cell (screen_seed
and cell id, which includes the training seed), so re-running a cell reproduces its answers.

e_c ~ N(0, cell_sd^2) is the training-run noise: what a second training run of the same cell would
change. One draw per cell id (screen_seed and cell id, so another training seed of the same factor
levels gets another draw), shared by every persona and control prompt of that cell, since it is one
adapter that came out stronger or weaker. cell_sd = 0 (the default) leaves every answer as before.

The statistics estimate on the rate scale, not the logit scale. `expected_rates` gives each cell's
true source rate and leakage under this model (by Gauss-Hermite quadrature, no sampling), and the true
effects and d follow by applying the same estimators to those rates; see `expected_rates` for which
random effects are averaged over and which are held at their drawn values.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import polars as pl

from eps_screen.analysis.screen_stats import declared_factors
from eps_screen.panels import load_panels
from eps_screen.run.scoring import answer_schema  # the answers-table contract, defined once
from eps_screen.spec.config import ScreenConfig, SimulationConfig
from eps_screen.spec.design import Cell
from eps_screen.spec.prediction_rules import reported_terms

# Sub-streams of one screen seed, so question, persona and control effects are independent of each other.
_QUESTION, _PERSONA, _CONTROL, _BASE, _CELL = 1, 2, 3, 4, 5


def _key(text: str) -> int:
    """A stable integer for a string (Python's hash() is salted per process)."""
    return zlib.crc32(text.encode())


@lru_cache(maxsize=64)
def _unit_normals(screen_seed: int, stream: int, n: int) -> np.ndarray:
    return np.array([np.random.default_rng([screen_seed, stream, i]).standard_normal() for i in range(n)])


def question_effects(sim: SimulationConfig, n_questions: int, screen_seed: int = 0) -> np.ndarray:
    return sim.question_sd * _unit_normals(screen_seed, _QUESTION, n_questions)


def control_effects(sim: SimulationConfig, n_random: int, screen_seed: int = 0) -> np.ndarray:
    return sim.question_sd * _unit_normals(screen_seed, _CONTROL, n_random)


def persona_effects(sim: SimulationConfig, personas: Sequence[str], screen_seed: int = 0) -> np.ndarray:
    unit = [np.random.default_rng([screen_seed, _PERSONA, _key(p)]).standard_normal() for p in personas]
    return sim.persona_sd * np.array(unit)


def cell_effect(sim: SimulationConfig, cell: Cell, screen_seed: int = 0) -> float:
    """The training-run noise e_c of this cell (log-odds); 0 when cell_sd is 0."""
    if sim.cell_sd == 0:
        return 0.0
    return sim.cell_sd * float(np.random.default_rng([screen_seed, _CELL, _key(cell.id)]).standard_normal())


def coded_levels(cell: Cell, factors: Sequence[str]) -> dict[str, int]:
    return {f: 2 * lvl - 1 for f, lvl in zip(factors, cell.levels, strict=True)}


def planted_terms(effects: dict[str, float], factors: Sequence[str]) -> dict[str, float]:
    """The planted log-odds effects by term (letters sorted), of declared factors only."""
    out: dict[str, float] = {}
    for term, value in effects.items():
        letters = "".join(sorted(term.replace(":", "")))
        if value and all(f in factors for f in letters):
            out[letters] = out.get(letters, 0.0) + value
    return out


def _linear(terms: dict[str, float], x: dict[str, int]) -> float:
    return sum(v / 2 * float(np.prod([x[f] for f in t])) for t, v in terms.items())


def _curved(curvature: dict[str, float], x: dict[str, int]) -> float:
    return sum(v * (1 - x[f] ** 2) for f, v in curvature.items() if f in x)


def source_logit(sim: SimulationConfig, cell: Cell, factors: Sequence[str]) -> float:
    """Fixed part of the source persona's log-odds in this cell (no question or persona effect)."""
    x = coded_levels(cell, factors)
    return sim.base_logit + _linear(planted_terms(sim.effects, factors), x) + _curved(sim.curvature, x)


def leak_logit(sim: SimulationConfig, cell: Cell, factors: Sequence[str]) -> float:
    """Fixed part of a non-source persona's (or a random control's) log-odds in this cell."""
    x = coded_levels(cell, factors)
    return (sim.base_logit + sim.leak_offset + _linear(planted_terms(sim.leak_effects, factors), x)
            + _curved(sim.leak_curvature, x))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _frame(columns: dict[str, object], n: int, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Build n rows in the answers schema: arrays become columns, scalars (None included) are broadcast."""
    arrays = {k: v for k, v in columns.items() if isinstance(v, np.ndarray)}
    frame = pl.DataFrame(arrays).with_columns(
        pl.lit(v, dtype=schema[k]).alias(k) for k, v in columns.items() if k not in arrays
    )
    assert frame.height == n
    return frame.select(pl.col(k).cast(dtype) for k, dtype in schema.items())


def _answers(
    cell_id: str, source: str | None, seed: int, levels: dict[str, int | None], personas: Sequence[str],
    p_persona: np.ndarray, p_random: np.ndarray, n_samples: int, rng: np.random.Generator,
) -> pl.DataFrame:
    """Draw the answers for (personas x questions) and (controls) probabilities and lay them out as rows."""
    n_p, n_q = p_persona.shape
    hits = rng.random((n_p, n_q, n_samples)) < p_persona[:, :, None]
    rows = n_p * n_q * n_samples
    persona_col = np.repeat(np.asarray(personas, dtype=str), n_q * n_samples)
    persona_part = {
        "panel": "persona",
        "persona": persona_col,
        "question": np.tile(np.repeat(np.arange(n_q), n_samples), n_p),
        "sample": np.tile(np.arange(n_samples), n_p * n_q),
        "marker": hits.ravel(),
        "is_source": persona_col == source,
    }
    n_r = p_random.shape[0]
    random_hits = rng.random((n_r, n_samples)) < p_random[:, None]
    random_part = {
        "panel": "random",
        "persona": "random",
        "question": np.repeat(np.arange(n_r), n_samples),
        "sample": np.tile(np.arange(n_samples), n_r),
        "marker": random_hits.ravel(),
        "is_source": np.zeros(n_r * n_samples, dtype=bool),
    }
    ident = {"cell_id": cell_id, "source": source, "seed": seed, **levels, "text": None}  # nothing was generated
    schema = answer_schema(list(levels))
    parts = [_frame({**ident, **persona_part}, rows, schema)]
    if n_r:
        parts.append(_frame({**ident, **random_part}, n_r * n_samples, schema))
    return pl.concat(parts)


def simulate_cell_answers(
    config: ScreenConfig, cell: Cell, personas: list[str], n_questions: int, n_samples: int, n_random: int,
    *, screen_seed: int = 0,
) -> pl.DataFrame:
    """One cell's evaluated answers (answers-table schema) drawn from the planted model above."""
    if cell.source not in personas:
        raise ValueError(f"the source persona {cell.source!r} is not among the eval personas")
    sim, factors = config.simulation, declared_factors(config)
    u = question_effects(sim, n_questions, screen_seed)
    v = persona_effects(sim, personas, screen_seed)
    is_source = np.array([p == cell.source for p in personas])
    e = cell_effect(sim, cell, screen_seed)
    fixed = np.where(is_source, source_logit(sim, cell, factors), leak_logit(sim, cell, factors)) + e
    p_persona = _sigmoid(fixed[:, None] + v[:, None] + u[None, :])
    p_random = _sigmoid(leak_logit(sim, cell, factors) + e + control_effects(sim, n_random, screen_seed))
    rng = np.random.default_rng([screen_seed, _key(cell.id)])
    levels = cell.row_levels  # a factor at its midpoint (a centre cell) has no 0/1 level to write
    return _answers(cell.id, cell.source, cell.seed, levels, personas, p_persona, p_random, n_samples, rng)


def simulate_base_answers(
    config: ScreenConfig, condition: dict[str, int] | None = None, *, personas: list[str] | None = None,
    n_questions: int | None = None, n_samples: int | None = None, n_random: int | None = None,
    screen_seed: int = 0, base_rate: float = 0.001,
) -> pl.DataFrame:
    """The pre-screen under one condition (levels of the factors that touch evaluation, e.g. {A: 1, B: 0, C: 1}):
    the base model, no adapter, marker rate near `base_rate`.

    cell_id 'base-A1B0C1' (as the pipeline names the conditions; 'base' for none), source and factor columns
    null, is_source False (no persona was trained on). The screen's question and persona effects apply around
    logit(base_rate); the panel sizes default to config.eval.
    """
    sim, e = config.simulation, config.eval
    personas = personas or load_panels().eval_personas(config.sources, e.personas)
    n_questions = e.questions if n_questions is None else n_questions
    n_samples = e.samples if n_samples is None else n_samples
    n_random = e.random_controls if n_random is None else n_random
    base = np.log(base_rate / (1 - base_rate))
    u = question_effects(sim, n_questions, screen_seed)
    v = persona_effects(sim, personas, screen_seed)
    p_persona = _sigmoid(base + v[:, None] + u[None, :])
    p_random = _sigmoid(base + control_effects(sim, n_random, screen_seed))
    code = "".join(f"{f}{lv}" for f, lv in (condition or {}).items())
    cell_id = f"base-{code}" if code else "base"
    rng = np.random.default_rng([screen_seed, _BASE, _key(cell_id)])
    levels: dict[str, int | None] = {f: None for f in declared_factors(config)}
    return _answers(cell_id, None, config.seeds.primary, levels, personas, p_persona, p_random, n_samples, rng)


def simulate_screen(
    config: ScreenConfig, cells: Sequence[Cell], personas: list[str] | None = None, *, screen_seed: int = 0,
) -> pl.DataFrame:
    """Every cell's answers in one table, with the panel sizes of config.eval (convenience for tests and benchmarks)."""
    personas = personas or load_panels().eval_personas(config.sources, config.eval.personas)
    e = config.eval
    return pl.concat(
        [simulate_cell_answers(config, c, personas, e.questions, e.samples, e.random_controls, screen_seed=screen_seed) for c in cells]
    )


# --------------------------------------------------------------------------- the known answer

_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(80)
_WEIGHTS = _WEIGHTS / _WEIGHTS.sum()  # probabilists' Hermite: E f(Z) = sum w_i f(x_i) / sqrt(2 pi)


def _mean_sigmoid(eta: np.ndarray, sd: float) -> np.ndarray:
    """E[sigmoid(eta + sd * Z)], Z ~ N(0, 1), elementwise over eta."""
    return _sigmoid(np.asarray(eta)[..., None] + sd * _NODES) @ _WEIGHTS


def expected_rates(
    config: ScreenConfig, cells: Sequence[Cell], personas: list[str], n_questions: int, *, screen_seed: int = 0,
) -> pl.DataFrame:
    """Each cell's true source rate (SR) and leakage (LR): the values the screen's estimators target.

    The estimand follows what the CIs resample (docs/experiment.md: questions for SR, personas for LR) and, for
    both, the training run: every rate is averaged over the population of training runs
    (e_c ~ N(0, cell_sd^2)), since the CIs are meant to cover what a second training run would change.
    - SR = E_{u,e}[p] over the *population* of questions (u ~ N(0, question_sd^2)), for this source's
      own drawn persona effect v_s (the source is a fixed persona, not a sample).
    - LR = E_{v,e}[mean over the n_questions drawn questions of p] over the *population* of personas
      (v ~ N(0, persona_sd^2)). It IS conditional on the drawn eval questions: the leakage CI resamples
      personas (and training runs), not questions, so it does not claim to cover question variability,
      and its target holds the questions fixed, as the persona bootstrap does.
    Effects and Cohen's d of these rates (stats.py applied to this table) are the planted values on
    the scale the aggregation reports, to be compared with its estimates and CIs.
    """
    sim, factors = config.simulation, declared_factors(config)
    u = question_effects(sim, n_questions, screen_seed)
    v = dict(zip(personas, persona_effects(sim, personas, screen_seed), strict=True))
    rows = []
    for c in cells:
        sr = float(_mean_sigmoid(source_logit(sim, c, factors) + v[c.source], np.hypot(sim.question_sd, sim.cell_sd)))
        lr = float(_mean_sigmoid(leak_logit(sim, c, factors) + u, np.hypot(sim.persona_sd, sim.cell_sd)).mean())
        rows.append({"cell_id": c.id, "source": c.source, "seed": c.seed, **c.row_levels,
                     "SR": sr, "LR": lr})
    return pl.DataFrame(rows)


def true_effects(
    config: ScreenConfig, cells: Sequence[Cell], personas: list[str], n_questions: int, *, screen_seed: int = 0,
) -> dict[tuple[str, str, str], dict[str, float]]:
    """The planted values on the reported scale: {(response, source or 'pooled', term): {effect, d, m_hi, m_lo}}.

    The screen's estimators (per source over its cells, pooled = mean over sources) applied to the
    noise-free rates of `expected_rates`: what a screen with infinitely many answers would report.
    """
    from eps_screen.analysis.screen_stats import POOLED
    from eps_screen.analysis.stats import cohens_d_rates, level_mean_matrices, term_columns, term_name

    factors = declared_factors(config)
    terms = reported_terms(factors)
    cells = [c for c in cells if not c.is_centre]  # the effects are the design cells' (centre cells: curvature.py)
    rates = expected_rates(config, cells, personas, n_questions, screen_seed=screen_seed)
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    sources = list(dict.fromkeys(rates.get_column("source").to_list()))
    for response in ("SR", "LR"):
        per_source = []
        for s in sources:
            part = rates.filter(pl.col("source") == s)
            coded = 2.0 * part.select(factors).to_numpy() - 1.0
            hi, lo, n_hi, n_lo = level_mean_matrices(term_columns(coded, factors, terms))
            y = part.get_column(response).to_numpy()
            m_hi, m_lo = hi @ y, lo @ y
            stats = {"effect": m_hi - m_lo, "d": cohens_d_rates(m_hi, m_lo, n_hi, n_lo), "m_hi": m_hi, "m_lo": m_lo}
            per_source.append(stats)
            for i, term in enumerate(terms):
                out[(response, s, term_name(term))] = {k: float(v[i]) for k, v in stats.items()}
        for i, term in enumerate(terms):
            out[(response, POOLED, term_name(term))] = {
                k: float(np.mean([st[k][i] for st in per_source])) for k in ("effect", "d", "m_hi", "m_lo")
            }
    return out
