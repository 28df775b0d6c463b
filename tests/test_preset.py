"""The `screen/preset` deployment (issue 13): a preset's name or a path plus overrides, validated at submit and
when the run starts; a screen whose cells go to a pool with no worker fails at once with the command that starts
one; `eps-screen run --submit` says the same for the `cpu` pool instead of leaving a run Late."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
import yaml

from eps_screen.spec.config import ConfigError
from eps_screen.spec.presets import preset_names, resolve, screen_name, with_overrides
from tests.conftest import CONFIGS, ROOT, drop_pools

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_the_dropdown_lists_every_shipped_config():
    from flows.preset import Preset, screen_preset

    assert sorted(typing.get_args(Preset)) == preset_names(ROOT) == sorted(p.stem for p in CONFIGS.glob("*.yaml"))
    schema = screen_preset.parameters.model_dump()["properties"]
    assert sorted(schema["preset"]["enum"]) == preset_names(ROOT)
    assert set(schema) == {"preset", "config_path", "name", "store", "overrides"}
    for field in schema.values():  # Prefect's form strips angle brackets: a help text must not need them
        assert field.get("description") and "<" not in field["description"], field


def test_overrides_by_dotted_path_and_as_a_partial_config(tmp_path):
    config = resolve("simulated", name="mine", store=str(tmp_path), base=ROOT,
                     overrides={"execution.max_parallel_cells": 3, "eval": {"samples": 2}})
    shipped = yaml.safe_load((CONFIGS / "simulated.yaml").read_text())
    assert (config.name, config.store, config.execution.max_parallel_cells) == ("mine", str(tmp_path), 3)
    assert config.eval.samples == 2 and config.eval.personas == shipped["eval"]["personas"]  # merged, not replaced
    assert config.execution.pool == "inprocess"
    assert with_overrides({"a": {"b": 1}}, {"a.c": 2}) == {"a": {"b": 1, "c": 2}}


def test_a_path_instead_of_a_preset(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text((CONFIGS / "tiny.yaml").read_text())
    assert resolve("simulated", config_path=str(path)).name == "tiny"


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"overrides": {"execution.pool": "gpu-farm"}}, "execution.pool"),
    ({"overrides": {"name.first": "x"}}, "overrides: 'name.first': name is a value, not a section"),
    ({"overrides": {"execution..pool": "x"}}, "overrides: 'execution..pool' is not a field path"),
    ({"name": "Not A Slug!"}, "name"),
    ({"config_path": "nope.yaml"}, "config_path: "),
])
def test_bad_input_names_the_field(kwargs, expected):
    with pytest.raises(ConfigError) as err:
        resolve("simulated", base=ROOT, **kwargs)
    assert err.value.problems[0].startswith(expected), err.value.problems


def test_a_preset_outside_the_repository_says_where_it_looked(tmp_path):
    with pytest.raises(ConfigError) as err:
        resolve("tiny", base=tmp_path)
    assert err.value.problems == [f"preset: {tmp_path / 'deployments/configs/tiny.yaml'} does not exist (read from "
                                  f"the run's working directory {tmp_path}: run `eps-screen deploy` from the "
                                  "repository root, or give an absolute config_path)"]


def test_the_screen_name_of_either_form():
    assert screen_name({"config": {"name": "full"}}) == "full"
    assert screen_name({"preset": "tiny"}, base=ROOT) == "tiny"
    assert screen_name({"preset": "tiny", "name": "mine"}, base=ROOT) == "mine"
    assert screen_name({"preset": "tiny", "overrides": {"name": "over"}}, base=ROOT) == "over"
    assert screen_name({"preset": "gone"}, base=ROOT) == "screen"


@pytest.fixture
def client():
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        yield client
        drop_pools(client)


def _pool(client, name: str) -> None:
    from prefect.client.schemas.actions import WorkPoolCreate

    client.create_work_pool(WorkPoolCreate(name=name, type="process"))


def test_the_server_refuses_a_preset_not_in_the_list(client):
    from prefect.exceptions import PrefectHTTPStatusError

    from flows.preset import screen_preset

    _pool(client, "cpu")
    flow_id = client.create_flow_from_name("screen")
    deployment = client.create_deployment(flow_id=flow_id, name="preset", work_pool_name="cpu",
                                          entrypoint="flows/preset.py:screen_preset", enforce_parameter_schema=True,
                                          parameter_openapi_schema=screen_preset.parameters.model_dump())
    with pytest.raises(PrefectHTTPStatusError) as err:
        client.create_flow_run_from_deployment(deployment, parameters={"preset": "qwen70b"})
    assert err.value.response.status_code == 409 and "qwen70b" in err.value.response.text
    assert client.create_flow_run_from_deployment(deployment, parameters={"preset": "tiny", "name": "ok"}).id


def test_a_bad_override_fails_the_run_at_once_naming_the_field(tmp_path):
    from flows.preset import screen_preset

    state = screen_preset("simulated", store=str(tmp_path), overrides={"execution.pool": "gpu-farm"},
                          return_state=True)
    assert state.is_failed() and state.message.startswith("execution.pool: "), state.message
    assert not (tmp_path / "simulated").exists()


def test_cells_for_a_pool_with_no_worker_fail_at_once_with_the_command(tmp_path, client):
    from flows.preset import screen_preset

    def run():
        return screen_preset("simulated", name="noworker", store=str(tmp_path),
                             overrides={"execution.pool": "local-gpu"}, return_state=True)

    state = run()
    assert state.is_failed() and state.message == "work pool 'local-gpu' does not exist: run `eps-screen deploy`"
    _pool(client, "local-gpu")
    state = run()
    assert state.is_failed() and state.message == (
        "no worker online for pool 'local-gpu': start one (deployments/pools/start-local-gpu-workers.sh; "
        "docs/walkthroughs.md)")
    assert not list(Path(tmp_path).glob("noworker/cells/*"))
    assert client.read_flow_run(state.state_details.flow_run_id).name == "screen-noworker"


def test_submit_with_no_cpu_worker_is_one_line_not_a_late_run(tmp_path, client, capsys):
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    from flows.cli import main

    path = tmp_path / "screen.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load((CONFIGS / "simulated.yaml").read_text()),
                                    "store": str(tmp_path / "store")}))
    assert main(["run", str(path), "--submit", "--no-watch"]) == 2
    assert capsys.readouterr().err.strip() == ("error: deployment 'screen/screen' does not exist: run `eps-screen "
                                               "deploy` from the repository root")
    _pool(client, "cpu")
    deployment = client.create_deployment(flow_id=client.create_flow_from_name("screen"), name="screen",
                                          work_pool_name="cpu", entrypoint="flows/screen.py:screen")
    assert main(["run", str(path), "--submit", "--no-watch"]) == 2
    assert capsys.readouterr().err.strip() == ("error: no worker online for pool 'cpu': start one (prefect worker "
                                               "start --pool cpu; docs/walkthroughs.md)")
    assert client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment]))) == []


def test_the_full_config_form_accepts_every_shipped_config_at_submit(client):
    """`eps-screen run --submit` sends the whole config to the `screen` deployment, whose schema is enforced too."""
    from eps_screen.spec.config import load_config
    from flows.screen import screen

    _pool(client, "cpu")
    deployment = client.create_deployment(flow_id=client.create_flow_from_name("screen"), name="screen",
                                          work_pool_name="cpu", entrypoint="flows/screen.py:screen",
                                          enforce_parameter_schema=True,
                                          parameter_openapi_schema=screen.parameters.model_dump())
    for path in sorted(CONFIGS.glob("*.yaml")):
        config = load_config(path).model_dump(mode="json")
        assert client.create_flow_run_from_deployment(deployment, parameters={"config": config}).id, path


def test_no_help_text_of_either_form_needs_angle_brackets():
    """The UI's form strips `<...>` from descriptions ("results go to //."): neither form's help may use them."""
    from flows.preset import screen_preset
    from flows.screen import screen

    def descriptions(node):
        if isinstance(node, dict):
            if isinstance(node.get("description"), str):
                yield node["description"]
            for value in node.values():
                yield from descriptions(value)
        elif isinstance(node, list):
            for value in node:
                yield from descriptions(value)

    for flow in (screen, screen_preset):
        texts = list(descriptions(flow.parameters.model_dump()))
        assert len(texts) > 4 and not [t for t in texts if re.search(r"<[^>]*>", t)], flow.name


def test_kill_criterion_5_is_a_gate_task_that_ends_the_screen_killed(tmp_path, monkeypatch):
    """Dispatch stops on the spend cap: the `gate 5: cost overrun` task shows the ledger's outcome and ends Killed,
    without writing the record a second time (flows/runtime/ledger.py wrote it once)."""
    import json

    import flows.screen
    from eps_screen.analysis import gates
    from eps_screen.plan.screen_plan import make_plan
    from eps_screen.spec.config import parse_config
    from eps_screen.store.result_store import ResultStore
    from flows.runtime.dispatch import CostOverrun
    from flows.screen import ScreenRun, Stopped

    data = yaml.safe_load((CONFIGS / "simulated.yaml").read_text())
    config = parse_config({**data, "name": "cap", "store": str(tmp_path), "execution": {"pool": "local-gpu"}})
    decided = gates.cost_overrun(0.1, 0.9, 0.30, config.gates.max_job_hours, config.gates.spend_factor)
    assert decided.fired
    recorded = decided.model_copy(update={"reason": "spend $0.46 passed 1.5 x the estimate $0.30; cancelled 1 cell(s)",
                                          "numbers": {**decided.numbers, "cancelled": 1}})
    ResultStore.for_config(config).save_gate(recorded.model_dump(mode="json"))  # as the ledger records it

    def over(*args, **kwargs):
        raise CostOverrun("Kill criterion 5 (cost overrun): " + recorded.reason, {}, gate=recorded,
                                   cancelled=["a-A0B0C0D0E0-s1"])

    monkeypatch.setattr(flows.screen, "dispatch_cells", over)
    gates_file = tmp_path / "cap" / "phases" / "gates.json"
    written = gates_file.stat().st_mtime_ns
    with pytest.raises(Stopped) as err:
        ScreenRun(config, ResultStore.for_config(config), make_plan(config)).dispatch(["a-A0B0C0D0E0-s1"])
    assert err.value.state.name == "Killed"
    assert err.value.state.message == ("kill criterion 5 (cost overrun): spend $0.46 passed 1.5 x the estimate $0.30;"
                                       " cancelled 1 cell(s)")
    # one record: the ledger's, untouched by the gate task
    assert gates_file.stat().st_mtime_ns == written
    assert json.loads(gates_file.read_text())["5"] == recorded.model_dump(mode="json")


def test_the_preset_help_is_written_from_the_shipped_configs(tmp_path):
    """Each preset's help on the form is the first sentence of its config's opening comment: a new or edited preset
    documents itself."""
    from eps_screen.spec.presets import preset_summaries, preset_summary
    from flows.preset import screen_preset

    text = screen_preset.parameters.model_dump()["properties"]["preset"]["description"]
    summaries = preset_summaries(ROOT)
    assert set(summaries) == set(preset_names(ROOT))
    for name, summary in summaries.items():
        assert f"{name}: {summary}" in text and len(summary) > 20
    assert summaries["tiny"].endswith("in-process on the CPU, in minutes")  # tiny.yaml's own words

    path = tmp_path / "mine.yaml"
    path.write_text("# eps-screen run mine.yaml\n#\n# A screen of <= 8 cells (mine: one source, a 2^3 of rank,\n"
                    "# learning rate and epochs) on the tiny model: minutes. Second sentence.\nname: mine\n")
    assert preset_summary(path) == "A screen of at most 8 cells (mine: one source, a 2^3 of rank, learning rate and " \
                                   "epochs) on the tiny model: minutes"
    path.write_text("# " + "A long one, " * 30 + "the end: and more.\nname: long\n")
    assert preset_summary(path) == ("A long one, " * 16).rstrip(", ") + " ..."
