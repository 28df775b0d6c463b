"""Prefect worker type `runpod` (registered through the `prefect.collections` entry point).

Importing this package registers `RunPodWorker` under its type, which is what makes
`prefect work-pool create NAME --type runpod` and `prefect worker start --pool NAME --type runpod` work.
"""

from eps_screen_runpod.job import RunPodAccount, RunPodJobConfiguration, RunPodVariables
from eps_screen_runpod.worker import RunPodWorker, RunPodWorkerResult

__all__ = ["RunPodAccount", "RunPodJobConfiguration", "RunPodVariables", "RunPodWorker", "RunPodWorkerResult"]
