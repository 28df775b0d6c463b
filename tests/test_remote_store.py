"""A result store at an s3:// URL, against a real S3 API (moto's server on 127.0.0.1): two machines (two local
caches) share one store, a half-pushed cell is never finished, and the CLI, doctor and job flow work on it."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests
import yaml

from eps_screen.run import pipeline
from eps_screen.spec.config import ConfigError, parse_config
from eps_screen.spec.design import Cell
from eps_screen.store.remote import Remote
from eps_screen.store.result_store import ResultStore, screen_names
from tests.conftest import CONFIGS
from tests.integration.conftest import free_port

pytestmark = pytest.mark.integration

CELL = Cell("librarian", (1, 0, 1, 0, 1), 42)


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    """moto's S3 server, with dummy credentials in the environment (the way pods and the screen get real ones).

    A process of its own: moto's server is a Flask app, and Flask's context proxies in this process's modules make
    vLLM's CPU kernel rebinding (it calls hasattr on every module global) raise in any later vLLM test."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while True:
            try:
                requests.get(endpoint, timeout=2)
                break
            except requests.RequestException:
                if server.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"moto_server did not start (exit {server.poll()})") from None
                time.sleep(0.2)
        with pytest.MonkeyPatch.context() as mp:
            for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                                "AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": "us-east-1",
                                "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent"}.items():
                mp.setenv(name, value)
            yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_moto_stays_out_of_this_process(s3_endpoint):
    assert "flask" not in sys.modules and "moto" not in sys.modules


@pytest.fixture
def url(s3_endpoint) -> str:
    """A fresh bucket per test; the store lives under a prefix in it."""
    bucket = f"eps-{uuid.uuid4().hex[:12]}"
    Remote(f"s3://{bucket}").fs.mkdir(bucket)
    return f"s3://{bucket}/results"


def simulated(url: str, cache: Path, **overrides):
    data = yaml.safe_load((CONFIGS / "simulated.yaml").read_text())
    data.update(store=url, store_cache=str(cache), **overrides)
    return parse_config(data)


def test_a_cell_saved_through_one_cache_is_finished_in_another(url, tmp_path):
    a, b = simulated(url, tmp_path / "a"), simulated(url, tmp_path / "b")
    store_a, store_b = ResultStore.for_config(a), ResultStore.for_config(b)
    assert store_a.location == store_b.location == f"{url}/simulated" and store_a.dir != store_b.dir
    adapter = store_a.cell_dir(a, CELL) / "adapter" / "adapter_model.safetensors"
    adapter.parent.mkdir(parents=True)
    adapter.write_bytes(b"weights")  # where training leaves the adapter before the cell is saved
    assert not store_b.is_finished(b, CELL)

    metrics = pipeline.run_cell(a, CELL, store_a)

    assert store_b.is_finished(b, CELL)
    assert store_b.cell_metrics(b, CELL)["source_rate"] == metrics["source_rate"]
    answers = store_b.load_answers(b, [CELL])
    assert answers.height == metrics["answers"] and answers.equals(store_a.load_answers(a, [CELL]))
    assert store_a.remote.exists(f"simulated/cells/{CELL.id}/{store_a.cell_dir(a, CELL).name}/adapter/adapter_model.safetensors")
    assert not (store_b.cell_dir(b, CELL) / "adapter").exists()  # adapters stay remote
    assert store_b.finished_count() == 1
    # what a cell's metrics call its adapter: the URL every machine can open, not the trainer's disk
    where = store_a.location_of(store_a.cell_dir(a, CELL) / "adapter")
    assert where == f"{url}/simulated/cells/{CELL.id}/{store_a.cell_dir(a, CELL).name}/adapter"
    assert where == store_b.location_of(store_b.cell_dir(b, CELL) / "adapter")


def test_status_lists_the_url_once_instead_of_asking_per_cell(url, tmp_path, monkeypatch):
    from flows.runtime.status import store_status

    a = simulated(url, tmp_path / "a")
    pipeline.run_cell(a, CELL, ResultStore.for_config(a))
    gets: list[str] = []
    real_get = Remote.get

    def counting_get(self, rel, local):
        gets.append(rel)
        return real_get(self, rel, local)

    monkeypatch.setattr(Remote, "get", counting_get)
    b = simulated(url, tmp_path / "b")  # another machine: nothing in its cache
    status = store_status(b, ResultStore.for_config(b))
    assert status.cells[CELL.id].state == "finished" and len(status.cells) == 96  # the slabs; multi-seed unknown
    cell_gets = [g for g in gets if "/cells/" in g]  # the finished cell's answers: their footer read at the URL
    assert cell_gets == [f"simulated/cells/{CELL.id}/{ResultStore.for_config(a).cell_dir(a, CELL).name}/metrics.json"]


def test_a_push_interrupted_before_metrics_is_not_finished_and_the_retry_completes_it(url, tmp_path, monkeypatch):
    a, b = simulated(url, tmp_path / "a"), simulated(url, tmp_path / "b")
    store_a, store_b = ResultStore.for_config(a), ResultStore.for_config(b)
    put = Remote.put

    def failing(self, local, rel):
        if rel.endswith("/metrics.json"):
            raise ConnectionError("upload interrupted")
        put(self, local, rel)

    monkeypatch.setattr(Remote, "put", failing)
    with pytest.raises(ConnectionError):
        pipeline.run_cell(a, CELL, store_a)
    remote_dir = f"simulated/cells/{CELL.id}/{store_a.cell_dir(a, CELL).name}"
    assert store_a.remote.exists(f"{remote_dir}/answers.parquet")
    assert not store_b.is_finished(b, CELL)
    assert not (store_a.cell_dir(a, CELL) / "metrics.json").exists()  # the cache never claims more than the URL

    monkeypatch.setattr(Remote, "put", put)
    retried = pipeline.run_cell(a, CELL, store_a)
    assert retried["reused"]  # completed from the cache, not recomputed
    assert store_b.is_finished(b, CELL) and store_b.load_answers(b, [CELL]).height == retried["answers"]


def test_gates_phases_and_screens_round_trip(url, tmp_path):
    from flows.aggregate import _stale
    from eps_screen.store.result_store import ScreenNotFound, load_screen

    a = simulated(url, tmp_path / "a")
    store_a, store_b = ResultStore.for_config(a), ResultStore(url, "simulated", tmp_path / "b")
    store_a.save_gate({"number": 1, "name": "contamination", "fired": False})
    store_a.save_phase("smoke", {"verdict": "ok"})
    assert store_b.gates() == [{"number": 1, "name": "contamination", "fired": False}]
    assert store_b.phase("smoke") == {"verdict": "ok"}
    store_b.save_gate({"number": 2, "name": "smoke", "fired": True})  # the other machine adds one
    assert [g["number"] for g in store_a.gates()] == [1, 2]

    store_a.save_screen({"config": a.model_dump(mode="json")})
    assert screen_names(url) == ["simulated"]
    loaded = load_screen(url, "simulated")
    assert loaded.store == url and loaded.store_cache is None and loaded.name == "simulated"
    with pytest.raises(ScreenNotFound, match="found: simulated"):
        load_screen(url, "other")

    pipeline.run_cell(a, CELL, store_a)
    assert _stale(store_b)  # results and no report yet
    (store_a.report_dir).mkdir(parents=True)
    (store_a.report_dir / "aggregate_metrics.json").write_text("{}")
    store_a.push_report()
    assert not _stale(store_b)


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"store": "nosuch://bucket/x"}, "store: unknown URL scheme 'nosuch://'"),
    ({"store": "gcs://bucket/x"}, "store: gcs:// needs the gcsfs package, which is not installed: pip install gcsfs"),
    ({"store": "s3://b/x", "store_options": {"endpoint_url": "http://e", "secret": "hunter2"}},
     "store_options: secret looks like a credential"),
    ({"store": "s3://b/x", "store_options": {"client_kwargs": {"aws_session_token": "hunter2"}}},
     "store_options: client_kwargs.aws_session_token looks like a credential"),
])
def test_config_errors_are_one_line_naming_the_field(overrides, expected):
    with pytest.raises(ConfigError) as err:
        parse_config(overrides)
    assert len(err.value.problems) == 1 and "\n" not in err.value.problems[0]
    assert err.value.problems[0].startswith(expected)
    assert "hunter2" not in err.value.problems[0]


def doctor_store(tmp_path: Path, url: str, **overrides) -> str:
    """The doctor's store check on a config; a failure as the one line the doctor prints."""
    from flows.cli.doctor import Doctor

    data = yaml.safe_load((CONFIGS / "simulated.yaml").read_text())
    data.update(store=url, store_cache=str(tmp_path / "cache"), **overrides)
    path = tmp_path / "screen.yaml"
    path.write_text(yaml.safe_dump(data))
    doc = Doctor(str(path))
    doc.check_config()
    try:
        return "ok " + doc.check_store()
    except Exception as exc:  # noqa: BLE001 - what Doctor.run turns into the line
        assert "\n" not in str(exc).strip()
        return "FAIL " + str(exc)


def test_doctor_store_check(url, tmp_path, s3_endpoint):
    assert doctor_store(tmp_path, url).startswith(f"ok {url}/simulated is writable")
    assert doctor_store(tmp_path, url, execution={"pool": "runpod-gpu"}).startswith("ok ")
    assert Remote(url).glob("simulated/*") == []  # the probe object is gone

    missing = doctor_store(tmp_path, "s3://no-such-bucket/results")
    assert missing.startswith("FAIL s3://no-such-bucket/results/simulated is not writable: the bucket does not exist")
    unreachable = doctor_store(tmp_path, url, store_options={"endpoint_url": "http://127.0.0.1:9"})
    assert unreachable.startswith(f"FAIL {url}/simulated is not writable: the endpoint is not reachable")
    assert "endpoint_url" in unreachable


@pytest.mark.usefixtures("prefect_harness")
def test_the_job_flow_writes_to_the_url_store(url, tmp_path):
    from flows.job import job

    a = simulated(url, tmp_path / "a")
    job(a, [CELL.id])

    b = simulated(url, tmp_path / "b")
    store_b = ResultStore.for_config(b)
    assert store_b.is_finished(b, CELL)
    assert store_b.cell_metrics(b, CELL) == ResultStore.for_config(a).cell_metrics(a, CELL)
