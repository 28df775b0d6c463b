"""The work of a screen, counted once from its declared design: cells per phase and per dispatch, answer sets,
pre-screen conditions, and the tokens each trains and generates under its own recipe. The plan shows it, the
estimate prices it, and GPU jobs (phase_sizes, under the config's execution settings) group its dispatches.

Tokens are counted per A x B prompt condition (the rates differ by condition) with the rule-of-thumb sequence
lengths of sequence_lengths. The phase-3 (multi-seed) cells are picked from the slabs' results: counted as the mean
slab cell, with answer sets of the mean regime.
"""

from __future__ import annotations

from dataclasses import dataclass

from eps_screen.plan.phase_sizes import Dispatches, known_dispatches, multiseed_count
from eps_screen.plan.sequence_lengths import sequence_tokens
from eps_screen.spec import design
from eps_screen.spec.config import ScreenConfig

CONDITIONS = ("A0B0", "A1B0", "A0B1", "A1B1")


@dataclass(frozen=True)
class CellWork:
    condition: str  # the cell's A x B prompt condition
    train_tokens: float  # examples x sequence tokens x epochs
    answer_tokens: float  # its evaluation panel's answers x answer tokens


@dataclass(frozen=True)
class ScreenWork:
    smoke: list[design.Cell]
    fold_over: list[design.Cell]
    slab: list[design.Cell]
    n_multi: int  # phase-3 cells (picked later: counted, not known)
    pre_screen: list[dict[str, int]]  # the pre-screen's conditions, as levels
    regimes: list[design.Regime]  # the answer sets phases 1-2 need
    dispatches: Dispatches  # the cells of each dispatch known before any result, as the screen sends them
    cells: dict[str, CellWork]  # each distinct cell of phases 1-2, by id
    regime_tokens: dict[design.Regime, tuple[str, float]]  # (condition, answer tokens) of each answer set
    pre_screen_tokens: dict[str, float]  # answer tokens of the pre-screen, by condition
    answers_per_cell: int
    examples_per_cell: int

    @property
    def distinct_cells(self) -> int:
        return len(self.cells) + self.n_multi

    @property
    def cells_per_phase(self) -> dict[str, int]:
        return {"smoke": len(self.smoke), "fold_over": len(self.fold_over), "slab": len(self.slab),
                "centre": sum(c.is_centre for c in self.slab), "multiseed": self.n_multi}  # centre: of the slab's

    def by_condition(self, part: str) -> dict[str, float]:
        """Train or answer tokens of every cell (the multi-seed ones as the mean cell), by condition."""
        out = dict.fromkeys(CONDITIONS, 0.0)
        for w in self.cells.values():
            out[w.condition] += w.train_tokens if part == "train" else w.answer_tokens
        return {c: t * self.distinct_cells / len(self.cells) for c, t in out.items()}

    def answer_set_tokens(self) -> dict[str, dict[str, float]]:
        """Answer-set tokens by condition, on- and off-policy, phase 3's new seeds' sets counted as the slabs' mix."""
        out = {"on": dict.fromkeys(CONDITIONS, 0.0), "off": dict.fromkeys(CONDITIONS, 0.0)}
        for r in self.regimes:
            cond, tokens = self.regime_tokens[r]
            out["off" if r.off_policy else "on"][cond] += tokens
        more = 1 + self.n_multi / max(1, len(self.regimes))
        return {side: {c: t * more for c, t in by.items()} for side, by in out.items()}

    def regime(self, config: ScreenConfig, r: design.Regime) -> tuple[str, float]:
        """(condition, tokens) of an answer set, one no slab cell has counted once it is asked for."""
        if r not in self.regime_tokens:
            self.regime_tokens[r] = regime_tokens(config, r)
        return self.regime_tokens[r]


def cell_work(config: ScreenConfig, cell: design.Cell) -> CellWork:
    """A cell's condition, training and evaluation tokens under its own recipe."""
    rc, cond = (r := design.recipe(config, cell)).config, r.condition
    a, b = int(cond.long_system_prompt), int(cond.long_format)
    _, answer, seq = sequence_tokens(rc, a, b)
    examples = rc.data.positives + (
        0 if not cond.whole_answer_loss and rc.data.e0_negatives == "none" else rc.data.negatives)
    answers = (rc.eval.personas * rc.eval.questions + rc.eval.random_controls) * rc.eval.samples
    return CellWork(f"A{a}B{b}", examples * seq * rc.training.epochs, answers * answer)


def regime_tokens(config: ScreenConfig, regime: design.Regime) -> tuple[str, float]:
    """(A x B condition, answer tokens) of a regime's answer set under its own recipe."""
    rc, cond = (rr := design.regime_recipe(config, regime)).config, rr.condition
    a, b = int(cond.long_system_prompt), int(cond.long_format)
    return f"A{a}B{b}", (rc.data.positives + rc.data.negatives) * sequence_tokens(rc, a, b)[1]


def screen_work(config: ScreenConfig) -> ScreenWork:
    smoke, folded, slab = design.smoke_cells(config), design.fold_over_cells(config), design.all_slab_cells(config)
    ev = config.eval
    answers_per_cell = (ev.personas * ev.questions + ev.random_controls) * ev.samples
    distinct = {c.id: c for c in smoke + folded + slab}  # a Plackett-Burman slab's fold-over lies outside it
    regimes = design.regimes(config, slab)
    conditions = design.pre_screen_conditions(config)
    pre = dict.fromkeys(CONDITIONS, 0.0)
    for levels in conditions:
        cond = design.recipe_at(config, levels).condition
        a, b = int(cond.long_system_prompt), int(cond.long_format)
        pre[f"A{a}B{b}"] += answers_per_cell * sequence_tokens(config, a, b)[1]
    return ScreenWork(
        smoke=smoke, fold_over=folded, slab=slab, n_multi=multiseed_count(config), pre_screen=conditions,
        regimes=regimes, dispatches=known_dispatches(config), cells={i: cell_work(config, c) for i, c in distinct.items()},
        regime_tokens={r: regime_tokens(config, r) for r in regimes}, pre_screen_tokens=pre,
        answers_per_cell=answers_per_cell, examples_per_cell=config.data.positives + config.data.negatives)
