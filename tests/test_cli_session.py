"""What every command sets before Prefect is imported (flows/cli/session.py): telemetry off, server and SDK both.

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

CHECK = "from prefect._internal.analytics.enabled import is_telemetry_enabled; print(is_telemetry_enabled())"


def _telemetry_enabled(setup: str) -> str:
    from prefect._internal.analytics.ci_detection import CI_ENV_VARS

    env = {k: v for k, v in os.environ.items() if k not in CI_ENV_VARS and k != "DO_NOT_TRACK"}
    out = subprocess.run([sys.executable, "-c", f"{setup}; {CHECK}"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("setup, enabled", [
    ("import flows.cli.session as s; s.prefect_env()", "False"),
    ("pass", "True"),  # the control: Prefect's SDK telemetry is on unless something turns it off
])
def test_the_cli_turns_prefects_sdk_telemetry_off(setup, enabled):
    assert _telemetry_enabled(setup) == enabled
