"""Every finished cell of every screen in a store, one row each: what `eps-screen results` prints or writes.

A cell is finished when its metrics.json exists (the store writes it last), so the table is read from those files
alone, never from the adapters. A screen whose recipe changed keeps its earlier cells under other keys; `current`
says which rows the screen's latest config would reuse. Factor columns are named by the factors' letters: screens
with different factors share the table, a factor a screen lacks being null there. The columns are flat (no
nested types), so the parquet reads as it is in polars, pandas or DuckDB. `gpu_seconds` and `cost_usd` are the
cell's share of what its GPU runs cost (eps_screen/plan/costs.py: the pods' recorded prices, split by the cells'
recorded seconds), 0 for a cell computed in-process.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from eps_screen.plan.costs import CellCost, charges
from eps_screen.spec.design import Cell, level_code
from eps_screen.store.result_store import ResultStore, ScreenNotFound, cell_key, load_screen, read_json, screen_names

FORMATS = ("table", "csv", "parquet")

# (column, dtype, path in metrics.json), in the order the table shows them, before the factor columns.
_COLUMNS = (
    ("screen", pl.String, None),
    ("cell_id", pl.String, ("cell_id",)),
    ("source", pl.String, ("source",)),
    ("seed", pl.Int64, ("seed",)),
    ("levels", pl.String, None),
    ("key", pl.String, ("key",)),
    ("current", pl.Boolean, None),
    ("source_rate", pl.Float64, ("source_rate",)),
    ("leakage", pl.Float64, ("leakage",)),
    ("random_control_rate", pl.Float64, ("random_control_rate",)),
    ("answers", pl.Int64, ("answers",)),
    ("train_loss", pl.Float64, ("train", "final_loss")),
    ("train_tokens", pl.Int64, ("train", "tokens")),
    ("train_s", pl.Float64, ("timings", "train_s")),
    ("cell_s", pl.Float64, ("timings", "total_s")),
    ("gpu_seconds", pl.Float64, None),
    ("cost_usd", pl.Float64, None),
)


def _get(data: dict, path: tuple[str, ...]):
    for part in path:
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def _rows(root: Path, screen: str) -> list[dict]:
    try:
        config = load_screen(root, screen)
    except (ScreenNotFound, ValueError):  # a screen.json this version cannot read: its cells, without `current`
        config = None
    store = ResultStore(root, screen)
    priced = charges(store.run_costs())
    rows = []
    for path in sorted((root / screen / "cells").glob("*/*/metrics.json")):
        metrics = store.read_checked(path, f"cell {path.parent.parent.name}", read_json)
        if metrics is None:  # unreadable: kept aside, so the next run computes the cell again
            continue
        cell = Cell.parse(metrics["cell_id"])
        row = {name: _get(metrics, where) for name, _, where in _COLUMNS if where}
        row["key"] = row["key"] or path.parent.name
        row |= {"screen": screen, "levels": level_code(cell.factors, cell.levels),
                "current": None if config is None else cell_key(config, cell) == row["key"]}
        row |= cell.row_levels  # a centre cell's midpoint is no level 0 or 1: left empty, as in its answers
        row |= _cost(priced.get((cell.id, row["key"])), metrics)
        rows.append(row)
    return rows


def _cost(charged: CellCost | None, metrics: dict) -> dict:
    """The cell's share of its runs' pod costs (eps_screen/plan/costs.py); $0 for a cell computed in-process (the CPU
    costs nothing); null for a GPU cell whose runs were never priced."""
    if charged is not None:
        return {"gpu_seconds": charged.gpu_seconds, "cost_usd": charged.usd}
    in_process = _get(metrics, ("config", "execution", "pool")) in ("inprocess", None)
    return {"gpu_seconds": 0.0, "cost_usd": 0.0} if in_process else {"gpu_seconds": None, "cost_usd": None}


def results_table(root: str | Path, screens: list[str] | None = None) -> pl.DataFrame:
    """One row per finished cell of the named screens (default: every screen in the store)."""
    root = Path(root)
    known = screen_names(root)
    missing = [s for s in screens or [] if s not in known]
    if missing:
        raise ScreenNotFound(f"no screen {', '.join(map(repr, missing))} in store {root} "
                             f"(found: {', '.join(known) or 'none'})")
    rows = [r for s in screens or known for r in _rows(root, s)]
    factors = sorted({k for r in rows for k in r if len(k) == 1 and k.isupper()})
    schema = {name: dtype for name, dtype, _ in _COLUMNS} | {f: pl.Int8 for f in factors}
    return pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)


def where(table: pl.DataFrame, condition: str) -> pl.DataFrame:
    """The rows that meet an SQL condition over the columns, e.g. "E = 1 AND source_rate > 0.1"."""
    try:
        return pl.SQLContext(cells=table, eager=True).execute(f"SELECT * FROM cells WHERE {condition}")
    except (pl.exceptions.PolarsError, ValueError) as exc:
        columns = ", ".join(table.columns)
        reason = str(exc).strip().splitlines()[0]
        raise ValueError(f"--where {condition!r} is not an SQL condition over the columns ({columns}): {reason}") from exc
