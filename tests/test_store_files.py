"""The store's single-file rules (eps_screen/store/files.py, eps_screen/store/remote.py): an interrupted write leaves
the old file whole, each kind of unreadable file is told apart from a good one, and a URL filesystem without atomic
objects gets its files under a temporary name first."""

from __future__ import annotations

import polars as pl
import pytest

from eps_screen.store.files import BAD, Unreadable, check_file, set_aside, write_json, write_parquet
from eps_screen.store.remote import Remote


class Interrupted(Exception):
    pass


class BreaksOff:
    """A frame whose write stops half-way, as a full disk or a killed process stops it."""

    def write_parquet(self, path):
        with open(path, "wb") as f:
            f.write(b"PAR1 half a file")
        raise Interrupted


def test_an_interrupted_write_leaves_the_old_file_whole_and_no_temporary(tmp_path):
    path = tmp_path / "answers.parquet"
    write_parquet(path, pl.DataFrame({"marker": [True, False]}))
    with pytest.raises(Interrupted):
        write_parquet(path, BreaksOff())
    assert pl.read_parquet(path)["marker"].to_list() == [True, False]
    assert [p.name for p in tmp_path.iterdir()] == ["answers.parquet"]


@pytest.mark.parametrize(("name", "data", "why"), [
    ("metrics.json", b'{"broken', "not JSON"),
    ("metrics.json", b"", "empty file"),
    ("metrics.json", b"[1, 2]", "a JSON list, not a record"),
    ("answers.jsonl", b'{"a": 1}\n{"a": ', "not JSON lines"),
    ("answers.parquet", b"", "empty file"),
])
def test_each_kind_of_unreadable_file_says_why(tmp_path, name, data, why):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(Unreadable, match=why):
        check_file(path)
    aside = set_aside(path)
    assert not path.exists() and aside.name.startswith(f"{name}{BAD}") and aside.read_bytes() == data
    assert set_aside(path) is None  # gone already: another process moved it


def test_a_cut_parquet_fails_on_its_footer_and_a_whole_one_passes(tmp_path):
    path = tmp_path / "answers.parquet"
    write_parquet(path, pl.DataFrame({"marker": [True] * 1000}))
    check_file(path, whole=True)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(Unreadable, match="not a parquet file"):
        check_file(path)


def test_a_filesystem_without_atomic_objects_gets_a_temporary_name_first(monkeypatch):
    remote = Remote("memory://store-files-test/results")
    assert not remote.atomic and Remote("s3://bucket/results").atomic
    written = []
    pipe = type(remote.fs).pipe_file
    monkeypatch.setattr(type(remote.fs), "pipe_file", lambda fs, path, data, **kw: (written.append(path),
                                                                                      pipe(fs, path, data, **kw)))
    remote.write("screen/phases/gates.json", b"{}")
    assert written[0].rsplit("/", 1)[1].startswith(".gates.json.put-")
    assert remote.read("screen/phases/gates.json") == b"{}"
    assert remote.find("screen") == ["screen/phases/gates.json"]
    assert remote.move("screen/phases/gates.json", "screen/phases/gates.json.bad-1")
    assert not remote.move("screen/phases/gates.json", "screen/phases/gates.json.bad-2")


def test_write_json_replaces_whole(tmp_path):
    path = tmp_path / "a" / "metrics.json"
    write_json(path, {"x": 1})
    write_json(path, {"x": 2})
    check_file(path)
    assert path.read_text().replace(" ", "").replace("\n", "") == '{"x":2}'
