"""Experiment tracking in MLflow (`tracking.backend: mlflow`; off by default): a screen is a parent run, each of its
cells a child run of it (tag mlflow.parentRunId).

Every process finds its runs by tags, never by an id handed to it: the screen's process, a cell pool worker and a GPU
pod each look up the parent (in the experiment, tags eps_kind=screen, eps_screen=NAME and eps_store=a digest of the
store's location) and a cell's child (under that parent, eps_cell_key=the cell's content key, store.cell_key) with
search_runs before creating one, so a re-run or a resubmitted cell logs into the run it had.

  parent  tags: screen, store; the config of its latest run (config.json). At aggregation: each gate's outcome
          (metrics gate_N_fired, gates.json), the report (clean_result.html, summary.md, tag report_url),
          cells_finished, gpu_seconds, cost_usd; ended FINISHED there, or KILLED/FAILED by end_screen.
  child   params: cell id, source, seed, factor levels, the recipe (pipeline._recipe_record, flattened). Per optimizer
          step: loss, learning_rate, tokens_per_s (training.train_lora's callback, or training_together's step loop
          for cells trained in shared passes). Scored: source_rate, leakage, random_control_rate, final_loss and
          metrics.json. At aggregation: gpu_seconds and cost_usd (eps_screen.plan.costs.cell_costs), and the whole
          record of a finished cell that has no run yet (one finished before tracking was on).

Tracking never fails a cell: an unreachable server or a refused call logs one warning and that run logs nothing
more. A tracking URI from the environment may carry credentials, so a URI is only ever shown through `shown`.
mlflow is imported only when tracking is on: the product works without the `mlflow` extra.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import Cell, level_symbol
from eps_screen.store.result_store import ResultStore, cell_key

log = logging.getLogger(__name__)

# MLflow's own HTTP defaults (7 retries with backoff, 120 s per request) would hold a cell for minutes on an
# unreachable server; a user's own settings of these variables win.
_CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30", "MLFLOW_DISABLE_TELEMETRY": "true"}
_FLUSH_S, _FLUSH_POINTS = 5.0, 200  # per-step points are sent in batches: one request per step would pace training


def shown(uri: str) -> str:
    """A tracking URI fit for a log line: no user, password, query or fragment."""
    parts = urlsplit(uri)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}" if parts.scheme else parts.path


def _scrubbed(text: str, uri: str) -> str:
    """An error message with any credentials of URLs in it removed (MLflow's messages quote the request's URL)."""
    return re.sub(r"//[^/@\s'\"]*@", "//", text.replace(uri, shown(uri)))[:300]


class _Server:
    """One process's link to the tracking server for one screen: the client, the experiment and the parent run,
    looked up once and kept (a worker process computes many cells)."""

    def __init__(self, config: ScreenConfig, store: ResultStore):
        self.uri = config.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI", "")
        self.config, self.store = config, store
        self.client = None
        self.experiment_id: str | None = None
        self.parent_id: str | None = None

    def warn(self, what: str, exc: BaseException) -> None:
        log.warning("tracking: %s failed at %s (%s: %s); the screen goes on without it", what, shown(self.uri),
                    type(exc).__name__, _scrubbed(str(exc), self.uri))

    def connect(self) -> None:
        if not self.uri:
            raise RuntimeError("tracking.backend is mlflow, but neither tracking.uri nor MLFLOW_TRACKING_URI is set")
        for name, value in _CLIENT_DEFAULTS.items():
            os.environ.setdefault(name, value)
        # Ending a run would print its URL to stdout, credentials of the URI included; stdout's last line is the
        # report's path (README, "Two commands").
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        if self.uri.startswith(("http://", "https://")):
            import requests

            # A refused connection answers in milliseconds here, where MLflow's client would retry it for seconds.
            requests.get(f"{self.uri.rstrip('/')}/health", timeout=10)
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment_id = self._experiment()
        self.parent_id = self._parent()

    def _experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        name = self.config.tracking.experiment
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:  # another process created it first
            return self.client.get_experiment_by_name(name).experiment_id

    def _parent(self) -> str:
        tags = {"eps_kind": "screen", "eps_screen": self.config.name, "eps_store": _digest(self.store.location)}
        found = self.find(tags)
        if found is not None:
            return found.info.run_id
        run = self.client.create_run(self.experiment_id, run_name=self.config.name,
                                     tags={**tags, "store": self.store.location})
        return run.info.run_id

    def find(self, tags: dict[str, str]):
        """The oldest run of the experiment with these tags, or None."""
        where = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        runs = self.client.search_runs([self.experiment_id], where, max_results=1,
                                       order_by=["attributes.start_time ASC"])
        return runs[0] if runs else None

    def children(self) -> dict[str, object]:
        """Every child run of the parent, by cell key (the oldest of a key, as `find` takes it)."""
        out, token = {}, None
        while True:
            page = self.client.search_runs([self.experiment_id], f"tags.`mlflow.parentRunId` = '{self.parent_id}'",
                                           max_results=1000, page_token=token, order_by=["attributes.start_time ASC"])
            for run in page:
                if "eps_cell_key" in run.data.tags:
                    out.setdefault(run.data.tags["eps_cell_key"], run)
            token = page.token
            if not token:
                return out

    def child(self, cell: Cell) -> str:
        """The cell's run under the parent, created when it has none."""
        key = cell_key(self.config, cell)
        found = self.find({"mlflow.parentRunId": self.parent_id, "eps_cell_key": key})
        if found is not None:
            return found.info.run_id
        return self.new_child(cell, key)

    def new_child(self, cell: Cell, key: str) -> str:
        run = self.client.create_run(self.experiment_id, run_name=cell.id, tags={
            "mlflow.parentRunId": self.parent_id, "eps_kind": "cell", "eps_screen": self.config.name,
            "eps_cell": cell.id, "eps_cell_key": key})
        return run.info.run_id

    def artifact_json(self, run_id: str, name: str, data: dict) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(json.dumps(data, indent=1, default=str))
            self.client.log_artifact(run_id, str(path))


_servers: dict[tuple, _Server] = {}


def _server(config: ScreenConfig, store: ResultStore) -> _Server | None:
    """This process's connected _Server for the screen, or None (tracking off, or the server not reached: warned)."""
    if config.tracking.backend != "mlflow":
        return None
    key = (config.tracking.uri, config.tracking.experiment, config.name, store.location)
    server = _servers.get(key)
    if server is not None:
        return server
    server = _Server(config, store)
    try:
        server.connect()
    except Exception as exc:  # noqa: BLE001 - tracking must never fail a cell; the next cell tries again
        server.warn("connecting", exc)
        return None
    _servers[key] = server
    return server


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _flat(prefix: str, value) -> dict[str, str]:
    if isinstance(value, dict):
        return {k: v for name, item in value.items() for k, v in _flat(f"{prefix}.{name}", item).items()}
    return {prefix: str(value)}


def _params(cell: Cell, recipe: dict) -> dict[str, str]:
    """A child run's params: the cell, each declared factor's level, and its recipe (pipeline._recipe_record)."""
    params = {"cell_id": cell.id, "source": cell.source, "seed": str(cell.seed)}
    params.update((f"factor.{f}", level_symbol(level)) for f, level in zip(cell.factors, cell.levels, strict=True))
    for section, value in recipe.items():
        params.update(_flat(f"recipe.{section}", value))
    return params


def _results(metrics: dict) -> dict[str, float]:
    """What a finished cell's metrics.json holds that is tracked as a metric."""
    out = {k: metrics.get(k) for k in ("source_rate", "leakage", "random_control_rate")}
    out["final_loss"] = (metrics.get("train") or {}).get("final_loss")
    out["cell_seconds"] = (metrics.get("timings") or {}).get("total_s")
    return {k: float(v) for k, v in out.items() if v is not None}


def start_screen(config: ScreenConfig, store: ResultStore) -> None:
    """The screen's parent run, found or created (its cells' processes find it by its tags), marked running, with
    the config this run has (a re-run with a changed recipe replaces config.json)."""
    server = _server(config, store)
    if server is None:
        return
    try:
        server.client.update_run(server.parent_id, status="RUNNING")
        server.artifact_json(server.parent_id, "config.json", config.model_dump(mode="json"))
    except Exception as exc:  # noqa: BLE001
        server.warn("marking the screen's run running", exc)


class CellRun:
    """A cell's child run while the cell is computed: `step` takes per-step training metrics (a training.StepLog),
    `finished` the cell's metrics once scored. After a failed call it logs nothing more."""

    def __init__(self, server: _Server | None, run_id: str | None):
        self.server, self.run_id = server, run_id
        self._points: list = []
        self._sent = time.monotonic()
        self._ended = False

    @property
    def live(self) -> bool:
        return self.server is not None and self.run_id is not None

    def _call(self, what: str, method: str, *args, **kwargs) -> None:
        """client.<method>(run id, ...), unless an earlier call failed; a failure is warned and ends the logging."""
        if not self.live:
            return
        try:
            getattr(self.server.client, method)(self.run_id, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - tracking must never fail a cell
            self.server.warn(what, exc)
            self.run_id = None

    def step(self, step: int, values: dict[str, float]) -> None:
        if not self.live:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._points += [Metric(k, float(v), now, step) for k, v in values.items() if v is not None]
        if len(self._points) >= _FLUSH_POINTS or time.monotonic() - self._sent > _FLUSH_S:
            self.flush()

    def flush(self) -> None:
        points, self._points, self._sent = self._points, [], time.monotonic()
        if points:
            self._call("logging training steps", "log_batch", metrics=points)

    def finished(self, metrics: dict, metrics_path: Path) -> None:
        self._ended = True
        self.flush()
        if not self.live:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        points = [Metric(k, v, now, 0) for k, v in _results(metrics).items()]
        self._call("logging the cell's results", "log_batch", metrics=points)
        self._call("logging metrics.json", "log_artifact", str(metrics_path))
        self._call("ending the cell's run", "set_terminated", "FINISHED")

    def failed(self) -> None:
        if self._ended:  # a job's cell scored before another of its cells failed keeps its FINISHED run
            return
        self.flush()
        self._call("ending the cell's run", "set_terminated", "FAILED")


@contextmanager
def cell_run(config: ScreenConfig, cell: Cell, store: ResultStore, recipe: dict) -> Iterator[CellRun]:
    """The cell's child run (found by its content key, or created) for the time the cell is computed; ended FAILED
    when the computation raises. Tracking off or unreachable: a CellRun that logs nothing."""
    server = _server(config, store)
    run = CellRun(server, None)
    if server is not None:
        try:
            run.run_id = server.child(cell)
            server.client.update_run(run.run_id, status="RUNNING")
            server.client.log_batch(run.run_id, params=_param_list(_params(cell, recipe)))
        except Exception as exc:  # noqa: BLE001
            server.warn(f"opening the run of cell {cell.id}", exc)
            run.run_id = None
    try:
        yield run
    except BaseException:
        run.failed()
        raise


def _param_list(params: dict[str, str]) -> list:
    from mlflow.entities import Param

    return [Param(k, v[:6000]) for k, v in params.items()]


def log_aggregation(config: ScreenConfig, store: ResultStore, summary: dict) -> None:
    """At the end of the aggregation: each finished cell's GPU-seconds and cost on its run (a run created, with the
    cell's whole record, for a cell that has none), and the gates and the report on the parent, which it ends."""
    server = _server(config, store)
    if server is None:
        return
    from eps_screen.plan.costs import cell_costs, screen_cost

    try:
        costs = cell_costs(config, store)
        _log_cells(server, config, store, costs)
        _log_screen(server, store, summary, len(costs), screen_cost(config, store))
    except Exception as exc:  # noqa: BLE001 - a report is not worth less for a tracking server that is down
        server.warn("logging the aggregation", exc)


def _log_cells(server: _Server, config: ScreenConfig, store: ResultStore, costs: dict) -> None:
    from mlflow.entities import Metric

    runs = server.children()
    now = int(time.time() * 1000)
    for cell_id, cost in costs.items():
        cell = Cell.parse(cell_id)
        key = cell_key(config, cell)
        run = runs.get(key)
        run_id = run.info.run_id if run is not None else server.new_child(cell, key)
        had = run.data.metrics if run is not None else {}
        values = {"gpu_seconds": cost.gpu_seconds, "cost_usd": cost.usd}
        params = []
        if "source_rate" not in had:  # finished before tracking was on, or its own logging failed
            metrics = store.cell_metrics(config, cell)
            values.update(_results(metrics))
            params = _param_list(_params(cell, metrics.get("recipe") or {}))
            server.client.log_artifact(run_id, str(store.cell_dir(config, cell) / "metrics.json"))
        points = [Metric(k, float(v), now, 0) for k, v in values.items() if had.get(k) != float(v)]
        if points or params:
            server.client.log_batch(run_id, metrics=points, params=params)
        if run is None or run.info.status != "FINISHED":
            server.client.set_terminated(run_id, "FINISHED")


def end_screen(config: ScreenConfig, store: ResultStore, killed: bool) -> None:
    """A screen that stopped before its aggregation: its gates on the parent run, ended KILLED (a gate fired) or
    FAILED."""
    server = _server(config, store)
    if server is None:
        return
    try:
        _log_gates(server, store, {})
        server.client.set_terminated(server.parent_id, "KILLED" if killed else "FAILED")
    except Exception as exc:  # noqa: BLE001
        server.warn("ending the screen's run", exc)


def _log_gates(server: _Server, store: ResultStore, values: dict[str, float], tags: list | None = None) -> None:
    """Each gate's outcome (metric gate_N_fired, 1 when it fired; gates.json) and `values` on the parent run."""
    from mlflow.entities import Metric

    gates = sorted(store.gates(), key=lambda g: int(g["number"]))
    values = {**values, **{f"gate_{g['number']}_fired": float(bool(g.get("fired")))
                           for g in gates if g.get("evaluated", True)}}
    now = int(time.time() * 1000)
    server.client.log_batch(server.parent_id, metrics=[Metric(k, v, now, 0) for k, v in values.items()],
                            tags=tags or [])
    server.artifact_json(server.parent_id, "gates.json", {"gates": gates})


def _log_screen(server: _Server, store: ResultStore, summary: dict, finished: int, cost) -> None:
    """The parent's figures: the screen's whole cost (its cells, the pre-screen and runs for no current cell, as
    the report's Cost section has it) beside the plan's estimate."""
    from mlflow.entities import RunTag

    parent = server.parent_id
    values = {"cells_finished": float(finished), "cost_usd": cost.usd, "gpu_seconds": cost.gpu_seconds}
    values.update({name: float(v) for name, v in (("estimate_cost_usd", cost.estimate_usd),
                                                  ("estimate_gpu_hours", cost.estimate_gpu_hours)) if v is not None})
    _log_gates(server, store, values, [RunTag("report_url", str(summary["url"]))] if summary.get("url") else [])
    if summary.get("markdown"):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "summary.md"
            path.write_text(summary["markdown"])
            server.client.log_artifact(parent, str(path))
    report = Path(summary["report"]) if summary.get("report") else None
    if report is not None and report.is_file():
        server.client.log_artifact(parent, str(report))
    server.client.set_terminated(parent, "FINISHED")
