"""A store that survives a bad file (issue 43): spoiled JSON, a cut-off parquet, a zero-byte file and a missing file
each make their cell or phase record read as not done; the bad file is kept aside, one line names it, the next run
computes only those and completes, and `verify` finds and repairs the same files. On a local store here; on the S3
store (moto) in tests/test_store_bad_files_s3.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from eps_screen.spec.config import parse_config
from eps_screen.store.files import BAD
from tests.conftest import CONFIGS

pytestmark = pytest.mark.usefixtures("prefect_harness")

# One cell per kind of damage, and the pre-screen's phase record.
SPOILED_JSON = "librarian-A0B0C0D0E0F0-s42"
CUT_PARQUET = "librarian-A1B1C1D1E1F1-s42"
MISSING = "surgeon-A1B0C0D0E1F0-s42"
EMPTY_JSON = "surgeon-A0B1C1D0E0F0-s42"
EMPTY_PARQUET = "librarian-A1B0C0D0E1F0-s42"
DAMAGED = {SPOILED_JSON, CUT_PARQUET, MISSING, EMPTY_JSON, EMPTY_PARQUET}


def small_screen(store: str, name: str, **extra):
    """sim-6-2.yaml (a 2^(6-2) on the simulated backend) cut to two sources and a small panel: 36 cells."""
    data = yaml.safe_load((CONFIGS / "sim-6-2.yaml").read_text())
    data.update(name=name, store=store, sources=["librarian", "surgeon"],
                eval={"personas": 4, "questions": 6, "samples": 2, "random_controls": 2},
                seeds={"multiseed": [137], "top_k": 2}, bootstrap={"resamples": 200}, **extra)
    return parse_config(data)


def spoil(files: dict[str, Path | str], write, delete) -> None:
    """Damage the store the ways a full disk, a broken copy or a sync tool does. files: cell id -> its directory
    (a Path, or a path relative to a URL); write(path, bytes) and delete(path) act on it."""
    write(f"{files[SPOILED_JSON]}/metrics.json", b'{"broken')
    write(f"{files[EMPTY_JSON]}/metrics.json", b"")
    write(f"{files[EMPTY_PARQUET]}/answers.parquet", b"")
    delete(f"{files[MISSING]}/metrics.json")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """Two finished screens, each in a store of its own (run here, not under a test's capsys: Prefect's console
    handler keeps the stream it first writes to)."""
    from flows.screen import screen

    stores = {}
    for name in ("spoiled", "checked"):
        stores[name] = tmp_path_factory.mktemp(name)
        assert screen(small_screen(str(stores[name]), name), return_state=True).is_completed()
    return stores


class Lines(logging.Handler):
    """The store's log lines (one per file kept aside)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def store_log():
    handler = Lines()
    logger = logging.getLogger("eps_screen.store.result_store")
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


def markers(screen_dir: Path) -> dict[str, int]:
    return {p.parent.parent.name: p.stat().st_ino for p in screen_dir.glob("cells/*/*/metrics.json")}


def cell_dirs(screen_dir: Path) -> dict[str, Path]:
    return {p.parent.name: p for p in screen_dir.glob("cells/*/*")}


def test_each_bad_file_is_kept_aside_and_only_its_cell_is_computed_again(finished, capsys, store_log):
    from eps_screen.store.result_store import ResultStore
    from flows.cli import main
    from flows.screen import screen

    tmp_path = finished["spoiled"]
    config = small_screen(str(tmp_path), "spoiled")
    screen_dir = tmp_path / "spoiled"
    dirs = cell_dirs(screen_dir)
    cut = dirs[CUT_PARQUET] / "answers.parquet"
    cut.write_bytes(cut.read_bytes()[:100])
    spoil(dirs, lambda p, data: Path(p).write_bytes(data), lambda p: Path(p).unlink())
    (screen_dir / "phases" / "pre_screen.json").write_text("")
    before = markers(screen_dir)

    # The report of the spoiled store leaves the unreadable cells out instead of failing on them.
    assert main(["report", "spoiled", "--store", str(tmp_path)]) == 0
    lines = list(store_log)
    assert len(lines) == 4  # one per unreadable file; none for the missing one
    assert any(f"cell {SPOILED_JSON}: metrics.json: not JSON" in line for line in lines)
    assert any(f"cell {CUT_PARQUET}: answers.parquet: not a parquet file" in line for line in lines)
    assert any(f"cell {EMPTY_JSON}: metrics.json: empty file" in line for line in lines)
    assert all(f"kept aside as {screen_dir}/cells/" in line and ".bad-" in line for line in lines)
    assert (dirs[SPOILED_JSON] / "answers.parquet").exists()  # only the unreadable file is moved
    assert sorted(p.name.split(BAD)[0] for p in screen_dir.rglob(f"*{BAD}*")) == [
        "answers.parquet", "answers.parquet", "metrics.json", "metrics.json"]

    store = ResultStore.for_config(config)
    assert main(["status", "spoiled", "--store", str(tmp_path), "--cells", "none", "--store-only"]) == 0
    status = capsys.readouterr().out
    assert "4 unreadable file(s) kept aside" in status and status.count(BAD) == 4

    state = screen(config, return_state=True)
    assert state.is_completed(), state.message
    after = markers(screen_dir)
    rewritten = {c for c in after if c not in before or after[c] != before[c]}
    assert rewritten == DAMAGED  # those five cells computed again, no other
    assert all(store.is_finished(config, _cell(c)) for c in DAMAGED)
    assert store.phase("pre_screen") is not None  # the pre-screen too, its record having been empty
    assert store_log[4:] == [line for line in store_log[4:] if "phase record pre_screen: pre_screen.json: empty" in line]
    assert len(store_log) == 5
    assert len(list(screen_dir.rglob(f"*{BAD}*"))) == 5


def _cell(cell_id: str):
    from eps_screen.spec.design import Cell

    return Cell.parse(cell_id)


def test_verify_lists_the_bad_files_and_repair_keeps_them_aside(finished, capsys):
    from flows.cli import main

    tmp_path = finished["checked"]
    screen_dir = tmp_path / "checked"
    assert main(["verify", "--store", str(tmp_path)]) == 0
    clean = capsys.readouterr().out.strip().splitlines()
    assert len(clean) == 1 and " 0 unreadable" in clean[0]
    checked = int(clean[0].split(": ")[1].split()[0])
    assert checked >= 2 * 36  # every cell's metrics.json and answers.parquet, and more

    dirs = cell_dirs(screen_dir)
    cut = dirs[CUT_PARQUET] / "answers.parquet"
    cut.write_bytes(cut.read_bytes()[:100])
    spoil(dirs, lambda p, data: Path(p).write_bytes(data), lambda p: Path(p).unlink())
    assert main(["verify", "--store", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    bad = sorted(line.split()[1].removeprefix(str(screen_dir) + "/") for line in out.splitlines()
                 if line.startswith("unreadable"))
    assert [b.split("/")[1] for b in bad] == sorted([SPOILED_JSON, CUT_PARQUET, EMPTY_JSON, EMPTY_PARQUET])
    assert "--repair" in out.splitlines()[-1]

    assert main(["verify", "--store", str(tmp_path), "--repair"]) == 0
    repaired = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("kept aside") for line in repaired) == 4 and "4 unreadable, kept aside" in repaired[-1]
    assert len(list(screen_dir.rglob(f"*{BAD}*"))) == 4
    assert main(["verify", "--store", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("kept aside") == 4 and " 0 unreadable" in out.splitlines()[-1]

    assert main(["verify", "--store", str(tmp_path / "nowhere")]) == 2
    assert "no store at" in capsys.readouterr().err
