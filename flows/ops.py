"""`eps-screen status | retry | report`: a screen seen from its store and from Prefect.

The store says which cells are finished (metrics.json present); Prefect says what is running, failed or
crashed. A screen flow run whose process is gone stays "Running" in Prefect forever (nothing marks it), so
every screen run records `<host>:<pid>` of its own process as the run's infrastructure pid when it starts
(whether this CLI or a pool worker started it: a process worker records the bare pid, which says nothing about
the host), and `retry` marks such a run Crashed when that process no longer exists on this host; for a run on
another host it asks for `--force`.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eps_screen.config import ScreenConfig, parse_config
from eps_screen.plan import make_plan, phase_cells
from eps_screen.presets import screen_name
from eps_screen.remote import is_url
from eps_screen.store import ResultStore, local_dir, read_screen, screen_names
from flows.runtime.names import SCREEN

REPO = Path(__file__).resolve().parent.parent
SCREEN_DEPLOYMENT = SCREEN.full_name
_RUNNING = {"RUNNING", "PENDING", "CANCELLING"}
_QUEUED = {"SCHEDULED", "PAUSED"}


# --- the API --------------------------------------------------------------------------------------------------
def api_url() -> str | None:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def api_problem(required: bool) -> str | None:
    """None when the API answers (or is not needed); else one line saying what is wrong."""
    import httpx
    from prefect.settings import PREFECT_API_KEY

    url = api_url()
    if not url:
        return "PREFECT_API_URL is not set: start a server (prefect server start) and export it" if required else None
    key = PREFECT_API_KEY.value()
    headers = {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}
    try:
        response = httpx.get(f"{url.rstrip('/')}/health", headers=headers, timeout=5)
    except httpx.HTTPError as exc:
        return f"Prefect API {url} is not reachable ({type(exc).__name__})"
    if response.status_code != 200:
        return f"Prefect API {url} answered HTTP {response.status_code} on /health"
    return None


def ui_url(flow_run_id: Any) -> str | None:
    from prefect.settings import PREFECT_UI_URL

    base = PREFECT_UI_URL.value()
    return f"{base}/runs/flow-run/{flow_run_id}" if base else None


# --- which process owns a run ----------------------------------------------------------------------------------
def owner_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def record_owner(flow, flow_run, state) -> None:
    """The screen flow's on_running hook: the run's infrastructure pid = this process, with its host."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, infrastructure_pid=owner_tag())


def process_alive(run) -> bool | None:
    """True/False for a run owned by a process on this host (`host:pid`); None when that cannot be told here."""
    if run.state is not None and run.state.is_final():
        return False
    host, _, pid = (run.infrastructure_pid or "").rpartition(":")
    if not host or not pid.isdigit() or host != socket.gethostname():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- a screen's status ------------------------------------------------------------------------------------------
@dataclass
class CellStatus:
    cell_id: str
    phases: list[str]
    state: str = "missing"  # finished, running, queued, failed, crashed, cancelled, interrupted, missing
    source_rate: float | None = None
    leakage: float | None = None
    runs: int = 0
    message: str = ""


@dataclass
class ScreenStatus:
    config: ScreenConfig
    dir: Path
    cells: dict[str, CellStatus]
    phases: dict[str, list[str]]  # phase row -> cell ids
    multiseed_known: bool
    gates: list[dict]
    screen_runs: list[Any] = field(default_factory=list)  # newest first
    prefect_note: str = ""

    @property
    def latest_run(self):
        return self.screen_runs[0] if self.screen_runs else None

    def unfinished(self) -> list[CellStatus]:
        return [c for c in self.cells.values() if c.state != "finished"]

    def counts(self, ids: list[str]) -> Counter:
        return Counter(self.cells[i].state for i in ids)


class ScreenNotFound(LookupError):
    """No <store>/<name>/screen.json."""


def load_screen(store_root: str | Path, name: str) -> ScreenConfig:
    """The config a screen last ran with (<store>/<name>/screen.json), its store set to `store_root` (a directory
    or a URL). A URL store's cache is this machine's default one: the recorded one is the other machine's."""
    saved = read_screen(store_root, name)
    if saved is None:
        known = screen_names(store_root)
        raise ScreenNotFound(f"no screen {name!r} in store {store_root} (found: {', '.join(known) or 'none'})")
    root = str(store_root)
    store = root if is_url(root) else str(local_dir(root))
    return parse_config({**saved["config"], "store": store, "store_cache": None})


def store_status(config: ScreenConfig) -> ScreenStatus:
    store = ResultStore.for_config(config)
    with store.listing():  # one listing for both the phase-3 pick and the cells' metrics
        cells = phase_cells(config, store)
        metrics = {c.id: store.cell_metrics(config, c) for phase in cells.values() for c in phase}
    phases: dict[str, list[str]] = {"smoke": [c.id for c in cells["smoke"]]}
    for source in config.sources:
        phases[f"slab {source}"] = [c.id for c in cells["slab"] if c.source == source]
    phases["multiseed"] = [c.id for c in cells["multiseed"]]
    status: dict[str, CellStatus] = {}
    for row, ids in phases.items():
        for cid in ids:
            status.setdefault(cid, CellStatus(cid, [])).phases.append(row)
    for cell_id, m in metrics.items():
        if m is not None:
            s = status[cell_id]
            s.state, s.source_rate, s.leakage = "finished", m["source_rate"], m["leakage"]
    return ScreenStatus(config, store.dir, status, phases, bool(cells["multiseed"]), store.gates())


def _page(read, **kwargs) -> list:
    out, offset = [], 0
    while True:
        page = read(limit=200, offset=offset, **kwargs)
        out += page
        if len(page) < 200:
            return out
        offset += 200


def screen_runs(client, name: str) -> list:
    """Flow runs of the `screen` flow for this screen name, newest first."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    runs = _page(client.read_flow_runs, flow_filter=FlowFilter(name=FlowFilterName(any_=["screen"])),
                 sort=FlowRunSort.EXPECTED_START_TIME_DESC)
    return [r for r in runs if screen_name(r.parameters or {}, base=REPO) == name]


def phase_runs(client, run_ids: list) -> dict:
    """The phase subflow runs of these screen runs: {phase run id: its screen run id}."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    return {phase.id: run_id for run_id in run_ids for phase in _page(
        client.read_flow_runs, flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(
            any_=[run_id])))}


def add_prefect(status: ScreenStatus, client) -> None:
    """Per unfinished cell: the state of its newest run (a task run in-process, or a cell flow run on a pool)."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterTags,
        TaskRunFilter,
        TaskRunFilterName,
    )

    name = status.config.name
    status.screen_runs = screen_runs(client, name)
    owners = {r.id: r for r in status.screen_runs}
    attempts: dict[str, list[tuple[Any, Any, bool]]] = {}  # cell -> [(time, state, its owner is gone)]
    if owners:
        # in-process cells are tasks of the phase subflows (and, in runs from before the phases, of the screen run)
        screen_of = {**{i: i for i in owners}, **phase_runs(client, list(owners))}
        tasks = _page(client.read_task_runs, flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(screen_of))),
                      task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="cell ")))
        for t in tasks:
            cell_id = t.name.removeprefix("cell ")
            owner = owners.get(screen_of.get(t.flow_run_id))
            gone = owner is None or owner.state.is_final() or process_alive(owner) is False
            attempts.setdefault(cell_id, []).append((t.expected_start_time or t.created, t.state, gone))
    tagged = FlowRunFilter(tags=FlowRunFilterTags(all_=[f"screen:{name}"]))  # the cell runs dispatch submits
    cell_runs = _page(client.read_flow_runs, flow_run_filter=tagged)
    for r in cell_runs:  # a GPU job: its cells run in a row, so each shares the job's state
        for cell_id in (r.parameters or {}).get("cell_ids") or []:
            attempts.setdefault(cell_id, []).append((r.expected_start_time or r.created, r.state, False))
    for cell_id, runs in attempts.items():
        cell = status.cells.get(cell_id)
        if cell is None:
            continue
        cell.runs = len(runs)
        if cell.state == "finished":
            continue
        _, state, gone = max(runs, key=lambda x: x[0])
        kind = state.type.value if state is not None else ""
        cell.message = (state.message or "") if state is not None else ""
        if kind in _RUNNING:
            cell.state = "interrupted" if gone else "running"
        elif kind in _QUEUED:
            cell.state = "queued"
        elif kind in {"FAILED", "CRASHED", "CANCELLED"}:
            cell.state = kind.lower()


def screen_status(store_root: str | Path, name: str, with_prefect: bool = True) -> ScreenStatus:
    status = store_status(load_screen(store_root, name))
    if not with_prefect:
        status.prefect_note = "Prefect not asked (--store-only)"
        return status
    if not api_url():
        status.prefect_note = "PREFECT_API_URL is not set: run states not shown (the store alone says what is finished)"
        return status
    problem = api_problem(required=True)
    if problem:
        status.prefect_note = problem
        return status
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        add_prefect(status, client)
    return status


# --- rendering ---------------------------------------------------------------------------------------------------
_STYLE = {"finished": "green", "running": "cyan", "queued": "blue", "failed": "red", "crashed": "red",
          "cancelled": "yellow", "interrupted": "magenta", "missing": "dim"}
_ORDER = ["finished", "running", "queued", "failed", "crashed", "cancelled", "interrupted", "missing"]
_SHORT = {"finished": "done", "running": "run", "queued": "queue", "failed": "fail", "crashed": "crash",
          "cancelled": "cancel", "interrupted": "intr", "missing": "todo"}


def _rate(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"


def render(status: ScreenStatus, console, cells: str = "unfinished") -> None:
    from rich.markup import escape
    from rich.table import Table

    cfg = status.config
    console.print(f"[bold]screen {cfg.name}[/]  store {status.dir}  pool {cfg.execution.pool}")
    run = status.latest_run
    if run is not None:
        alive = process_alive(run)
        where = {True: "process alive", False: "process gone", None: "process not on this host"}[alive]
        if run.state.is_final():
            where = "ended"
        url = ui_url(run.id)
        console.print(escape(f"latest screen run {run.name} ({run.id}): {run.state.name} {run.state.message or ''}"
                             f" [{where}]") + (f"\n  {url}" if url else ""))
    if status.prefect_note:
        console.print(f"[yellow]{status.prefect_note}[/]")
    report = status.dir / "report" / "clean_result.html"
    if report.exists():
        console.print(f"report {report} ({time.strftime('%Y-%m-%d %H:%M', time.localtime(report.stat().st_mtime))})")

    table = Table(title="phases (intr = interrupted: its screen run is gone; todo = not run yet)")
    table.add_column("phase")
    table.add_column("cells", justify="right")
    for state in _ORDER:
        table.add_column(_SHORT[state], justify="right", style=_STYLE[state])
    for row, ids in status.phases.items():
        counts = status.counts(ids)
        label = row if ids or row != "multiseed" else "multiseed (after the slabs)"
        table.add_row(label, str(len(ids)), *[str(counts.get(s, "")) for s in _ORDER])
    total = status.counts(list(status.cells))
    table.add_row("[bold]all distinct[/]", str(len(status.cells)), *[str(total.get(s, "")) for s in _ORDER])
    console.print(table)

    if status.gates:
        gates = Table(title="gates")
        for col in ("gate", "fired", "reason"):
            gates.add_column(col)
        for g in sorted(status.gates, key=lambda g: int(g["number"])):
            gates.add_row(f"{g['number']} {g['name']}", "[red]yes[/]" if g["fired"] else "no", str(g.get("reason", "")))
        console.print(gates)

    shown = list(status.cells.values()) if cells == "all" else status.unfinished() if cells == "unfinished" else []
    if shown:
        t = Table(title=f"cells ({cells})")
        for col in ("cell", "phase", "state", "SR", "LR", "runs", "message"):
            t.add_column(col)
        for c in shown:
            t.add_row(c.cell_id, ", ".join(c.phases), f"[{_STYLE[c.state]}]{c.state}[/]", _rate(c.source_rate),
                      _rate(c.leakage), str(c.runs or ""), escape(c.message[:80]))
        console.print(t)
    elif cells == "unfinished":
        console.print("every known cell is finished")


# --- running a screen, with live progress -------------------------------------------------------------------------
def finished_count(config: ScreenConfig) -> int:
    return ResultStore.for_config(config).finished_count()


def finished_ids(store: ResultStore) -> set[str]:
    """The ids of the cells with a metrics.json (of any key): one listing, cheap enough to poll."""
    pattern = "cells/*/*/metrics.json"
    if store.remote:
        return {Path(p).parent.parent.name for p in store.remote.glob(f"{store.screen}/{pattern}")}
    return {p.parent.parent.name for p in store.dir.glob(pattern)}


def screen_phase(config: ScreenConfig, store: ResultStore, done: set[str]) -> str:
    """The phase a running screen is in, from the store: the first whose work is not all there."""
    from eps_screen import design
    from eps_screen.pipeline import finished_pre_screen

    if finished_pre_screen(config, store) is None:
        return "phase 0: pre-screen"
    smoke = [c.id for c in design.smoke_cells(config)]
    if not done.issuperset(smoke):
        return f"phase 1: smoke {len(done.intersection(smoke))}/{len(smoke)}"
    for source in config.sources:
        slab = [c.id for c in design.slab_cells(config, source)]
        if not done.issuperset(slab):
            return f"phase 2: slab {source} {len(done.intersection(slab))}/{len(slab)}"
    return "phase 3: multi-seed" if len(done) < make_plan(config).distinct_cells else "phase 4: aggregation"


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class ScreenProgress:
    """A screen's progress read from its store while something else runs it: phase, cells finished of the plan's
    distinct cells, elapsed, and time left (the cells left at the pace of those finished since this started).

    On a terminal, a rich bar redrawn in place; otherwise (a pipe, a log file) one plain line whenever the phase
    or the count changes, and at least every `heartbeat_s`. The first line is printed at once."""

    def __init__(self, config: ScreenConfig, console, label: str, poll_s: float = 2.0, heartbeat_s: float = 30.0):
        self.config, self.console, self.label = config, console, label
        self.store = ResultStore.for_config(config)
        self.total = make_plan(config).distinct_cells
        self.poll_s, self.heartbeat_s = poll_s, heartbeat_s
        self.live = console.is_terminal
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.started = time.monotonic()
        self.first: tuple[float, int] | None = None  # (when, count) at the first cell finished here
        self.last: tuple[float, int] = (self.started, -1)
        self.bar = None
        self.printed, self.said = 0.0, [""]

    def _eta(self, now: float, done: int) -> str:
        if done >= self.total:
            return "0s"
        if self.first is None or done - self.first[1] < 1:
            return "?"
        pace = (self.last[0] - self.first[0]) / max(1, self.last[1] - self.first[1])
        return "~" + _duration(pace * (self.total - done))

    def state(self) -> tuple[str, int, str]:
        """(phase, cells done, time left), and the pace is updated."""
        ids = finished_ids(self.store)
        done, now = min(self.total, len(ids)), time.monotonic()
        if done != self.last[1]:
            if self.last[1] >= 0 and self.first is None:
                self.first = (now, done)
            self.last = (now, done)
        return screen_phase(self.config, self.store, ids), done, self._eta(now, done)

    def line(self) -> str:
        phase, done, eta = self.state()
        return f"{self.label}: {phase} | {done}/{self.total} cells | {_duration(time.monotonic() - self.started)} " \
               f"elapsed | time left {eta}"

    def _say(self, force: bool = False) -> None:
        """A plain line when the phase or the count changed since the last one, or the heartbeat is due."""
        text = self.line()
        head = text.split(" | ", 2)[:2]
        if force or head != self.said or time.monotonic() - self.printed >= self.heartbeat_s:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)
            self.printed, self.said = time.monotonic(), head

    def _poll(self) -> None:
        while not self.halt.wait(self.poll_s):
            try:
                if self.live:
                    phase, done, eta = self.state()
                    self.bar.update(self.task, completed=done, phase=phase, eta=eta)
                else:
                    self._say()
            except Exception as exc:  # a store read that fails now and then must not stop the screen
                self.console.print(f"(progress not read: {type(exc).__name__}: {exc})", markup=False)

    def __enter__(self):
        from eps_screen.pipeline import finished_pre_screen
        from eps_screen.tinymodel import is_tiny

        if is_tiny(self.config.model.base) and finished_pre_screen(self.config, self.store) is None:
            self.console.print(f"{self.label}: phase 0 runs the base model on the eval panel; a first run builds the "
                               "tiny model before it (1-2 min)", markup=False, highlight=False, soft_wrap=True)
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn(f"{self.label} {{task.fields[phase]}}"), BarColumn(bar_width=20),
                                MofNCompleteColumn(), TextColumn("cells"), TimeElapsedColumn(),
                                TextColumn("time left {task.fields[eta]}"), console=self.console, transient=False)
            phase, done, eta = self.state()
            self.task = self.bar.add_task(self.label, total=self.total, completed=done, phase=phase, eta=eta)
            self.bar.start()
        else:
            self._say(force=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.halt.set()
        self.thread.join()
        if self.live:
            phase, done, eta = self.state()
            self.bar.update(self.task, completed=done, phase=phase, eta=eta)
            self.bar.stop()
        else:
            self._say()


def run_screen_here(config: ScreenConfig, console):
    """The screen flow in this process (finished cells are read from the store), its progress shown from the
    first second (Prefect's import and temporary server take several); returns the flow's final state."""
    with ScreenProgress(config, console, f"screen {config.name}"):
        from flows.screen import screen  # imports Prefect

        return screen(config, return_state=True)


class CannotSubmit(RuntimeError):
    """The `screen` deployment is missing, or its pool has no worker to run it: one line with the fix."""


def submit_problem(client) -> str | None:
    """Why a run of the `screen` deployment would not start now (it would sit Late, silently), or None."""
    from prefect.exceptions import ObjectNotFound

    from flows.workers import pool_problem

    try:
        deployment = client.read_deployment_by_name(SCREEN_DEPLOYMENT)
    except ObjectNotFound:
        return f"deployment {SCREEN_DEPLOYMENT!r} does not exist: run `eps-screen deploy` from the repository root"
    return pool_problem(client, deployment.work_pool_name)


def submit_screen(config: ScreenConfig, console, watch: bool = True):
    """A run of the `screen` deployment with this config; watched (progress bar) until it ends unless watch=False.
    Raises CannotSubmit, before submitting, when no worker could run it."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    with get_client(sync_client=True) as client:
        problem = submit_problem(client)
    if problem:
        raise CannotSubmit(problem)
    run = run_deployment(SCREEN_DEPLOYMENT, parameters={"config": config.model_dump(mode="json")}, timeout=0)
    url = ui_url(run.id)
    console.print(f"submitted {SCREEN_DEPLOYMENT} run {run.name} ({run.id})" + (f": {url}" if url else ""))
    if not watch:
        return run.state
    with get_client(sync_client=True) as client, ScreenProgress(config, console, f"screen {config.name}"):
        try:
            while not (state := client.read_flow_run(run.id).state).is_final():
                time.sleep(2)
        except KeyboardInterrupt:
            console.print(f"stopped watching; run {run.id} goes on")
            return None
    return state


# --- retry and report ---------------------------------------------------------------------------------------------
def mark_crashed(client, run, why: str) -> int:
    """Set a dead screen run Crashed, and its phase runs and task runs still 'Running' with it; returns the task runs
    changed."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.states import Crashed

    client.set_flow_run_state(run.id, Crashed(message=why), force=True)
    phases = phase_runs(client, [run.id])
    for phase in phases:
        if not client.read_flow_run(phase).state.is_final():
            client.set_flow_run_state(phase, Crashed(message=why), force=True)
    changed = 0
    for t in _page(client.read_task_runs, flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id, *phases]))):
        if t.state is not None and not t.state.is_final():
            client.set_task_run_state(t.id, Crashed(message=why), force=True)
            changed += 1
    return changed


def wait_for_cell_runs(client, name: str, console, limit_s: float) -> bool:
    """Wait for cell flow runs of this screen still on a pool (they may finish cells); False if they outlast limit_s."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    tag = FlowRunFilter(tags=FlowRunFilterTags(all_=[f"screen:{name}"]))
    deadline = time.monotonic() + limit_s
    active = [r for r in _page(client.read_flow_runs, flow_run_filter=tag) if not r.state.is_final()]
    if not active:
        return True
    console.print(f"{len(active)} cell run(s) of the last screen run are still on a pool; waiting for them")
    while active and time.monotonic() < deadline:
        time.sleep(3)
        active = [r for r in _page(client.read_flow_runs, flow_run_filter=tag) if not r.state.is_final()]
    return not active


def retry(store_root: str | Path, name: str, console, *, force: bool = False, submit: bool = False,
          wait_s: float = 3600) -> int:
    """Run the screen again, so that only its unfinished (failed, crashed, missing) cells are computed; then
    re-aggregate. Refuses while an earlier run of it may still be alive, unless force."""
    status = screen_status(store_root, name)
    config = status.config
    if api_url() and not status.prefect_note:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            for run in status.screen_runs:
                if run.state.is_final():
                    continue
                alive = process_alive(run)
                if alive is False or force:
                    why = "its process is gone" if alive is False else "marked by `eps-screen retry --force`"
                    n = mark_crashed(client, run, f"screen run abandoned: {why}")
                    console.print(f"marked screen run {run.name} ({run.id}) Crashed: {why} ({n} task runs with it)")
                else:
                    where = "on this host" if alive else "(its process is not on this host)"
                    console.print(f"[red]error[/]: screen run {run.name} ({run.id}) is {run.state.name} {where}; "
                                  f"wait for it, cancel it, or pass --force if its process is gone")
                    return 2
            if not wait_for_cell_runs(client, name, console, wait_s):
                console.print("[red]error[/]: cell runs still in flight; try again later")
                return 2
        status = screen_status(store_root, name)
    todo = status.unfinished()
    counts = Counter(c.state for c in todo)
    known = len(status.cells)
    console.print(f"screen {name}: {known - len(todo)} of {known} known cells finished; to compute: "
                  + (", ".join(f"{n} {s}" for s, n in counts.most_common()) or "none")
                  + ("" if status.multiseed_known else " (+ the multi-seed cells, once the slabs finish)"))
    for c in todo:
        if c.state in {"failed", "crashed", "cancelled", "interrupted"}:
            console.print(f"  {c.cell_id}: {c.state} {c.message[:100]}")
    state = submit_screen(config, console) if submit else run_screen_here(config, console)
    if state is None:
        return 0
    console.print(f"screen run ended {state.name}" + (f": {state.message}" if state.message else ""))
    reached_report = state.is_completed()
    if not reached_report:
        report(store_root, name, console)
    after = store_status(config)
    left = after.unfinished()
    console.print(f"{len(after.cells) - len(left)} of {len(after.cells)} cells finished")
    return 0 if state.is_completed() else (3 if state.name == "Killed" else 1)


def aggregate_here(config: ScreenConfig) -> tuple[dict, Any]:
    """Aggregate the screen's stored cells in this process, without Prefect: (the summary the `aggregate` flow
    returns, the AggregateResult or None when no cell is finished). The flow adds its artifacts to this."""
    from eps_screen.aggregate import aggregate as aggregate_results
    from eps_screen.plan import expected_cells

    store = ResultStore.for_config(config)
    expected = expected_cells(config, store)
    answers = store.load_answers(config, expected)
    if answers is None:
        return {"report": None, "partial": True, "cells": 0}, None
    result = aggregate_results(config, answers, [c.id for c in expected], store.report_dir, {"gates": store.gates()})
    for gate in result.metrics.gates:
        store.save_gate(gate.model_dump(mode="json"))
    store.push_report()
    summary = {"report": str(result.paths["clean_result.html"]), "partial": result.partial,
               "cells": answers["cell_id"].n_unique(), "fired": [g.name for g in result.fired]}
    return summary, result


def report(store_root: str | Path, name: str, console) -> int:
    """Re-aggregate one screen now, whatever its state (partial screens give a partial report).

    As a run of the `aggregate` flow (its summary and link artifacts in the UI) when a Prefect API answers;
    otherwise here, without Prefect: the store is all it reads, so no temporary server is started for it."""
    from rich.table import Table

    config = load_screen(store_root, name)
    with_prefect = bool(api_url()) and api_problem(required=True) is None
    with console.status(f"aggregating {name} ({finished_count(config)} finished cells)"):
        if with_prefect:
            from flows.aggregate import aggregate

            state = aggregate(config, return_state=True)
            if not state.is_completed():
                console.print(f"[red]error[/]: aggregate ended {state.name}: {state.message}")
                return 1
            result = state.result()
        else:
            result, _ = aggregate_here(config)
    if result["report"] is None:
        console.print(f"screen {name}: no finished cells yet, nothing to aggregate")
        return 1
    gates = Table(title=f"{name}: {result['cells']} cells" + (" (partial)" if result["partial"] else ""))
    for col in ("gate", "fired", "reason"):
        gates.add_column(col)
    for g in sorted(ResultStore.for_config(config).gates(), key=lambda g: int(g["number"])):
        gates.add_row(f"{g['number']} {g['name']}", "[red]yes[/]" if g["fired"] else "no", str(g.get("reason", "")))
    console.print(gates)
    console.print(result["report"])
    return 0
