"""Two runs of one screen started together on one store (issue 43): the second stops with one line naming the first,
or, told to run beside it (--force), computes no cell the first computes; with and without a shared Prefect API.

Each run is the CLI in a process of its own, as two people sharing a store start it. Every cell (and the pre-screen) a
process saves is written to a log by a module each imports before the CLI, which wraps ResultStore.save_cell and
save_phase (the screen runs its cells in that process: execution.max_parallel_cells is 1), so a cell computed by
both runs shows twice there."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import ROOT, quiet_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

CELLS = 36 + 1  # small_screen: 2 sources x 16 slab runs + 4 multi-seed cells, and the pre-screen

SITE = '''
import os
if os.environ.get("EPS_TEST_SAVED"):
    from eps_screen.store import result_store as store

    _save = store.ResultStore.save_cell

    def save_cell(self, config, cell, answers, metrics):
        with open(os.environ["EPS_TEST_SAVED"], "a") as log:
            log.write(f"{cell.id} {os.getpid()}\\n")
        return _save(self, config, cell, answers, metrics)

    store.ResultStore.save_cell = save_cell
    _phase = store.ResultStore.save_phase

    def save_phase(self, name, data, answers=None):
        if name == "pre_screen":
            with open(os.environ["EPS_TEST_SAVED"], "a") as log:
                log.write(f"pre-screen {os.getpid()}\\n")
        return _phase(self, name, data, answers)

    store.ResultStore.save_phase = save_phase
'''


def start_two(tmp_path: Path, force: bool, api: str | None = None) -> tuple[list[subprocess.CompletedProcess], Counter]:
    from tests.test_store_bad_files import small_screen

    config = small_screen(str(tmp_path / "store"), "two").model_dump(mode="json")
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(config))
    site = tmp_path / "site"
    site.mkdir()
    (site / "count_saves.py").write_text(SITE)
    saved = tmp_path / "saved.log"
    procs = []
    for i in range(2):
        extra = {"PREFECT_API_URL": api} if api else {}
        env = quiet_env(tmp_path / f"home{i}", PYTHONPATH=f"{site}:{ROOT}", EPS_TEST_SAVED=str(saved), **extra)
        cli = "import sys, count_saves; from flows.cli import main; sys.exit(main(sys.argv[1:]))"
        procs.append(subprocess.Popen([sys.executable, "-c", cli, "run", str(path), *(["--force"] * force)],
                                      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=800)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    lines = saved.read_text().splitlines() if saved.exists() else []
    return done, Counter(line.split()[0] for line in lines)


def _tail(run: subprocess.CompletedProcess) -> str:
    return f"exit {run.returncode}\n{run.stderr[-3000:]}"


def test_the_second_run_stops_with_one_line_naming_the_first(tmp_path):
    runs, saved = start_two(tmp_path, force=False)
    codes = sorted(r.returncode for r in runs)
    assert codes == [0, 2], [_tail(r) for r in runs]
    stopped = next(r for r in runs if r.returncode == 2)
    line = next(line for line in stopped.stderr.splitlines() if line.startswith("error: "))
    assert "screen 'two' is running elsewhere on this store" in line and "pid" in line and "since" in line
    assert "--force" in line
    assert len(saved) == CELLS and max(saved.values()) == 1


@pytest.mark.parametrize("shared_api", [False, True], ids=["own-servers", "shared-api"])
def test_two_forced_runs_compute_no_cell_twice(tmp_path, shared_api, request):
    api = None
    if shared_api:  # the session's server (tests/conftest.py), which both runs then report to
        from prefect.settings import PREFECT_API_URL

        request.getfixturevalue("prefect_harness")
        api = PREFECT_API_URL.value()
    runs, saved = start_two(tmp_path, force=True, api=api)
    assert [r.returncode for r in runs] == [0, 0], [_tail(r) for r in runs]
    assert len(saved) == CELLS, (saved, [_tail(r) for r in runs])
    twice = {cell: n for cell, n in saved.items() if n > 1}
    assert not twice, twice
    assert not list((tmp_path / "store" / "two" / "claims").rglob("*.json"))  # both released every claim
    assert not list((tmp_path / "store" / "two" / "runs").glob("*.json"))
