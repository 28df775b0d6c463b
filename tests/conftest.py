"""Shared fixtures: the tiny-model cache, shipped configs, and one Prefect test harness per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "deployments" / "configs"

# Built tiny models are cached across test sessions (each variant takes ~40 s to build once).
os.environ.setdefault("EPS_SCREEN_CACHE", str(ROOT / ".eps-cache"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect server for in-process flow runs (starting one costs 6-11 s: once per session)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def tiny_config(store: Path, **overrides):
    """tiny.yaml with its store moved to `store` and any top-level sections replaced."""
    import yaml

    from eps_screen.config import parse_config

    data = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    data.update(store=str(store), **overrides)
    return parse_config(data)


def qwen7b_config(**sections):
    """qwen7b.yaml with the named sections updated key by key (section=dict of fields)."""
    import yaml

    from eps_screen.config import parse_config

    data = yaml.safe_load((CONFIGS / "qwen7b.yaml").read_text())
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return parse_config(data)


# The tiny screen's module fixture is the longest unit of the suite (13-16 minutes under CI's load). With
# two xdist workers it must start first, so the other worker runs the rest of the suite beside it instead of
# leaving it to run alone at the end. The Makefile passes --no-loadscope-reorder so xdist keeps this order.
RUN_FIRST = ("tests/test_screen_flow.py",)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in RUN_FIRST)
