"""The report over HTTP (issue 13): `eps-screen serve` serves a store's clean_result.html read-only, the screen
run links it by URL (never file://), and the run's summary artifact carries the TL;DR, the gates and the effects.
The link names its store (issue 24): the server answers for the store it was started on and for every store a
screen run registered, registered before or after it started; a store it does not know gets a 404 that says which
store the link wants and the command that serves it."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from eps_screen.report.serve import REPORT_URL_ENV, report_url
from eps_screen.report.stores import register, registered, store_id
from eps_screen.run.aggregate import aggregate
from eps_screen.run.simulate import simulate_screen
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import all_slab_cells
from eps_screen.store.result_store import ResultStore

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store with one screen, `sim`, whose report was written from simulated cells (seconds)."""
    root = tmp_path_factory.mktemp("store")
    config = ScreenConfig(name="sim", store=str(root), bootstrap={"resamples": 200})
    cells = all_slab_cells(config)
    (root / "sim").mkdir()
    (root / "sim" / "screen.json").write_text("{}")
    result = aggregate(config, simulate_screen(config, cells), [c.id for c in cells], root / "sim" / "report")
    return root, config, result


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The module's own registry of stores ($EPS_SCREEN_CACHE/served-stores), for this process and the server."""
    path = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EPS_SCREEN_CACHE", str(path))
        yield path


def copy_of(root: Path, into: Path, screen: str) -> Path:
    """Another store whose screen `screen` has the report of `root`'s `sim` (a copy: no second aggregation)."""
    shutil.copytree(root / "sim" / "report", into / screen / "report")
    (into / screen / "screen.json").write_text("{}")
    return into


@pytest.fixture(scope="module")
def served(store, cache):
    """`eps-screen serve --store ROOT --port 0` in a subprocess; its URL from the first line it prints."""
    root = store[0]
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "--store", str(root), "--port", "0"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "EPS_SCREEN_CACHE": str(cache)})
    try:
        line = proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert found, line
        yield found.group(0)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_the_page_is_served_with_its_tldr(served, store):
    page = requests.get(f"{served}sim/report/clean_result.html", timeout=10)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert re.search(r'id="tldr"><b>TL;DR\.</b> \S', page.text)
    index = requests.get(served, timeout=10)
    assert 'href="/sim/report/clean_result.html"' in index.text
    assert requests.get(f"{served}sim", timeout=10).url.endswith("/sim/report/clean_result.html")
    beside = sorted(p.relative_to(store[0] / "sim" / "report").as_posix()
                    for p in (store[0] / "sim" / "report").rglob("*") if p.is_file() and p.name != "clean_result.html")
    assert beside  # the figures and JSON files beside the page
    for rel in beside:
        assert requests.get(f"{served}sim/report/{rel}", timeout=10).content == (store[0] / "sim/report" / rel).read_bytes()


def test_only_reports_are_served_and_nothing_is_written(served, store, tmp_path):
    other = copy_of(store[0], tmp_path / "other", "elsewhere")
    register(ResultStore(other, "elsewhere"))
    sid, own = store_id(str(other)), store_id(str(store[0]))
    for path in ("sim/screen.json", "sim/", "sim/report/", "../etc/passwd", "sim/report/%2e%2e/screen.json",
                 f"stores/{sid}/elsewhere/screen.json", f"stores/{sid}/", f"stores/{sid}/elsewhere/report/",
                 f"stores/{sid}/elsewhere/report/%2e%2e/screen.json",
                 f"stores/{sid}/%2e%2e/sim/report/clean_result.html",
                 f"stores/{own}/sim/screen.json", f"stores/{own}/", "stores/", f"stores/{sid}.json",
                 "stores/..%2f..%2fetc/passwd", f"stores/{sid}/elsewhere/report/../../elsewhere/screen.json"):
        got = requests.get(f"{served}{path}", timeout=10, allow_redirects=False)
        assert got.status_code in (302, 404), path
        assert got.status_code == 404 or got.headers["Location"].endswith("/report/clean_result.html"), path
    assert requests.get(f"{served}sim/screen.json", timeout=10).status_code == 404
    assert requests.get(f"{served}stores/{sid}/elsewhere/screen.json", timeout=10).status_code == 404
    assert requests.post(f"{served}sim/report/clean_result.html", data=b"x", timeout=10).status_code == 405
    assert requests.put(f"{served}sim/report/new.html", data=b"x", timeout=10).status_code == 405
    put = requests.put(f"{served}stores/{sid}/elsewhere/report/new.html", data=b"x", timeout=10)
    assert put.status_code == 405
    assert not (store[0] / "sim" / "report" / "new.html").exists()
    assert not (other / "elsewhere" / "report" / "new.html").exists()


def test_a_link_names_its_store_and_works_for_a_store_registered_after_the_server_started(served, store, tmp_path):
    other = copy_of(store[0], tmp_path / "other", "elsewhere")
    link = report_url(str(other), "elsewhere", base=served)
    assert link.startswith(f"{served}stores/{store_id(str(other))}/elsewhere/report/clean_result.html?store=")
    unknown = requests.get(link, timeout=10)  # not registered yet: the page says which store, and how to serve it
    assert unknown.status_code == 404 and unknown.headers["Content-Type"].startswith("text/html")
    assert f"<code>{other}</code>" in unknown.text and f"eps-screen serve --store {other}</code>" in unknown.text
    register(ResultStore(other, "elsewhere"))  # what aggregation does, after the server started
    page = requests.get(link, timeout=10)
    assert page.status_code == 200 and re.search(r'id="tldr"><b>TL;DR\.</b> \S', page.text)
    prefix = f"{served}stores/{store_id(str(other))}/elsewhere"
    assert requests.get(prefix, timeout=10).url == f"{prefix}/report/clean_result.html"
    for rel in (p.relative_to(other / "elsewhere").as_posix() for p in (other / "elsewhere" / "report").rglob("*")
                if p.is_file()):  # the figures and JSON files beside the page, by the page's relative links
        assert requests.get(f"{prefix}/{rel}", timeout=10).content == (other / "elsewhere" / rel).read_bytes()
    index = requests.get(served, timeout=10).text
    assert f"Reports in {other}" in index and f'href="/stores/{store_id(str(other))}/elsewhere/report/' in index
    # the server's own store: by the long link a run makes (never registered here), and by its short one
    own = requests.get(report_url(str(store[0]), "sim", base=served), timeout=10)
    assert own.status_code == 200 and "TL;DR." in own.text


def test_a_store_unknown_to_the_server_is_named_only_by_its_own_link(served, cache, tmp_path):
    anonymous = requests.get(f"{served}stores/0123456789ab/s/report/clean_result.html", timeout=10)
    assert anonymous.status_code == 404
    assert "<code>0123456789ab</code>" in anonymous.text and "eps-screen serve --store DIR" in anonymous.text
    # a ?store= that is not the id's store is not repeated: a crafted link cannot make the page name another store
    crafted = requests.get(f"{served}stores/0123456789ab/s/report/clean_result.html?store=/etc", timeout=10)
    assert crafted.status_code == 404 and "/etc" not in crafted.text
    gone = tmp_path / "gone"
    gone.mkdir()
    register(ResultStore(gone, "s"))
    shutil.rmtree(gone)
    page = requests.get(report_url(str(gone), "s", base=served), timeout=10)
    assert page.status_code == 404 and f"its directory {gone} is gone" in page.text
    assert f"eps-screen serve --store {gone}</code>" in page.text
    assert store_id(str(gone)) not in registered()  # nor listed in the index


def test_a_registry_that_cannot_be_written_costs_a_warning_not_the_aggregation(tmp_path, monkeypatch, caplog):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("EPS_SCREEN_CACHE", str(tmp_path / "file"))  # a file where the directory would be
    register(ResultStore(tmp_path / "store", "s"))
    assert "eps-screen serve --store" in caplog.text and str(tmp_path / "store") in caplog.text


def test_report_url(monkeypatch):
    monkeypatch.delenv(REPORT_URL_ENV, raising=False)
    assert store_id("/data/eps-results") == store_id("/data/eps-results/") == "a2b9390c735f"  # links already made
    assert report_url("/data/eps-results", "my-screen") == \
        "http://127.0.0.1:8765/stores/a2b9390c735f/my-screen/report/clean_result.html?store=/data/eps-results"
    assert report_url("s3://bucket/eps", "s") == "s3://bucket/eps/s/report/clean_result.html"
    monkeypatch.setenv(REPORT_URL_ENV, "https://reports.example.org/eps/")
    assert report_url("/data/eps-results", "s") == \
        "https://reports.example.org/eps/stores/a2b9390c735f/s/report/clean_result.html?store=/data/eps-results"
    assert report_url("s3://bucket/eps", "s") == \
        "https://reports.example.org/eps/stores/3463365f295b/s/report/clean_result.html?store=s3://bucket/eps"
    assert report_url("/data/my results", "s").endswith("?store=/data/my%20results")


def test_summary_markdown_has_tldr_gates_and_effects(store):
    from eps_screen.plan.screen_plan import make_plan
    from flows.aggregate import _summary_markdown

    _, config, result = store
    text = _summary_markdown(config, result, "http://127.0.0.1:8765/sim/report/clean_result.html",
                             make_plan(config).distinct_cells, "/data/eps-results")
    assert ("[clean_result.html](http://127.0.0.1:8765/sim/report/clean_result.html) in the store "
            "`/data/eps-results`") in text
    assert re.search(r"\*\*TL;DR\.\*\* This screen trained \d+ LoRA recipes", text)
    assert "| gate | fired | reason |" in text and "| effect (pooled over sources) |" in text
    assert len(re.findall(r"^\| [A-E] .*\| (SR|LR) \|", text, re.MULTILINE)) == 10  # 5 factors x 2 responses
    marks = {(e.term, e.response): e.clear for e in result.main_effects.effects if e.source == "pooled"}
    rows = re.findall(r"^\| ([A-E]) .*\| (SR|LR) \| .* \| (\*\*clear\*\*|not clear) \|$", text, re.MULTILINE)
    assert {(t, r): m == "**clear**" for t, r, m in rows} == marks  # the page's one definition of clear
    assert re.search(r"Cells present: \d+ of \d+ cells", text)
    assert "file://" not in text
