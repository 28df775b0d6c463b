"""The Prefect UI shows a screen the way a researcher needs it (issue 6, "Done when" 1).

A real `prefect server start` with the UI on 127.0.0.1, the pools and deployments applied by `eps-screen deploy`,
a `cpu` worker, and a simulated screen (all 114 cells, in the screen's own process) triggered through the API as
a run of the `screen` deployment. Headless Chromium then renders the flow run's page (its task-run and artifact
tabs) and the artifact list; the test reads the DOM after the scripts ran. Screenshots: test-output/ui-*.png.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import anyio
import pytest
import yaml

from tests.integration.conftest import ROOT
from tests.integration.servers import EPS_SCREEN, client_env, prefect_server, server_errors, worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--hide-scrollbars", "--virtual-time-budget=15000",
         "--window-size=1600,1200"]
OUT = ROOT / "test-output"


def browse(url: str, profile: Path, screenshot: Path | None = None) -> str:
    """The page's text after its scripts ran (and a screenshot when asked)."""
    base = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}"]
    if screenshot is not None:
        subprocess.run([*base, f"--screenshot={screenshot}", url], capture_output=True, timeout=120)
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))


async def trigger_and_wait(config: dict, limit_s: float = 300):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    run = await run_deployment("screen/screen", parameters={"config": config}, timeout=0)
    progress: list[float] = []
    async with get_client() as client:
        deadline = time.monotonic() + limit_s
        while not (state := (await client.read_flow_run(run.id)).state).is_final():
            assert time.monotonic() < deadline, "screen run did not finish"
            progress += [a.data for a in await progress_artifacts(client, config["name"])]
            await anyio.sleep(0.5)
        artifacts = await client.read_artifacts(limit=200)
    return run, state, progress, artifacts


async def progress_artifacts(client, name: str):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    return await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"progress-{name}"])))


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")
def test_flow_run_page_lists_cell_runs_and_artifacts(tmp_path: Path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    OUT.mkdir(exist_ok=True)
    config = yaml.safe_load((ROOT / "deployments" / "configs" / "simulated.yaml").read_text())
    config.update(name="ui-screen", store=str(tmp_path / "store"))
    with prefect_server(tmp_path / "server", PREFECT_UI_ENABLED="true") as (api, server_log):
        env = client_env(tmp_path / "cli", api)
        deployed = subprocess.run([EPS_SCREEN, "deploy", "--pool", "cpu"], env=env, cwd=ROOT, capture_output=True,
                                  text=True, timeout=300)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        assert "deployment screen -> pool cpu" in deployed.stdout
        with worker("cpu", client_env(tmp_path / "worker", api, PREFECT_WORKER_QUERY_SECONDS="1"),
                    tmp_path / "worker.log", "--name", "cpu-ui-test"):
            with temporary_settings({PREFECT_API_URL: api}):
                run, state, progress, artifacts = anyio.run(trigger_and_wait, config)
        assert state.is_completed(), (state, (tmp_path / "worker.log").read_text()[-3000:])

        # the artifacts, through the API: one table per cell, the summary, the report link, the progress
        keys = {a.key for a in artifacts if a.key}
        assert {"summary-ui-screen", "report-ui-screen", "progress-ui-screen"} <= keys
        assert sum(1 for k in keys if k.startswith("cell-ui-screen-")) == 114
        moving = sorted({p for p in progress if 0 < p < 100})
        assert moving, f"the progress artifact never showed an intermediate value: {sorted(set(progress))}"

        ui = api.removesuffix("/api")
        page = f"{ui}/runs/flow-run/{run.id}"
        profile = tmp_path / "chromium"
        tasks = browse(f"{page}?tab=Task%20Runs", profile, OUT / "ui-flow-run.png")
        arts = browse(f"{page}?tab=Artifacts", profile, OUT / "ui-flow-run-artifacts.png")
        listing = browse(f"{ui}/artifacts", profile, OUT / "ui-artifacts.png")
        for name, text in (("tasks", tasks), ("artifacts", arts), ("listing", listing)):
            (OUT / f"ui-{name}.txt").write_text(text)
        assert run.name in tasks and "Completed" in tasks
        assert re.search(r"cell (librarian|software_engineer|nurse)-A[01]B[01]C[01]D[01]E[01]-s\d+", tasks), tasks[:2000]
        assert "progress-ui-screen" in arts and re.search(r"cell-ui-screen-", arts), arts[:2000]
        assert "summary-ui-screen" in listing and "report-ui-screen" in listing, listing[:2000]
        assert server_errors(server_log) == []
    assert (OUT / "ui-flow-run.png").stat().st_size > 10_000
