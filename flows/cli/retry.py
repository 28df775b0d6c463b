"""`eps-screen retry SCREEN`: run a screen again, computing only its unfinished cells, then re-aggregate."""

from __future__ import annotations

from flows.cli.session import console
from flows.cli.stored_screen import screen_command
from flows.runtime.interrupt import until_interrupted
from flows.runtime.submit import retry


@screen_command
def run(args, config, store) -> int:
    return until_interrupted(lambda: retry(config, store, console(), force=args.force, submit=args.submit,
                                           wait_s=args.wait), store.finished_count)
