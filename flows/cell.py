"""One cell as its own flow run: the unit of GPU work that the local-gpu and runpod-gpu pools execute.

It finds its answers (generating them if no earlier cell of its regime did), trains, evaluates, scores and
writes to the store; a finished cell returns at once. The return value is the cell's summary.
"""

from __future__ import annotations

from prefect import flow

from eps_screen.config import ScreenConfig
from eps_screen.design import Cell
from tasks.cells import cell_task, regime_task


@flow(name="cell", persist_result=True)
def cell(config: ScreenConfig, cell_id: str) -> dict:
    parsed = Cell.parse(cell_id)
    if not config.simulated:
        regime_task(config, parsed.regime)
    return cell_task(config, cell_id)
