"""flows/runtime/names.py, the one table of pools and deployments, agrees with what Prefect is given."""

from __future__ import annotations

import ast
import re

import yaml

from flows.runtime import names
from tests.conftest import ROOT


def _flow_names(path) -> dict[str, str]:
    """Function name -> the `name=` of its @flow decorator, read from the source (no import)."""
    found = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and getattr(deco.func, "id", None) == "flow":
                    found[node.name] = next(k.value.value for k in deco.keywords if k.arg == "name")
    return found


def test_the_table_is_what_prefect_yaml_deploys():
    spec = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())["deployments"]
    declared = {}
    for d in spec:
        file, function = d["entrypoint"].split(":")
        declared[d["name"]] = (_flow_names(ROOT / file)[function], d["work_pool"]["name"])
    assert declared == {d.name: (d.flow, d.pool) for d in names.DEPLOYMENTS}


def test_the_pools_are_those_of_deployments_pools():
    types = {p.stem: yaml.safe_load(p.read_text())["type"] for p in (ROOT / "deployments" / "pools").glob("*.yaml")}
    assert types == names.POOL_TYPES


def test_each_gpu_pool_of_the_config_has_its_cell_deployment():
    from eps_screen.spec.config import ExecutionConfig

    pools = set(ExecutionConfig.model_fields["pool"].annotation.__args__) - {"inprocess"}
    assert set(names.JOB_DEPLOYMENTS) == pools
    assert set(names.JOB_DEPLOYMENTS.values()) == {"job/job-local-gpu", "job/job-runpod"}


def test_the_integration_tier_deploys_flows_that_exist():
    """A renamed flow file must fail here, in the fast tier, not in (or silently around) a slow integration test."""
    found = []
    for test in (ROOT / "tests" / "integration").glob("*.py"):
        for file, function in re.findall(r"[\"']([\w/]+\.py):(\w+)[\"']", test.read_text()):
            found.append(file)
            assert (ROOT / file).is_file(), f"{test.name} deploys {file}:{function}, a missing file"
            assert function in _flow_names(ROOT / file), f"{test.name} deploys {file}:{function}, not a flow there"
    assert "flows/job.py" in found
