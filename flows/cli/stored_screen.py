"""status, retry and report: commands on a screen already in the store, named by SCREEN and --store."""

from __future__ import annotations

import sys
from collections.abc import Callable

from eps_screen.config import ConfigError, ScreenConfig
from eps_screen.store import ResultStore, ScreenNotFound, load_screen
from flows.cli.session import command_env
from flows.runtime.submit import CannotSubmit


def screen_command(fn: Callable[[object, ScreenConfig, ResultStore], int]) -> Callable[[object], int]:
    """The command gets the screen's stored config and its store, each built once here. A missing screen, or a
    --submit no worker could run, is one line on stderr, exit 2."""

    def run(args) -> int:
        command_env()
        try:
            config = load_screen(args.store, args.screen)
            return fn(args, config, ResultStore.for_config(config))
        except (ScreenNotFound, CannotSubmit) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except ConfigError as err:
            print(f"error: the stored config of {args.screen!r} is no longer valid: {err.problems[0]}", file=sys.stderr)
            return 2

    return run
