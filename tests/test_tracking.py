"""MLflow tracking (eps_screen/run/tracking.py) without a server: off, it imports nothing; unreachable, a cell still
finishes with one warning; a URI's credentials are refused in the config and never shown. The tracked screen itself,
against a real `mlflow server`, is tests/integration/test_marker_screen.py."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from eps_screen.run import tracking
from eps_screen.spec.config import ConfigError, parse_config
from eps_screen.spec.design import all_slab_cells
from eps_screen.store.result_store import ResultStore
from tests.conftest import ROOT
from tests.integration.conftest import free_port


def _config(store, **tracking_section):
    return parse_config({"name": "tracked", "model": {"base": "tiny"}, "store": str(store),
                         **({"tracking": tracking_section} if tracking_section else {})})


@pytest.mark.parametrize("uri", ["http://alice:hunter2@mlflow.example:5000", "https://mlflow.example/?token=hunter2"])
def test_a_uri_with_credentials_is_refused_without_echoing_them(tmp_path, uri):
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, backend="mlflow", uri=uri)
    assert "hunter2" not in str(err.value)
    assert "MLFLOW_TRACKING_USERNAME" in str(err.value)


def test_tracking_is_off_by_default_and_a_uri_alone_does_not_turn_it_on(tmp_path):
    assert _config(tmp_path).tracking.backend == "none"
    with pytest.raises(ConfigError, match="backend is none"):
        _config(tmp_path, uri="http://127.0.0.1:5000")


def test_shown_drops_user_password_and_query():
    shown = tracking.shown("https://alice:hunter2@mlflow.example:5000/base?token=x")
    assert shown == "https://mlflow.example:5000/base"
    assert tracking.shown("sqlite:////tmp/mlflow.db") == "sqlite:////tmp/mlflow.db"


def test_an_unreachable_server_warns_and_the_cell_goes_on(tmp_path, monkeypatch, caplog):
    # The URI from the environment, where credentials may be: the warning names the server without them.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alice:hunter2@127.0.0.1:{free_port()}")
    config = _config(tmp_path, backend="mlflow")
    store = ResultStore.for_config(config)
    cell = all_slab_cells(config)[0]
    metrics = tmp_path / "metrics.json"
    metrics.write_text("{}")
    with caplog.at_level(logging.WARNING, logger="eps_screen.run.tracking"):
        tracking.start_screen(config, store)
        with tracking.cell_run(config, cell, store, {}) as run:
            run.step(1, {"loss": 1.0, "learning_rate": 1e-4, "tokens_per_s": 10.0})
            run.finished({"source_rate": 0.5, "leakage": 0.1}, metrics)
        tracking.log_aggregation(config, store, {"report": str(metrics)})
    assert not run.live
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings and all("127.0.0.1" in w and "hunter2" not in w and "alice" not in w for w in warnings)


def test_a_cell_that_raises_propagates_with_tracking_unreachable(tmp_path, monkeypatch):
    config = _config(tmp_path, backend="mlflow", uri=f"http://127.0.0.1:{free_port()}")
    store = ResultStore.for_config(config)
    with pytest.raises(RuntimeError, match="the cell's own error"):
        with tracking.cell_run(config, all_slab_cells(config)[0], store, {}):
            raise RuntimeError("the cell's own error")


def test_tracking_off_never_imports_mlflow(tmp_path):
    code = (
        "import sys\n"
        "from eps_screen.run import tracking\n"
        "from eps_screen.spec.config import parse_config\n"
        "from eps_screen.spec.design import all_slab_cells\n"
        "from eps_screen.store.result_store import ResultStore\n"
        f"config = parse_config({{'model': {{'base': 'tiny'}}, 'store': {str(tmp_path)!r}}})\n"
        "store = ResultStore.for_config(config)\n"
        "tracking.start_screen(config, store)\n"
        "with tracking.cell_run(config, all_slab_cells(config)[0], store, {}) as run:\n"
        "    run.step(1, {'loss': 1.0})\n"
        "tracking.log_aggregation(config, store, {})\n"
        "print('mlflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
