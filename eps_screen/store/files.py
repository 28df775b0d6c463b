"""The store's files one at a time: written atomically, read back checked, and a file that cannot be read kept aside.

Every artifact is written to a temporary name in its own directory and renamed into place, so a crash, a full disk
or a copy that breaks off leaves either the old file or the new one, never half of one. A file that is there but
cannot be parsed anyway (spoiled by hand, by a sync tool, by a disk) is renamed `<name>.bad-<UTC time>`: kept for
whoever wants to look at it, and out of the way, so the cell, answer set or phase record it belonged to reads as not
done and is computed again. One log line names the file and what it belonged to.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

log = logging.getLogger("eps_screen.store.result_store")

BAD = ".bad-"  # in a set-aside file's name: metrics.json.bad-20261206T061500Z


class Unreadable(ValueError):
    """A store file that is there but cannot be parsed."""


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, data: dict) -> None:
    write_text(path, json.dumps(data, indent=1, default=str))


def write_parquet(path: Path, frame) -> None:
    """A polars frame as parquet, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        frame.write_parquet(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parse_json(data: bytes, name: str = "") -> dict:
    """A JSON object, or Unreadable saying why not (an empty file, spoiled text, a list where a record belongs)."""
    if not data.strip():
        raise Unreadable(f"{name}: empty file")
    try:
        value = json.loads(data)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise Unreadable(f"{name}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise Unreadable(f"{name}: a JSON {type(value).__name__}, not a record")
    return value


def parse_jsonl(data: bytes, name: str = "") -> list[dict]:
    try:
        return [json.loads(line) for line in data.decode().splitlines() if line.strip()]
    except ValueError as exc:
        raise Unreadable(f"{name}: not JSON lines ({exc})") from None


def check_parquet(source, name: str = "", whole: bool = False) -> None:
    """Raises Unreadable unless `source` (a path or an open file) is a parquet file: its footer, which a cut-off
    copy lacks; with `whole`, every page as well (verify's deep check)."""
    try:
        if whole:
            pq.read_table(source)
        else:
            pq.read_metadata(source)
    except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid is a ValueError
        raise Unreadable(f"{name}: not a parquet file ({str(exc)[:200]})") from None


def check_file(path: Path, whole: bool = False) -> None:
    """Raises Unreadable unless the store file parses as its suffix says (.json, .jsonl, .parquet)."""
    if path.suffix == ".parquet":
        if path.stat().st_size == 0:
            raise Unreadable(f"{path.name}: empty file")
        check_parquet(path, path.name, whole)
    elif path.suffix == ".json":
        parse_json(path.read_bytes(), path.name)
    elif path.suffix == ".jsonl":
        parse_jsonl(path.read_bytes(), path.name)


def checked(path: Path) -> bool:
    """Whether a store file kind this module can check (the rest, adapter weights and figures, are not)."""
    return path.suffix in (".json", ".jsonl", ".parquet") and not path.name.startswith(".") and BAD not in path.name


def aside_name(name: str) -> str:
    return f"{name}{BAD}{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%S%fZ')}"


def set_aside(path: Path) -> Path | None:
    """Rename an unreadable file out of the way; None when it is gone already (another process moved it)."""
    target = path.with_name(aside_name(path.name))
    try:
        os.replace(path, target)
    except FileNotFoundError:
        return None
    return target


def report_aside(what: str, problem: str, where: str) -> None:
    log.warning("%s: %s; kept aside as %s, so it reads as not done", what, problem, where)


# Parquet files whose footer read, by (path, inode, size, mtime), or by (URL, path) for one read at its URL: a
# store's finished cells are asked about again and again (status, each phase, each cell's cache key); a local file
# rewritten is a new entry.
_READ: set[tuple] = set()


def _parquet(source, name: str = "") -> bool:
    if not isinstance(source, Path):
        check_parquet(source, name)
        return True
    st = source.stat()
    seen = (str(source), st.st_ino, st.st_size, st.st_mtime_ns)
    if seen not in _READ:
        check_parquet(source, source.name)
        _READ.add(seen)
    return True


class CheckedReads:
    """ResultStore's reads that check what they read (its cache `_fetch`, `_rel`, `remote` and `url` they use)."""

    def read_checked(self, path: Path, what: str, parse: Callable[[Path], object]):
        """parse(path), fetched from the URL if only there; None if there is none or it cannot be parsed: then it
        is kept aside, `what` reads as not done. At a URL store an unreadable cache copy is dropped for the URL's,
        and only an unreadable URL copy is set aside (there, where every machine looks)."""
        if not self._fetch(path):
            return None
        try:
            return parse(path)
        except Unreadable as exc:
            problem = str(exc)
        if self.remote is None:
            aside = set_aside(path)
            if aside is not None:
                report_aside(what, problem, str(aside))
            return None
        path.unlink(missing_ok=True)
        if self.remote.get(self._rel(path), path):
            try:
                return parse(path)
            except Unreadable:
                path.unlink(missing_ok=True)
                rel = self._rel(path)
                aside = aside_name(rel)
                if self.remote.move(rel, aside):
                    report_aside(what, problem, f"{self.url}/{aside}")
        return None

    def _parquet_reads(self, path: Path, what: str) -> bool:
        """Whether its footer reads; at the URL when not cached (a few bytes there, not megabytes of answers)."""
        if path.exists() or self.remote is None:
            return self.read_checked(path, what, _parquet) is not None
        if (seen := (self.url, rel := self._rel(path))) in _READ:  # read at the URL earlier in this process
            return True
        try:
            with self.remote.open(rel) as f:
                _parquet(f, path.name)
            _READ.add(seen)
            return True
        except FileNotFoundError:
            return False
        except Unreadable as exc:
            if self.remote.move(rel, aside := aside_name(rel)):
                report_aside(what, str(exc), f"{self.url}/{aside}")
            return False
