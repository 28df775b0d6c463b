"""`eps-screen doctor`: every failing check is one line naming the problem, the exit code is 1, no traceback.

Runs in-process on the session's Prefect test harness; pools, workers (heartbeats), deployments and Secret
blocks are created through the client, and removed after each test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import CONFIGS, drop_pools
from tests.fakes.fixtures import TEST_KEY, fake_runpod_fixture  # noqa: F401

pytestmark = pytest.mark.usefixtures("prefect_harness")

CHECKS = ["config", "weights", "store", "prefect api", "work pool", "workers", "job deployment", "credentials", "cpu pool",
          "cpu workers", "screen deployment", "preset deployment", "aggregate deployment"]
LINE = re.compile(rf"^(ok  |FAIL|skip) ({'|'.join(CHECKS)}): \S")
UI = CHECKS[8:]


def write_config(tmp_path: Path, pool: str = "local-gpu", **overrides) -> str:
    data = yaml.safe_load((CONFIGS / "simulated.yaml").read_text())
    data.update({"store": str(tmp_path / "store"), "execution": {"pool": pool}, **overrides})
    path = tmp_path / "screen.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def doctor(capsys, config: str) -> tuple[int, dict[str, str]]:
    from flows.cli import main

    code = main(["doctor", config])
    captured = capsys.readouterr()
    out = captured.out.strip().splitlines()
    assert "Traceback" not in captured.out + captured.err
    assert len(out) == len(CHECKS) + 1, out  # one line per check, then the verdict
    assert all(LINE.match(line) for line in out[:-1]), out
    lines = {line[5:].split(":", 1)[0]: line for line in out[:-1]}
    assert list(lines) == CHECKS
    assert out[-1] == ("all checks passed" if code == 0 else f"{sum(v.startswith('FAIL') for v in lines.values())} "
                       "check(s) failed")
    return code, lines


@pytest.fixture
def api():
    """A client of the harness; pools and deployments made by a test are deleted after it."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        yield client
        drop_pools(client)


def make_pool(client, name: str, type_: str = "process", **defaults) -> None:
    from prefect.client.schemas.actions import WorkPoolCreate

    from flows.runtime.deploy import PoolSpec, base_job_template

    template = base_job_template(PoolSpec(name, type_, defaults=defaults))
    client.create_work_pool(WorkPoolCreate(name=name, type=type_, base_job_template=template))


def make_deployment(client, pool: str, name: str, flow: str = "job") -> None:
    flow_id = client.create_flow_from_name(flow)
    client.create_deployment(flow_id=flow_id, name=name, work_pool_name=pool, entrypoint=f"flows/{flow}.py:{flow}")


def ui_ready(client, worker: bool = True) -> None:
    """What a run started from the UI needs: the cpu pool, a worker on it, the screen, preset and aggregate
    deployments."""
    make_pool(client, "cpu")
    if worker:
        client.send_worker_heartbeat("cpu", "cpu-0", heartbeat_interval_seconds=30)
    for flow, name in (("screen", "screen"), ("screen", "preset"), ("aggregate-all", "aggregate")):
        make_deployment(client, "cpu", name, flow)


def test_all_checks_pass_for_a_ready_local_gpu_pool(tmp_path, capsys, api):
    ui_ready(api)
    make_pool(api, "local-gpu")
    api.send_worker_heartbeat("local-gpu", "gpu-0", heartbeat_interval_seconds=30)
    make_deployment(api, "local-gpu", "job-local-gpu")
    code, lines = doctor(capsys, write_config(tmp_path))
    assert code == 0, lines
    assert "1 online: gpu-0" in lines["workers"]
    assert lines["cpu workers"] == "ok   cpu workers: 1 online: cpu-0"
    assert lines["preset deployment"] == "ok   preset deployment: screen/preset on pool cpu"
    assert not (tmp_path / "store").exists()  # the store check creates nothing


def test_the_ui_path_is_checked_for_an_in_process_config_too(tmp_path, capsys, api):
    code, lines = doctor(capsys, write_config(tmp_path, pool="inprocess"))
    assert code == 1
    assert lines["work pool"].startswith("skip work pool: cells run in-process")
    assert lines["cpu pool"] == ("FAIL cpu pool: work pool 'cpu' (screen runs started from the UI or with --submit) "
                                 "does not exist: run `eps-screen deploy`")
    assert lines["cpu workers"] == "skip cpu workers: no cpu pool"
    for kind, name in (("screen", "screen/screen"), ("preset", "screen/preset"), ("aggregate", "aggregate-all/aggregate")):
        assert lines[f"{kind} deployment"] == (f"FAIL {kind} deployment: deployment {name!r} does not exist: run "
                                               "`eps-screen deploy`")
    ui_ready(api, worker=False)
    code, lines = doctor(capsys, write_config(tmp_path, pool="inprocess"))
    assert code == 1 and [c for c in CHECKS if lines[c].startswith("FAIL")] == ["cpu workers"]
    assert lines["cpu workers"] == ("FAIL cpu workers: no worker online for pool 'cpu': start one (prefect worker "
                                    "start --pool cpu; docs/walkthroughs.md)")
    api.send_worker_heartbeat("cpu", "cpu-0", heartbeat_interval_seconds=30)
    code, lines = doctor(capsys, write_config(tmp_path, pool="inprocess"))
    assert code == 0 and all(lines[c].startswith("ok") for c in UI), lines


def test_a_deployment_on_another_pool(tmp_path, capsys, api):
    ui_ready(api)
    make_pool(api, "local-gpu")
    api.delete_deployment(api.read_deployment_by_name("screen/preset").id)
    make_deployment(api, "local-gpu", "preset", "screen")
    code, lines = doctor(capsys, write_config(tmp_path, pool="inprocess"))
    assert code == 1 and lines["preset deployment"] == ("FAIL preset deployment: deployment 'screen/preset' is on "
                                                        "pool 'local-gpu', not 'cpu': run `eps-screen deploy`")


def test_missing_config_file(tmp_path, capsys):
    code, lines = doctor(capsys, str(tmp_path / "nope.yaml"))
    assert code == 1
    assert lines["config"] == f"FAIL config: {tmp_path / 'nope.yaml'}: no such config file"
    assert all(lines[c].startswith("skip") for c in CHECKS[1:])


def test_invalid_config(tmp_path, capsys):
    code, lines = doctor(capsys, write_config(tmp_path, sources=["librarian", "pirate"]))
    assert code == 1 and lines["config"].startswith("FAIL config: sources: unknown personas ['pirate']")


def test_weights_not_fetched(tmp_path, capsys, monkeypatch):
    """A packaged model whose file is not here: one line that names the command fetching it."""
    monkeypatch.setenv("EPS_SCREEN_CACHE", str(tmp_path / "cache"))
    code, lines = doctor(capsys, write_config(tmp_path, pool="inprocess", model={"base": "smollm2-135m-instruct"},
                                              backend={"training": "trl", "generation": "transformers"}))
    assert code == 1 and lines["weights"].startswith("FAIL weights: model 'smollm2-135m-instruct': its weights are "
                                                     "not fetched")
    assert lines["weights"].endswith("run `eps-screen models fetch smollm2-135m-instruct`")
    code, lines = doctor(capsys, write_config(tmp_path, pool="inprocess"))
    assert lines["weights"] == "ok   weights: none: the simulated backend trains and asks no model", lines


def test_store_not_writable(tmp_path, capsys):
    (tmp_path / "file").write_text("in the way")
    code, lines = doctor(capsys, write_config(tmp_path, pool="inprocess", store=str(tmp_path / "file" / "store")))
    assert code == 1 and lines["store"].startswith(f"FAIL store: {tmp_path / 'file' / 'store'}/simulated is not writable")


def test_api_unreachable(tmp_path, capsys):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        code, lines = doctor(capsys, write_config(tmp_path))
    assert code == 1
    assert lines["prefect api"] == "FAIL prefect api: Prefect API http://127.0.0.1:9/api is not reachable (ConnectError)"
    assert lines["work pool"] == "skip work pool: no Prefect API"
    assert all(lines[c] == f"skip {c}: no Prefect API" for c in UI)


def test_api_not_set_for_a_gpu_pool(tmp_path, capsys):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        code, lines = doctor(capsys, write_config(tmp_path))
        assert code == 1 and lines["prefect api"].startswith("FAIL prefect api: PREFECT_API_URL is not set")
        code, lines = doctor(capsys, write_config(tmp_path, pool="inprocess"))  # in-process: a temporary server
        assert code == 0 and "starts a temporary server" in lines["prefect api"]
        assert all(lines[c] == f"skip {c}: no Prefect API configured (PREFECT_API_URL)" for c in UI), lines


def test_pool_missing(tmp_path, capsys, api):
    code, lines = doctor(capsys, write_config(tmp_path))
    assert code == 1
    assert lines["work pool"] == "FAIL work pool: work pool 'local-gpu' does not exist: run `eps-screen deploy`"
    assert lines["job deployment"].startswith("FAIL job deployment: deployment 'job/job-local-gpu' does not exist")


def test_pool_of_the_wrong_type(tmp_path, capsys, api):
    make_pool(api, "runpod-gpu", "process")
    code, lines = doctor(capsys, write_config(tmp_path, pool="runpod-gpu"))
    assert code == 1 and "has type 'process', expected 'runpod'" in lines["work pool"]


def test_no_worker_online(tmp_path, capsys, api):
    make_pool(api, "local-gpu")
    make_deployment(api, "local-gpu", "job-local-gpu")
    code, lines = doctor(capsys, write_config(tmp_path))
    assert code == 1
    assert lines["workers"].startswith("FAIL workers: no worker online for pool 'local-gpu': start one")
    assert lines["job deployment"].startswith("ok")


def runpod_ready(client, **defaults) -> None:
    from flows.runtime.deploy import worker_class

    if worker_class("runpod") is None:
        pytest.skip("the runpod worker type is not installed")
    make_pool(client, "runpod-gpu", "runpod", **defaults)
    client.send_worker_heartbeat("runpod-gpu", "runpod-1", heartbeat_interval_seconds=30)
    make_deployment(client, "runpod-gpu", "job-runpod")


def test_runpod_key_missing(tmp_path, capsys, api, monkeypatch):
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    runpod_ready(api, image="ghcr.io/lab/eps:1", prefect_api_url="https://prefect.lab.org/api")
    code, lines = doctor(capsys, write_config(tmp_path, pool="runpod-gpu"))
    assert code == 1
    assert lines["credentials"] == ("FAIL credentials: no RunPod account with a key: default: environment variable "
                                    "RUNPOD_API_KEY is not set here (the worker's environment needs it)")


@pytest.mark.integration  # the fake RunPod API serves on 127.0.0.1
def test_runpod_secret_block_missing_then_present(tmp_path, capsys, api, fake_runpod):
    from prefect.blocks.system import Secret

    accounts = [{"name": "lab", "api_key_secret_block": "runpod-lab-doctor"}]
    runpod_ready(api, image="ghcr.io/lab/eps:1", prefect_api_url="https://prefect.lab.org/api", accounts=accounts)
    code, lines = doctor(capsys, write_config(tmp_path, pool="runpod-gpu"))
    assert "Secret block 'runpod-lab-doctor' does not exist" in lines["credentials"]
    secret = TEST_KEY  # a key the fake RunPod API (RUNPOD_API_BASE_URL) accepts
    Secret(value=secret).save("runpod-lab-doctor", overwrite=True)
    code, lines = doctor(capsys, write_config(tmp_path, pool="runpod-gpu"))
    assert lines["credentials"] == "ok   credentials: RunPod key for lab accepted by RunPod; image ghcr.io/lab/eps:1"
    assert secret not in "".join(lines.values())
    # the one check a RunPod screen cannot pass today: a local store the pods cannot write
    assert code == 1 and lines["store"].startswith("FAIL store:") and "RunPod pods" in lines["store"]


@pytest.mark.integration  # the fake RunPod API serves on 127.0.0.1
def test_runpod_key_rejected_by_runpod_is_one_line_naming_the_account(tmp_path, capsys, api, monkeypatch,
                                                                       fake_runpod):
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_revoked_0123456789")
    runpod_ready(api, image="ghcr.io/lab/eps:1", prefect_api_url="https://prefect.lab.org/api")
    code, lines = doctor(capsys, write_config(tmp_path, pool="runpod-gpu"))
    assert code == 1 and lines["credentials"].startswith(
        "FAIL credentials: RunPod rejected the API key of account 'default' (HTTP 401): replace the key")
    assert "rpa_revoked" not in "".join(lines.values()) and fake_runpod.stats["unauthorized"] == 1
    monkeypatch.setenv("RUNPOD_API_KEY", TEST_KEY)
    code, lines = doctor(capsys, write_config(tmp_path, pool="runpod-gpu"))
    assert lines["credentials"].startswith("ok   credentials: RunPod key for default accepted by RunPod")


def test_runpod_pods_cannot_reach_a_local_api(tmp_path, capsys, api, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_x")
    runpod_ready(api, image="ghcr.io/lab/eps:1")
    code, lines = doctor(capsys, write_config(tmp_path, pool="runpod-gpu"))
    assert code == 1 and lines["credentials"].startswith("FAIL credentials: pods cannot reach the Prefect API at http://127.0.0.1")


def test_runpod_image_missing(tmp_path, capsys, api, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_x")
    runpod_ready(api, prefect_api_url="https://prefect.lab.org/api")
    code, lines = doctor(capsys, write_config(tmp_path, pool="runpod-gpu"))
    assert code == 1 and lines["credentials"].startswith("FAIL credentials: no image set for the pods")
