"""The stores `eps-screen serve` answers for: each store's id, and the registry of the stores screen runs wrote
reports to on this machine.

A report link names its store (`/stores/<id>/<screen>/report/...`, eps_screen.report.serve), so it works whatever
store the run used, not only the one the server was started on. The id is a short hash of the store's location:
its URL for a URL store (the same on every machine, whatever its local mirror), else its resolved path.

Aggregation registers the store it wrote a report to: one file per store, $EPS_SCREEN_CACHE/served-stores/<id>.json
(default ~/.cache/eps-screen), holding the store's location and the local directory its reports are in. The server
reads it at each request, so a server already running serves a store registered after it started. One file per
store, never rewritten with other contents, so two screens aggregating at once need no lock.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path

from eps_screen.models.tiny import cache_root
from eps_screen.store.result_store import ResultStore, write_json

log = logging.getLogger(__name__)

_ID = re.compile(r"[0-9a-f]{12}")


def location(store: ResultStore) -> str:
    """What a store's id hashes and its links and messages name: its URL, else its resolved directory."""
    return store.url or str(store.root)


def store_id(where: str) -> str:
    return hashlib.sha256(where.rstrip("/").encode()).hexdigest()[:12]


def is_store_id(text: str) -> bool:
    return bool(_ID.fullmatch(text))


def registry_dir() -> Path:
    return cache_root().expanduser() / "served-stores"


def register(store: ResultStore) -> None:
    """Let every `eps-screen serve` on this machine serve this store's reports. A registry that cannot be written
    costs only the link (its 404 page says which store to serve), never the aggregation: a warning, not an error."""
    entry = {"location": location(store), "dir": str(store.root)}
    path = registry_dir() / f"{store_id(entry['location'])}.json"
    try:
        if not path.exists() or json.loads(path.read_text()) != entry:
            write_json(path, entry)
    except (OSError, ValueError) as e:
        log.warning("could not register the store %s for `eps-screen serve` (%s): serve it with "
                    "`eps-screen serve --store %s`", entry["location"], e, entry["location"])


def lookup(sid: str) -> dict | None:
    """The registered entry of a store id ({"location", "dir"}), or None. `sid` comes from a URL: only an id's
    form names a file, so no request reads anything but a registry entry."""
    if not is_store_id(sid):
        return None
    try:
        return json.loads((registry_dir() / f"{sid}.json").read_text())
    except (OSError, ValueError):
        return None


def registered() -> dict[str, dict]:
    """Every registered store whose directory still exists, by id (a test's temporary store is gone later)."""
    found = {}
    for path in sorted(registry_dir().glob("*.json")):
        entry = lookup(path.stem)
        if entry and Path(entry["dir"]).is_dir():
            found[path.stem] = entry
    return found
