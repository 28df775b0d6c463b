"""The Prefect worker of type `runpod`: one RunPod pod per flow run, watched until the run ends.

    prefect work-pool create gpu --type runpod
    prefect worker start --pool gpu --type runpod

`run()` rents a pod (provision.py: fallback over GPU types, clouds and accounts), reports its id as the
run's infrastructure pid, then checks the pod and the flow run every `poll_interval_s` (<= 15 s):

- the flow run reached a final state            -> done (its own state stands);
- the flow run is Cancelling                    -> terminate, mark Cancelled;
- the pod is gone from the account's inventory  -> Crashed "pod vanished";
- the container exited, run not final in grace  -> Crashed "container exited";
- pod RUNNING but the flow run not yet Running after `bootstrap_timeout_s` -> Crashed (kill criterion 6).
  "Progress" means the engine inside the pod moved the flow run to Running: that proves the image
  started, the code loaded and the pod reaches the Prefect API. Later silence is not judged here;
- pod not RUNNING within `start_timeout_s`; pod older than `max_wall_hours` -> Crashed.

Before acting on a kill decision the worker reads the flow run again (the read at the top of the poll may
be stale after slow RunPod calls: a run that has just started is not "silent"). A kill is then recorded
before the pod is touched: the label `eps-screen.killed-by` (marks.py) and a Crashed state whose message
names the infrastructure; then the pod is terminated, and a run that the dying process moved on (Running,
Failed) is set Crashed again. Dispatch reads the label and the state history, so a late write from the pod
cannot turn an infrastructure kill into a flow failure. Kill criterion 6 is decided by
`kills.bootstrap_silence` (the rule of `eps_screen.analysis.gates`, in its wire format); when it fires, its outcome
travels as the label `eps-screen.gate6` and dispatch records it in the store. A job that can never start (a
missing or rejected key, an unknown GPU type, a refused image: provision.ProvisioningFailed.permanent) ends
Failed at once with one line and the label `eps-screen.permanent-failure`, no traceback; dispatch then stops
the screen.
The pod's cost is published once, as an artifact keyed by the pod (cost.py). A
background reaper terminates pods named `<prefix>-<flow run id>` whose runs are finished or unknown, and
adopts (watches) pods of live runs that no worker watches, e.g. after this worker restarted. Stopping the
worker leaves live pods alone.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import anyio
import anyio.abc
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.exceptions import InfrastructureNotFound, ObjectNotFound
from prefect.states import Crashed
from prefect.workers.base import BaseWorker, BaseWorkerResult

from eps_screen_runpod import kills, marks
from eps_screen_runpod.api import BadApiKey, RunPodApi, RunPodApiError
from eps_screen_runpod.cost import PodCost, publish_pod_cost
from eps_screen_runpod.job import RunPodAccount, RunPodJobConfiguration, RunPodVariables, resolve_api_key
from eps_screen_runpod.provision import ProvisionedPod, ProvisioningFailed, provision

_EXITED = {"EXITED", "TERMINATED", "DEAD"}
# Returned when the worker ended the run as Crashed itself: any non-zero code makes the base worker propose
# Crashed too (refused: the run is already terminal); -1 maps to Prefect's generic "check the logs" hint,
# not to 1's misleading "unhandled exception in the flow".
CRASHED_BY_WORKER = -1
API_READ_TIMEOUT_S = 5.0
_NOT_STARTED = {StateType.SCHEDULED, StateType.PENDING}
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


class RunPodWorkerResult(BaseWorkerResult):
    """What became of one flow run's pod."""


@dataclass
class Outcome:
    kind: str  # "final" | "crash" | "cancel"
    message: str
    flow_run: FlowRun | None = None
    gate: kills.KillOutcome | None = None  # the kill criterion that decided a crash, when one did
    pod_gone: bool = False  # the pod vanished: no process of it can write to the run any more


class RunPodWorker(BaseWorker[RunPodJobConfiguration, RunPodVariables, RunPodWorkerResult]):
    """Runs each flow run on its own RunPod GPU pod and never leaves a pod that no run owns."""

    type = "runpod"
    job_configuration = RunPodJobConfiguration
    job_configuration_variables = RunPodVariables
    _description = "Run flows on RunPod GPU pods, with GPU/cloud/account fallback, pod watching and orphan reaping."
    _display_name = "RunPod"
    _documentation_url = "https://docs.runpod.io/pods/overview"
    _logo_url = "https://avatars.githubusercontent.com/u/95939477"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watching: set[UUID] = set()
        self._accounts_seen: dict[str, RunPodAccount] = {}
        self._prefixes_seen: set[str] = set()
        self._costed: set[str] = set()  # pods whose cost this worker published: a pod is costed once
        self._reaper_warned: dict[str, str] = {}  # account -> the listing error last warned about (warn once)

    # -- lifecycle ---------------------------------------------------------------------------------
    async def setup(self) -> None:
        await super().setup()
        assert self._runs_task_group is not None
        scope = anyio.CancelScope()
        self._scheduled_task_scopes.add(scope)  # the base teardown cancels these
        self._runs_task_group.start_soon(self._reap_loop, scope)

    async def run(
        self,
        flow_run: FlowRun,
        configuration: RunPodJobConfiguration,
        task_status: anyio.abc.TaskStatus[str] | None = None,
    ) -> RunPodWorkerResult:
        logger = self.get_flow_run_logger(flow_run)
        if not configuration.image:
            raise ValueError("job variable 'image' is not set: name the GPU image in the pool or the deployment")
        self._remember(configuration)
        self._watching.add(flow_run.id)
        try:
            apis = [await self._api_or_reason(a) for a in configuration.accounts]
            try:
                pod = await provision(configuration, apis, logger)
            except ProvisioningFailed as exc:
                if not exc.permanent:
                    raise
                return await self._fail_for_good(flow_run, exc, logger, task_status)
            if task_status is not None:
                task_status.started(pod.infrastructure_pid)
            return await self._own(flow_run, configuration, pod, logger)
        finally:
            self._watching.discard(flow_run.id)

    async def kill_infrastructure(
        self, infrastructure_pid: str, configuration: RunPodJobConfiguration, grace_seconds: int = 30
    ) -> None:
        account_name, _, pod_id = infrastructure_pid.rpartition(":")
        account = next((a for a in configuration.accounts if a.name == account_name), None)
        if account is None or not pod_id:
            raise InfrastructureNotFound(f"no account {account_name!r} in this job configuration")
        api = RunPodApi(await resolve_api_key(account), account.name)
        if not await anyio.to_thread.run_sync(api.terminate_pod, pod_id):
            raise InfrastructureNotFound(f"pod {pod_id} does not exist")
        self._logger.info("Terminated pod %s (account %s) on cancellation", pod_id, account_name)

    # -- owning one pod ----------------------------------------------------------------------------
    async def _own(self, flow_run: FlowRun, cfg: RunPodJobConfiguration, pod: ProvisionedPod, logger: Any,
                   running_since: float | None = None) -> RunPodWorkerResult:
        try:
            outcome = await self._watch(flow_run, cfg, pod, logger, running_since)
        except anyio.get_cancelled_exc_class():
            logger.warning("Worker stopping: pod %s keeps running; a restarted worker adopts or reaps it", pod.pod_id)
            raise
        except Exception as exc:  # a bug or a dead Prefect API: never keep paying for the pod
            outcome = Outcome("crash", f"RunPod worker lost track of pod {pod.pod_id}: {type(exc).__name__}: {exc}")
        with anyio.CancelScope(shield=True):
            if outcome.pod_gone:
                # Nothing left to race: clean up at once; recording the kill may wait on a slow Prefect API.
                await self._terminate(pod, logger, outcome, flow_run.id)
            killed = outcome.kind == "crash" and await self._record_kill(flow_run, outcome, logger)  # before the pod
            if not outcome.pod_gone:
                await self._terminate(pod, logger, outcome, flow_run.id)
            if outcome.kind == "crash":
                if killed:
                    await self._crash_again_if_moved(flow_run, outcome, logger)
                return RunPodWorkerResult(identifier=pod.infrastructure_pid, status_code=CRASHED_BY_WORKER)
            if outcome.kind == "cancel" and outcome.flow_run is not None:
                await self._mark_flow_run_as_cancelled(outcome.flow_run, {"message": outcome.message})
        return RunPodWorkerResult(identifier=pod.infrastructure_pid, status_code=0)

    async def _watch(self, flow_run: FlowRun, cfg: RunPodJobConfiguration, pod: ProvisionedPod, logger: Any,
                     running_since: float | None) -> Outcome:
        created = time.monotonic()
        started = False  # the flow run has been seen Running: bootstrap is over for good (retries may reschedule)
        exited_since: float | None = None
        quiet_errors = 0
        interval = min(cfg.poll_interval_s, 15.0)
        await anyio.sleep(min(interval, 1.0))
        while True:
            now = time.monotonic()
            current = await self._read_flow_run(flow_run.id, logger)
            state = current.state if current else None
            if state is not None and state.is_final():
                return Outcome("final", f"flow run ended {state.name}")
            if state is not None and state.type == StateType.CANCELLING:
                return Outcome("cancel", f"Cancelled: pod {pod.pod_id} terminated by the RunPod worker", current)
            started = started or (state is not None and state.type not in _NOT_STARTED)
            try:
                info = await anyio.to_thread.run_sync(pod.api.get_pod, pod.pod_id)
                if info is None and not await self._in_inventory(pod):
                    return Outcome("crash", f"RunPod pod {pod.pod_id} ({pod.gpu_type}, {pod.cloud}) vanished from"
                                            f" the inventory of account {pod.account}", pod_gone=True)
                quiet_errors = 0
            except RunPodApiError as exc:
                info = None
                quiet_errors += 1
                if quiet_errors in (1, 10) or quiet_errors % 60 == 0:
                    logger.warning("Cannot read pod %s (%s); still watching", pod.pod_id, exc)
            if info is not None:
                status = str(info.get("desiredStatus") or "")
                if info.get("costPerHr"):
                    pod.usd_per_hour = float(info["costPerHr"])
                if status == "RUNNING" and info.get("runtime") and running_since is None:
                    running_since = now
                    logger.info("Pod %s RUNNING after %.0f s", pod.pod_id, now - created)
                if status in _EXITED:
                    exited_since = exited_since or now
                    if now - exited_since >= cfg.exit_grace_s:
                        return Outcome("crash", f"RunPod pod {pod.pod_id} container {status.lower()} but the flow run"
                                                f" is still {state.name if state else 'unknown'}")
            if running_since is None and now - created > cfg.start_timeout_s:
                return Outcome("crash", f"RunPod pod {pod.pod_id} did not reach RUNNING in {cfg.start_timeout_s:.0f} s")
            silence = (kills.bootstrap_silence(now - running_since, started, cfg.bootstrap_timeout_s)
                       if running_since is not None and state is not None else None)
            if silence is not None and silence.fired:
                # The read above came before the RunPod calls: the engine may have started the run since.
                fresh = await self._read_flow_run(flow_run.id, logger)
                if fresh is None or fresh.state is None or fresh.state.type not in _NOT_STARTED:
                    started = fresh is not None and fresh.state is not None
                    await anyio.sleep(interval)
                    continue
                return Outcome("crash", f"Bootstrap silence (kill criterion 6): pod {pod.pod_id} RUNNING for"
                                        f" {now - running_since:.0f} s but the flow run never started"
                                        f" ({silence.reason})", gate=silence)
            wall = kills.wall_time((now - created) / 3600, cfg.max_wall_hours)
            if wall.fired:  # the pod's own clock; dispatch's (from the run leaving Scheduled) usually fires first
                return Outcome("crash", f"RunPod pod {pod.pod_id} exceeded max_wall_hours={cfg.max_wall_hours:g}"
                                        " (kill criterion 5)", gate=wall)
            await anyio.sleep(interval)

    async def _record_kill(self, flow_run: FlowRun, outcome: Outcome, logger: Any) -> bool:
        """Label the run as killed by the infrastructure and set it Crashed, before its pod is terminated: a write
        from the dying process then lands on a run dispatch already knows to resubmit. False when the run ended by
        itself meanwhile: its own state stands (the pod goes anyway)."""
        current = await self._read_flow_run(flow_run.id, logger)
        if current is not None and current.state is not None and current.state.is_final():
            return False
        labels: dict[str, Any] = {marks.KILLED_BY: f"{marks.WORKER}: {outcome.message[:150]}"}
        if outcome.gate is not None:
            labels[marks.GATE6 if outcome.gate.number == 6 else marks.GATE5] = outcome.gate.to_json()
        await self._label(flow_run.id, labels, logger)
        outcome.message = marks.CRASH_PREFIX + outcome.message
        await self._propose_crashed_state(flow_run, outcome.message)
        return True

    async def _crash_again_if_moved(self, flow_run: FlowRun, outcome: Outcome, logger: Any) -> None:
        """After the pod is gone: a run its dying process moved off Crashed (Running, or Failed by the flow) is
        set Crashed again, so its last state says what happened."""
        current = await self._read_flow_run(flow_run.id, logger)
        state = current.state if current is not None else None
        if state is None or state.is_crashed() or state.is_completed() or state.is_cancelled():
            return
        try:
            await self.client.set_flow_run_state(flow_run.id, Crashed(message=outcome.message), force=True)
            logger.warning("Flow run %s moved to %s after its pod was killed; set Crashed again", flow_run.id,
                           state.name)
        except Exception as exc:
            logger.warning("Could not set flow run %s Crashed again (%s)", flow_run.id, type(exc).__name__)

    async def _label(self, flow_run_id: UUID, labels: dict[str, Any], logger: Any) -> None:
        try:
            with anyio.fail_after(30):
                await self.client.update_flow_run_labels(flow_run_id, labels)
        except Exception as exc:  # the state and its message still say it; dispatch also reads the history
            logger.warning("Could not label flow run %s (%s)", flow_run_id, type(exc).__name__)

    async def _fail_for_good(self, flow_run: FlowRun, exc: ProvisioningFailed, logger: Any,
                             task_status: anyio.abc.TaskStatus[str] | None) -> RunPodWorkerResult:
        """A job no retry can start: one error line, the run Failed with that line, no traceback, no pod."""
        from prefect.states import Failed

        line = exc.line()
        logger.error("%s", line)
        await self._label(flow_run.id, {marks.PERMANENT: line[:500]}, logger)
        try:
            await self.client.set_flow_run_state(flow_run.id, Failed(message=line), force=True)
        except Exception as err:
            logger.warning("Could not set flow run %s Failed (%s)", flow_run.id, type(err).__name__)
        if task_status is not None:
            task_status.started(exc)  # type: ignore[arg-type]  # no pod: the base worker records no pid
        return RunPodWorkerResult(identifier="", status_code=CRASHED_BY_WORKER)

    async def _in_inventory(self, pod: ProvisionedPod) -> bool:
        """A second opinion before calling a pod vanished: is it in the account's pod list?"""
        pods = await anyio.to_thread.run_sync(pod.api.list_pods)
        return any(p.get("id") == pod.pod_id for p in pods)

    async def _read_flow_run(self, flow_run_id: UUID, logger: Any) -> FlowRun | None:
        """The run, or None when the Prefect API fails or is slow: the pod is checked either way. A SQLite-backed
        server can hold a read for its whole lock timeout (60 s); measured in CI, that delayed a vanished pod's
        detection by 59 s when the pod check waited for it."""
        try:
            with anyio.fail_after(API_READ_TIMEOUT_S):
                return await self.client.read_flow_run(flow_run_id)
        except ObjectNotFound:
            raise
        except TimeoutError:
            logger.warning("No answer about flow run %s from the Prefect API in %.0f s; checking its pod anyway",
                           flow_run_id, API_READ_TIMEOUT_S)
            return None
        except Exception as exc:
            logger.warning("Cannot read flow run %s (%s); still watching", flow_run_id, type(exc).__name__)
            return None

    async def _terminate(self, pod: ProvisionedPod, logger: Any, outcome: Outcome, flow_run_id: UUID) -> None:
        ended = time.time()
        try:
            gone = not await anyio.to_thread.run_sync(pod.api.terminate_pod, pod.pod_id)
            logger.info("Pod %s %s (%s)", pod.pod_id, "already gone" if gone else "terminated", outcome.message)
        except RunPodApiError as exc:
            logger.error("Could not terminate pod %s (%s); the reaper will retry", pod.pod_id, exc)
        if pod.pod_id in self._costed:  # the reaper adopted a pod this worker already let go of
            return
        self._costed.add(pod.pod_id)
        cost = PodCost.measure(pod_id=pod.pod_id, account=pod.account, gpu_type=pod.gpu_type, cloud=pod.cloud,
                               gpu_count=pod.gpu_count, usd_per_hour=pod.usd_per_hour, started=pod.created_at,
                               ended=ended, outcome=outcome.message[:200])
        try:
            await publish_pod_cost(self.client, flow_run_id, cost)
        except Exception as exc:
            self._costed.discard(pod.pod_id)
            logger.warning("Could not publish the cost of pod %s (%s)", pod.pod_id, type(exc).__name__)

    # -- accounts ----------------------------------------------------------------------------------
    def _remember(self, cfg: RunPodJobConfiguration) -> None:
        self._prefixes_seen.add(cfg.name_prefix)
        for account in cfg.accounts:
            self._accounts_seen.setdefault(account.name, account)

    async def _api_or_reason(self, account: RunPodAccount) -> RunPodApi | tuple[str, str]:
        try:
            return RunPodApi(await resolve_api_key(account), account.name)
        except ValueError as exc:
            return (account.name, str(exc))

    # -- reaper ------------------------------------------------------------------------------------
    async def _reap_loop(self, scope: anyio.CancelScope) -> None:
        with scope:
            while True:
                interval = 120.0
                try:
                    interval = await self.reap_once()
                except Exception as exc:
                    self._logger.warning("Reaper pass failed (%s: %s)", type(exc).__name__, exc)
                await anyio.sleep(interval)

    async def reap_once(self) -> float:
        """Terminate orphaned pods, adopt unwatched live ones; returns the pool's reap interval."""
        defaults = await self.job_configuration.from_template_and_values(
            self.work_pool.base_job_template, {}, client=self.client
        )
        self._remember(defaults)
        for account in list(self._accounts_seen.values()):
            api = await self._api_or_reason(account)
            if isinstance(api, tuple):
                self._logger.debug("Reaper skips account %s: %s", *api)
                continue
            try:
                pods = await anyio.to_thread.run_sync(api.list_pods)
            except RunPodApiError as exc:
                # Once per account and cause, not every pass: a rejected key stays rejected until someone acts.
                log = self._logger.debug if self._reaper_warned.get(account.name) == str(exc) else (
                    self._logger.error if isinstance(exc, BadApiKey) else self._logger.warning)
                self._reaper_warned[account.name] = str(exc)
                log("Reaper cannot list pods of account %s (%s)", account.name, exc)
                continue
            self._reaper_warned.pop(account.name, None)
            for info in pods:
                await self._reap_pod(api, info)
        return defaults.reap_interval_s

    async def _reap_pod(self, api: RunPodApi, info: dict[str, Any]) -> None:
        flow_run_id = _flow_run_id_from_name(str(info.get("name") or ""), self._prefixes_seen)
        if flow_run_id is None or flow_run_id in self._watching:
            return
        pod_id = str(info.get("id"))
        try:
            flow_run = await self.client.read_flow_run(flow_run_id)
        except ObjectNotFound:
            flow_run = None
        if flow_run is None or flow_run.state is None or flow_run.state.is_final():
            why = "is unknown" if flow_run is None else f"is {flow_run.state.name if flow_run.state else 'stateless'}"
            await anyio.to_thread.run_sync(api.terminate_pod, pod_id)
            self._logger.info("Reaper terminated pod %s: its flow run %s %s", pod_id, flow_run_id, why)
            return
        if flow_run.work_pool_name != self._work_pool_name:
            return  # a live run of another pool: its own worker owns it
        owner = (flow_run.labels or {}).get("prefect.worker.name")
        if owner and owner != self.name and owner in await self._online_workers():
            return  # its worker is alive and watching it
        await self._adopt(flow_run, api, info)

    async def _online_workers(self) -> set[str]:
        from prefect.client.schemas.objects import WorkerStatus

        workers = await self.client.read_workers_for_work_pool(self._work_pool_name)
        return {w.name for w in workers if w.status == WorkerStatus.ONLINE}

    async def _adopt(self, flow_run: FlowRun, api: RunPodApi, info: dict[str, Any]) -> None:
        cfg = await self.job_configuration.resolve_for_flow_run(
            flow_run, client=self.client, work_pool=self.work_pool, worker_name=self.name, worker_id=self.backend_id
        )
        uptime = float(info.get("uptimeSeconds") or 0)
        pod = ProvisionedPod(str(info["id"]), api, str((info.get("machine") or {}).get("gpuDisplayName") or "?"),
                             "?", int(info.get("gpuCount") or cfg.gpu_count), float(info.get("costPerHr") or 0),
                             created_at=time.time() - uptime, name=str(info.get("name")))
        self._watching.add(flow_run.id)
        logger = self.get_flow_run_logger(flow_run)
        logger.info("Adopted pod %s of live flow run %s (no worker was watching it)", pod.pod_id, flow_run.id)

        async def watch() -> None:
            try:
                await self._own(flow_run, cfg, pod, logger, running_since=time.monotonic() if uptime else None)
            finally:
                self._watching.discard(flow_run.id)

        assert self._runs_task_group is not None
        self._runs_task_group.start_soon(watch)


def _flow_run_id_from_name(name: str, prefixes: set[str] | None = None) -> UUID | None:
    match = re.fullmatch(rf"([a-z0-9-]+?)-({_UUID})", name)
    if not match or (prefixes is not None and match.group(1) not in prefixes):
        return None
    return UUID(match.group(2))
