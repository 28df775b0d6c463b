"""`eps-screen verify`: every JSON, JSON-lines and parquet file of a store read back, and (repair) the unreadable
ones kept aside as `<name>.bad-<time>`, so the next run of their screen computes what they held again.

A run does the same on its own for each file it reads (eps_screen/store/result_store.py); verify checks the whole store
at once, parquet files page by page (a run reads only a parquet's footer). A URL store is checked at the URL, where
every machine looks, not in this machine's cache. Adapter weights and figures are not checked: a cell's adapter is
trusted only with its metrics.json, and the report is written anew by every aggregation.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from eps_screen.spec.config_urls import is_url
from eps_screen.store.files import (
    BAD,
    Unreadable,
    aside_name,
    check_file,
    check_parquet,
    parse_json,
    parse_jsonl,
    set_aside,
)
from eps_screen.store.remote import Remote
from eps_screen.store.result_store import ResultStore, local_dir

_KINDS = (".json", ".jsonl", ".parquet")


@dataclass
class Verified:
    location: str  # the store: a directory or a URL
    checked: int = 0
    bad: list[tuple[str, str]] = field(default_factory=list)  # (file, why it cannot be read)
    aside: list[str] = field(default_factory=list)  # files kept aside, earlier or by this repair
    repaired: bool = False


def _wanted(rel: str, screens: list[str] | None) -> bool:
    name = rel.rsplit("/", 1)[-1]
    if screens and rel.split("/", 1)[0] not in screens:
        return False
    return not any(part.startswith(".") for part in rel.split("/")) and (BAD in name or name.endswith(_KINDS))


def verify(store: str | Path, screens: list[str] | None = None, repair: bool = False) -> Verified:
    """Check every store file of these screens (all when None); with repair, set the unreadable ones aside."""
    if is_url(str(store)):
        return _verify_url(Remote(str(store)), screens, repair)
    root = local_dir(store)
    if not root.is_dir():
        raise FileNotFoundError(f"no store at {root}")
    out = Verified(str(root), repaired=repair)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if not _wanted(rel, screens):
            continue
        if BAD in path.name:
            out.aside.append(str(path))
            continue
        out.checked += 1
        try:
            check_file(path, whole=True)
        except Unreadable as exc:
            out.bad.append((str(path), str(exc).split(": ", 1)[-1]))
            if repair and (moved := set_aside(path)) is not None:
                out.aside.append(str(moved))
    return out


def _check_remote(remote: Remote, rel: str) -> None:
    name = rel.rsplit("/", 1)[-1]
    if name.endswith(".parquet"):
        data = remote.read(rel)
        if not data:
            raise Unreadable(f"{name}: empty file")
        check_parquet(io.BytesIO(data), name, whole=True)
    elif name.endswith(".jsonl"):
        parse_jsonl(remote.read(rel), name)
    else:
        parse_json(remote.read(rel), name)


def _verify_url(remote: Remote, screens: list[str] | None, repair: bool) -> Verified:
    out = Verified(remote.url, repaired=repair)
    for rel in remote.find(""):
        if not _wanted(rel, screens):
            continue
        if BAD in rel.rsplit("/", 1)[-1]:
            out.aside.append(f"{remote.url}/{rel}")
            continue
        out.checked += 1
        try:
            _check_remote(remote, rel)
        except Unreadable as exc:
            out.bad.append((f"{remote.url}/{rel}", str(exc).split(": ", 1)[-1]))
            if repair and remote.move(rel, moved := aside_name(rel)):
                out.aside.append(f"{remote.url}/{moved}")
    return out


def aside_files(store: ResultStore) -> Iterator[str]:
    """The screen's files kept aside as unreadable (what `status` lists), at the URL for a URL store."""
    if store.remote is not None:
        for rel in store.remote.find(store.screen):
            if BAD in rel.rsplit("/", 1)[-1]:
                yield f"{store.url}/{rel}"
        return
    if store.dir.is_dir():
        yield from sorted(str(p) for p in store.dir.rglob(f"*{BAD}*") if p.is_file())
