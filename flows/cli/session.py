"""What every command may need: a config read (or one line per problem), Prefect's environment, the console."""

from __future__ import annotations

import os
import shutil
import sys

from eps_screen.config import ConfigError, ScreenConfig, load_config


def load(path: str) -> ScreenConfig:
    """The config at `path`, or each of its problems on stderr and exit 2."""
    try:
        return load_config(path)
    except ConfigError as err:
        for line in err.problems:
            print(f"error: {line}", file=sys.stderr)
        raise SystemExit(2) from None


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

