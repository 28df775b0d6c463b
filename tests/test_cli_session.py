"""What every command sets before Prefect is imported (flows/cli/session.py): telemetry off, server and SDK both,
and transformers' loading bars off (they would break into the run's progress bar).

Prefect's SDK reads only DO_NOT_TRACK (and CI variables) for its own telemetry, and on a terminal prints a first-run
notice; PREFECT_SERVER_ANALYTICS_ENABLED covers the server alone. Checked in a fresh interpreter with no CI variable
and no opt-out inherited, with and without the CLI's environment (no telemetry is sent either way: that needs a
terminal, which a subprocess here is not).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

TELEMETRY = "from prefect._internal.analytics.enabled import is_telemetry_enabled; print(is_telemetry_enabled())"
BARS = "from transformers.utils.logging import is_progress_bar_enabled; print(is_progress_bar_enabled())"


def _ask(setup: str, check: str) -> str:
    from prefect._internal.analytics.ci_detection import CI_ENV_VARS

    env = {k: v for k, v in os.environ.items()
           if k not in CI_ENV_VARS and k not in ("DO_NOT_TRACK", "HF_HUB_DISABLE_PROGRESS_BARS")}
    out = subprocess.run([sys.executable, "-c", f"{setup}; {check}"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


CLI = "import flows.cli.session as s; s.command_env()"


@pytest.mark.parametrize("check", [TELEMETRY, BARS], ids=["prefect-sdk-telemetry", "transformers-bars"])
def test_the_cli_turns_it_off(check):
    assert _ask(CLI, check) == "False"
    assert _ask("pass", check) == "True"  # the control: on unless something turns it off
