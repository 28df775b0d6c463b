"""`eps-screen deploy | status | retry | report` and the files they apply (deployments/prefect.yaml, pools/).

One simulated screen per module (114 cells, in-process, on the session's Prefect test harness), and a small one of
declared factors (sim-6-2.yaml) for retry; the commands run in-process through `flows.cli.main`, their output
captured.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import CONFIGS, ROOT, drop_pools

pytestmark = pytest.mark.usefixtures("prefect_harness")

PREFECT_FILE = ROOT / "deployments" / "prefect.yaml"


# --- the deployment files ------------------------------------------------------------------------------------------
def test_prefect_yaml_names_what_the_screen_dispatches_to():
    from flows.runtime.deploy import pool_specs, pools_of_deployments
    from flows.runtime.names import JOB_DEPLOYMENTS

    spec = yaml.safe_load(PREFECT_FILE.read_text())
    deployments = {d["name"]: d for d in spec["deployments"]}
    flows = {d["name"]: d["entrypoint"] for d in spec["deployments"]}
    for pool, target in JOB_DEPLOYMENTS.items():  # "job/job-local-gpu" on pool local-gpu, ...
        flow, name = target.split("/")
        assert flows[name] == "flows/job.py:job" and flow == "job"
        assert deployments[name]["work_pool"]["name"] == pool
    assert set(pools_of_deployments().values()) <= set(pool_specs())
    assert deployments["aggregate"]["entrypoint"] == "flows/aggregate.py:aggregate_all"
    assert deployments["aggregate"]["schedules"][0]["cron"] == "0 * * * *"
    assert deployments["screen"]["work_pool"]["name"] == "cpu"  # never a GPU slot for the orchestrator
    assert deployments["preset"]["work_pool"]["name"] == "cpu" and flows["preset"] == "flows/preset.py:screen_preset"
    assert deployments["preset"]["enforce_parameter_schema"] and deployments["screen"]["enforce_parameter_schema"]
    assert "pull" not in spec  # local pools: the directory `prefect deploy` runs in; RunPod: /app in the image
    pull = deployments["job-runpod"]["pull"][0]["prefect.deployments.steps.set_working_directory"]
    assert pull["directory"] == "/app"


def test_screen_deployment_form_is_the_config_schema():
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema

    from eps_screen.spec.config import parse_config

    spec = {d["name"]: d for d in yaml.safe_load(PREFECT_FILE.read_text())["deployments"]}
    schema = parameter_schema(load_flow_from_entrypoint(str(ROOT / "flows" / "screen.py") + ":screen"))
    config_schema = schema.model_dump()["definitions"]["ScreenConfig"]
    assert {"execution", "backend", "sources", "gates", "store"} <= set(config_schema["properties"])
    assert config_schema["additionalProperties"] is False  # a typo in the form is refused, not ignored
    default = parse_config(spec["screen"]["parameters"]["config"])
    assert default.execution.pool == "local-gpu" and default.store == "results"


def test_pool_templates_layer_their_defaults_over_the_worker_type():
    from flows.runtime.deploy import base_job_template, concurrency, pool_specs, worker_class

    specs = pool_specs()
    assert {s.type for s in specs.values()} == {"process", "runpod"}
    for spec in specs.values():
        if worker_class(spec.type) is None:
            continue
        props = base_job_template(spec)["variables"]["properties"]
        for key, value in spec.defaults.items():
            if isinstance(value, str):  # {python}: the deploying interpreter (tests/test_job_host.py)
                value = value.replace("{python}", sys.executable)
            assert props[key]["default"] == value
    assert concurrency(specs["local-gpu"], gpus=4) == 4  # one cell per GPU
    assert concurrency(specs["cpu"], gpus=4) is None


def test_redeploying_keeps_what_was_set_in_the_ui():
    from flows.runtime.deploy import PoolSpec, keep_ui_edits

    stock = {"variables": {"properties": {"image": {"default": None}, "env": {"default": {}}, "gpu_count": {"default": 1}}}}
    spec = PoolSpec("runpod-gpu", "runpod", defaults={"env": {"A": "1"}})
    new = {"variables": {"properties": {"image": {"default": None}, "env": {"default": {"A": "1"}},
                                        "gpu_count": {"default": 1}}}}
    live = {"variables": {"properties": {"image": {"default": "ghcr.io/lab/eps:abc"}, "env": {"default": {"B": "2"}},
                                         "gpu_count": {"default": 2}}}}
    merged = keep_ui_edits(new, live, stock, spec)["variables"]["properties"]
    assert merged["image"]["default"] == "ghcr.io/lab/eps:abc" and merged["gpu_count"]["default"] == 2
    assert merged["env"]["default"] == {"A": "1"}  # the pool file sets env: the file wins


def test_deploy_twice_is_idempotent_and_skips_pools_of_missing_worker_types(capsys, monkeypatch):
    from prefect.client.orchestration import get_client

    import flows.runtime.deploy as deploy_mod
    from flows.cli import main

    real = deploy_mod.worker_class
    monkeypatch.setattr(deploy_mod, "worker_class", lambda t: None if t == "runpod" else real(t))
    with get_client(sync_client=True) as client:  # a pool left by another test would change what is deployed
        drop_pools(client)
    assert main(["deploy", "--gpus", "2"]) == 0
    first = capsys.readouterr().out
    assert "work pool local-gpu: created (type process, concurrency limit 2)" in first
    assert "skip work pool runpod-gpu: worker type 'runpod' is not installed" in first
    assert "skip deployment job-runpod: its pool runpod-gpu does not exist" in first
    assert main(["deploy", "--gpus", "2", "--aggregate-cron", "*/5 * * * *"]) == 0
    second = capsys.readouterr().out
    assert "work pool local-gpu: updated" in second and "deployment aggregate -> pool cpu" in second
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name("aggregate-all/aggregate")
        assert [s.schedule.cron for s in client.read_deployment_schedules(dep.id)] == ["*/5 * * * *"]
        assert client.read_work_pool("local-gpu").concurrency_limit == 2
        for name in ("screen/screen", "screen/preset", "job/job-local-gpu"):  # the preset resolves its path here
            assert client.read_deployment_by_name(name).pull_steps == [
                {"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}]
        drop_pools(client)


def test_the_aggregate_schedule_starts_only_once_the_deployment_has_the_new_store():
    """A schedule created before the store was set let the scheduler make a run with the old store (CI saw the
    scheduled aggregate read an empty `results`). When the schedule reaches the server, the deployment there must
    already carry the new store."""
    from prefect.client.orchestration import get_client

    from flows.runtime.deploy import set_aggregate
    from flows.runtime.names import AGGREGATE

    seen: list[str] = []

    class Watching:  # the real client; on schedule creation it reads what the server holds at that moment
        def __init__(self, client):
            self.client = client

        def __getattr__(self, name):
            return getattr(self.client, name)

        def create_deployment_schedules(self, deployment_id, schedules):
            seen.append(self.client.read_deployment(deployment_id).parameters["store"])
            return self.client.create_deployment_schedules(deployment_id, schedules)

    flow_name, name = AGGREGATE.flow, AGGREGATE.name
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name(flow_name)
        dep_id = client.create_deployment(flow_id, name, entrypoint="flows/aggregate.py:aggregate_all",
                                          parameters={"store": "results"})
        try:
            changed = set_aggregate(Watching(client), "* * * * *", "/data/store")
            assert changed == ["store '/data/store'", "schedule cron '* * * * *' (UTC)"]
            assert seen == ["/data/store"]
            assert [s.schedule.cron for s in client.read_deployment_schedules(dep_id)] == ["* * * * *"]
        finally:
            client.delete_deployment(dep_id)


def test_print_template_gives_prefects_own_format(capsys):
    from flows.cli import main

    assert main(["deploy", "--print-template", "local-gpu"]) == 0
    template = json.loads(capsys.readouterr().out)
    assert set(template) == {"job_configuration", "variables"}
    assert template["variables"]["properties"]["env"]["default"]["TOKENIZERS_PARALLELISM"] == "true"


# --- status, retry, report on a finished simulated screen ---------------------------------------------------------
@pytest.fixture(scope="module")
def screen_store(tmp_path_factory):
    from eps_screen.spec.config import load_config
    from flows.screen import screen

    store = tmp_path_factory.mktemp("ops-store")
    config = load_config(CONFIGS / "simulated.yaml").model_copy(update={"store": str(store), "name": "ops"})
    assert screen(config, return_state=True).is_completed()
    return store, store / "ops"


def markers(screen_dir: Path) -> dict[str, int]:
    return {p.parent.parent.name: p.stat().st_ino for p in screen_dir.glob("cells/*/*/metrics.json")}


def test_status_per_phase_and_per_cell(screen_store, capsys):
    from flows.cli import main

    store, _ = screen_store
    assert main(["status", "ops", "--store", str(store), "--cells", "all"]) == 0
    out = capsys.readouterr().out
    assert "latest screen run" in out and "Completed" in out
    for row in ("smoke", "slab librarian", "slab surgeon", "slab programmer", "multiseed", "all distinct"):
        assert row in out
    assert "librarian-A0B0C0D0E0-s42" in out and "finished" in out
    assert "pre-screen contamination" in out  # the gates table


def test_unknown_screen_is_one_line(screen_store, capsys):
    from flows.cli import main

    store, _ = screen_store
    assert main(["status", "nope", "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: no screen 'nope' in store {store} (found: ops)"]


def test_retry_recomputes_only_the_unfinished_cells_then_reports(screen_store, capsys):
    from flows.cli import main

    store, screen_dir = screen_store
    lost = ["programmer-A1B1C1D1E1-s42", "surgeon-A0B1C0D1E0-s42"]
    for cell in lost:
        shutil.rmtree(screen_dir / "cells" / cell)
    report = screen_dir / "report" / "clean_result.html"
    before, report_before = markers(screen_dir), report.stat().st_mtime_ns
    assert main(["status", "ops", "--store", str(store)]) == 0
    status = capsys.readouterr().out
    assert all(cell in status for cell in lost) and "todo" in status

    assert main(["retry", "ops", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    # a lost slab cell hides the multi-seed pick until it is back
    assert "94 of 96 known cells finished; to compute: 2 missing (+ the multi-seed cells" in out
    assert "114 of 114 cells finished" in out
    after = markers(screen_dir)
    assert set(after) == set(before) | set(lost)
    assert {c: after[c] for c in before} == before  # no finished cell rewritten
    assert report.stat().st_mtime_ns > report_before

    assert main(["report", "ops", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == str(report) and "ops: 114 cells" in out


# --- a dead screen run is told apart by its host and pid (issue 11, item 5) ----------------------------------------
def test_every_screen_run_records_its_host_and_pid(screen_store):
    """However it started (this CLI, or a pool worker that records only a bare pid), the run names host:pid."""
    from prefect.client.orchestration import get_client

    from flows.runtime.runs import owner_tag, screen_runs

    with get_client(sync_client=True) as client:
        runs = screen_runs(client, "ops")
    assert runs and all(r.infrastructure_pid == owner_tag() for r in runs)  # the fixture called the flow directly


def test_status_and_retry_tell_a_dead_run_on_this_host(screen_store, capsys, monkeypatch):
    import socket
    import subprocess
    import sys

    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Running

    import flows.runtime.submit as submit
    from eps_screen.store.result_store import load_screen
    from flows.cli import main
    from flows.screen import screen

    store, _ = screen_store
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(child.stdout)  # a process of this host that has exited
    config = load_screen(store, "ops")
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(screen, parameters={"config": config.model_dump(mode="json")}, state=Running())
        client.update_flow_run(run.id, infrastructure_pid=f"{socket.gethostname()}:{dead_pid}")
    assert main(["status", "ops", "--store", str(store), "--cells", "none"]) == 0
    out = capsys.readouterr().out
    assert "Running" in out and "[process gone]" in out and "not on this host" not in out

    monkeypatch.setattr(submit, "run_screen_here", lambda config, store, plan, console, **_: Completed())  # only the marking matters here
    assert main(["retry", "ops", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert f"({run.id}) Crashed: its process is gone" in out and "--force" not in out
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run.id).state.type.value == "CRASHED"


# --- retry on a screen of declared factors (sim-6-2.yaml: a 2^(6-2) of six fields) ---------------------------------
def test_retry_of_a_declared_design_recomputes_only_its_lost_cells(tmp_path, capsys):
    from eps_screen.spec.config import parse_config
    from flows.cli import main
    from flows.screen import screen

    data = yaml.safe_load((CONFIGS / "sim-6-2.yaml").read_text())
    data.update(name="declared", store=str(tmp_path), sources=["librarian", "surgeon"],
                eval={"personas": 4, "questions": 6, "samples": 2, "random_controls": 2},
                seeds={"multiseed": [137], "top_k": 2}, bootstrap={"resamples": 200})
    assert screen(parse_config(data), return_state=True).is_completed()
    screen_dir = tmp_path / "declared"
    lost = ["surgeon-A1B1C1D1E1F1-s42", "librarian-A1B0C0D0E1F0-s42"]  # slab runs of E=ABC, F=BCD
    for cell in lost:
        shutil.rmtree(screen_dir / "cells" / cell)
    before = markers(screen_dir)
    assert main(["retry", "declared", "--store", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "30 of 32 known cells finished; to compute: 2 missing (+ the multi-seed cells" in out
    assert "36 of 36 cells finished" in out  # 2 x 16 slab cells and 2 x 2 at the extra seed
    after = markers(screen_dir)
    assert set(after) == set(before) | set(lost) and {c: after[c] for c in before} == before
