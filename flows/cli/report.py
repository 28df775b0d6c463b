"""`eps-screen report SCREEN`: re-aggregate a screen now (partial screens too) and show its gates."""

from __future__ import annotations

from flows.cli.session import console
from flows.cli.stored_screen import screen_command
from flows.runtime.submit import report


@screen_command
def run(args, config, store) -> int:
    return report(config, store, console())
