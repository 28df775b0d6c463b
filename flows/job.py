"""One GPU job as its own flow run: the unit of work that the local-gpu and runpod-gpu pools execute.

It runs its cells in one process, so the base model and the generation engine load once per job. First the
answer sets of the job's regimes (one engine call per model; the off-policy model's engine is then released);
then, with execution.job_eval = per_job (the default), every cell's training with the engine asleep (short cells
together, in shared passes) and one multi-LoRA evaluation of all adapters (pipeline.run_job), or with per_cell each
cell trained and evaluated in turn. Every cell is scored and written to the store as soon as its answers exist; a
finished cell returns at once, so a resubmitted job redoes only what it had not finished. The return value is
{cell id: the cell's summary}. On a GPU pool the screen also sends the pre-screen here, as the id "pre-screen": the
base model is sampled on a GPU too.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from eps_screen.run import warm
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import PRE_SCREEN_ID, Cell, regimes
from eps_screen.store.result_store import ResultStore
from tasks.cells import answer_sets_task, cell_task, job_task, pre_screen_task


@flow(name="job", persist_result=True)
def job(config: ScreenConfig, cell_ids: list[str]) -> dict[str, dict]:
    if not cell_ids:
        raise ValueError("cell_ids is empty: name at least one cell (e.g. librarian-A0B0C0D0E0-s42)")
    cells = [Cell.parse(c) for c in cell_ids if c != PRE_SCREEN_ID]  # every id checked before any work starts
    store = ResultStore.for_config(config)  # this process's one store, handed to every task
    if warm.begin_job(config):
        get_run_logger().info("engines and trainers kept from the last job of this process (its job host)")
    summaries = {}
    if PRE_SCREEN_ID in cell_ids:
        # In a job host the engines outlive this job, and the next one trains: they leave room for its base now.
        pre = pre_screen_task(config, store, trains=bool(cells) or warm.hosted())
        summaries[PRE_SCREEN_ID] = {k: pre[k] for k in ("marker_rate", "answers", "markers", "by_condition")}
    if not config.simulated and cells:
        answer_sets_task(config, regimes(config, cells), store)
    if config.execution.job_eval == "per_job" and not config.simulated and len(cells) > 1:
        summaries.update(job_task(config, [one.id for one in cells], len(cells), store))
    else:
        for one in cells:
            summaries[one.id] = cell_task(config, one.id, store)
    return summaries
