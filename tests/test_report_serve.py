"""The report over HTTP (issue 13): `eps-screen serve` serves a store's clean_result.html read-only, the screen
run links it by URL (never file://), and the run's summary artifact carries the TL;DR, the gates and the effects."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from eps_screen.aggregate import aggregate
from eps_screen.config import ScreenConfig
from eps_screen.design import all_slab_cells
from eps_screen.report.serve import REPORT_URL_ENV, report_url
from eps_screen.simulate import simulate_screen

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
def served(store):
    """`eps-screen serve --store ROOT --port 0` in a subprocess; its URL from the first line it prints."""
    root = store[0]
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "--store", str(root), "--port", "0"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
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


def test_only_reports_are_served_and_nothing_is_written(served, store):
    for path in ("sim/screen.json", "sim/", "sim/report/", "../etc/passwd", "sim/report/%2e%2e/screen.json"):
        assert requests.get(f"{served}{path}", timeout=10, allow_redirects=False).status_code in (302, 404), path
    assert requests.get(f"{served}sim/screen.json", timeout=10).status_code == 404
    assert requests.post(f"{served}sim/report/clean_result.html", data=b"x", timeout=10).status_code == 405
    assert requests.put(f"{served}sim/report/new.html", data=b"x", timeout=10).status_code == 405
    assert not (store[0] / "sim" / "report" / "new.html").exists()


def test_report_url(monkeypatch):
    monkeypatch.delenv(REPORT_URL_ENV, raising=False)
    assert report_url(None, "my-screen") == "http://127.0.0.1:8765/my-screen/report/clean_result.html"
    assert report_url("s3://bucket/eps", "s") == "s3://bucket/eps/s/report/clean_result.html"
    monkeypatch.setenv(REPORT_URL_ENV, "https://reports.example.org/eps/")
    assert report_url(None, "s") == "https://reports.example.org/eps/s/report/clean_result.html"
    assert report_url("s3://bucket/eps", "s") == "https://reports.example.org/eps/s/report/clean_result.html"


def test_summary_markdown_has_tldr_gates_and_effects(store):
    from eps_screen.plan import make_plan
    from flows.aggregate import _summary_markdown

    _, config, result = store
    text = _summary_markdown(config, result, "http://127.0.0.1:8765/sim/report/clean_result.html",
                             make_plan(config).distinct_cells)
    assert "[clean_result.html](http://127.0.0.1:8765/sim/report/clean_result.html)" in text
    assert re.search(r"\*\*TL;DR\.\*\* I trained \d+ LoRA recipes", text)
    assert "| gate | fired | reason |" in text and "| effect (pooled over sources) |" in text
    assert len(re.findall(r"^\| [A-E] .*\| (SR|LR) \|", text, re.MULTILINE)) == 10  # 5 factors x 2 responses
    assert re.search(r"Cells present: \d+ of \d+ cells", text)
    assert "file://" not in text
