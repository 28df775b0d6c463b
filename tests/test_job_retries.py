"""The GPU job task's retries (tasks/cells.py): any failure is retried twice, a CUDA out-of-memory error never.

After an out-of-memory error the failed attempt's tensors are still held by the process, so an in-process retry
fails at once (the 80 GB run, BENCHMARKS.md "An 80 GB card"): it would only spend rented minutes. The pipeline is
replaced by one that fails; the task runs on the session's Prefect test server.
"""

from __future__ import annotations

import pytest

from tests.conftest import tiny_config

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.mark.parametrize("error, attempts", [
    (RuntimeError("CUDA out of memory. Tried to allocate 322.00 MiB."), 1),  # torch's OutOfMemoryError wording
    (RuntimeError("CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:163"), 1),  # vLLM's allocator
    (ConnectionError("the store did not answer"), 3),
])
def test_a_job_is_retried_unless_the_gpu_ran_out_of_memory(error, attempts, tmp_path, monkeypatch):
    from prefect import flow

    from eps_screen.run import pipeline
    from eps_screen.store.result_store import ResultStore
    from tasks.cells import job_task

    calls = []

    def failing(config, cells, store):
        calls.append(len(cells))
        raise error

    monkeypatch.setattr(pipeline, "run_job", failing)
    config = tiny_config(tmp_path)

    @flow
    def one_job():
        return job_task.with_options(retry_delay_seconds=0)(config, ["librarian-A0B0C0D0E0-s42"], 1,
                                                            ResultStore.for_config(config), return_state=True)

    state = one_job(return_state=True)
    assert state.is_failed() and len(calls) == attempts
