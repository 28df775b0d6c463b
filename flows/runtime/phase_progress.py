"""The screen run's progress artifact in the UI: distinct cells finished of the plan's, and the phase it is in.

(The terminal's bar, read from the store while something else runs the screen, is flows/runtime/terminal.py.)
"""

from __future__ import annotations

from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from eps_screen.plan.screen_plan import Plan
from eps_screen.spec.config import ScreenConfig
from tasks import artifact_key


class PhaseProgress:
    """Cells finished out of the plan's distinct cells, and the current phase (its description, e.g. "phase 2: slabs
    (96 cells): 40 of 114 cells"); a log line at each phase's start and end."""

    def __init__(self, config: ScreenConfig, plan: Plan):
        self.done: set[str] = set()
        self.total = plan.distinct_cells
        self.phase = ""
        self.id = create_progress_artifact(
            progress=0.0, key=artifact_key(f"progress-{config.name}"), description=self.text()
        )

    def count(self) -> str:
        return f"{len(self.done)} of {self.total} cells"

    def text(self) -> str:
        return f"{self.phase or 'starting'}: {self.count()}"

    def begin(self, phase: str | None) -> None:
        """The phase before ends and this one starts (None: the last one ended)."""
        logger = get_run_logger()
        if self.phase:
            logger.info("%s: finished (%s)", self.phase, self.count())
        self.phase = phase or "finished"
        if phase:
            logger.info("%s: started (%s finished so far)", phase, self.count())
        self.advance([])

    def advance(self, cell_ids: list[str]) -> None:
        self.done.update(cell_ids)
        try:
            update_progress_artifact(self.id, progress=100.0 * len(self.done) / self.total, description=self.text())
        except Exception as exc:  # a bar that lags must not stop the screen; the next cell's update catches up
            get_run_logger().warning("progress artifact not updated (%s: %s)", type(exc).__name__, str(exc)[:200])
