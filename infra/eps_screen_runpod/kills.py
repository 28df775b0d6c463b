"""The two kill criteria the worker decides on a pod's own clock, in the wire format dispatch reads.

Kill criterion 6 (bootstrap silence) and the pod-clock backstop of kill criterion 5 (`max_wall_hours`) are decided
here, and travel to the screen as a label holding the outcome's JSON (marks.GATE6, marks.GATE5). The screen reads
that JSON as an `eps_screen.analysis.gates.GateOutcome` and records it. The worker is its own distribution (a worker
host installs Prefect and the RunPod SDK, not the product), so it cannot import `eps_screen.analysis.gates`; it speaks
the same format instead, and tests/test_runpod_worker.py pins the two together (same names, same fields, and for kill
criterion 6 the same outcome for the same numbers).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# The names of eps_screen.analysis.gates.GATE_NAMES for the two criteria decided here.
BOOTSTRAP_SILENCE = "bootstrap silence"
COST_OVERRUN = "cost overrun"


@dataclass(frozen=True)
class KillOutcome:
    """One evaluated kill criterion; the fields of eps_screen.analysis.gates.GateOutcome."""

    name: str
    number: int
    fired: bool
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)
    evaluated: bool = True

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def bootstrap_silence(seconds_since_running: float, progress_reported: bool, limit_s: float) -> KillOutcome:
    """Kill 6: the pod reached RUNNING and its flow run reported no progress within limit_s (it never booted)."""
    fired = (not progress_reported) and seconds_since_running >= limit_s
    state = "progress reported" if progress_reported else "no progress yet"
    return KillOutcome(
        BOOTSTRAP_SILENCE, 6, fired, f"{seconds_since_running:.0f} s since RUNNING, {state} (limit {limit_s:g} s)",
        {"seconds_since_running": seconds_since_running, "progress_reported": progress_reported, "limit_s": limit_s},
    )


def wall_time(pod_hours: float, max_wall_hours: float) -> KillOutcome:
    """Kill 5 on the pod's clock: the job ran longer than max_wall_hours. Spend is the screen's to judge, not this."""
    too_long = pod_hours > max_wall_hours
    return KillOutcome(
        COST_OVERRUN, 5, too_long, f"longest job in flight {pod_hours:.2f} h (limit {max_wall_hours:g} h)",
        {"longest_job_hours": pod_hours, "max_job_hours": max_wall_hours, "job_too_long": too_long,
         "over_budget": False},
    )
