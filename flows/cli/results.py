"""`eps-screen results`: every finished cell of every screen in a store, one row each (no Prefect)."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl

from eps_screen.analysis.results_table import results_table, where
from eps_screen.store.result_store import ScreenNotFound
from flows.cli.session import NoStore, existing_store


def run(args) -> int:
    if args.format == "parquet" and not args.output:
        print("--format parquet writes a file: give it --output FILE (e.g. --output cells.parquet)", file=sys.stderr)
        return 2
    try:
        # a URL store: its local mirror on this machine
        root = existing_store(args.store or "results", None if args.store else "the default --store results")
        table = results_table(root, args.screen)
        if args.where:
            table = where(table, args.where)
    except (NoStore, ScreenNotFound, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.format == "parquet":
        table.write_parquet(args.output)
    elif args.format == "csv":
        if args.output:
            table.write_csv(args.output)
        else:
            sys.stdout.write(table.write_csv())
    else:
        with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=400, tbl_hide_dataframe_shape=True):
            print(table)
    if args.output:
        print(f"{table.height} cells of {table['screen'].n_unique()} screen(s) -> {Path(args.output).resolve()}",
              file=sys.stderr)
    return 0
