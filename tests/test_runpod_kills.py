"""The worker's two kill criteria (eps_screen_runpod/kills.py) speak eps_screen.analysis.gates' language.

The worker is its own distribution and cannot import eps_screen; dispatch reads the worker's label as a
GateOutcome and records it. These pin the two together: a rule or a name changed on one side only fails here.
"""

from __future__ import annotations

import json
import math

import pytest

from eps_screen.analysis import gates
from eps_screen_runpod import kills


def test_names_and_numbers_are_the_gates_own():
    silence, wall = kills.bootstrap_silence(0, False, 1), kills.wall_time(0, 1)
    assert (silence.name, silence.number) == (gates.GATE_NAMES[6], 6)
    assert (wall.name, wall.number) == (gates.GATE_NAMES[5], 5)


@pytest.mark.parametrize("seconds", [0.0, 29.9, 30.0, 31.0, 600.0])
@pytest.mark.parametrize("progress", [False, True])
@pytest.mark.parametrize("limit_s", [30.0, 300.0])
def test_bootstrap_silence_is_the_gate_rule(seconds, progress, limit_s):
    mine = kills.bootstrap_silence(seconds, progress, limit_s)
    theirs = gates.bootstrap_silence(seconds, progress, limit_s)
    assert json.loads(mine.to_json()) == theirs.model_dump()
    assert gates.GateOutcome.model_validate_json(mine.to_json()) == theirs


@pytest.mark.parametrize("hours", [0.0, 23.9, 24.0, 24.01, 30.0])
def test_wall_time_fires_as_the_gate_does_and_reads_as_a_gate_outcome(hours):
    mine = gates.GateOutcome.model_validate_json(kills.wall_time(hours, 24.0).to_json())
    theirs = gates.cost_overrun(hours, 0.0, math.inf, 24.0)
    assert mine.fired == theirs.fired == (hours > 24.0)
    assert mine.numbers["job_too_long"] == theirs.numbers["job_too_long"] and not mine.numbers["over_budget"]
    assert theirs.reason.startswith(mine.reason)  # the job-hours half; spend is the screen's to judge
