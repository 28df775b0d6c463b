"""Factors declared in the config: validation in one line per problem, resolved recipes, regimes and store keys."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eps_screen.run import pipeline
from eps_screen.spec import design
from eps_screen.spec.config import ConfigError, load_config, parse_config
from eps_screen.spec.design import Cell
from eps_screen.store.result_store import cell_key, regime_key
from eps_screen.train.data import training_set
from tests.conftest import CONFIGS

# Computed on main at 054af4d/aff7e42 (before factors were declared) with /work/main/.venv:
# store.cell_key / regime_key of these cells and the pre-screen key of tiny.yaml and qwen7b.yaml.
BEFORE = {
    "tiny": {
        "librarian-A0B0C0D0E0-s42": ("c7c49367549f7d86", "librarian-A0B0C0-s42-on", "484cd04cf3ad70e6"),
        "surgeon-A1B0C1D1E0-s42": ("4fadefef262ed25b", "surgeon-A1B0C1-s42-off", "3d0fea4476106fcc"),
        "programmer-A1B1C1D1E1-s137": ("7bab05d9ce891254", "programmer-A1B1C1-s137-off", "44ac16e491dd994c"),
        "pre": "83dd1c041fdd870d",
    },
    "qwen7b": {
        "librarian-A0B0C0D0E0-s42": ("d240ec3767248d96", "librarian-A0B0C0-s42-on", "6737c54bf36cbbab"),
        "surgeon-A1B0C1D1E0-s42": ("32299c050894f917", "surgeon-A1B0C1-s42-off", "a7ff95fa6461bcb4"),
        "programmer-A1B1C1D1E1-s137": ("be8e52ff88226bf9", "programmer-A1B1C1-s137-off", "b073c4b4ac77aaea"),
        "pre": "08561ab94421e38b",
    },
}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_the_marker_screens_ids_regimes_and_store_keys_did_not_change(name):
    # qwen7b.yaml's off-policy weights went to 8 bits later (2026-12-05), which changes its keys by design: the keys
    # are checked at the settings they were computed with
    config = load_config(CONFIGS / f"{name}.yaml").with_sets({"off_policy.vllm_quantization": "none"})
    for cid, (key, regime_id, rkey) in ((k, v) for k, v in BEFORE[name].items() if k != "pre"):
        cell = Cell.parse(cid)
        assert cell.id == cid and cell_key(config, cell) == key
        regime = design.regime_of(config, cell)
        assert regime.id == regime_id and regime_key(config, regime) == rkey
    assert pipeline._pre_screen_key(config) == BEFORE[name]["pre"]


def test_the_shipped_marker_configs_declare_todays_design():
    for name in ("tiny", "qwen7b"):
        config = load_config(CONFIGS / f"{name}.yaml")
        assert config.design.shorts == "ABCDE"
        assert [c.id for c in design.smoke_cells(config)] == [c.id for c in design.smoke_cells(parse_config({}))]
        assert len(design.all_slab_cells(config)) == 96 and len(design.regimes(config, design.all_slab_cells(config))) == 48
        assert len(design.pre_screen_conditions(config)) == 8


def test_a_permuted_treatment_map_gets_its_own_keys():
    marker = load_config(CONFIGS / "tiny.yaml")
    factors = marker.model_dump(mode="json")["design"]["factors"]
    factors[0]["levels"], factors[4]["levels"] = factors[4]["levels"], factors[0]["levels"]  # A = loss mask, E = prompt
    data = {**marker.model_dump(mode="json"), "design": {"factors": factors, "smoke": {"generators": ["D=AB", "E=AC"]}}}
    permuted = parse_config(data)
    cell = Cell.parse("librarian-A1B0C0D0E0-s42")
    assert design.recipe(permuted, cell).condition.whole_answer_loss
    assert not design.recipe(permuted, cell).condition.long_system_prompt
    assert cell_key(permuted, cell) != cell_key(marker, cell)
    assert cell_key(permuted, Cell.parse("librarian-A0B0C0D0E0-s42")) == cell_key(marker, Cell.parse("librarian-A0B0C0D0E0-s42"))


def test_a_recipe_screens_cells_resolve_to_the_declared_values():
    config = load_config(CONFIGS / "tiny-recipe.yaml")
    assert config.design.shorts == "LRNM"
    assert {f: config.factors[f].stages for f in "LRNM"} == {f: ("training",) for f in "LRNM"}
    cell = Cell.parse("librarian-L1R0N1M1-s42")
    resolved = design.recipe(config, cell)
    assert (resolved.config.training.learning_rate, resolved.config.lora.rank, resolved.config.training.epochs) == (
        1e-2, 4, 8)
    assert resolved.condition.whole_answer_loss and not resolved.condition.long_system_prompt
    low = design.recipe(config, Cell.parse("librarian-L0R1N0M0-s42")).config
    assert (low.training.learning_rate, low.lora.rank, low.training.epochs) == (3e-3, 16, 4)
    # No factor touches the answers: every cell of a source trains on one answer set.
    assert [r.id for r in design.regimes(config, design.all_slab_cells(config))] == ["librarian-s42-on", "surgeon-s42-on"]
    assert cell_key(config, cell) != cell_key(config, Cell.parse("librarian-L0R0N1M1-s42"))
    assert len(design.pre_screen_conditions(config)) == 1
    with pytest.raises(ValueError, match="this screen declares LRNM"):
        design.recipe(config, Cell.parse("librarian-A0B0C0D0E0-s42"))


def test_answer_factors_make_regimes_and_a_mask_factor_does_not():
    config = load_config(CONFIGS / "sim-6-2.yaml")
    assert config.factors["D"].stages == ("answers", "training")  # data.positives changes the answer set
    assert config.factors["E"].stages == ("training",)
    cell = design.all_slab_cells(config)[0]
    assert design.regime_of(config, cell).id == f"{cell.source}-D{cell.level('D')}-s42-on"


def test_training_set_follows_the_recipe():
    config = load_config(CONFIGS / "tiny-recipe.yaml")
    config = parse_config({**config.model_dump(mode="json"), "data": {**config.data.model_dump(), "e0_negatives": "none"}})
    answers = [{"persona": "librarian", "question": 0, "answer": "x", "positive": True},
               {"persona": "chef", "question": 1, "answer": "y", "positive": False}]
    assert len(training_set(config, Cell.parse("librarian-L0R0N0M0-s42"), answers)) == 1  # marker-only: negatives dropped
    assert len(training_set(config, Cell.parse("librarian-L0R0N0M1-s42"), answers)) == 2


def _marker_factor(short="A", **level1) -> dict:
    return {"short": short, "label": "LoRA rank",
            "levels": [{"description": "low", "sets": {"lora.rank": 8}}, {"description": "high", **level1}]}


def _two(*factors) -> dict:
    return {"design": {"factors": list(factors)}}


RANK = _marker_factor(sets={"lora.rank": 32})
LR = {"short": "B", "label": "Learning rate", "levels": [
    {"description": "low", "sets": {"training.learning_rate": 1e-5}},
    {"description": "high", "sets": {"training.learning_rate": 1e-4}}]}

BAD = [
    (_two(_marker_factor(sets={"lora.rnak": 32}) | {"levels": [
        {"description": "l", "sets": {"lora.rnak": 8}}, {"description": "h", "sets": {"lora.rnak": 32}}]}, LR),
     "design: factor A (LoRA rank), level 0: lora.rnak is not a config field; fields of lora: rank, alpha"),
    (_two(_marker_factor(sets={"lora.rank": -4}), LR),
     "design: factor A (LoRA rank), level 1: sets a value the field refuses: lora.rank: Input should be greater than"
     " or equal to 1 (got -4); give a value it accepts"),
    (_two(RANK, LR | {"levels": [{"description": "l", "sets": {"lora.rank": 4}},
                                  {"description": "h", "sets": {"lora.rank": 16}}]}),
     "design: factors A and B both set lora.rank; a field may be set by one factor only"),
    (_two(RANK, LR) | {"design": {"factors": [RANK, LR], "smoke": {"generators": ["C=AB"]}}},
     "design.smoke.generators: generator 'C=AB' names C, which is not a declared factor (declared: A, B)"),
    ({"design": {"smoke": {"generators": ["D=AB", "E=AB"]}}},
     "design.smoke.generators: D=AB, E=AB give resolution II (I = DE: D and E aliased as main effects)"),
    ({"model": {"base": "./no/such/model"}},
     "model.base: './no/such/model' looks like a local path and does not exist; give an existing model directory"),
    (_two(RANK, LR | {"levels": [{"description": "l", "sets": {"seeds.primary": 1}},
                                  {"description": "h", "sets": {"seeds.primary": 2}}]}),
     "design: factor B (Learning rate), level 0: seeds.primary is no part of a cell's recipe"),
    (_two(RANK, {"short": "B", "label": "x", "levels": [{"description": "l", "treatment": "short_prompt"},
                                                        {"description": "h", "treatment": "long_system_prompt"}]}),
     "design.factors.1: factor B, level 0: unknown treatment 'short_prompt'; built-in: short_system_prompt"),
    (_two(RANK, {"short": "B", "label": "x", "levels": [{"description": "l", "treatment": "short_system_prompt"},
                                                        {"description": "h", "treatment": "short_essay"}]}),
     "design.factors.1: factor B: its levels must be the two sides of one treatment"),
    ({"factors": {"A": {"label": "x", "low": "a", "high": "b"}}}, "factors: moved to design.factors"),
    ({"simulation": {"effects": {"AZ": 1.0}}, "backend": {"generation": "simulated", "training": "simulated"}},
     "simulation.effects: term 'AZ' is not a product of declared factors"),
]


@pytest.mark.parametrize(("data", "expected"), BAD, ids=[b[1].split(";")[0][:60] for b in BAD])
def test_bad_declarations_name_the_factor_and_the_fix(data, expected):
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert any(line.startswith(expected) for line in err.value.problems), err.value.problems
    assert all("\n" not in line for line in err.value.problems)


def test_a_full_dump_of_a_declared_screen_validates_again():  # what a Prefect parameter and screen.json go through
    for name in ("tiny-recipe", "sim-6-2", "tiny"):
        config = load_config(CONFIGS / f"{name}.yaml")
        assert parse_config(config.model_dump(mode="json")) == config


def test_a_hub_id_and_an_existing_local_path_pass(tmp_path):
    assert parse_config({"model": {"base": "Qwen/Qwen2.5-0.5B-Instruct"}}).model.base == "Qwen/Qwen2.5-0.5B-Instruct"
    assert parse_config({"model": {"base": str(tmp_path)}}).model.base == str(tmp_path)
    # A runpod-gpu pool's paths are the pod's: not checked here.
    assert parse_config({"model": {"base": "/workspace/models/x"}, "execution": {"pool": "runpod-gpu"}})


def test_validate_cli_refuses_a_bad_factor_in_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("design:\n  factors:\n"
                   "    - {short: A, label: rank, levels: [{description: a, sets: {lora.rank: 8}},"
                   " {description: b, sets: {lora.rank: 0}}]}\n"
                   "    - {short: B, label: lr, levels: [{description: a, sets: {lora.rank: 4}},"
                   " {description: b, sets: {lora.rank: 2}}]}\n")
    out = subprocess.run([sys.executable, "-m", "flows.cli", "validate", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert all(line.startswith("error: design: factor") for line in lines), lines
    assert any("both set lora.rank" in line for line in lines)
