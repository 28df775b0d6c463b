"""The Prefect UI's form for a screen: the `screen` flow's config parameter, factors included, is made of objects
with fixed fields (the form cannot render a free-form mapping, and refused "Use JSON input" over one), and what
the form sends back is a config."""

from __future__ import annotations

import pytest
from prefect.utilities.schema_tools.validation import validate

from eps_screen.spec.config import ConfigError, ScreenConfig, load_config, parse_config
from tests.conftest import CONFIGS

FACTOR_MODEL = "DesignConfig"


def _schema() -> dict:
    from flows.screen import screen

    return screen.parameters.model_dump()


def _reachable(defs: dict, name: str, seen: set[str] | None = None) -> set[str]:
    """The definitions a definition refers to, itself included."""
    seen = set() if seen is None else seen
    seen.add(name)

    def refs(node):
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref:
                yield ref.rsplit("/", 1)[-1]
            for v in node.values():
                yield from refs(v)
        elif isinstance(node, list):
            for v in node:
                yield from refs(v)

    for ref in refs(defs[name]):
        if ref not in seen:
            _reachable(defs, ref, seen)
    return seen


def _free_form(node, path: str = "") -> list[str]:
    """Every object schema with no fixed fields (additionalProperties only), by where it sits."""
    found = []
    if isinstance(node, dict):
        if node.get("type") == "object" and not node.get("properties"):
            found.append(path)
        for k, v in node.items():
            found += _free_form(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += _free_form(v, f"{path}[{i}]")
    return found


def test_the_factor_model_has_fixed_fields_only():
    defs = _schema()["definitions"]
    names = _reachable(defs, FACTOR_MODEL)
    assert {"Factor", "Level", "FractionSpec", "PredictionRule"} <= names
    problems = [f"{n}{p}" for n in sorted(names) for p in _free_form(defs[n])]
    assert problems == [], problems
    for name in names:  # every object of the factor model is a closed form: its fields and nothing else
        assert defs[name].get("additionalProperties") is False, name
    setting = next(s for s in defs["Level"]["properties"]["sets"]["anyOf"] if s.get("type") == "array")["items"]
    assert set(setting["properties"]) == {"path", "value"} and setting["additionalProperties"] is False


@pytest.mark.parametrize("name", ["tiny-recipe", "sim-6-2", "tiny", "qwen7b"])
def test_what_the_form_sends_validates_and_is_the_config(name):
    """A config as JSON (a submitted run's parameter, the form's fields) passes the parameter schema Prefect
    enforces at submit, and reads back as the same config."""
    config = load_config(CONFIGS / f"{name}.yaml")
    dumped = config.model_dump(mode="json")
    errors = validate({"config": dumped}, _schema())
    assert errors == [], [e.message for e in errors][:3]
    assert ScreenConfig.model_validate(dumped) == config


def test_a_level_in_the_forms_shape_is_the_mapping_yaml_writes():
    config = load_config(CONFIGS / "tiny-recipe.yaml")
    data = config.model_dump(mode="json")
    rank = next(f for f in data["design"]["factors"] if f["short"] == "R")
    assert rank["levels"][1]["sets"] == [{"path": "lora.rank", "value": 16}]
    assert config.factors["R"].levels[1].sets == {"lora.rank": 16}  # in Python, a mapping as in the YAML
    rank["levels"][1]["sets"] = [{"path": "lora.rank", "value": 16}, {"path": "lora.rank", "value": 32}]
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert len(err.value.problems) == 1 and "lora.rank is set twice" in err.value.problems[0], err.value.problems
