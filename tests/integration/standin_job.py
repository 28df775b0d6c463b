"""A stand-in for flows/job.py with the same signature: `job(config, cell_ids) -> {cell_id: summary}`.

It "computes" each cell by sleeping $STANDIN_SECONDS, then writes <store>/standin/<cell_id>.json atomically and
appends a line to <store>/standin/computed.log. A cell whose file exists is returned from the store without
recomputing, as the real job flow does, so the log shows whether any finished cell was ever redone.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from prefect import flow

from eps_screen.spec.config import ScreenConfig


@flow(name="job", persist_result=True)
def job(config: ScreenConfig, cell_ids: list[str]) -> dict[str, dict]:
    root = Path(config.store) / "standin"
    root.mkdir(parents=True, exist_ok=True)
    return {cell_id: _one(root, cell_id) for cell_id in cell_ids}


def _one(root: Path, cell_id: str) -> dict:
    done = root / f"{cell_id}.json"
    if done.exists():
        return {**json.loads(done.read_text()), "from_store": True}
    with open(root / "started.log", "a") as log:
        log.write(f"{cell_id} {os.environ.get('PREFECT__FLOW_RUN_ID')}\n")
    time.sleep(float(os.environ.get("STANDIN_SECONDS", "1")))
    summary = {"cell_id": cell_id, "sr": round(len(cell_id) / 100, 3),
               "flow_run_id": os.environ.get("PREFECT__FLOW_RUN_ID")}
    tmp = done.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary))
    tmp.rename(done)
    with open(root / "computed.log", "a") as log:
        log.write(f"{cell_id}\n")
    return {**summary, "from_store": False}
