"""`status` and `report` on a local store without any Prefect server, and `run`'s live progress.

No Prefect harness here: a temporary server that starts fails the test, and every HTTP request the commands
send is recorded (at most one /health check, never a retry loop against an API that is not there). The store is
a simulated tiny.yaml screen written straight through the pipeline (the pre-screen and 96 slab cells, about a
second).
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from tests.conftest import tiny_config

SIMULATED = {"generation": "simulated", "training": "simulated"}


def simulated_tiny(store: Path):
    return tiny_config(store, name="offline", backend=SIMULATED, bootstrap={"resamples": 200})


@pytest.fixture(scope="module")
def offline_store(tmp_path_factory):
    from eps_screen.run import pipeline
    from eps_screen.spec import design
    from eps_screen.store.result_store import ResultStore

    root = tmp_path_factory.mktemp("offline-store")
    config = simulated_tiny(root)
    store = ResultStore.for_config(config)
    store.save_screen({"config": config.model_dump(mode="json"), "provenance": {}})
    pipeline.pre_screen(config, store)
    for cell in design.all_slab_cells(config):
        pipeline.run_cell(config, cell, store)
    return root


@pytest.fixture
def no_server(monkeypatch):
    """Starting Prefect's temporary server is an error."""
    from prefect.server.api.server import SubprocessASGIServer

    def refuse(self, *args, **kwargs):
        raise AssertionError("a temporary Prefect server was started")

    monkeypatch.setattr(SubprocessASGIServer, "start", refuse)


@pytest.fixture
def http_requests(monkeypatch) -> list[str]:
    """Every HTTP request sent, sync or async, as 'METHOD url'."""
    import httpx

    sent: list[str] = []
    sync, asynchronous = httpx.HTTPTransport.handle_request, httpx.AsyncHTTPTransport.handle_async_request

    def handle(self, request):
        sent.append(f"{request.method} {request.url}")
        return sync(self, request)

    async def handle_async(self, request):
        sent.append(f"{request.method} {request.url}")
        return await asynchronous(self, request)

    monkeypatch.setattr(httpx.HTTPTransport, "handle_request", handle)
    monkeypatch.setattr(httpx.AsyncHTTPTransport, "handle_async_request", handle_async)
    return sent


def sent_by_the_commands(requests: list[str], api: str | None) -> list[str]:
    """The requests, less Prefect's log shipping to another server: an earlier test's flow runs in this worker
    process leave a background log worker posting to its (temporary) server's /api/logs/, once seen in CI."""
    return [r for r in requests if not (r.startswith("POST ") and r.endswith("/api/logs/")
                                        and (api is None or not r.startswith(f"POST {api}/")))]


@pytest.mark.parametrize("api", [None, "http://127.0.0.1:9/api"], ids=["no-api-url", "api-url-nowhere"])
def test_status_and_report_need_no_server(offline_store, no_server, http_requests, api, capsys):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.cli import main

    settings = {"updates": {PREFECT_API_URL: api}} if api else {"restore_defaults": {PREFECT_API_URL}}
    # No server started (no_server), and no wait on the one that is not there: each command's only request is one
    # /health check, not retried (a temporary server alone took 16 s; retries against a dead URL take as long)
    one_check = [] if api is None else [f"GET {api}/health"]
    with temporary_settings(**settings):
        assert main(["status", "offline", "--store", str(offline_store), "--cells", "none"]) == 0
        out = capsys.readouterr().out
        assert "slab librarian" in out and "all distinct" in out
        assert ("not set" if api is None else "not reachable") in out
        assert sent_by_the_commands(http_requests, api) == one_check, http_requests

        http_requests.clear()
        assert main(["report", "offline", "--store", str(offline_store)]) == 0
    out = capsys.readouterr().out
    report = offline_store / "offline" / "report" / "clean_result.html"
    assert out.strip().splitlines()[-1] == str(report) and report.is_file()
    assert "offline: 96 cells (partial)" in out
    assert sent_by_the_commands(http_requests, api) == one_check, http_requests


def progress_output(tmp_path: Path, terminal: bool) -> str:
    from rich.console import Console

    from eps_screen.plan.screen_plan import make_plan
    from eps_screen.run import pipeline
    from eps_screen.spec import design
    from eps_screen.store.result_store import ResultStore
    from flows.runtime.terminal import TerminalProgress

    config = simulated_tiny(tmp_path)
    store = ResultStore.for_config(config)
    text = io.StringIO()
    console = Console(file=text, force_terminal=terminal, width=160)
    with TerminalProgress(config, store, make_plan(config).distinct_cells, console, "screen offline", poll_s=0.02):
        time.sleep(0.1)
        pipeline.pre_screen(config, store)
        time.sleep(0.1)
        for cell in design.smoke_cells(config):
            pipeline.run_cell(config, cell, store)
            time.sleep(0.05)
        time.sleep(0.1)
    return text.getvalue()


def test_progress_plain_lines_when_not_a_terminal(tmp_path):
    lines = progress_output(tmp_path, terminal=False).splitlines()
    assert "\x1b" not in "".join(lines)  # no cursor movement or colour in a pipe
    assert "builds the tiny model" in lines[0]  # what the first minutes of a first run are spent on
    assert lines[1].startswith("screen offline: phase 0: pre-screen | 0/114 cells |") and "time left ?" in lines[1]
    assert any("phase 1: smoke 3/8 | 3/114 cells" in line for line in lines)
    assert "phase 2: slabs 8/96 | 8/114 cells" in lines[-1]
    assert "time left ~" in lines[-1]  # the pace of the cells finished here gives the time left
    assert len(lines) <= 1 + 2 + 8 + 1  # a line per change, not per poll


def test_progress_bar_on_a_terminal(tmp_path):
    out = progress_output(tmp_path, terminal=True)
    assert "\x1b" in out and "8/114" in out and "phase 2: slabs" in out


def test_prefect_log_lines_print_above_the_live_bar_not_into_it(tmp_path):
    """While the bar is live a Prefect log line goes through the bar's console (rich prints it whole, above the
    bar); its handler's own stream gets nothing, and has its console back once the bar stops."""
    import logging

    from rich.console import Console

    from eps_screen.plan.screen_plan import make_plan
    from eps_screen.store.result_store import ResultStore
    from flows.runtime.terminal import TerminalProgress
    from prefect.logging.handlers import PrefectConsoleHandler

    config = simulated_tiny(tmp_path)
    own, text = io.StringIO(), io.StringIO()
    handler = PrefectConsoleHandler(stream=own)
    logger = logging.getLogger("prefect.eps-test")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    console = Console(file=text, force_terminal=True, width=160)
    try:
        with TerminalProgress(config, ResultStore.for_config(config), make_plan(config).distinct_cells, console,
                              "screen offline", poll_s=0.02):
            time.sleep(0.1)
            logger.info("Starting the smoke phase")
            time.sleep(0.1)
        assert handler.console.file is own  # restored
        logger.info("after the bar")
    finally:
        logger.removeHandler(handler)
    out = text.getvalue()
    assert "Starting the smoke phase" in out and "Starting the smoke phase" not in own.getvalue()
    line = next(x for x in out.split("\n") if "Starting the smoke phase" in x)
    shown = line.split("\r")[-1].replace("\x1b[2K", "")  # what the terminal shows: the bar's line erased first
    assert shown == "Starting the smoke phase"  # a line of its own: the bar's text is never glued to it
    assert "after the bar" in own.getvalue()


# --- a screen of declared factors: the 2^(6-2) of sim-6-2.yaml with its fold-over ----------------------------------
@pytest.fixture(scope="module")
def declared_store(tmp_path_factory):
    import yaml

    from eps_screen.run import pipeline
    from eps_screen.spec import design
    from eps_screen.spec.config import parse_config
    from eps_screen.store.result_store import ResultStore
    from tests.conftest import CONFIGS

    root = tmp_path_factory.mktemp("declared-store")
    data = yaml.safe_load((CONFIGS / "sim-6-2.yaml").read_text())
    data["design"]["fold_over"] = True
    data.update(store=str(root), eval={"personas": 4, "questions": 6, "samples": 2, "random_controls": 2},
                bootstrap={"resamples": 200})
    config = parse_config(data)
    store = ResultStore.for_config(config)
    store.save_screen({"config": config.model_dump(mode="json"), "provenance": {}})
    pipeline.pre_screen(config, store)
    for cell in design.all_slab_cells(config):  # the smoke's and the fold-over's cells are slab cells
        pipeline.run_cell(config, cell, store)
    return root, config, store


def test_status_lists_the_declared_factors_and_the_fold_over(declared_store, no_server, capsys):
    from flows.cli import main

    root, config, _ = declared_store
    assert main(["status", config.name, "--store", str(root), "--store-only", "--cells", "all"]) == 0
    out = capsys.readouterr().out
    assert ("factors A Learning rate, B LoRA rank, C Epochs, D Positives, E LoRA alpha, F Loss mask; slab 2^(6-2), "
            "E=ABC, F=BCD, resolution IV; smoke 2^(6-3)") in out
    assert "; fold-over 2^(6-3)" in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 3}
    for row, cells in (("smoke", 8), ("fold-over", 8), ("slab librarian", 16), ("slab surgeon", 16),
                       ("slab programmer", 16)):
        assert rows[row].split("│")[2].strip() == str(cells), rows[row]
    assert "librarian-A0B0C0D0E0F0-s42" in out and "todo" not in rows["slab librarian"]


def test_the_summary_shows_the_values_set_and_what_the_cis_omit(declared_store):
    from eps_screen.run.aggregate import aggregate_stored
    from flows.aggregate import _summary_markdown

    _, config, store = declared_store
    _, result = aggregate_stored(config, store)
    assert result.estimates.caveats == []  # the slab's two residual contrasts per source give the training noise
    text = _summary_markdown(config, result, "http://127.0.0.1:8765/sim-6-2/", 48, str(store.root))
    assert "| B LoRA rank | rank 8 (lora.rank = 8) | rank 32 (lora.rank = 32) |" in text
    assert "| A Learning rate | 1e-5 (training.learning_rate = 1e-05) |" in text
    assert "| F Loss mask |" in text and "Caveat" not in text
    off = config.model_copy(update={"bootstrap": config.bootstrap.model_copy(update={"training_noise": False})})
    _, result = aggregate_stored(off, store)
    text = _summary_markdown(off, result, "http://127.0.0.1:8765/sim-6-2/", 48, str(store.root))
    assert result.estimates.caveats and all(f"**Caveat.** {c}" in text for c in result.estimates.caveats)
    assert "The CIs omit training-run noise" in text
