"""What the RunPod worker writes on a flow run besides its state, for the screen's dispatch to read.

A state alone is not enough: a pod's dying process can still write Failed over the worker's Crashed
(issue 11: a cell lost that way). Labels are set before the worker touches the pod, and nothing in the pod
writes them, so dispatch (flows/runtime/recovery.py) reads them from the run whatever its final state says.
"""

from __future__ import annotations

KILLED_BY = "eps-screen.killed-by"  # the worker ended this run's pod: the infrastructure's doing, never the flow's
PERMANENT = "eps-screen.permanent-failure"  # one line: a cause no retry fixes (bad key, unknown GPU type, image)
GATE5 = "eps-screen.gate5"  # kill criterion 5 fired on the pod's own clock (max_wall_hours): its GateOutcome
GATE6 = "eps-screen.gate6"  # kill criterion 6 fired for this run: its GateOutcome as JSON
WORKER = "runpod-worker"
CRASH_PREFIX = "Crashed by the infrastructure (RunPod worker): "
