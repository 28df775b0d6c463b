"""How many cells each phase of a screen runs, how many each dispatch sends and how many GPU jobs they fill: the plan,
the estimate and the wall clock all count with these, so they agree."""

from __future__ import annotations

import math

from eps_screen.spec import design
from eps_screen.spec.config import MAX_CELLS_PER_JOB, ScreenConfig


def multiseed_count(config: ScreenConfig) -> int:
    """Phase-3 cells: each source's top cells (no more than its slab has) at each extra seed."""
    runs = len(design.phases(config).slab.runs())
    return len(config.sources) * min(config.seeds.top_k, runs) * len(config.seeds.multiseed)


def distinct_cells(config: ScreenConfig) -> int:
    """Cells the screen runs, each once: the smoke, fold-over and slab cells (the smoke's are slab cells) and the
    multi-seed ones."""
    cells = design.smoke_cells(config) + design.fold_over_cells(config) + design.all_slab_cells(config)
    return len({c.id for c in cells}) + multiseed_count(config)


def known_dispatches(config: ScreenConfig) -> list[list[design.Cell]]:
    """The cells of each dispatch known before any result, as flows/screen.py sends them: the smoke cells, the
    fold-over cells, every source's slab (one dispatch) less the cells those two ran. The multi-seed cells come
    from the slab's results."""
    smoke, folded = design.smoke_cells(config), design.fold_over_cells(config)
    ran = {c.id for c in smoke + folded}
    slab = [c for c in design.all_slab_cells(config) if c.id not in ran]
    return [d for d in (smoke, folded, slab) if d]


Dispatches = list[list[design.Cell]]  # known_dispatches' (a ScreenWork's): counted once, passed to the counts below


def dispatch_groups(config: ScreenConfig, n_multi: int | None = None, dispatches: Dispatches | None = None) -> list[int]:
    """Cells of each dispatch of a screen (the pre-screen is a job of its own): known_dispatches', then the
    multi-seed cells (`n_multi` of them, multiseed_count by default)."""
    multi = multiseed_count(config) if n_multi is None else n_multi
    known = known_dispatches(config) if dispatches is None else dispatches
    return [len(d) for d in known] + ([multi] if multi else [])


def gpu_jobs(config: ScreenConfig, n_multi: int | None = None, cells_per_job: int | None = None,
             dispatches: Dispatches | None = None) -> int:
    """GPU jobs (pod or process start-ups) the screen dispatches, as flows/runtime/dispatch.py groups them: the
    pre-screen's, then each dispatch's (dispatch_groups, `n_multi` multi-seed cells)."""
    per_job = cells_per_job or config.execution.cells_per_job
    return 1 + sum(_jobs(config, n, per_job) for n in dispatch_groups(config, n_multi, dispatches))


def _jobs(config: ScreenConfig, cells: int, per_job: int) -> int:
    """GPU jobs one dispatch of `cells` cells forms (design.group_jobs' count)."""
    ex = config.execution
    return math.ceil(cells / design.job_size(cells, per_job, ex.max_parallel_cells, ex.min_cells_per_job)) if cells else 0


def off_policy_engine_starts(config: ScreenConfig, n_multi: int | None = None,
                             dispatches: Dispatches | None = None) -> int:
    """GPU jobs that start the off-policy model's engine: those with an off-policy regime that no earlier dispatch
    made (as design.group_jobs groups them). Every multi-seed job is counted: its cells come from the slab's
    results, so which regimes they need is not known before."""
    if config.off_policy.kind != "model":
        return 0
    ex, made, starts = config.execution, set(), 0
    for cells in known_dispatches(config) if dispatches is None else dispatches:
        for job in design.group_jobs(config, [c.id for c in cells], ex.cells_per_job, ex.max_parallel_cells):
            regimes = {design.regime_of(config, design.Cell.parse(c)) for c in job}
            starts += any(r.off_policy and r not in made for r in regimes)
        made |= {design.regime_of(config, c) for c in cells}
    multi = multiseed_count(config) if n_multi is None else n_multi
    return starts + _jobs(config, multi, ex.cells_per_job)


def fewest_jobs_cells_per_job(config: ScreenConfig, n_multi: int | None = None,
                              dispatches: Dispatches | None = None) -> int:
    """The smallest cells_per_job that gives the fewest GPU jobs for execution.max_parallel_cells GPUs: start-up
    is paid per job, and dispatch never makes a job so big that a GPU would sit idle, so beyond this value nothing
    changes. With job_eval per_cell a bigger job loses no more to a vanished pod (the resubmitted job finds its
    finished cells in the store and redoes only the one in flight); with per_job (the default) it loses the job's
    trainings that were not yet evaluated."""
    parallel = config.execution.max_parallel_cells
    fewest = max(math.ceil(n / parallel) for n in dispatch_groups(config, n_multi, dispatches))
    return max(1, min(fewest, MAX_CELLS_PER_JOB))  # never a value the config would refuse
