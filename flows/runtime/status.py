"""`eps-screen status`: a screen seen from its store and from Prefect, and its rendering as rich tables.

The store says which cells are finished (metrics.json present); Prefect says what is running, queued, failed or
crashed (the newest run of each unfinished cell: a task run in-process, or a job flow run on a pool).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eps_screen.plan.costs import COST_HEADERS, cost_rows, screen_cost
from eps_screen.plan.screen_plan import phase_cells
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import phases
from eps_screen.store.claims import RunLease, since
from eps_screen.store.result_store import ResultStore
from eps_screen.store.verify import aside_files
from flows.runtime.api import api_problem, api_url, ui_url
from flows.runtime.runs import (
    QUEUED_STATES,
    RUNNING_STATES,
    cell_runs,
    phase_runs,
    process_alive,
    read_all,
    screen_runs,
)


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
    store: ResultStore
    cells: dict[str, CellStatus]
    phases: dict[str, list[str]]  # phase row -> cell ids
    multiseed_known: bool
    gates: list[dict]
    screen_runs: list[Any] = field(default_factory=list)  # newest first
    prefect_note: str = ""
    cost: dict | None = None  # eps_screen.plan.costs.ScreenCost.as_dict(): estimate beside actual, from the store
    aside: list[str] = field(default_factory=list)  # unreadable files kept aside (eps_screen/store/files.py)
    live: list[dict] = field(default_factory=list)  # leases of the runs live on the store (eps_screen/store/claims.py)

    @property
    def dir(self) -> Path:
        return self.store.dir

    @property
    def latest_run(self):
        return self.screen_runs[0] if self.screen_runs else None

    def unfinished(self) -> list[CellStatus]:
        return [c for c in self.cells.values() if c.state != "finished"]

    def counts(self, ids: list[str]) -> Counter:
        return Counter(self.cells[i].state for i in ids)


def store_status(config: ScreenConfig, store: ResultStore) -> ScreenStatus:
    with store.listing():  # one listing for both the phase-3 pick and the cells' metrics
        cells = phase_cells(config, store)
        metrics = {c.id: store.cell_metrics(config, c) for phase in cells.values() for c in phase}
    phases: dict[str, list[str]] = {"smoke": [c.id for c in cells["smoke"]]}
    if cells["fold_over"]:  # design.fold_over: the smoke fraction with every level flipped
        phases["fold-over"] = [c.id for c in cells["fold_over"]]
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
    return ScreenStatus(config, store, status, phases, bool(cells["multiseed"]), store.gates(),
                        cost=_cost(config, store), aside=list(aside_files(store)),
                        live=list(RunLease(store).live_runs().values()))


def _cost(config: ScreenConfig, store: ResultStore) -> dict | None:
    try:
        return screen_cost(config, store).as_dict()
    except Exception as exc:  # the cost view never hides the screen's status
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def add_prefect(status: ScreenStatus, client) -> None:
    """Per unfinished cell: the state of its newest run (a task run in-process, or a job flow run on a pool)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterName

    name = status.config.name
    status.screen_runs = screen_runs(client, name)
    owners = {r.id: r for r in status.screen_runs}
    attempts: dict[str, list[tuple[Any, Any, bool]]] = {}  # cell -> [(time, state, its owner is gone)]
    if owners:
        # in-process cells are tasks of the phase subflows (and, in runs from before the phases, of the screen run)
        screen_of = {**{i: i for i in owners}, **phase_runs(client, list(owners))}
        tasks = read_all(client.read_task_runs, flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(screen_of))),
                         task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="cell ")))
        for t in tasks:
            cell_id = t.name.removeprefix("cell ")
            owner = owners.get(screen_of.get(t.flow_run_id))
            gone = owner is None or owner.state.is_final() or process_alive(owner) is False
            attempts.setdefault(cell_id, []).append((t.expected_start_time or t.created, t.state, gone))
    for r in cell_runs(client, name):  # a GPU job: its cells run in a row, so each shares the job's state
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
        if kind in RUNNING_STATES:
            cell.state = "interrupted" if gone else "running"
        elif kind in QUEUED_STATES:
            cell.state = "queued"
        elif kind in {"FAILED", "CRASHED", "CANCELLED"}:
            cell.state = kind.lower()


def screen_status(config: ScreenConfig, store: ResultStore, with_prefect: bool = True) -> ScreenStatus:
    """The store's status, with Prefect's run states when an API answers (else a note says why not)."""
    status = store_status(config, store)
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


def render_gates(gates: list[dict], console, title: str = "gates") -> None:
    """The store's gate records as a table, by gate number (`status` and `report` both show it)."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("gate", "fired", "reason"):
        table.add_column(col)
    for g in sorted(gates, key=lambda g: int(g["number"])):
        table.add_row(f"{g['number']} {g['name']}", "[red]yes[/]" if g["fired"] else "no", str(g.get("reason", "")))
    console.print(table)


def render_cost(cost: dict, console) -> None:
    """Estimate beside actual, GPU-hours and USD (the rows of the report's Cost section)."""
    from rich.markup import escape
    from rich.table import Table

    if "error" in cost:
        console.print(f"[yellow]cost not shown: {escape(cost['error'])}[/]")
        return
    table = Table(title="cost (estimate vs actual; actual from the pods' recorded prices)")
    for i, col in enumerate(COST_HEADERS):
        table.add_column(col, justify="right" if 0 < i < 5 else "left")
    for row in cost_rows(cost):
        table.add_row(*map(escape, row))
    console.print(table)


def design_line(config: ScreenConfig) -> str:
    """The declared factors (cell ids spell their levels in this order) and each phase's design, in one line."""
    d = phases(config)
    designs = [f"slab {d.slab.describe()}", f"smoke {d.smoke.describe()}"]
    designs += [f"fold-over {d.fold_over.describe()}"] if d.fold_over is not None else []
    return ("factors " + ", ".join(f"{f.short} {f.label}" for f in config.design.factors) + "; "
            + "; ".join(designs))


def render(status: ScreenStatus, console, cells: str = "unfinished") -> None:
    from rich.markup import escape
    from rich.table import Table

    cfg = status.config
    console.print(f"[bold]screen {cfg.name}[/]  store {status.dir}  pool {cfg.execution.pool}")
    console.print(escape(design_line(cfg)), soft_wrap=True)
    run = status.latest_run
    if run is not None:
        alive = process_alive(run)
        where = {True: "process alive", False: "process gone", None: "process not on this host"}[alive]
        if run.state.is_final():
            where = "ended"
        url = ui_url(run.id)
        console.print(escape(f"latest screen run {run.name} ({run.id}): {run.state.name} {run.state.message or ''}"
                             f" [{where}]") + (f"\n  {url}" if url else ""))
    for lease in status.live:
        console.print(escape(f"running on this store: {lease['user']} on {lease['host']}, pid {lease['pid']}, since "
                             f"{since(lease)}"))
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

    if status.cost:
        render_cost(status.cost, console)

    if status.aside:
        console.print(f"[yellow]{len(status.aside)} unreadable file(s) kept aside; what they held reads as not done, "
                      "so the next run computes it again:[/]")
        for path in status.aside:
            console.print(f"  {escape(path)}", soft_wrap=True)

    if status.gates:
        render_gates(status.gates, console)

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
