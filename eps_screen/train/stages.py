"""The training stage of a GPU job: which of its cells share passes over the base, and which train alone.

Cells whose recipes share a together_key (eps_screen.train.together) and whose micro-batches are short enough
that several fit one pass under the token budget are trained together. That is where it was measured faster on the
H200 (BENCHMARKS.md, "Cells trained together"): 8 full-size A0B0 cells took 13.9 s each together against 30.1 s
each alone (55.3 s for a process's first), since short cells are bound by optimizer steps, not by tokens. Long
cells (one micro-batch fills the pass) gain nothing from it, and the compiled TRL path of train_lora was 15%
faster for them: they train alone. Each cell brings its own resolved config, so cells of one job may differ in
what a factor sets; `training.together: false` trains every cell alone.

A job runs its cells in stages of at most execution.cells_per_stage: a stage's cells are trained, then its
adapters evaluated and stored, before the next stage trains. A pod that vanishes loses at most one stage's
trainings, and one engine call serves no more adapters than the engine holds at once (8 by default, as
eval.vllm_max_loras), so a job may hold many cells (fewer pod start-ups) at no more risk than a job of one stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eps_screen.spec.config import ScreenConfig
from eps_screen.train.data import Example
from eps_screen.train.lora import StepLog
from eps_screen.train.together import shares_passes

# Together only where at least this many cells' micro-batches share a pass on average (1.0: nothing shared).
MIN_CELLS_PER_PASS = 2.0


def by_stage(config: ScreenConfig) -> bool:
    """Whether pipeline.run_job runs a GPU job's cells by stage (every training, then one evaluation of all the
    adapters): execution.job_eval per_job, real cells, and no factor on the base model (one engine serves the
    job's adapters, one base trains them). Only by stage can cells share training passes."""
    varies_model = any(p.startswith("model.") for f in config.design.factors for p in f.paths)
    return not config.simulated and config.execution.job_eval == "per_job" and not varies_model


def trains_together(config: ScreenConfig) -> bool:
    """Whether a GPU job of this config trains cells in shared passes, as the estimate and the memory plan count
    it: training.together, by stage, more than one cell a job, and settings that can share passes. Which of a
    job's cells do is `plan`'s call (its A0B0 cells at qwen7b.yaml's sizes)."""
    t = config.training
    return (t.together and config.execution.cells_per_job > 1 and by_stage(config)
            and shares_passes(t.packing, config.lora.dropout, t.gradient_checkpointing, t.epochs))


def most_together(config: ScreenConfig) -> int:
    """The most cells a GPU job of this config trains in shared passes: one stage's."""
    return min(config.execution.cells_per_job, config.execution.cells_per_stage)


@dataclass(frozen=True)
class CellTraining:
    config: ScreenConfig  # the cell's own resolved config
    examples: list[Example]
    whole_answer: bool
    seed: int
    out_dir: Path
    name: str = ""  # the cell's id, recorded in the reports of the cells it shared passes with
    on_step: StepLog | None = None  # where its optimizer steps' figures go (eps_screen.run.tracking)


def recipes_of(tokenizer, cells: list[CellTraining]) -> list:
    """Each cell's recipe: its training set tokenized (most of a stage plan's time)."""
    from eps_screen.train.together import recipe

    return [recipe(tokenizer, c.config, c.examples, c.whole_answer, c.seed, c.out_dir) for c in cells]


def plan(tokenizer, cells: list[CellTraining], recipes: list | None = None) -> tuple[list[list[int]], list]:
    """(groups of cell indices to train together, each cell's recipe); a cell in no group trains alone. `recipes`:
    the cells' recipes where the caller made them (recipes_of, elsewhere), else made here."""
    from eps_screen.train.together import cells_per_pass, together_key

    recipes = recipes_of(tokenizer, cells) if recipes is None else recipes
    by_key: dict[tuple, list[int]] = {}
    for i, (c, r) in enumerate(zip(cells, recipes, strict=True)):
        key = together_key(r)
        if key is not None and c.config.training.together:
            by_key.setdefault((c.config.model.base, *key), []).append(i)
    groups = [short for g in by_key.values() for short in [_short_cells(g, recipes)]
              if len(short) > 1 and cells_per_pass([recipes[i] for i in short]) >= MIN_CELLS_PER_PASS]
    return groups, recipes


def _short_cells(cells: list[int], recipes: list) -> list[int]:
    """Of these cells, those whose micro-batch leaves room for another's in a shared pass (under the budget of all of
    them): a long cell (one micro-batch fills a pass) would only hold the others back."""
    from eps_screen.train.together import forward_budget, piece_tokens

    budget = forward_budget([recipes[i] for i in cells])
    return [i for i in cells if 2 * piece_tokens(recipes[i]) <= budget]


@dataclass(frozen=True)
class Stage:
    cells: list[int]  # indices into the job's cells
    groups: list[list[int]]  # of those, the ones trained together (indices into `cells`' positions)
    recipes: list  # each of the stage's cells' recipe


def stages(tokenizer, cells: list[CellTraining], size: int, recipes: list | None = None) -> list[Stage]:
    """The job's cells in stages of at most `size`: every group of short cells that share passes (`plan`), shortest
    micro-batches first, split into stages of near-equal size of its own, then the cells that train alone, in job
    order. A split group's part that shares too little (fewer than MIN_CELLS_PER_PASS cells a pass) trains alone.
    Sorted, a stage holds cells of like lengths, which fill its passes alike. `recipes`: as `plan` takes them."""
    from eps_screen.train.together import cells_per_pass, piece_tokens

    groups, recipes = plan(tokenizer, cells, recipes)
    groups = [sorted(g, key=lambda i: piece_tokens(recipes[i])) for g in groups]
    out = []
    for part, grouped in stage_split(groups, len(cells), size):
        shares = grouped and len(part) > 1 and cells_per_pass([recipes[i] for i in part]) >= MIN_CELLS_PER_PASS
        out.append(Stage(part, [list(range(len(part)))] if shares else [], [recipes[i] for i in part]))
    return out


def stage_split(groups: list[list[int]], n: int, size: int) -> list[tuple[list[int], bool]]:
    """`n` cells' stages as (cell indices, whether they come from a group that shares passes): each group split
    into near-equal parts of at most `size`, then the other cells in order, `size` at a time. The estimate counts
    the engine calls of a job's evaluation from it."""
    out = []
    for group in groups:
        parts = -(-len(group) // size)
        out += [(group[k * len(group) // parts:(k + 1) * len(group) // parts], True) for k in range(parts)]
    grouped = {i for g in groups for i in g}
    alone = [i for i in range(n) if i not in grouped]
    return out + [(alone[k:k + size], False) for k in range(0, len(alone), size)]


def train_cells(base, cells: list[CellTraining], stage: Stage | None = None) -> list:
    """Every cell's adapter saved to its out_dir; returns their TrainReports in the order of `cells`. A report of
    cells trained together names the others in options["trained_with"]. `stage`: these cells are that stage's,
    already planned (`stages`)."""
    from eps_screen.train.lora import train_lora
    from eps_screen.train.together import train_together

    groups, recipes = (stage.groups, stage.recipes) if stage else plan(base.tokenizer, cells)
    reports: list = [None] * len(cells)
    for group in groups:
        trained = train_together(base, [recipes[i] for i in group], on_step=[cells[i].on_step for i in group])
        for i, rep in zip(group, trained, strict=True):
            rep.options["trained_with"] = [cells[j].name or str(cells[j].out_dir) for j in group if j != i]
            reports[i] = rep
    for i, c in enumerate(cells):
        if reports[i] is None:
            reports[i] = train_lora(base, c.examples, c.config, c.whole_answer, c.seed, c.out_dir, c.on_step,
                                    rows=list(recipes[i].rows))
    return reports
