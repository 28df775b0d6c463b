"""Prefect tasks around the cell pipeline: retries, cache keys and the per-cell artifact.

Each task is handed the store its process built once (and, in-process, the screen's cell pool); the pipeline does
the work. The cache key is the store's content address of the cell (inputs + pipeline version) plus the store's
location, so Prefect shows a re-run's finished cells as Cached; the store check inside run_cell is what makes a
re-run skip them on any machine, even with Prefect's result cache gone. A cell missing from the store gets no key
(no cache lookup), so a cell deleted from the store is recomputed, never "Cached"; answer sets follow the same rule
(a key only when every set of the task is stored).
"""

from __future__ import annotations

import hashlib

from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.runtime import task_run
from prefect.states import Crashed

from eps_screen.run import pipeline
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import Cell, Regime
from eps_screen.store.result_store import ResultStore, cell_key, regime_key
from tasks import artifact_key
from eps_screen.run.cell_pool import CellPool, CellProcessDied


def _cell_cache_key(_ctx, params) -> str | None:
    config, store, cell = params["config"], params["store"], Cell.parse(params["cell_id"])
    if not store.is_finished(config, cell):
        return None  # nothing to reuse: compute it, even if Prefect remembers a result for a cell since deleted
    return f"cell-{store.location}-{cell_key(config, cell)}"


def _answer_sets_cache_key(_ctx, params) -> str | None:
    config, store, regimes = params["config"], params["store"], params["regimes"]
    if not all(store.has_regime(config, regime) for regime in regimes):
        # A remembered result for answers the store no longer has would skip this task, and every cell of such a
        # regime would then generate the answers itself.
        return None
    keys = " ".join(regime_key(config, regime) for regime in regimes)
    return f"answer-sets-{store.location}-{hashlib.sha256(keys.encode()).hexdigest()[:16]}"


def _answer_sets_run_name() -> str:
    n = len(task_run.parameters["regimes"])
    return f"answer sets ({n} regime{'s' * (n != 1)})"


@task(name="answer sets", retries=2, retry_delay_seconds=5, cache_key_fn=_answer_sets_cache_key, persist_result=True,
      task_run_name=_answer_sets_run_name)
def answer_sets_task(config: ScreenConfig, regimes: list[Regime], store: ResultStore) -> dict[str, int]:
    """{regime id: answers} of the regimes, the missing sets generated (one engine call per model)."""
    return {regime_id: len(answers) for regime_id, answers in pipeline.answer_sets(config, regimes, store).items()}


# No tags: every tagged task run takes and releases a tag concurrency slot on the server, and on SQLite those
# writes are what answered 503 "database is locked" during a screen (measured: 1-2 per 114-cell screen with the
# tag, none in 3 runs without it). The run name "cell <id>" and the per-cell artifact identify cells in the UI.
@task(name="cell", retries=2, retry_delay_seconds=5, cache_key_fn=_cell_cache_key, persist_result=True,
      task_run_name="cell {cell_id}")
def cell_task(config: ScreenConfig, cell_id: str, store: ResultStore, pool: CellPool | None = None) -> dict:
    """The cell here, or on a worker process of `pool`. A worker that dies ends this run Crashed, not retried
    here: the phase runs the cell again in a run of its own."""
    cell = Cell.parse(cell_id)
    try:
        metrics = pipeline.run_cell(config, cell, store) if pool is None else pool.run(cell)
    except CellProcessDied as died:
        return Crashed(message=str(died))
    return _published(config, metrics)


def _unless_out_of_memory(_task, _task_run, state) -> bool:
    """Retry a job, but not after the GPU ran out of memory: the failed attempt's tensors are still held in this
    process, so the retry fails at once (measured on the 80 GB card), and the rented minutes are lost."""
    exc = state.data
    return not (isinstance(exc, BaseException) and "out of memory" in str(exc).lower())


@task(name="job", retries=2, retry_delay_seconds=5, retry_condition_fn=_unless_out_of_memory, persist_result=True,
      task_run_name="job of {n} cells")
def job_task(config: ScreenConfig, cell_ids: list[str], n: int, store: ResultStore) -> dict[str, dict]:
    """The cells of one GPU job by stage (pipeline.run_job): trainings, then one evaluation of every adapter."""
    done = pipeline.run_job(config, [Cell.parse(c) for c in cell_ids], store)
    return {cid: _published(config, metrics) for cid, metrics in done.items()}


@task(name="pre-screen", retries=1, persist_result=False)
def pre_screen_task(config: ScreenConfig, store: ResultStore, trains: bool = False) -> dict:
    return pipeline.pre_screen(config, store, trains)


def _published(config: ScreenConfig, metrics: dict) -> dict:
    """A cell's summary, with a table artifact when the cell was computed now."""
    if not metrics.get("reused"):
        create_table_artifact(
            key=artifact_key(f"cell-{config.name}-{metrics['cell_id']}"),
            table=[cell_summary(metrics)],
            description=f"Cell {metrics['cell_id']} of screen {config.name}",
        )
    return cell_summary(metrics)


def cell_summary(metrics: dict) -> dict:
    """What the flow and the UI need of a cell's metrics (the full record stays in the store)."""
    return {
        "cell_id": metrics["cell_id"],
        "source_rate": metrics["source_rate"],
        "leakage": metrics["leakage"],
        "random_control_rate": metrics.get("random_control_rate"),
        "answers": metrics["answers"],
        "markers": metrics["markers"],
        "adapter": metrics.get("adapter"),
        "seconds": round(metrics.get("timings", {}).get("total_s", 0.0), 2),
        "timings": {k: round(v, 3) for k, v in metrics.get("timings", {}).items()},
        "reused": bool(metrics.get("reused")),  # found finished: this run's pod did none of its work (costs.split_run)
    }
