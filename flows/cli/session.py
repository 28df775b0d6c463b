"""What every command may need: a config read (or one line per problem), a store that exists, Prefect's environment,
the console."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from eps_screen.spec.config import ConfigError, ScreenConfig, load_config
from eps_screen.spec.config_urls import is_url
from eps_screen.store.result_store import ResultStore


def load(path: str) -> ScreenConfig:
    """The config at `path`, or each of its problems on stderr and exit 2."""
    try:
        return load_config(path)
    except ConfigError as err:
        for line in err.problems:
            print(f"error: {line}", file=sys.stderr)
        raise SystemExit(2) from None


class NoStore(LookupError):
    """A local store (or a URL store's mirror on this machine) that does not exist."""


def existing_store(root: str, named_by: str | None = None) -> Path:
    """The local directory of a store (a URL store's mirror), or NoStore naming the path and what named it
    (`named_by`, default "--store ROOT")."""
    path = ResultStore(root, "-").root
    if path.is_dir():
        return path
    named_by = named_by or f"--store {root}"
    if is_url(root):
        raise NoStore(f"no local copy of the store {root} at {path} ({named_by}): run a screen on it from this "
                      "machine, or give its copy's directory with --store")
    relative = "" if Path(root).expanduser().is_absolute() else f", relative to the working directory {Path.cwd()}"
    raise NoStore(f"no store at {path} ({named_by}{relative}): give the directory a screen wrote to with --store")


def command_env() -> None:
    """Before Prefect or transformers is imported (here and in the cell processes, which inherit it): no telemetry
    (the server's analytics, and the SDK's, whose first-run notice would land on the terminal), no loading bars
    between the run's own progress lines, and time for a temporary server to start on a busy machine."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' bars follow huggingface_hub's
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def console():
    from rich.console import Console

    # Piped output (logs, CI) gets 120 columns instead of rich's 80, so the tables stay readable.
    return Console(highlight=False, width=None if sys.stdout.isatty() else max(120, shutil.get_terminal_size().columns))

