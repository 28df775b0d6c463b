"""One run per screen per store, and each cell computed by one run at most: leases and claims kept in the store.

A run of a screen writes `<screen>/runs/<token>.json` (its lease: who, on which host, which process, since when, and
a heartbeat renewed every BEAT_S seconds) and deletes it when it ends. A second run that finds a live lease stops
with one line naming it, unless told to run beside it (`--force`). Before a run computes a cell it claims it,
`<screen>/claims/<cell id>/<key>/<token>.json` (the pre-screen: `claims/pre-screen/-/`); a cell another live run
has claimed is waited on (it is read from the store once that run has finished it) instead of computed again. A run's death releases all it held: a lease
whose process is gone (its own host) or whose heartbeat is older than TTL_S (any host: a URL store's runs are on
machines whose processes cannot be asked) is dead, and so are its claims.

The store offers no compare-and-swap (an S3 PUT overwrites), so taking a lease or a claim is: write one's own, list
them all (local directories and S3 are read-after-write consistent), and hold it only when no other live one is
there; the one that finds itself alone marks its own `held`. Two that see each other before either holds both
withdraw and try again after a random pause; one that sees a `held` other yields to it.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from eps_screen.store.files import write_json
from eps_screen.store.result_store import ResultStore, cell_key

BEAT_S = 30.0
TTL_S = 120.0
_TRIES = 20


class Busy(RuntimeError):
    """Another live run of the screen holds the store: one line naming it."""


def _now() -> float:
    return time.time()


def alive(lease: dict, now: float | None = None) -> bool:
    """A lease of this host lives while its process does and beats; one of another host while it beats."""
    fresh = (now or _now()) - float(lease.get("beat", 0)) < float(lease.get("ttl", TTL_S))
    if lease.get("host") != socket.gethostname():
        return fresh
    try:
        os.kill(int(lease.get("pid", 0)), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):
        pass
    return fresh


def since(lease: dict) -> str:
    return dt.datetime.fromtimestamp(float(lease["started"]), dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def describe(lease: dict, screen: str) -> str:
    seen = max(0, round(_now() - float(lease["beat"])))
    run = f", Prefect run {lease['prefect_run']}" if lease.get("prefect_run") else ""
    return (f"screen {screen!r} is running elsewhere on this store: {lease['user']} on {lease['host']}, pid "
            f"{lease['pid']}{run}, since {since(lease)} (seen {seen} s ago); wait for it, or pass --force to run beside it "
            "(each cell is still computed by one run only)")


class _Files:
    """JSON records under the store's screen, local or at its URL, by path relative to the screen."""

    def __init__(self, store: ResultStore):
        self.store = store

    def put(self, rel: str, data: dict) -> None:
        if self.store.remote is None:
            write_json(self.store.dir / rel, data)
        else:
            self.store.remote.write(f"{self.store.screen}/{rel}", json.dumps(data).encode())

    def delete(self, rel: str) -> None:
        try:
            if self.store.remote is None:
                (self.store.dir / rel).unlink()
            else:
                self.store.remote.delete(f"{self.store.screen}/{rel}")
        except FileNotFoundError:
            pass

    def records(self, pattern: str) -> dict[str, dict]:
        """{relative path: record} of the readable records matching a glob (an unreadable one is as absent)."""
        out = {}
        if self.store.remote is None:
            paths = [p.relative_to(self.store.dir).as_posix() for p in self.store.dir.glob(pattern)]
            read = lambda rel: (self.store.dir / rel).read_bytes()  # noqa: E731
        else:
            prefix = f"{self.store.screen}/"
            paths = [p.removeprefix(prefix) for p in self.store.remote.glob(prefix + pattern)]
            read = lambda rel: self.store.remote.read(prefix + rel)  # noqa: E731
        for rel in paths:
            try:
                out[rel] = json.loads(read(rel))
            except (FileNotFoundError, ValueError):  # gone meanwhile, or half-written by a store without atomic puts
                continue
        return out


class RunLease:
    """This process's run of a screen on a store: its lease, its heartbeat and the cells it has claimed."""

    def __init__(self, store: ResultStore, prefect_run: str | None = None, beat_s: float = BEAT_S):
        self.store, self.files, self.beat_s = store, _Files(store), beat_s
        self.token = f"{socket.gethostname()}-{os.getpid()}-{os.urandom(4).hex()}"
        self.record = {"token": self.token, "user": getpass.getuser(), "host": socket.gethostname(),
                       "pid": os.getpid(), "started": _now(), "beat": _now(), "ttl": max(TTL_S, 4 * beat_s),
                       "prefect_run": prefect_run, "held": False}
        self._stop = threading.Event()
        self._beats: threading.Thread | None = None
        self.claimed: set[str] = set()

    @property
    def path(self) -> str:
        return f"runs/{self.token}.json"

    def live_runs(self) -> dict[str, dict]:
        """{token: lease} of the live runs of this screen, this one included once written; dead ones are deleted."""
        live = {}
        for rel, lease in self.files.records("runs/*.json").items():
            if alive(lease):
                live[lease.get("token", "")] = lease
            else:
                self.files.delete(rel)
        return live

    def holder(self) -> dict | None:
        """Another run's live lease, if one holds the screen."""
        return next((lease for token, lease in self.live_runs().items() if token != self.token and lease.get("held")),
                    None)

    def start(self, force: bool = False) -> None:
        """Take the screen (raises Busy naming the run that holds it), or with force run beside whoever holds it."""
        for _ in range(_TRIES):
            self._write()
            others = {t: lease for t, lease in self.live_runs().items() if t != self.token}
            if force or not others:
                break
            self.files.delete(self.path)
            held = [lease for lease in others.values() if lease.get("held")]
            if held:
                raise Busy(describe(held[0], self.store.screen))
            time.sleep(random.uniform(0.2, 1.5))  # two runs that saw each other both withdrew: try again apart
        else:
            raise Busy(f"screen {self.store.screen!r}: other runs keep starting on this store; try again")
        self.record["held"] = True
        self._write()
        self._beats = threading.Thread(target=self._beat, name=f"lease {self.token}", daemon=True)
        self._beats.start()

    def _write(self) -> None:
        self.record["beat"] = _now()
        self.files.put(self.path, self.record)

    def _beat(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                self._write()
            except Exception:  # a missed beat is not worth the run; TTL_S covers three in a row
                continue

    def end(self) -> None:
        """Release every claim and the lease (the run ended, however)."""
        self._stop.set()
        for rel in list(self.claimed):
            self.files.delete(rel)
        self.claimed.clear()
        self.files.delete(self.path)

    # --- cells, and other work held the same way ----------------------------------------------------------------
    def _folder(self, config, cell) -> str:
        return f"claims/{cell.id}/{cell_key(config, cell)}"

    def _claim_path(self, config, cell) -> str:
        return f"{self._folder(config, cell)}/{self.token}.json"

    def claim(self, config, cells: list) -> tuple[list, list]:
        """(cells this run may compute: finished ones and those it now holds, cells another live run holds)."""
        return self._claim(cells, lambda c: self._folder(config, c), lambda c: self.store.is_finished(config, c))

    def release(self, config, cells: list) -> None:
        for cell in cells:
            self._release(self._claim_path(config, cell))

    def wait(self, config, cells: list, poll_s: float = 2.0) -> list:
        """Block until each of these cells (held by other runs) is finished, or free because its run died; returns
        them all, to be claimed again (a finished one is then read from the store)."""
        return self._wait(cells, lambda c: self._folder(config, c), lambda c: self.store.is_finished(config, c), poll_s)

    @contextmanager
    def holding(self, name: str, done: Callable[[], bool], poll_s: float = 2.0) -> Iterator[None]:
        """The block runs while this run alone holds `name`, work that is not a cell (the pre-screen): at once when
        done(), else once no other live run holds it (after waiting for it to finish or die)."""
        folder = f"claims/{name}/-"
        while True:
            mine, theirs = self._claim([name], lambda _: folder, lambda _: done())
            if mine:
                break
            self._wait(theirs, lambda _: folder, lambda _: done(), poll_s)
        try:
            yield
        finally:
            self._release(f"{folder}/{self.token}.json")

    def _claim(self, items: list, folder_of: Callable, done: Callable) -> tuple[list, list]:
        todo = [i for i in items if not done(i)]
        mine, theirs = [i for i in items if i not in todo], []
        for _ in range(_TRIES):
            if not todo:
                break
            for item in todo:
                self.files.put(f"{folder_of(item)}/{self.token}.json", {"token": self.token, "held": False})
            live = self.live_runs()
            claims = self._claims(live)
            contended = []
            for item in todo:
                folder = folder_of(item)
                path = f"{folder}/{self.token}.json"
                others = [c for rel, c in claims.items() if rel.startswith(folder + "/") and rel != path
                          and c.get("token") in live]
                if not others:
                    self.files.put(path, {"token": self.token, "held": True})
                    self.claimed.add(path)
                    mine.append(item)
                    continue
                self.files.delete(path)
                (theirs if any(c.get("held") for c in others) else contended).append(item)
            todo = contended
            if todo:
                time.sleep(random.uniform(0.2, 1.5))
        theirs += todo
        return mine, theirs

    def _claims(self, live: dict[str, dict]) -> dict[str, dict]:
        """The claims of live runs; those of dead ones are deleted (their run's death released them)."""
        claims = self.files.records("claims/*/*/*.json")
        for rel, c in list(claims.items()):
            if c.get("token") not in live and c.get("token") != self.token:
                self.files.delete(rel)
                del claims[rel]
        return claims

    def _release(self, path: str) -> None:
        if path in self.claimed:
            self.files.delete(path)
            self.claimed.discard(path)

    def _wait(self, items: list, folder_of: Callable, done: Callable, poll_s: float) -> list:
        pending = list(items)
        while pending:
            live = self.live_runs()
            held = {rel.rsplit("/", 1)[0] for rel, c in self._claims(live).items()
                    if c.get("token") in live and c.get("held")}
            pending = [i for i in pending if not done(i) and folder_of(i) in held]
            if pending:
                time.sleep(poll_s)
        return list(items)
