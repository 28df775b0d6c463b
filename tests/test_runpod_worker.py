"""RunPodWorker.run against a temporary Prefect server and the fake RunPod API: one test per fault.

The fake pods run tests/fakes/flow_run_script.py, which plays the flow-run engine (Running -> Completed,
hangs, exits early, ...) so each watch rule is exercised in a few seconds.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import anyio
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eps_screen_runpod import RunPodJobConfiguration, RunPodWorker  # noqa: E402
from eps_screen_runpod.cost import read_pod_costs  # noqa: E402
from eps_screen_runpod.provision import ProvisioningFailed, docker_args_for, provision  # noqa: E402
from prefect import flow  # noqa: E402
from prefect.client.orchestration import get_client  # noqa: E402
from prefect.client.schemas.filters import (  # noqa: E402
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    DeploymentFilter,
    DeploymentFilterId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.logging.handlers import APILogHandler  # noqa: E402
from prefect.settings import PREFECT_API_KEY, temporary_settings  # noqa: E402
from prefect.states import Cancelling, Completed, Pending  # noqa: E402
from prefect.workers.base import BaseWorker  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from tests.fakes.fixtures import OTHER_KEY, TEST_KEY, fake_runpod_fixture  # noqa: E402,F401
from tests.fakes.runpod_api import FakeRunPod  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
SCRIPT = ROOT / "tests" / "fakes" / "flow_run_script.py"
POOL = "runpod-unit"
PREFECT_KEY = "pnu_PREFECTKEY_abcdefghijklmnopqrstuvwxyz0123"
GPUS = ["NVIDIA H100 80GB HBM3", "NVIDIA A100 80GB PCIe"]


@flow(name="runpod-unit-flow")
def unit_flow() -> None:
    pass


@pytest.fixture(scope="module", autouse=True)
def harness(prefect_harness):
    """The session's temporary server (tests/conftest.py), with this module's work pool. The pool and its
    deployments go at the end: a later file on the same pytest worker (test_doctor) reads `job/job-runpod`, and
    met this module's `lab` account in it (CI of aae52b6)."""
    anyio.run(create_pool)
    yield
    from tests.conftest import drop_pools

    with get_client(sync_client=True) as client:
        drop_pools(client, names=(POOL,))


async def create_pool() -> None:
    from prefect.client.schemas.actions import WorkPoolCreate

    # A pod the reaper adopts is watched with the pool's defaults: at the default 10 s poll the reaper test waited up
    # to 10 s for a run that had already completed (CI: 11.8 s for that test). run_one's runs set their own 0.5 s.
    template = RunPodWorker.get_default_base_job_template()
    template["variables"]["properties"]["poll_interval_s"]["default"] = 0.5
    async with get_client() as client:
        await client.create_work_pool(WorkPoolCreate(name=POOL, type="runpod", base_job_template=template))


@pytest.fixture
def fake(fake_runpod: FakeRunPod, monkeypatch, tmp_path) -> FakeRunPod:
    monkeypatch.setenv("RUNPOD_API_KEY", TEST_KEY)
    monkeypatch.setenv("SPARE_RUNPOD_KEY", OTHER_KEY)
    fake_runpod.workdir = str(ROOT)
    fake_runpod.image_env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "PREFECT_HOME": str(tmp_path / "pod-prefect-home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    return fake_runpod


def config(flow_run, mode: str = "complete", seconds: float = 0.5, **overrides: Any) -> RunPodJobConfiguration:
    values: dict[str, Any] = dict(
        image="eps-screen:test", gpu_types=GPUS, poll_interval_s=0.5, bootstrap_timeout_s=30, exit_grace_s=1,
        accounts=[{"name": "main", "api_key_env": "RUNPOD_API_KEY"}],
        command=f"python {SCRIPT} {mode} {seconds}",
    )
    values.update(overrides)
    cfg = RunPodJobConfiguration(**values)
    cfg.prepare_for_flow_run(flow_run)
    return cfg


class Started:
    def __init__(self) -> None:
        self.value: str | None = None

    def started(self, value: str) -> None:
        self.value = value


async def new_flow_run():
    async with get_client() as client:
        return await client.create_flow_run(unit_flow, state=Pending(), work_pool_name=POOL)


async def final_state(flow_run_id):
    async with get_client() as client:
        return (await client.read_flow_run(flow_run_id)).state


def run_one(mode: str = "complete", seconds: float = 0.5, during=None, **overrides: Any):
    """Create a flow run, let the worker run it; returns (flow_run, result, final state, started pid)."""

    async def main():
        flow_run = await new_flow_run()
        cfg = config(flow_run, mode, seconds, **overrides)
        started = Started()
        async with RunPodWorker(work_pool_name=POOL) as worker:
            if during is None:
                result = await worker.run(flow_run, cfg, task_status=started)
            else:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(during, flow_run, started)
                    result = await worker.run(flow_run, cfg, task_status=started)
                    tg.cancel_scope.cancel()
        return flow_run, result, await final_state(flow_run.id), started.value

    return anyio.run(main)


def test_worker_type_is_registered_with_described_fields():
    assert BaseWorker.get_worker_class_from_type("runpod") is RunPodWorker
    props = RunPodWorker.get_default_base_job_template()["variables"]["properties"]
    for name in ("gpu_types", "gpu_count", "cloud_types", "accounts", "image", "container_disk_gb", "volume_gb",
                 "network_volume_id", "env", "max_wall_hours", "max_hourly_price", "poll_interval_s",
                 "bootstrap_timeout_s"):
        assert props[name].get("description"), name
    with pytest.raises(ValidationError):
        RunPodJobConfiguration(poll_interval_s=30)
    with pytest.raises(ValidationError, match="exactly one"):
        RunPodJobConfiguration(accounts=[{"name": "a", "api_key_env": "X", "api_key_secret_block": "b"}])


def test_completed_run_terminates_pod_reports_cost_and_sends_only_needed_env(fake: FakeRunPod):
    with temporary_settings({PREFECT_API_KEY: PREFECT_KEY}):
        flow_run, result, state, pid = run_one(env={"HF_HOME": "/workspace/hf"})
    assert result.status_code == 0 and state.is_completed()
    assert pid and pid.startswith("main:")
    assert fake.live_pods() == [] and fake.running_processes() == []
    created = fake.events_of("created")[0]
    assert created["env_keys"] == ["HF_HOME", "PREFECT_API_KEY", "PREFECT_API_URL", "PREFECT__FLOW_RUN_ID"]
    assert created["name"] == f"prefect-eps-{flow_run.id}"

    async def costs():
        async with get_client() as client:
            return await read_pod_costs(client, [flow_run.id])

    usd = anyio.run(costs)[flow_run.id]
    assert 0 < usd < 0.01  # a few seconds of a $1.64/h GPU


def test_fallback_over_gpu_types_clouds_and_accounts_logs_every_skip(fake: FakeRunPod, monkeypatch):
    fake.faults.no_capacity = [("main", None, None), ("spare", GPUS[0], None)]
    monkeypatch.setenv("BROKEN_KEY", "rpa_not_a_real_key")
    cfg = RunPodJobConfiguration(
        image="img", gpu_types=GPUS, cloud_types=["SECURE", "COMMUNITY"],
        accounts=[{"name": "nokey", "api_key_env": "UNSET_RUNPOD_KEY"},
                  {"name": "broken", "api_key_env": "BROKEN_KEY"},
                  {"name": "main", "api_key_env": "RUNPOD_API_KEY"},
                  {"name": "spare", "api_key_env": "SPARE_RUNPOD_KEY"}],
        name="prefect-eps-fallback",
    )
    messages: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    logger = logging.getLogger("test-fallback")
    logger.addHandler(Capture())

    async def main():
        worker = RunPodWorker(work_pool_name=POOL)
        apis = [await worker._api_or_reason(a) for a in cfg.accounts]
        return await provision(cfg, apis, logger)

    pod = anyio.run(main)
    assert (pod.account, pod.gpu_type, pod.cloud) == ("spare", GPUS[1], "SECURE")
    text = "\n".join(messages)
    assert "UNSET_RUNPOD_KEY is not set" in text and "rejected the API key of account 'broken'" in text
    assert text.count("no capacity") == 4 + 2  # main: 2 GPUs x 2 clouds; spare: H100 x 2 clouds
    assert "rpa_not_a_real_key" not in text


def test_max_hourly_price_and_no_capacity_anywhere_fail_provisioning(fake: FakeRunPod):
    fake.faults.no_capacity = [(None, GPUS[1], None)]
    with pytest.raises(ProvisioningFailed) as err:
        run_one(max_hourly_price=2.0)
    assert "above max_hourly_price" in str(err.value) and "no capacity" in str(err.value)
    assert fake.live_pods() == []


def test_vanished_pod_crashes_the_run_quickly(fake: FakeRunPod):
    fake.faults.vanish_pods = {0}
    fake.faults.vanish_after_s = (2.5, 2.5)
    _, result, state, _ = run_one("hang")
    assert result.status_code != 0 and state.is_crashed() and "vanished" in state.message
    # "Quickly" on the worker's own clock: vanish -> its terminate of the pod that is gone. Each poll (0.5 s) waits
    # at most API_READ_TIMEOUT_S (5 s) on the Prefect API and then asks the fake on loopback, so 30 s is a margin of
    # many polls, not a race with a loaded server (the run's Crashed timestamp also waits on the server's writes).
    noticed = fake.events_of("terminate_missing")[0]["t"] - fake.events_of("vanished")[0]["t"]
    assert 0 <= noticed < 30, noticed
    assert fake.running_processes() == []


def test_a_slow_prefect_api_does_not_delay_vanish_detection(fake: FakeRunPod, monkeypatch):
    from prefect.client.orchestration import PrefectClient

    from eps_screen_runpod.worker import API_READ_TIMEOUT_S

    read = PrefectClient.read_flow_run
    holds = {"started": 0, "waited_out": 0}

    async def held(self, flow_run_id):  # while the pod lives, reads wait like a SQLite server's 60 s lock wait
        if fake.live_pods():
            holds["started"] += 1
            await anyio.sleep(120)
            holds["waited_out"] += 1
        return await read(self, flow_run_id)

    monkeypatch.setattr(PrefectClient, "read_flow_run", held)
    fake.faults.vanish_pods = {0}
    fake.faults.vanish_after_s = (1.0, 1.0)
    _, result, state, _ = run_one("hang")
    noticed = fake.events_of("terminate_missing")[0]["t"] - fake.events_of("vanished")[0]["t"]
    assert result.status_code != 0 and state.is_crashed() and "vanished" in state.message
    # The worker gave up on every held read (its own API_READ_TIMEOUT_S) and checked the pod: none of the 120 s
    # holds ran out. Without the timeout the first hold is waited out (measured: detection after 119 s).
    assert holds["started"] >= 1 and holds["waited_out"] == 0, holds
    # On the worker's clock, a few of its own read timeouts at most: a margin, not a race with the box's load
    assert noticed < 6 * API_READ_TIMEOUT_S, noticed


def test_container_exit_without_final_state_crashes(fake: FakeRunPod):
    _, result, state, _ = run_one("exit")
    assert state.is_crashed() and "container exited" in state.message
    assert fake.live_pods() == []


def test_a_container_that_exits_0_without_its_work_crashes_the_run(fake: FakeRunPod):
    fake.faults.exit_zero_pods = {0}  # exit code 0 is not success: the flow run never ran
    _, result, state, _ = run_one("complete")
    assert [e["exit_code"] for e in fake.events_of("exited")] == [0]
    assert result.status_code != 0 and state.is_crashed() and "container exited" in state.message
    assert fake.live_pods() == []


def test_bootstrap_silence_crashes_and_terminates(fake: FakeRunPod):
    fake.faults.silent_pods = {0}
    flow_run, result, state, _ = run_one(bootstrap_timeout_s=2)
    assert state.is_crashed() and "Bootstrap silence (kill criterion 6)" in state.message
    gate = json.loads(_history(flow_run.id)[1].labels["eps-screen.gate6"])  # decided by the silence rule, 2 s limit
    assert gate["fired"] and gate["numbers"]["limit_s"] == 2 and not gate["numbers"]["progress_reported"]
    assert fake.live_pods() == []


def test_slow_start_is_waited_for_but_bounded(fake: FakeRunPod):
    fake.faults.start_delay_s = (2.0, 2.0)
    _, _, state, _ = run_one(start_timeout_s=20)
    assert state.is_completed()
    _, _, state, _ = run_one(start_timeout_s=1)
    assert state.is_crashed() and "did not reach RUNNING" in state.message
    assert fake.live_pods() == []


def test_wall_time_limit(fake: FakeRunPod):
    flow_run, _, state, _ = run_one("hang", max_wall_hours=3 / 3600)
    assert state.is_crashed() and "max_wall_hours" in state.message
    gate = json.loads(_history(flow_run.id)[1].labels["eps-screen.gate5"])  # gates.cost_overrun, for dispatch
    assert gate["fired"] and gate["numbers"]["job_too_long"] and gate["number"] == 5
    assert fake.live_pods() == []


def test_api_errors_while_watching_are_survived(fake: FakeRunPod):
    async def flaky(flow_run, started):
        while started.value is None:
            await anyio.sleep(0.1)
        fake.faults.fail_next = [503, 429, 502, 500]

    _, _, state, _ = run_one("complete", 3, during=flaky)
    assert state.is_completed() and fake.stats["http_errors"] == 4
    assert fake.live_pods() == []


def test_cancellation_terminates_the_pod(fake: FakeRunPod):
    async def cancel(flow_run, started):
        while not fake.running_processes():
            await anyio.sleep(0.1)
        await anyio.sleep(2)  # the script has set Running
        async with get_client() as client:
            await client.set_flow_run_state(flow_run.id, Cancelling(), force=True)

    _, result, state, _ = run_one("hang", during=cancel)
    assert state.is_cancelled() and result.status_code == 0
    assert fake.live_pods() == [] and fake.running_processes() == []


def test_kill_infrastructure_terminates_by_pid(fake: FakeRunPod):
    async def main():
        flow_run = await new_flow_run()
        cfg = config(flow_run, "hang")
        async with RunPodWorker(work_pool_name=POOL) as worker:
            apis = [await worker._api_or_reason(a) for a in cfg.accounts]
            pod = await provision(cfg, apis, logging.getLogger("t"))
            await worker.kill_infrastructure(pod.infrastructure_pid, cfg)
            from prefect.exceptions import InfrastructureNotFound

            with pytest.raises(InfrastructureNotFound):
                await worker.kill_infrastructure(pod.infrastructure_pid, cfg)

    anyio.run(main)
    assert fake.live_pods() == []


def test_hostile_command_and_env_reach_the_pod_intact(fake: FakeRunPod, tmp_path: Path):
    out = tmp_path / "hostile.txt"
    hostile = 'a "quoted" \\ back\\slash\nnew line } { $HOME `x` \'single\' \u00e9 \U0001F600'
    command = f"printf '%s' \"$HOSTILE\" > {out}; printf '%s' '}}}}\"{{{{' >> {out}; python {SCRIPT} complete 0.2"

    _, _, state, _ = run_one(command=command, env={"HOSTILE": hostile})
    assert state.is_completed()
    assert out.read_text() == hostile + '}}"{{'
    deploys = [d for d in fake.documents if "podFindAndDeployOnDemand" in d]
    assert len(deploys) == 1 and json.dumps(hostile)[1:-1] in deploys[0]  # escaped exactly, in one literal
    assert docker_args_for(command).count('"') == 0


def test_secrets_never_reach_logs_artifacts_or_reprs(fake: FakeRunPod, capfd, caplog):
    # Everything Prefect and this package log, down to DEBUG. (Not third-party wire logs: the websockets
    # library's own DEBUG frames echo Prefect's auth token, whoever the worker is.)
    caplog.set_level(logging.DEBUG, logger="prefect")
    caplog.set_level(logging.DEBUG, logger="eps_screen_runpod")
    fake.faults.no_capacity = [(None, GPUS[0], None)]
    with temporary_settings({PREFECT_API_KEY: PREFECT_KEY}):
        flow_run, _, state, _ = run_one("env", env={"ENV_DUMP": str(Path(fake.log_dir) / "env.txt")})
        cfg = config(flow_run)

        async def collect():
            # The worker's run logs reach the server through Prefect's batching log thread: drain it, then read
            # until the line this test looks for has landed (a loaded SQLite server may hold the write).
            await APILogHandler.aflush()
            deadline = time.monotonic() + 90
            async with get_client() as client:
                while True:
                    logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id])))
                    if any("Skipping" in log.message for log in logs) or time.monotonic() > deadline:
                        break
                    await anyio.sleep(0.5)
                # this run's (the session's server holds every earlier test's): the worker's pod cost record
                arts = await client.read_artifacts(artifact_filter=ArtifactFilter(
                    flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id])))
                return [log.message for log in logs], [json.dumps(a.model_dump(mode="json")) for a in arts]

        logs, artifacts = anyio.run(collect)
    assert state.is_completed()
    assert PREFECT_KEY in (Path(fake.log_dir) / "env.txt").read_text()  # the pod does get what it needs
    out, err = capfd.readouterr()
    pod_logs = "".join(p.read_text() for p in Path(fake.log_dir).glob("pod-*.log"))
    corpus = "\n".join([out, err, caplog.text, pod_logs, repr(cfg), str(cfg), *logs, *artifacts])
    assert any("Skipping" in line for line in logs) and artifacts
    for secret in (TEST_KEY, OTHER_KEY, PREFECT_KEY):
        assert secret not in corpus
    assert "PREFECT_API_KEY" not in cfg.env and PREFECT_KEY in cfg.pod_env().values()


def test_reaper_terminates_orphans_and_adopts_unwatched_live_runs(fake: FakeRunPod):
    from eps_screen_runpod.api import RunPodApi
    from pydantic import SecretStr

    api = RunPodApi(SecretStr(TEST_KEY), "main")
    gpu = GPUS[1]

    def pod_for(name: str, command: str, env: dict[str, str]) -> str:
        return api.create_pod(name=name, image="img", gpu_type_id=gpu, cloud_type="SECURE", gpu_count=1,
                              container_disk_gb=10, volume_gb=0, volume_mount_path="/w",
                              docker_args=docker_args_for(command), env=env, network_volume_id=None,
                              data_center_id=None)["id"]

    async def main():
        async with get_client() as client:
            done = await client.create_flow_run(unit_flow, state=Pending())
            await client.set_flow_run_state(done.id, Completed(), force=True)
        live = await new_flow_run()
        orphan = pod_for(f"prefect-eps-{done.id}", "sleep 60", {})
        unknown = pod_for("prefect-eps-00000000-0000-4000-8000-000000000000", "sleep 60", {})
        other = pod_for("someone-elses-pod", "sleep 60", {})
        cfg = config(live)
        adopted = pod_for(f"prefect-eps-{live.id}", f"python {SCRIPT} complete 2", cfg.pod_env())
        watched = await new_flow_run()  # live, and its worker is online: not ours to adopt
        async with get_client() as client:
            await client.update_flow_run_labels(watched.id, {"prefect.worker.name": "busy-worker"})
        busy = pod_for(f"prefect-eps-{watched.id}", "sleep 60", {})
        async with RunPodWorker(work_pool_name=POOL, name="busy-worker"), RunPodWorker(work_pool_name=POOL) as worker:
            await anyio.sleep(0.5)  # setup's first reaper pass
            await worker.reap_once()
            ids = {p["id"] for p in fake.live_pods()}
            assert orphan not in ids and unknown not in ids and other in ids and busy in ids
            assert watched.id not in worker._watching
            api.terminate_pod(busy)
            for _ in range(200):  # the adopted pod is watched until its run completes
                if adopted not in {p["id"] for p in fake.live_pods()}:
                    break
                await anyio.sleep(0.1)
        return live, adopted, other

    live, adopted, other = anyio.run(main)
    assert anyio.run(final_state, live.id).is_completed()
    assert [p["id"] for p in fake.live_pods()] == [other]
    api.terminate_pod(other)


# -- issue 11: the race that lost a cell, and permanent errors --------------------------------------------------
def _history(flow_run_id):
    async def main():
        async with get_client() as client:
            return await client.read_flow_run_states(flow_run_id), (await client.read_flow_run(flow_run_id))

    return anyio.run(main)


def test_a_silence_decision_on_a_stale_read_is_checked_again_before_the_kill(fake: FakeRunPod, monkeypatch):
    """The engine moves the run to Running while the worker is in a RunPod call, after the worker's state read:
    bootstrap silence on that read would kill a run that has just started."""
    from eps_screen_runpod.api import RunPodApi
    from prefect.states import Running

    get_pod = RunPodApi.get_pod
    moved: list[float] = []

    def engine_starts_during_the_call(self, pod_id):
        info = get_pod(self, pod_id)
        running = [e["t"] for e in fake.events_of("running") if e["pod_id"] == pod_id]
        if running and time.time() - running[0] > 2.3 and not moved:  # past bootstrap_timeout_s=2
            with get_client(sync_client=True) as client:
                client.set_flow_run_state(UUID(fake.pods[pod_id].env["PREFECT__FLOW_RUN_ID"]), Running())
            moved.append(time.time())
        return info

    async def completes_later(flow_run, started):
        while not moved:
            await anyio.sleep(0.1)
        await anyio.sleep(1.5)
        async with get_client() as client:
            await client.set_flow_run_state(flow_run.id, Completed())

    monkeypatch.setattr(RunPodApi, "get_pod", engine_starts_during_the_call)
    fake.faults.silent_pods = {0}
    flow_run, result, state, _ = run_one(bootstrap_timeout_s=2, during=completes_later)
    states, _ = _history(flow_run.id)
    assert moved and state.is_completed() and result.status_code == 0
    assert not any(s.is_crashed() for s in states), [s.name for s in states]
    assert fake.live_pods() == []


def test_an_infrastructure_kill_stays_one_when_the_dying_flow_writes_failed(fake: FakeRunPod, monkeypatch):
    """Issue 11's sequence: kill decided (bootstrap silence), the first podTerminate answers 500, the engine moves
    the run to Running meanwhile, and the dying process writes Failed after the kill. The worker labels the run and
    writes Crashed before terminating, and sets Crashed again afterwards; dispatch resubmits it."""
    from eps_screen_runpod.api import RunPodApi
    from prefect.states import Failed, Running

    from flows.runtime.recovery import infrastructure_ended

    terminate = RunPodApi.terminate_pod

    def racing_terminate(self, pod_id):
        flow_run_id = UUID(fake.pods[pod_id].env["PREFECT__FLOW_RUN_ID"]) if pod_id in fake.pods else None
        fake.faults.fail_next = [500]  # the first attempt answers 500; the client retries
        with get_client(sync_client=True) as client:
            if flow_run_id is not None:
                client.set_flow_run_state(flow_run_id, Running())  # the engine, meanwhile
            gone = terminate(self, pod_id)
            if flow_run_id is not None:  # the dying process's last write
                client.set_flow_run_state(flow_run_id, Failed(message="ValueError: Task run is not set"))
        return gone

    monkeypatch.setattr(RunPodApi, "terminate_pod", racing_terminate)
    fake.faults.silent_pods = {0}
    flow_run, result, state, _ = run_one(bootstrap_timeout_s=2)
    states, run = _history(flow_run.id)
    names = [s.name for s in states]
    assert result.status_code != 0 and state.is_crashed(), names
    assert "infrastructure" in state.message and "Bootstrap silence" in state.message
    assert run.labels.get("eps-screen.killed-by", "").startswith("runpod-worker")
    assert json.loads(run.labels["eps-screen.gate6"])["fired"] is True
    assert fake.stats["http_errors"] >= 1 and fake.live_pods() == []

    async def resubmitted():
        async with get_client() as client:
            return await infrastructure_ended(client, run, logging.getLogger("t"))

    assert anyio.run(resubmitted)


def test_a_rejected_key_fails_the_run_at_once_with_one_line_and_no_traceback(fake: FakeRunPod, monkeypatch, caplog):
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_not_a_key_of_this_account")
    caplog.set_level(logging.INFO)
    flow_run, result, state, _ = run_one()
    _, run = _history(flow_run.id)
    assert state.is_failed() and "account 'main'" in state.message and "HTTP 401" in state.message
    assert "\n" not in state.message and run.labels["eps-screen.permanent-failure"] == state.message
    # at once: provisioning's first request was refused and nothing was retried (the others are the reaper's pod
    # listings, `myself { pods }`, one per account per pass)
    provisioning = [body for body in fake.refused_bodies if "myself" not in body]
    assert len(provisioning) == 1 and "gpuTypes" in provisioning[0], fake.refused_bodies
    assert "Traceback" not in caplog.text and fake.live_pods() == []
    # a GPU type RunPod does not know is as permanent; a transient failure (no capacity) is not
    _, _, state, _ = run_one(gpu_types=["NVIDIA H900"], accounts=[{"name": "main", "api_key_env": "SPARE_RUNPOD_KEY"}])
    assert state.is_failed() and "does not know this GPU type" in state.message
    fake.faults.no_capacity = [(None, None, None)]
    with pytest.raises(ProvisioningFailed):
        run_one(accounts=[{"name": "main", "api_key_env": "SPARE_RUNPOD_KEY"}])


def test_the_reaper_reports_a_rejected_key_once_not_every_pass(fake: FakeRunPod, monkeypatch, caplog):
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_not_a_key_of_this_account")
    caplog.set_level(logging.DEBUG)

    async def main():
        async with RunPodWorker(work_pool_name=POOL) as worker:
            for _ in range(4):
                await worker.reap_once()

    anyio.run(main)
    lines = [r for r in caplog.records if "Reaper cannot list pods" in r.getMessage()]
    assert sum(r.levelno >= logging.WARNING for r in lines) == 1  # 5 passes (setup's and 4), one line


@flow(name="job")
def job_stand_in(config: dict, cell_ids: list[str]) -> dict:  # never runs: no pod starts with a bad key
    return {}


def test_a_bad_key_fails_the_screen_in_seconds_with_one_line_naming_the_account(fake: FakeRunPod, monkeypatch,
                                                                                 tmp_path, caplog):
    """The screen's own path (ScreenRun.dispatch -> dispatch -> this worker -> the fake API) with a key RunPod
    rejects: one attempt per job, no resubmission, the screen's state one line that names the account."""
    import contextvars
    import threading

    from eps_screen.plan.screen_plan import make_plan
    from eps_screen.spec.config import ScreenConfig
    from eps_screen.store.result_store import ResultStore
    from flows.screen import ScreenRun, Stopped

    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_revoked_key_of_the_lab_account")
    caplog.set_level(logging.INFO)

    async def deploy():
        async with get_client() as client:
            flow_id = await client.create_flow_from_name("job")
            await client.create_deployment(flow_id=flow_id, name="job-runpod", entrypoint="x.py:job",
                                           work_pool_name=POOL, job_variables={
                                               "image": "eps-screen:test", "gpu_types": GPUS, "poll_interval_s": 0.5,
                                               "accounts": [{"name": "lab", "api_key_env": "RUNPOD_API_KEY"}]})

    anyio.run(deploy)
    stop = threading.Event()

    def worker_loop():
        async def main():
            async with RunPodWorker(work_pool_name=POOL, prefetch_seconds=1) as worker:
                while not stop.is_set():
                    await worker.get_and_submit_flow_runs()
                    await anyio.sleep(0.3)

        anyio.run(main)

    settings = contextvars.copy_context()  # the harness's Prefect settings live in context variables
    thread = threading.Thread(target=settings.run, args=(worker_loop,), daemon=True)
    thread.start()
    import yaml

    data = yaml.safe_load((ROOT / "deployments" / "configs" / "simulated.yaml").read_text())
    config = ScreenConfig(**{**data, "name": "badkey", "store": str(tmp_path / "store"),
                             "execution": {"pool": "runpod-gpu", "max_parallel_cells": 3, "crash_resubmits": 6,
                                           "resubmit_backoff_s": 0.2}})
    cells = [f"s{i}-A0B0C0D0E0-s1" for i in range(6)]
    t0 = time.monotonic()
    try:
        with pytest.raises(Stopped) as err:
            ScreenRun(config, ResultStore.for_config(config), make_plan(config)).dispatch(cells)
    finally:
        stop.set()
        thread.join(timeout=30)
    elapsed = time.monotonic() - t0
    message = err.value.state.message

    async def screen_runs():
        async with get_client() as client:
            deployment = await client.read_deployment_by_name("job/job-runpod")
            return await client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])))

    # What took 16 minutes was 224 resubmitted runs. Here: the first wave of jobs only (max_parallel_cells 3), each
    # tried once, and the screen stopped on the first refusal, not on a clock of this loaded box.
    runs = anyio.run(screen_runs)
    assert 1 <= len(runs) <= 3 and all(r.name.endswith("-a0") for r in runs), [r.name for r in runs]
    assert "\n" not in message and "account 'lab'" in message and "HTTP 401" in message, message
    assert "rpa_revoked" not in message and "Traceback" not in caplog.text
    assert fake.stats["deployed"] == 0 and fake.live_pods() == []
    print(f"bad key: screen stopped in {elapsed:.1f} s: {message}")


def test_slow_answers_periodic_429s_and_a_failing_first_terminate_still_end_with_no_pod(fake: FakeRunPod):
    fake.faults.delay_s, fake.faults.status_every, fake.faults.first_terminate_status = 0.1, (3, 429), 500
    _, result, state, _ = run_one("complete")
    assert state.is_completed() and result.status_code == 0
    assert fake.stats["http_errors"] >= 2 and len(fake._terminate_failed) == 1
    assert fake.live_pods() == [] and fake.events_of("terminated")
