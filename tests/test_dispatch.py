"""The dispatch room (flows/runtime/dispatch.py, recovery.py, ledger.py) against a temporary Prefect server, with a
scripted stand-in for the work pool.

`Executor` plays the worker: it picks up the deployment's scheduled runs and drives each to the state a
script names for (cell, attempt): complete, crash, fail, fail-infra, hang. That isolates dispatch's own
rules (bounded resubmits, backoff, never re-running a completed cell, the spend cap, cancellation, re-attach to
runs an earlier dispatch left) from pods; tests/integration/test_runpod_pool.py runs the real chain, and
tests/integration/test_redispatch.py kills a dispatcher there.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Callable

import anyio
import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eps_screen_runpod.cost import PodCost, publish_pod_cost  # noqa: E402
from prefect import flow  # noqa: E402
from prefect.client.orchestration import get_client  # noqa: E402
from prefect.client.schemas.filters import (  # noqa: E402
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType  # noqa: E402
from prefect.states import Cancelled, Completed, Crashed, Failed, Pending, Running  # noqa: E402

import flows.runtime.dispatch as dispatch_module  # noqa: E402
from eps_screen.analysis import gates  # noqa: E402
from eps_screen.run.aggregate import collect_gates  # noqa: E402
from eps_screen.spec.config import ScreenConfig  # noqa: E402
from eps_screen.spec.design import Cell  # noqa: E402
from eps_screen.store.result_store import ResultStore  # noqa: E402
from eps_screen_runpod import marks  # noqa: E402
from flows.runtime.dispatch import (  # noqa: E402
    API_OUTAGE_S,
    ApiUnavailable,
    CellsFailed,
    CostOverrun,
    InfrastructureRefused,
    Job,
    adispatch_cells,
)

pytestmark = pytest.mark.timeout(120)
DEPLOYMENT = "job/dispatch-unit"
STORE = tempfile.mkdtemp(prefix="dispatch-unit-store-")  # where dispatch records kill criteria 5 and 6


@flow(name="job")
def job(config: dict, cell_ids: list[str]) -> dict:  # never executed here: the Executor plays it
    return {c: {"cell_id": c} for c in cell_ids}


def ids(*names: str) -> list[str]:
    """Cell ids whose source is the short name, so regime order (the order jobs are formed in) is name order."""
    return [f"{n}-A0B0C0D0E0-s1" for n in names]


def short(cell_id: str) -> str:
    return cell_id.split("-", 1)[0]


@pytest.fixture(scope="module", autouse=True)
def harness(prefect_harness):
    """The session's temporary server (tests/conftest.py: one start per session, not one per module); the
    Executor and dispatch only see runs of this module's deployment."""
    return anyio.run(make_deployment)


async def make_deployment():
    async with get_client() as client:
        flow_id = await client.create_flow_from_name("job")
        return await client.create_deployment(flow_id=flow_id, name="dispatch-unit", entrypoint="x.py:job")


def screen_config(name: str = "unit", **execution) -> ScreenConfig:
    ex = {"pool": "runpod-gpu", "max_parallel_cells": 3, "crash_resubmits": 2, "resubmit_backoff_s": 0.2,
          "gpu_hourly_usd": 2.0, **execution}
    return ScreenConfig(name=name, store=STORE, execution=ex)


async def _killed_then_failed(client, run_id, label: bool = True):
    """Issue 11's lost cell: the worker labels the run and writes Crashed, then the pod's dying process writes Failed."""
    if label:
        await client.update_flow_run_labels(run_id, {marks.KILLED_BY: f"{marks.WORKER}: bootstrap silence"})
    await client.set_flow_run_state(run_id, Crashed(message=marks.CRASH_PREFIX + "bootstrap silence"), force=True)
    await client.set_flow_run_state(run_id, Failed(message="ValueError: Task run is not set"))


async def _silent(client, run_id):
    """The worker killed the pod for bootstrap silence (kill criterion 6) and said so in a label."""
    outcome = gates.bootstrap_silence(31.0, False, 30.0)
    await client.update_flow_run_labels(run_id, {marks.KILLED_BY: marks.WORKER, marks.GATE6: outcome.model_dump_json()})
    await client.set_flow_run_state(run_id, Crashed(message=marks.CRASH_PREFIX + outcome.reason), force=True)


async def _refused(client, run_id):
    """The worker could not start the job for good: a rejected key."""
    line = ("RunPod refused the job for good (not retried): account main: RunPod rejected the API key of account "
            "'main' (HTTP 401)")
    await client.update_flow_run_labels(run_id, {marks.PERMANENT: line})
    await client.set_flow_run_state(run_id, Failed(message=line), force=True)


async def _wall(client, run_id):
    """The worker's own clock passed max_wall_hours (kill criterion 5): it killed the pod and said so."""
    outcome = gates.cost_overrun(24.5, 0.0, float("inf"), 24.0)
    await client.update_flow_run_labels(run_id, {marks.KILLED_BY: marks.WORKER, marks.GATE5: outcome.model_dump_json()})
    await client.set_flow_run_state(run_id, Crashed(message=marks.CRASH_PREFIX + outcome.reason), force=True)


async def _silent_but_completed(client, run_id):
    """The worker decided silence and labelled the run, but the flow started and completed before its Crashed write
    (seen in tests/integration/test_runpod_pool.py under 0.3 s API answers): Crashed is refused on a Completed run."""
    outcome = gates.bootstrap_silence(61.0, False, 60.0)
    await client.update_flow_run_labels(run_id, {marks.KILLED_BY: marks.WORKER, marks.GATE6: outcome.model_dump_json()})
    await client.set_flow_run_state(run_id, Completed())


WORKER_FATES = {"wall": _wall, "killed-then-failed": _killed_then_failed,
                "killed-then-failed-unlabelled": lambda c, r: _killed_then_failed(c, r, label=False),
                "silent": _silent, "silent-but-completed": _silent_but_completed, "refused": _refused}


class Executor:
    """Drives scheduled runs of the deployment; `script(cell_id, attempt)` picks each run's fate."""

    def __init__(self, deployment_id, script: Callable[[str, int], str], cost_usd: float = 0.0):
        self.deployment_id, self.script, self.cost_usd = deployment_id, script, cost_usd
        self.seen: list[tuple[str, int, str]] = []
        self.max_in_flight = 0
        self.hanging: set = set()
        self.jobs: list[list[str]] = []  # the cells of each run, in submission order

    async def loop(self):
        async with get_client() as client:
            while True:
                runs = await client.read_flow_runs(
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[self.deployment_id])),
                    flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
                        any_=[StateType.SCHEDULED, StateType.CANCELLING]))))
                for run in runs:
                    if run.state.type == StateType.CANCELLING:  # what the worker does: pod gone, run Cancelled
                        await client.set_flow_run_state(run.id, Cancelled(message="pod terminated"), force=True)
                        self.hanging.discard(run.id)
                        continue
                    cell_id, attempt = short(run.parameters["cell_ids"][0]), int(run.name.rsplit("-a", 1)[1])
                    fate = self.script(cell_id, attempt)
                    self.seen.append((cell_id, attempt, fate))
                    self.jobs.append([short(c) for c in run.parameters["cell_ids"]])
                    await client.set_flow_run_state(run.id, Pending())
                    await client.set_flow_run_state(run.id, Running())
                    if self.cost_usd:
                        await publish_pod_cost(client, run.id, PodCost.measure(
                            pod_id="p", account="a", gpu_type="g", cloud="SECURE", gpu_count=1,
                            usd_per_hour=self.cost_usd * 3600, started=0, ended=1, outcome=fate))
                    if fate == "hang":
                        self.hanging.add(run.id)
                        continue
                    if fate in WORKER_FATES:
                        await WORKER_FATES[fate](client, run.id)
                        continue
                    final = {"complete": Completed(), "crash": Crashed(message="pod vanished"),
                             "fail": Failed(message="ValueError in training"),
                             "fail-infra": Failed(message="Flow run infrastructure exited with non-zero status")}[fate]
                    await client.set_flow_run_state(run.id, final, force=True)
                self.max_in_flight = max(self.max_in_flight, len(self.hanging))
                await anyio.sleep(0.1)


async def end_leftovers(deployment_id) -> None:
    """Runs a test left unfinished (a dispatch that raised while the Executor had not picked some up) would be
    re-attached by the next test's dispatch of the same cells: end them."""
    with anyio.CancelScope(shield=True):
        async with get_client() as client:
            runs = await client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
                flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
                    any_=[StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.CANCELLING]))))
            for run in runs:
                await client.set_flow_run_state(run.id, Cancelled(message="left by an earlier test"), force=True)


LAST: list[Executor] = [None]  # type: ignore[list-item]  # the latest Executor, for tests whose dispatch raises


def dispatch(harness, script, cells, cost_usd=0.0, budget_usd=None, on_done=None, api_outage_s=API_OUTAGE_S,
             cost_wait_s=0.0, **execution):
    """One dispatch against the Executor. cost_wait_s=0: the end reads the pod costs once and waits no longer (the
    Executor publishes a run's cost before it ends it, or never)."""
    executor = LAST[0] = Executor(harness, script, cost_usd)

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(executor.loop)
            try:
                return await adispatch_cells(screen_config(**execution), cells, DEPLOYMENT, budget_usd,
                                             poll_s=0.2, key_prefix=f"k{time.time_ns()}", cancel_wait_s=10,
                                             on_done=on_done, api_outage_s=api_outage_s, cost_wait_s=cost_wait_s)
            finally:
                tg.cancel_scope.cancel()
                await end_leftovers(harness)

    try:
        return anyio.run(main), executor
    except BaseExceptionGroup as group:  # unwrap the task group's single error
        raise group.exceptions[0] from None


def test_all_complete_and_parallelism_is_bounded(harness):
    cells = ids(*(f"c{i}" for i in range(7)))
    reported: list[tuple[str, int]] = []  # (cell, how many cells the dispatcher had finished by then)
    out, ex = dispatch(harness, lambda c, a: "complete", cells, max_parallel_cells=2,
                       on_done=lambda c: reported.append((c, sum(1 for s in LAST[0].seen if s[2] == "complete"))))
    assert sorted(out) == cells and all(out[c]["cell_id"] == c for c in cells)
    assert len(ex.seen) == 7
    # one report per cell, as it completes: the screen's progress artifact moves per cell on GPU pools
    assert sorted(c for c, _ in reported) == cells
    assert [n for _, n in reported][0] < 7


def test_crashes_are_resubmitted_with_backoff_and_completed_cells_never_rerun(harness):
    crashes = {"c1": 1, "c2": 2}  # c1 crashes once, c2 twice, then both complete
    t0 = time.monotonic()
    out, ex = dispatch(harness, lambda c, a: "crash" if a < crashes.get(c, 0) else "complete",
                       ids("c0", "c1", "c2"), resubmit_backoff_s=0.5)
    assert sorted(out) == ids("c0", "c1", "c2")
    assert [s for s in ex.seen if s[0] == "c2"] == [("c2", 0, "crash"), ("c2", 1, "crash"), ("c2", 2, "complete")]
    assert sum(1 for c, _, f in ex.seen if f == "complete") == 3  # each cell completed exactly once
    # a lower bound set by dispatch's own backoff (0.5 s then 1.0 s for c2): a loaded box only lengthens it
    assert time.monotonic() - t0 >= 0.5 + 1.0


def test_resubmits_are_bounded_and_flow_failures_not_retried(harness):
    script = {"c0": "complete", "c1": "crash", "c2": "fail", "c3": "fail-infra"}
    with pytest.raises(CellsFailed) as err:
        dispatch(harness, lambda c, a: script[c] if a < 5 else "complete", ids(*script), crash_resubmits=1)
    assert set(err.value.failed) == set(ids("c1", "c2", "c3")) and list(err.value.summaries) == ids("c0")
    retried = sorted((c, a) for c, a, _ in LAST[0].seen if c in ("c1", "c3"))
    assert retried == [("c1", 0), ("c1", 1), ("c3", 0), ("c3", 1)]  # one resubmit each
    assert [a for c, a, _ in LAST[0].seen if c == "c2"] == [0]  # the flow's own failure: not retried
    assert err.value.failed[ids("c2")[0]].startswith("Failed: ValueError")


def test_spend_cap_counts_published_pod_costs(harness):
    # each finished run published a $1 pod cost; budget $2 x spend_factor 1.5 = $3 -> the 4th trips the cap
    with pytest.raises(CostOverrun) as err:
        dispatch(harness, lambda c, a: "complete", ids(*(f"c{i}" for i in range(6))), cost_usd=1.0, budget_usd=2.0,
                 max_parallel_cells=1, gpu_hourly_usd=0.0, name="unit-cap")
    exc = err.value
    assert exc.outcome == "CostOverrun" and 3.0 < exc.spend_usd <= 4.0
    assert sorted(exc.summaries) == ids("c0", "c1", "c2", "c3")
    assert "Kill criterion 5" in str(exc)


def test_spend_cap_counts_what_the_screens_earlier_dispatches_spent(harness):
    # the budget is the whole screen's: a later phase (or a resumed run) starts from what the store says was spent
    dispatch(harness, lambda c, a: "complete", ids("e0", "e1"), cost_usd=1.0, max_parallel_cells=1,
             gpu_hourly_usd=0.0, name="unit-phases")
    with pytest.raises(CostOverrun) as err:  # $2 spent before; $3 cap -> the second run of this dispatch trips it
        dispatch(harness, lambda c, a: "complete", ids("f0", "f1", "f2"), cost_usd=1.0, budget_usd=2.0,
                 max_parallel_cells=1, gpu_hourly_usd=0.0, name="unit-phases")
    assert 3.0 < err.value.spend_usd <= 4.0 and sorted(err.value.summaries) == ids("f0", "f1")


def test_each_priced_run_is_recorded_in_the_store_once_split_among_its_cells(harness):
    # one $1 pod per run (the Executor publishes it as the worker would); three single-cell runs and one crash
    store = ResultStore(STORE, "unit")
    before = {r["flow_run_id"] for r in store.run_costs()}
    out, ex = dispatch(harness, lambda c, a: "crash" if (c, a) == ("k1", 0) else "complete", ids("k0", "k1", "k2"),
                       cost_usd=1.0, max_parallel_cells=3)
    new = [r for r in store.run_costs() if r["flow_run_id"] not in before]
    assert len(new) == len(ex.seen) == 4 and all(r["priced_from"] == "pod" for r in new)
    assert sorted((list(r["cells"]), r["state"]) for r in new) == sorted(
        [(ids("k0"), "Completed"), (ids("k1"), "Crashed"), (ids("k1"), "Completed"), (ids("k2"), "Completed")])
    assert all(r["usd"] == pytest.approx(1.0) and r["gpu_seconds"] == pytest.approx(1.0) for r in new)


def test_spend_cap_cancels_in_flight_runs(harness):
    # runs in flight are priced at gpu_hourly_usd ($1/s here): 4 hanging runs pass $3 within a second
    before = {r["flow_run_id"] for r in ResultStore(STORE, "unit-hang").run_costs()}
    with pytest.raises(CostOverrun) as err:
        dispatch(harness, lambda c, a: "hang", ids(*(f"c{i}" for i in range(6))), budget_usd=2.0,
                 max_parallel_cells=4, gpu_hourly_usd=3600.0, name="unit-hang")
    exc = err.value
    assert exc.spend_usd > 3.0 and exc.cancelled == ids("c0", "c1", "c2", "c3") and exc.summaries == {}
    # what the cancelled runs cost so far is recorded too, as estimates the next dispatch re-prices from their pods
    stopped = [r for r in ResultStore(STORE, "unit-hang").run_costs() if r["flow_run_id"] not in before]
    assert sorted(c for r in stopped for c in r["cells"]) == exc.cancelled
    assert all(r["priced_from"] == "estimate" and r["usd"] > 0 for r in stopped)


def test_job_over_max_hours_stops_dispatch(harness):
    cfg_gates = {"max_job_hours": 2 / 3600}

    def run():
        executor = Executor(harness, lambda c, a: "hang")

        async def main():
            async with anyio.create_task_group() as tg:
                tg.start_soon(executor.loop)
                try:
                    config = ScreenConfig(name="unit-long", store=STORE, gates=cfg_gates,
                                          execution={"pool": "runpod-gpu", "max_parallel_cells": 2})
                    return await adispatch_cells(config, ids("a", "b", "c"), DEPLOYMENT, None, poll_s=0.2,
                                                 key_prefix=f"k{time.time_ns()}", cancel_wait_s=10)
                finally:
                    tg.cancel_scope.cancel()

        return anyio.run(main), executor

    with pytest.raises(BaseException) as err:
        run()
    exc = err.value.exceptions[0] if isinstance(err.value, BaseExceptionGroup) else err.value
    assert isinstance(exc, CostOverrun) and "max_job_hours" in str(exc) and sorted(exc.cancelled) == ids("a", "b")
    # kill criterion 5, decided by gates.cost_overrun, is a recorded gate event that the aggregation reads
    recorded = {g.number: g for g in collect_gates({"gates": ResultStore(STORE, "unit-long").gates()})}
    assert recorded[5].fired and recorded[5].numbers["job_too_long"] and recorded[5].numbers["longest_job_hours"] > 2 / 3600
    assert recorded[5].numbers["cancelled"] == 2 and "cancelled 2 cell(s)" in recorded[5].reason  # one record, after


def test_jobs_run_cells_in_a_row_and_a_crashed_job_is_resubmitted_whole(harness):
    cells = ids(*(f"c{i}" for i in range(7)))
    out, ex = dispatch(harness, lambda c, a: "crash" if c == "c3" and a == 0 else "complete", cells,
                       cells_per_job=3, max_parallel_cells=2)
    assert sorted(out) == cells
    # jobs of 3 (7 cells, 2 GPUs: 3 per job still keeps both busy), and the crashed job again with all its cells
    assert sorted(ex.jobs) == [["c0", "c1", "c2"], ["c3", "c4", "c5"], ["c3", "c4", "c5"], ["c6"]]
    assert [s for s in ex.seen if s[0] == "c3"] == [("c3", 0, "crash"), ("c3", 1, "complete")]


def http_error(status: int):
    import httpx

    request = httpx.Request("POST", "http://127.0.0.1/api/flow_runs/filter")
    return httpx.HTTPStatusError(f"Server error '{status}'", request=request,
                                 response=httpx.Response(status, request=request))


def fail_dispatch_reads(monkeypatch, failures: int | None, status: int = 500) -> list[int]:
    """Dispatch's reads of its runs fail with `status` (the first `failures` of them, or all); the Executor's,
    which filter by deployment, still work. Returns a list that grows by one per failed read."""
    from prefect.client.orchestration import PrefectClient

    real, failed = PrefectClient.read_flow_runs, []

    async def read_flow_runs(self, **kwargs):
        if "deployment_filter" not in kwargs and (failures is None or len(failed) < failures):
            failed.append(status)
            raise http_error(status)
        return await real(self, **kwargs)

    monkeypatch.setattr(PrefectClient, "read_flow_runs", read_flow_runs)
    return failed


def test_api_failures_are_waited_out_and_a_lost_submit_answer_does_not_double_a_run(harness, monkeypatch):
    # A SQLite server whose connections all wait on its lock answers 500 for a while: dispatch keeps polling.
    failed_reads = fail_dispatch_reads(monkeypatch, failures=4)
    real_submit, lost = dispatch_module._submit, []

    async def submit(client, config, job, *args):
        run_id = await real_submit(client, config, job, *args)
        if not lost:  # the run was created but the answer never arrived
            lost.append(run_id)
            raise http_error(503)
        return run_id

    monkeypatch.setattr(dispatch_module, "_submit", submit)
    cells = ids("c0", "c1", "c2")
    out, ex = dispatch(harness, lambda c, a: "complete", cells, max_parallel_cells=2)
    assert sorted(out) == cells and failed_reads == [500] * 4 and len(lost) == 1
    # the same idempotency key found the run created before the error: every cell ran exactly once
    assert sorted(c for c, _, _ in ex.seen) == ["c0", "c1", "c2"]


def test_an_api_down_longer_than_the_outage_stops_dispatch_with_what_to_do(harness, monkeypatch):
    failed = fail_dispatch_reads(monkeypatch, failures=None)
    t0 = time.monotonic()
    with pytest.raises(ApiUnavailable) as err:
        dispatch(harness, lambda c, a: "complete", ids("c0", "c1"), api_outage_s=1.0)
    # It waited the outage out (a lower bound: load only lengthens it), then stopped. One failed read per 0.2 s poll,
    # and a sleep never ends early: the k-th failure comes >= (k-1) x 0.2 s after the first, so the 7th is past the
    # 1.0 s at the latest. Giving up late would mean more reads, whatever the box's load.
    assert time.monotonic() - t0 > 1.0
    assert 2 <= len(failed) <= 7, failed
    assert "Prefect API failed every request" in str(err.value) and "run the screen again" in str(err.value)
    assert err.value.summaries == {}


def test_a_client_error_from_the_api_is_not_waited_out(harness, monkeypatch):
    import httpx

    fail_dispatch_reads(monkeypatch, failures=None, status=422)
    with pytest.raises(httpx.HTTPStatusError):
        dispatch(harness, lambda c, a: "complete", ids("c0"))


def test_job_size_keeps_every_gpu_busy_and_groups_regimes():
    from eps_screen.spec.design import all_slab_cells, group_jobs, regime_of

    config = ScreenConfig(name="unit")
    slab = [c.id for c in all_slab_cells(config) if c.source == "librarian"]
    assert len(slab) == 32
    jobs = group_jobs(config, slab, per_job=4, parallel=8)
    assert [len(j) for j in jobs] == [4] * 8 and sorted(c for j in jobs for c in j) == sorted(slab)
    # the two cells of a regime (they differ only in E) always share a job: its answers are generated once
    for job in jobs:
        regimes = [regime_of(config, Cell.parse(c)) for c in job]
        assert all(regimes.count(r) == 2 for r in regimes)
    assert [len(j) for j in group_jobs(config, slab[:10], per_job=8, parallel=8)] == [2] * 5  # never idle GPUs
    assert [len(j) for j in group_jobs(config, slab, per_job=1, parallel=8)] == [1] * 32


def test_importing_the_dispatch_room_has_no_side_effects(tmp_path):
    """No request, no server, no database at import: the API named is a closed port and PREFECT_HOME stays empty."""
    import os
    import subprocess

    home = tmp_path / "prefect-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_API_URL="http://127.0.0.1:9/api")
    code = "import flows.runtime.dispatch, flows.runtime.recovery, flows.runtime.ledger; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
    assert list(home.iterdir()) == []


@pytest.mark.parametrize("fate", ["killed-then-failed", "killed-then-failed-unlabelled"])
def test_a_run_the_infrastructure_killed_is_resubmitted_even_if_the_flow_wrote_failed_after(harness, fate):
    # the worker's Crashed, then the dying process's Failed: by the label, or by the Crashed state in the history
    out, ex = dispatch(harness, lambda c, a: fate if c == "c1" and a == 0 else "complete", ids("c0", "c1"))
    assert sorted(out) == ids("c0", "c1")
    assert [s for s in ex.seen if s[0] == "c1"] == [("c1", 0, fate), ("c1", 1, "complete")]


def test_a_permanent_infrastructure_failure_stops_dispatch_at_once_with_one_line(harness):
    with pytest.raises(InfrastructureRefused) as err:
        dispatch(harness, lambda c, a: "refused" if c == "c0" else "hang", ids("c0", "c1", "c2"), crash_resubmits=6)
    message = str(err.value)
    assert "account 'main'" in message and "HTTP 401" in message and "\n" not in message
    assert [s for s in LAST[0].seen if s[0] == "c0"] == [("c0", 0, "refused")]  # never resubmitted
    # at once: the jobs in flight (they hang forever) were cancelled, not waited for
    assert sorted(err.value.details["cancelled"]) == ids("c1", "c2")


def test_a_silent_pod_is_a_recorded_gate_event_and_a_quiet_dispatch_records_the_gates_not_fired(harness):
    store = ResultStore(STORE, "unit")
    store.save_phase("gates", {})
    dispatch(harness, lambda c, a: "complete", ids("c0"))
    quiet = {g.number: g for g in collect_gates({"gates": store.gates()})}
    assert not quiet[5].fired and not quiet[6].fired and "silent" in quiet[6].reason

    out, ex = dispatch(harness, lambda c, a: "silent" if a == 0 else "complete", ids("c0", "c1"))
    assert sorted(out) == ids("c0", "c1") and len(ex.seen) == 4  # both resubmitted once
    recorded = {g.number: g for g in collect_gates({"gates": store.gates()})}
    assert recorded[6].fired and len(recorded[6].numbers["events"]) == 2
    assert recorded[6].numbers["limit_s"] == 30.0 and "cell c" in recorded[6].reason
    assert not recorded[5].fired


def test_a_flow_that_completed_while_the_worker_killed_it_is_done_and_no_gate_event(harness):
    store = ResultStore(STORE, "unit")
    store.save_phase("gates", {})
    out, ex = dispatch(harness, lambda c, a: "silent-but-completed" if c == "c0" else "complete", ids("c0", "c1"))
    assert sorted(out) == ids("c0", "c1") and len(ex.seen) == 2  # done once, not resubmitted
    recorded = {g.number: g for g in collect_gates({"gates": store.gates()})}
    assert not recorded[6].fired and "events" not in recorded[6].numbers


def test_a_job_the_worker_killed_past_max_wall_hours_stops_dispatch_and_is_recorded(harness):
    store = ResultStore(STORE, "unit")
    with pytest.raises(CostOverrun) as err:
        dispatch(harness, lambda c, a: "wall" if c == "c0" else "hang", ids("c0", "c1"))
    assert "longest job in flight 24.50 h (limit 24 h)" in str(err.value) and err.value.cancelled == ids("c1")
    assert [s for s in LAST[0].seen if s[0] == "c0"] == [("c0", 0, "wall")]  # not resubmitted
    recorded = {g.number: g for g in collect_gates({"gates": store.gates()})}
    assert recorded[5].fired and recorded[5].numbers["job_too_long"]


def left_by_a_dead_dispatcher(harness, cells: list[list[str]], **execution) -> list:
    """Runs submitted as a dispatcher that died would have left them: Scheduled, under its own key prefix."""
    config = screen_config(**execution)

    async def submit():
        async with get_client() as client:
            return [await dispatch_module._submit(client, config, Job(tuple(job)), DEPLOYMENT, f"dead{time.time_ns()}",
                                                  None) for job in cells]

    return anyio.run(submit)


def test_a_dispatch_re_attaches_to_the_runs_a_dead_dispatcher_left_instead_of_submitting_again(harness):
    # the dead dispatcher had grouped c0+c1 in one job and c2 in another; c3 it never submitted
    left = left_by_a_dead_dispatcher(harness, [ids("c0", "c1"), ids("c2")], cells_per_job=2)
    out, ex = dispatch(harness, lambda c, a: "complete", ids("c0", "c1", "c2", "c3"), cells_per_job=2)
    assert sorted(out) == ids("c0", "c1", "c2", "c3")
    # each cell ran once: the two runs left behind, and one new run for c3 only
    assert sorted(ex.jobs) == [["c0", "c1"], ["c2"], ["c3"]]
    assert out[ids("c0")[0]]["cell_id"] == ids("c0")[0]

    async def states():
        async with get_client() as client:
            return [(await client.read_flow_run(run_id)).state.name for run_id in left]

    assert anyio.run(states) == ["Completed", "Completed"]


def test_a_re_attached_run_that_crashes_is_resubmitted_for_the_cells_this_dispatch_wants(harness):
    left_by_a_dead_dispatcher(harness, [ids("c0", "c1")], cells_per_job=2)
    # this dispatch wants c1 only (c0 is another phase's); the run it re-attached to crashes
    out, ex = dispatch(harness, lambda c, a: "crash" if a == 0 else "complete", ids("c1"), cells_per_job=2)
    assert sorted(out) == ids("c1")
    assert ex.jobs == [["c0", "c1"], ["c1"]] and [s[1:] for s in ex.seen] == [(0, "crash"), (1, "complete")]


def test_runs_of_another_config_are_not_re_attached(harness):
    left_by_a_dead_dispatcher(harness, [ids("c0")], max_parallel_cells=5)  # another config: another fingerprint
    out, ex = dispatch(harness, lambda c, a: "complete", ids("c0"))
    assert sorted(out) == ids("c0") and ex.jobs == [["c0"], ["c0"]]  # the executor ran both: not attached


def test_a_completed_run_is_taken_only_for_cells_the_store_has_finished(harness, tmp_path):
    """The screen read the store, a run completed, then dispatch looked: that run is taken, not rented again. A cell
    the store no longer has (deleted to compute it again) is computed again, whatever its old run says."""
    config = screen_config()
    finished, deleted = Cell.parse(ids("c0")[0]), Cell.parse(ids("c1")[0])
    store = ResultStore.for_config(config)
    store.cell_dir(config, finished).mkdir(parents=True, exist_ok=True)
    pl.DataFrame({"marker": [True]}).write_parquet(store.cell_dir(config, finished) / "answers.parquet")
    (store.cell_dir(config, finished) / "metrics.json").write_text("{}")  # finished: both files read
    try:
        dispatch(harness, lambda c, a: "complete", ids("c0", "c1"))  # both complete (the earlier dispatch)
        out, ex = dispatch(harness, lambda c, a: "complete", ids("c0", "c1"))
        assert sorted(out) == ids("c0", "c1") and ex.jobs == [["c1"]]
        assert not store.is_finished(config, deleted)
    finally:
        (store.cell_dir(config, finished) / "metrics.json").unlink()
        (store.cell_dir(config, finished) / "answers.parquet").unlink()
