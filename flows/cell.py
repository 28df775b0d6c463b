"""One GPU job as its own flow run: the unit of work that the local-gpu and runpod-gpu pools execute.

It runs its cells in a row in one process, so the base model loads once per job (pipeline and training
keep it per process). Each cell finds its answers (generating them if no earlier cell of its regime did),
trains, evaluates, scores and writes to the store; a finished cell returns at once, so a resubmitted job
redoes only what it had not finished. The return value is {cell id: the cell's summary}. On a GPU pool the
screen also sends the pre-screen here, as the id "pre-screen": the base model is sampled on a GPU too.
"""

from __future__ import annotations

from prefect import flow

from eps_screen.config import ScreenConfig
from eps_screen.design import PRE_SCREEN_ID, Cell
from tasks.cells import cell_task, pre_screen_task, regime_task


@flow(name="cell", persist_result=True)
def cell(config: ScreenConfig, cell_ids: list[str]) -> dict[str, dict]:
    if not cell_ids:
        raise ValueError("cell_ids is empty: name at least one cell (e.g. librarian-A0B0C0D0E0-s42)")
    cells = [Cell.parse(c) for c in cell_ids if c != PRE_SCREEN_ID]  # every id checked before any work starts
    summaries = {}
    if PRE_SCREEN_ID in cell_ids:
        pre = pre_screen_task(config)
        summaries[PRE_SCREEN_ID] = {k: pre[k] for k in ("marker_rate", "answers", "markers", "by_condition")}
    for one in cells:
        if not config.simulated:
            regime_task(config, one.regime)
        summaries[one.id] = cell_task(config, one.id)
    return summaries
