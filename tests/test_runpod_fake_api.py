"""The fake RunPod API: real GraphQL parsing, real pod processes, each fault on demand."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import requests
from pydantic import SecretStr

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eps_screen_runpod.api import (  # noqa: E402
    BadApiKey,
    NoCapacity,
    QueryRejected,
    RetryPolicy,
    RunPodApi,
    TransientApiError,
)
from eps_screen_runpod.provision import docker_args_for  # noqa: E402
from runpod.api.mutations import pods as sdk_pods  # noqa: E402

from tests.fakes.fixtures import OTHER_KEY, TEST_KEY, fake_runpod_fixture  # noqa: E402,F401
from tests.fakes.runpod_api import FakeRunPod  # noqa: E402

pytestmark = pytest.mark.integration

FAST = RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=0.05, timeout_s=5)
GPU = "NVIDIA A100 80GB PCIe"


def api(key: str = TEST_KEY, account: str = "main") -> RunPodApi:
    return RunPodApi(SecretStr(key), account, retry=FAST)


def deploy(client: RunPodApi, command: str = "true", **kw) -> dict:
    args = dict(name="prefect-eps-test", image="img:1", gpu_type_id=GPU, cloud_type="SECURE", gpu_count=1,
                container_disk_gb=10, volume_gb=0, volume_mount_path="/workspace",
                docker_args=docker_args_for(command), env={"A": "1"}, network_volume_id=None, data_center_id=None)
    args.update(kw)
    return client.create_pod(**args)


def wait_for(predicate, timeout: float = 10.0, step: float = 0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError("condition not met in time")


def test_sdk_queries_parse_and_answer(fake_runpod: FakeRunPod):
    client = api()
    gpu = client.gpu_type(GPU)
    assert gpu["securePrice"] == 1.64 and gpu["lowestPrice"]["uninterruptablePrice"] > 0
    assert client.gpu_type("No Such GPU") is None
    pod = deploy(client)
    assert client.get_pod(pod["id"])["name"] == "prefect-eps-test"
    assert [p["id"] for p in client.list_pods()] == [pod["id"]]
    assert api(OTHER_KEY, "spare").list_pods() == []  # pods are per account
    assert client.terminate_pod(pod["id"]) is True
    assert client.terminate_pod(pod["id"]) is False  # already gone
    assert client.get_pod(pod["id"]) is None


def test_malformed_query_is_a_graphql_error(fake_runpod: FakeRunPod):
    resp = requests.post(f"{fake_runpod.url}/graphql", json={"query": "query { myself { pods { id } }"},
                         headers={"Authorization": f"Bearer {TEST_KEY}"}, timeout=5)
    assert resp.status_code == 400 and "Syntax Error" in resp.json()["errors"][0]["message"]
    with pytest.raises(QueryRejected, match="Cannot query field"):
        api().query("query { myself { nonsense } }")


def test_unescaped_sdk_string_breaks_the_query(fake_runpod: FakeRunPod):
    """Why the worker escapes: the SDK's f-string with a raw quote yields invalid GraphQL."""
    raw = sdk_pods.generate_pod_deployment_mutation(name="x", image_name="img", gpu_type_id=GPU,
                                                     docker_args='python -c "print(1)"')
    with pytest.raises(QueryRejected, match="Syntax Error"):
        api().query(raw)
    assert fake_runpod.live_pods() == []


def test_bad_api_key(fake_runpod: FakeRunPod):
    with pytest.raises(BadApiKey, match="account 'main'") as err:
        api("rpa_wrong").list_pods()
    assert "rpa_wrong" not in str(err.value)


def test_http_429_and_5xx_are_retried_then_reported(fake_runpod: FakeRunPod):
    fake_runpod.faults.fail_next = [429, 503]
    assert api().list_pods() == []
    assert fake_runpod.stats["http_errors"] == 2
    fake_runpod.faults.fail_next = [502, 500, 429]
    with pytest.raises(TransientApiError, match="HTTP 429"):
        api().list_pods()


def test_no_capacity_by_pattern(fake_runpod: FakeRunPod):
    fake_runpod.faults.no_capacity = [("main", GPU, "SECURE")]
    with pytest.raises(NoCapacity):
        deploy(api())
    assert deploy(api(), cloud_type="COMMUNITY")["id"]
    assert deploy(api(OTHER_KEY, "spare"))["id"]


def test_pod_runs_its_command_with_only_its_env(fake_runpod: FakeRunPod, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("WORKER_ONLY_SECRET", "leak-me")
    out = tmp_path / "out.txt"
    pod = deploy(api(), f"env > {out}; echo done >> {out}", env={"GREETING": 'he said "hi"\n{x}'})
    wait_for(lambda: api().get_pod(pod["id"])["desiredStatus"] == "EXITED")
    text = out.read_text()
    assert 'GREETING=he said "hi"\n{x}' in text and text.endswith("done\n")
    assert "WORKER_ONLY_SECRET" not in text


def test_vanish_kills_the_process_and_drops_the_pod(fake_runpod: FakeRunPod):
    fake_runpod.faults.vanish_pods = {0}
    fake_runpod.faults.vanish_after_s = (0.5, 0.5)
    pod = deploy(api(), "sleep 30")
    wait_for(lambda: fake_runpod.events_of("vanished"))
    assert api().get_pod(pod["id"]) is None and api().list_pods() == []
    assert fake_runpod.running_processes() == []


def test_silent_pod_is_running_without_a_process(fake_runpod: FakeRunPod, tmp_path: Path):
    fake_runpod.faults.silent_pods = {0}
    marker = tmp_path / "started"
    pod = deploy(api(), f"touch {marker}")
    wait_for(lambda: api().get_pod(pod["id"])["desiredStatus"] == "RUNNING")
    time.sleep(0.5)
    assert not marker.exists() and fake_runpod.running_processes() == []


def test_slow_start_and_terminate(fake_runpod: FakeRunPod):
    fake_runpod.faults.start_delay_s = (1.0, 1.0)
    pod = deploy(api(), "sleep 30")
    assert api().get_pod(pod["id"])["desiredStatus"] == "CREATED"
    wait_for(lambda: fake_runpod.running_processes())
    api().terminate_pod(pod["id"])
    assert fake_runpod.running_processes() == [] and fake_runpod.live_pods() == []
    assert requests.get(f"{fake_runpod.url}/_fake/pods", timeout=5).json() == []


def test_late_pod_starts_its_command_late_and_is_stopped_with_sigterm_first(fake_runpod: FakeRunPod, tmp_path: Path):
    fake_runpod.faults.late_pods, fake_runpod.faults.late_start_s = {0}, 1.0
    started, termed = tmp_path / "started", tmp_path / "sigterm"
    pod = deploy(api(), f"trap 'touch {termed}; exit 0' TERM; touch {started}; sleep 30 & wait")
    wait_for(started.exists)
    running, command = fake_runpod.events_of("running")[0]["t"], fake_runpod.events_of("command_started")[0]["t"]
    assert command - running >= 1.0  # the fake's own clock: RUNNING, then the command a second later
    api().terminate_pod(pod["id"])
    wait_for(lambda: not fake_runpod.running_processes())
    assert termed.exists() and fake_runpod.live_pods() == []  # SIGTERM reached the command before any SIGKILL
