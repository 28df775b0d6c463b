"""status, retry and report: commands on a screen already in the store, named by its config file or by its name.

A config file gives the screen's name and its store (`--store` overrides it). A bare name is looked up in --store,
else in `results` and in the stores screen runs registered on this machine (eps_screen.report.stores). A store that
does not exist is an error naming its path, never an empty answer.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from eps_screen.spec.config import ConfigError, ScreenConfig
from eps_screen.spec.config_urls import is_url
from eps_screen.store.result_store import ResultStore, ScreenNotFound, load_screen, local_dir
from flows.cli.session import NoStore, command_env, existing_store, load
from flows.runtime.submit import CannotSubmit

DEFAULT_STORE = "results"


def is_config_file(arg: str) -> bool:
    return arg.endswith((".yaml", ".yml")) or Path(arg).is_file()


def find_screen(arg: str, store: str | None) -> ScreenConfig:
    """The stored config of the screen `arg` names (a config file or a screen's name), its store set."""
    if is_config_file(arg):
        config = load(arg)
        root = store or config.store
        if not is_url(root):
            existing_store(root, None if store else f"store: {root} in {arg}")
        return load_screen(root, config.name)
    if store:
        if not is_url(store):
            existing_store(store)
        return load_screen(store, arg)
    return load_screen(_registered_store(arg), arg)


def _registered_store(name: str) -> str:
    """`results` when it holds the screen, else the one store registered on this machine that does."""
    from eps_screen.report.stores import registered

    if (local_dir(DEFAULT_STORE) / name / "screen.json").exists():
        return DEFAULT_STORE
    found = sorted({e["location"] for e in registered().values() if (Path(e["dir"]) / name / "screen.json").exists()})
    if len(found) == 1:
        return found[0]
    if found:
        raise ScreenNotFound(f"screen {name!r} is in several stores ({', '.join(found)}): name one with --store, or "
                             "give the screen's config file")
    raise ScreenNotFound(f"no screen {name!r} in {local_dir(DEFAULT_STORE)} or in a store registered on this machine:"
                         " give the screen's config file, or its store with --store")


def screen_command(fn: Callable[[object, ScreenConfig, ResultStore], int]) -> Callable[[object], int]:
    """The command gets the screen's stored config and its store, each built once here. A missing store or screen,
    or a --submit no worker could run, is one line on stderr, exit 2."""

    def run(args) -> int:
        command_env()
        try:
            config = find_screen(args.screen, args.store)
            return fn(args, config, ResultStore.for_config(config))
        except (NoStore, ScreenNotFound, CannotSubmit) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except ConfigError as err:
            print(f"error: the stored config of {args.screen!r} is no longer valid: {err.problems[0]}", file=sys.stderr)
            return 2

    return run
