"""The one table of eps-screen's work pools and deployments, by name, and the pool each deployment runs on.

deployments/prefect.yaml and deployments/pools/ declare the same facts for Prefect; tests/test_names.py fails
when they and this table disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

CPU_POOL = "cpu"  # the screen orchestrator and the scheduled aggregate: never a GPU slot
LOCAL_GPU_POOL = "local-gpu"
RUNPOD_POOL = "runpod-gpu"

# Work pool -> the worker type it is created with (deployments/pools/<pool>.yaml `type`).
POOL_TYPES = {CPU_POOL: "process", LOCAL_GPU_POOL: "process", RUNPOD_POOL: "runpod"}


@dataclass(frozen=True)
class Deployment:
    flow: str  # the @flow's name
    name: str  # the deployment's name in deployments/prefect.yaml
    pool: str

    @property
    def full_name(self) -> str:
        """`flow/deployment`, the name Prefect reads and runs a deployment by."""
        return f"{self.flow}/{self.name}"


SCREEN = Deployment("screen", "screen", CPU_POOL)
PRESET = Deployment("screen", "preset", CPU_POOL)
AGGREGATE = Deployment("aggregate-all", "aggregate", CPU_POOL)
JOB_LOCAL_GPU = Deployment("job", "job-local-gpu", LOCAL_GPU_POOL)
JOB_RUNPOD = Deployment("job", "job-runpod", RUNPOD_POOL)
DEPLOYMENTS = (SCREEN, PRESET, AGGREGATE, JOB_LOCAL_GPU, JOB_RUNPOD)

# config.execution.pool -> the `flow/deployment` its cells are dispatched to.
JOB_DEPLOYMENTS = {d.pool: d.full_name for d in (JOB_LOCAL_GPU, JOB_RUNPOD)}
