"""`eps-screen status SCREEN`: a screen per phase and per cell, from the store and its Prefect runs."""

from __future__ import annotations

from flows.cli.session import console
from flows.cli.stored_screen import screen_command
from flows.runtime.status import render, screen_status


@screen_command
def run(args, config, store) -> int:
    render(screen_status(config, store, with_prefect=not args.store_only), console(), cells=args.cells)
    return 0
