"""The wall clock of a screen on a GPU pool: the GPU-hours estimate says what a screen costs, this says how long
the user waits for it, which is what more GPUs at once (execution.max_parallel_cells) buy with their extra start-ups.

The phases run one after another: the pre-screen's job, then each dispatch (phase_sizes.known_dispatches, then the
multi-seed cells) in GPU jobs as design.group_jobs forms them, at most max_parallel_cells of them at once, each next
job on the first GPU that frees (flows/runtime/dispatch.py). A job takes its start-up, then makes the answer sets of
its cells that are not in the store when it comes to them (made by an earlier dispatch, or stored by an earlier job
of the same dispatch; two jobs at once that need one both make it), then trains and evaluates its cells. The start-up
is `warm_startup_s` on a GPU that has run a job before (the local-gpu pool's job host keeps what a job started), the
pre-screen's GPU among them; free GPUs that ran a job are taken first.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

from eps_screen.plan.phase_sizes import Dispatches, known_dispatches
from eps_screen.spec import design
from eps_screen.spec.config import ScreenConfig

Span = tuple[float, float]  # a job's start and end, seconds from the screen's start


@dataclass(frozen=True)
class JobCosts:
    """Seconds of each part of a GPU job, at the rates the GPU-hours estimate uses."""

    startup_s: float  # a cell job's start-up
    warm_startup_s: float  # a cell job's start-up on a GPU that ran a job before (in a job host; a pod: startup_s)
    off_start_s: float  # the off-policy engine's start, in a job that makes off-policy answers (0: none is started)
    cell_s: Callable[[design.Cell], float]  # a cell's training and evaluation
    regime_s: Callable[[design.Regime], float]  # one answer set
    multiseed_cell_s: float  # a multi-seed cell (not known before): the mean slab cell and the mean answer set


def schedule(config: ScreenConfig, costs: JobCosts, pre_screen_s: float, n_multi: int,
             dispatches: Dispatches | None = None) -> list[list[Span]]:
    """Each GPU job's span, by dispatch in the order the screen sends them, the pre-screen's job (`pre_screen_s`
    long) first. Every multi-seed job counted as starting the off-policy engine, as the GPU-hours are."""
    ex, stored = config.execution, {}
    spans, used = [[(0.0, pre_screen_s)]], 1
    for cells in known_dispatches(config) if dispatches is None else dispatches:
        by_id = {c.id: c for c in cells}
        jobs = design.group_jobs(config, list(by_id), ex.cells_per_job, ex.max_parallel_cells)
        dispatched, used = _dispatch(spans[-1], [_cell_job(config, costs, [by_id[c] for c in job], stored)
                                                 for job in jobs], ex.max_parallel_cells, costs, used)
        spans.append(dispatched)
    if n_multi:
        size = design.job_size(n_multi, ex.cells_per_job, ex.max_parallel_cells, ex.min_cells_per_job)
        lengths = [costs.off_start_s + min(size, n_multi - i) * costs.multiseed_cell_s for i in range(0, n_multi, size)]
        dispatched, used = _dispatch(spans[-1], [lambda start, s=s: start + s for s in lengths],
                                     ex.max_parallel_cells, costs, used)
        spans.append(dispatched)
    return spans


def _cell_job(config: ScreenConfig, costs: JobCosts, cells: list[design.Cell],
              stored: dict[design.Regime, float]) -> Callable[[float], float]:
    """The job as a function from the end of its start-up to its end, that records when it stores each answer set it
    makes."""

    def end(start: float) -> float:
        t, engine = start, False
        for r in design.regimes(config, cells):
            if stored.get(r, math.inf) <= t:
                continue
            if r.off_policy and not engine:
                t, engine = t + costs.off_start_s, True
            t += costs.regime_s(r)
            stored[r] = min(stored.get(r, math.inf), t)
        return t + sum(map(costs.cell_s, cells))

    return end


def _dispatch(before: list[Span], jobs: list[Callable[[float], float]], gpus: int, costs: JobCosts,
              used: int) -> tuple[list[Span], int]:
    """The jobs' spans once the previous phase's jobs (`before`) have all ended, at most `gpus` at once, in order,
    each with its start-up (warm on the `used` GPUs that ran a job before, taken first); and the GPUs used since."""
    slots = max(1, min(gpus, len(jobs)))
    now = max(end for _, end in before)
    free = [(now, 0 if k < used else 1) for k in range(slots)]  # (free at, 1 if it never ran a job)
    heapq.heapify(free)
    spans = []
    for job in jobs:
        start, fresh = heapq.heappop(free)
        spans.append((start, job(start + (costs.startup_s if fresh else costs.warm_startup_s))))
        used += fresh
        heapq.heappush(free, (spans[-1][1], 0))
    return spans, used


def wall_hours(spans: list[list[Span]]) -> float:
    """Hours from the pre-screen's start to the last job's end."""
    return max(end for _, end in spans[-1]) / 3600
