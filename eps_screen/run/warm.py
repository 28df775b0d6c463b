"""What a GPU job leaves up for the next job of its process, when that process is a job host (the local-gpu pool's
command, flows/runtime/job_host.py): the vLLM engines and the trainer processes, with their compiled code.

A job calls `begin_job` first. In a host, a job of the same config as the last finds them as that job left them; a
job of any other config closes them and starts its own, as a fresh process would. Outside a host nothing changes: a
job's trainers end with it, and its engines with its process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from eps_screen.run import engines
from eps_screen.run.trainers import TrainerPool
from eps_screen.spec.config import ScreenConfig

HOSTED = "EPS_JOB_HOST"  # "1" in a job host's process

_LAST: dict = {"config": None, "trainers": None}


def hosted() -> bool:
    return os.environ.get(HOSTED) == "1"


def begin_job(config: ScreenConfig) -> bool:
    """A job starts: whether what the last job of this process left up is kept for it (a host, the same config).
    Outside a host this does nothing: a job's process ends with it."""
    if not hosted():
        return False
    key = config.model_dump_json()
    if _LAST["config"] == key:
        return True
    close()
    _LAST["config"] = key
    return False


def close() -> None:
    """End what the jobs of this process left up: engines and trainers."""
    engines.close_all()
    pool, _LAST["trainers"] = _LAST["trainers"], None
    if pool is not None:
        pool.close()


@contextmanager
def trainer_pool(config: ScreenConfig, processes: int) -> Iterator[TrainerPool]:
    """The job's trainer processes: in a host, the last job's where they are as many (begin_job decided the config);
    elsewhere new ones, ended with the block."""
    if not hosted():
        with TrainerPool(config, processes) as pool:
            yield pool
        return
    kept = _LAST["trainers"]
    if kept is None or kept.processes != processes:
        if kept is not None:
            kept.close()
        _LAST["trainers"] = kept = TrainerPool(config, processes)
    yield kept
