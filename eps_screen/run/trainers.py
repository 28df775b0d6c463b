"""Processes that train a GPU job's cells beside its engines (training.processes > 1), each with its own base.

One training of a small model is bound by its process's Python (kernel launches, the autograd engine), not by the
card: SmolLM2's cells took 0.20-0.29 s an optimizer step whether a step held 1,300 tokens or 16,000 (H100,
BENCHMARKS.md). So several processes train several cells at once, and they train a job's next stage while its
engines, awake, evaluate the stage before (eps_screen.run.pipeline): neither the trainings nor the evaluation wait
for the other. Each worker loads the base once and trains what it is given with train.stages.train_cells (cells
that share passes stay one task); it sends back each cell's TrainReport and its optimizer steps' figures, which the
parent hands to the cell's tracking run.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace

from eps_screen.spec.config import ScreenConfig
from eps_screen.train.stages import CellTraining, Stage

_BASE = None  # a worker's base model, loaded by _start


def _start(config: ScreenConfig) -> None:
    # Packed rows change length every step, and the allocator's fixed-size segments fragment across them (an A1
    # cell of SmolLM2 reserved 24 GiB for 9 GiB allocated): growable segments keep each trainer near what it uses,
    # which several trainers and the engines sharing one card need.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    global _BASE
    from eps_screen.run import engines

    _BASE = engines.training_base(config)


def _train(cells: list[CellTraining], stage: Stage) -> tuple[list, list[list[tuple[int, dict]]]]:
    """A task in a worker: (each cell's TrainReport, each cell's optimizer steps as (step, figures))."""
    from eps_screen.train.stages import train_cells

    logs: list[list[tuple[int, dict]]] = [[] for _ in cells]
    recorded = [replace(c, on_step=lambda step, figures, log=log: log.append((step, figures)))
                for c, log in zip(cells, logs, strict=True)]
    reports = train_cells(_BASE, recorded, stage)
    for report in reports:
        report.options["worker"] = os.getpid()
    return reports, logs


def _recipes(cells: list[CellTraining]) -> list:
    """A task in a worker: the cells' recipes, their sets tokenized by its base's tokenizer."""
    from eps_screen.train.stages import recipes_of

    return recipes_of(_BASE.tokenizer, cells)


@dataclass
class StageTraining:
    """A stage's trainings under way in the workers."""

    cells: list[CellTraining]
    tasks: list[tuple[list[int], Future]]  # (the stage's cell positions, their task)
    submitted: float
    processes: int

    def result(self) -> tuple[list, float]:
        """(each cell's TrainReport in the stage's order, seconds from submission to the last task's end), once
        every task is done; each cell's steps go to its on_step. A worker's error is raised here."""
        reports: list = [None] * len(self.cells)
        for positions, future in self.tasks:
            try:
                trained, logs = future.result()
            except Exception as err:
                if type(err).__name__ == "OutOfMemoryError":
                    raise RuntimeError(
                        f"a trainer ran out of GPU memory beside {self.processes - 1} others and the engines: set"
                        " training.processes lower, or training.max_batch_tokens (cells stored so far are kept)"
                    ) from err
                raise
            for i, report, log in zip(positions, trained, logs, strict=True):
                reports[i] = report
                if self.cells[i].on_step is not None:
                    for step, figures in log:
                        self.cells[i].on_step(step, figures)
        return reports, time.perf_counter() - self.submitted


class TrainerPool:
    """`processes` spawned workers (the parent has CUDA and threads), started with the pool: they import and load
    the base while the job makes its answer sets."""

    def __init__(self, config: ScreenConfig, processes: int):
        self.processes = processes
        self._pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_start, initargs=(config,))
        for _ in range(processes):
            self._pool.submit(time.sleep, 0)  # every worker starts now, not at the first stage

    def recipes(self, cells: list[CellTraining]) -> list:
        """Each cell's recipe (train.stages.recipes_of), the cells dealt out to the workers in a few parts each. A
        job plans its stages from every cell's tokenized set before the first trains, with the card idle: in one
        process that took 111 s for 88 cells on the H100's machine (BENCHMARKS.md)."""
        size = -(-len(cells) // (2 * self.processes))
        parts = [self._pool.submit(_recipes, [replace(c, on_step=None) for c in cells[k:k + size]])
                 for k in range(0, len(cells), size)]
        return [r for part in parts for r in part.result()]

    def submit(self, cells: list[CellTraining], stage: Stage) -> StageTraining:
        """The stage's trainings as tasks, longest first: each group of cells that share passes one task, each other
        cell one. `cells`: the stage's, in its order; stage.groups index into them."""
        grouped = {i for g in stage.groups for i in g}
        units = [list(g) for g in stage.groups] + [[i] for i in range(len(cells)) if i not in grouped]
        units.sort(key=lambda unit: [-sum(w) for w in zip(*(_work(stage.recipes[i]) for i in unit))])
        tasks = []
        for unit in units:
            part = Stage(cells=list(range(len(unit))), groups=[list(range(len(unit)))] if len(unit) > 1 else [],
                         recipes=[stage.recipes[i] for i in unit])
            tasks.append((unit, self._pool.submit(_train, [replace(cells[i], on_step=None) for i in unit], part)))
        return StageTraining(cells, tasks, time.perf_counter(), self.processes)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> TrainerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _work(recipe) -> tuple[int, int]:
    """A cell's training work, to order tasks: (optimizer steps, what a Python-bound training's time follows; tokens
    an epoch)."""
    from eps_screen.train.together import schedule

    return len(schedule(recipe)), sum(len(row.input_ids) for row in recipe.rows)
