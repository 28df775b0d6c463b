"""Where the CLI finds a store (issue 43, "The CLI at the edges"): a store that does not exist is an error naming its
path (exit 2), never an empty table; status, retry and report take the screen's config file, or find the store of a
screen named alone in `results` or among the stores registered on this machine.

The store holds one simulated screen's smoke cells, written straight through the pipeline (no Prefect); status reads
only the store (--store-only).
"""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from eps_screen.report.stores import register
from eps_screen.run import pipeline
from eps_screen.spec import design
from eps_screen.store.result_store import ResultStore
from flows.cli import main
from tests.conftest import tiny_config

SIMULATED = {"generation": "simulated", "training": "simulated"}


@pytest.fixture(scope="module")
def screen_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("lookup-store")
    config = tiny_config(root, name="lookup", backend=SIMULATED)
    store = ResultStore.for_config(config)
    store.save_screen({"config": config.model_dump(mode="json"), "provenance": {}})
    for cell in design.smoke_cells(config):
        pipeline.run_cell(config, cell, store)
    return root, config


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working directory with no `results`, and a registry of stores of this test's own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EPS_SCREEN_CACHE", str(tmp_path / "cache"))
    return tmp_path


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("argv", [("results", "--store", "{missing}"), ("results",),
                                  ("status", "lookup", "--store", "{missing}"),
                                  ("report", "lookup", "--store", "{missing}")])
def test_a_store_that_does_not_exist_is_an_error_naming_its_path(elsewhere, argv):
    missing = elsewhere / "no" / "such"
    code, out, err = cli(*(a.format(missing=missing) for a in argv))
    path = missing if "--store" in argv else elsewhere / "results"
    assert code == 2 and not out, out
    assert err.startswith(f"error: no store at {path} (") and len(err.strip().splitlines()) == 1, err


def test_status_takes_the_config_file(screen_store, elsewhere):
    root, config = screen_store
    path = elsewhere / "mine.yaml"
    path.write_text(yaml.safe_dump({**config.model_dump(mode="json"), "store": str(root)}))
    code, out, err = cli("status", str(path), "--store-only", "--cells", "none")
    assert code == 0, err
    assert "lookup" in out and "smoke" in out

    path.write_text(yaml.safe_dump({**config.model_dump(mode="json"), "store": "results"}))
    code, out, err = cli("status", str(path), "--store-only")
    assert code == 2 and f"no store at {elsewhere / 'results'} (store: results in {path}" in err


def test_a_screen_named_alone_is_found_in_the_store_its_run_registered(screen_store, elsewhere):
    root, config = screen_store
    code, _, err = cli("status", "lookup", "--store-only")
    assert code == 2 and "no screen 'lookup' in" in err and "registered on this machine" in err

    register(ResultStore.for_config(config))  # what `eps-screen run` does first
    code, out, err = cli("status", "lookup", "--store-only", "--cells", "none")
    assert code == 0, err
    assert "lookup" in out

    other = elsewhere / "other-store"  # a second registered store with a screen of that name
    (other / "lookup").mkdir(parents=True)
    (other / "lookup" / "screen.json").write_text((root / "lookup" / "screen.json").read_text())
    register(ResultStore(str(other), "lookup"))
    code, _, err = cli("status", "lookup", "--store-only")
    assert code == 2 and "several stores" in err and str(Path(root).resolve()) in err and str(other) in err
