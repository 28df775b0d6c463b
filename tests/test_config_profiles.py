"""Size profiles (issue 43): a small model's config gets panel and data sizes made for it in every field it leaves
out, so a first screen of one's own on the tiny model is not the 7B's plan; what a config sets is kept, shipped
configs and stored screens are unchanged, and validate names the profile and what it filled."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from eps_screen.spec.config import ScreenConfig, parse_config, read_config_file
from eps_screen.spec.config_profiles import PROFILES, with_profile
from tests.conftest import CONFIGS, ROOT

# What a user writes from the README: the tiny model and a 2^3 recipe of their own, no sizes.
MINE = {"name": "mine", "model": {"base": "tiny"}, "sources": ["librarian", "surgeon"], "design": {"factors": [
    {"short": "L", "label": "learning rate", "levels": [{"description": "low", "sets": {"training.learning_rate": 3e-3}},
                                                         {"description": "high", "sets": {"training.learning_rate": 1e-2}}]},
    {"short": "R", "label": "rank", "levels": [{"description": "r4", "sets": {"lora.rank": 4}},
                                                {"description": "r16", "sets": {"lora.rank": 16}}]},
    {"short": "N", "label": "epochs", "levels": [{"description": "4 epochs", "sets": {"training.epochs": 4}},
                                                  {"description": "8 epochs", "sets": {"training.epochs": 8}}]}]}}


def test_a_tiny_screen_of_ones_own_is_sized_for_the_tiny_model():
    config = parse_config(MINE)
    assert (config.data.positives, config.data.negatives, config.data.train_questions) == (16, 32, 8)
    assert (config.eval.personas, config.eval.questions, config.eval.samples) == (8, 4, 2)
    assert (config.eval.max_new_tokens, config.training.max_length, config.lora.alpha) == (32, 1024, 16)
    # the factors set these in every cell: the shared value stays the schema's, the profile does not touch it
    assert (config.training.learning_rate, config.lora.rank) == (1e-5, 32)
    assert ScreenConfig.model_validate(MINE).eval.personas == 24  # without the profile: the 7B's panel


def test_what_the_config_sets_is_kept_and_the_panel_holds_every_source():
    data = {**MINE, "eval": {"samples": 5, "max_new_tokens": 100}, "data": {"positives": 50},
            "sources": ["librarian", "surgeon", "programmer", "chef", "nurse", "teacher", "lawyer", "farmer", "dentist"]}
    config = parse_config(data)
    assert (config.eval.samples, config.eval.max_new_tokens, config.data.positives) == (5, 100, 50)
    assert config.eval.personas == 9 and config.data.negatives == 32
    _, profile, filled = with_profile(data)
    assert profile.name == "tiny" and "eval.samples" not in filled and filled["eval.personas"] == 9


def test_smollm2_gets_its_own_profile_and_other_models_none():
    data = {"model": {"base": "smollm2-135m-instruct"}}
    _, profile, filled = with_profile(data)
    assert profile.name == "smollm2-135m" and filled["eval.max_new_tokens"] == 64
    assert with_profile({"model": {"base": "HuggingFaceTB/SmolLM2-135M-Instruct"}})[1] is profile
    for base in ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"):
        assert with_profile({"model": {"base": base}})[1:] == (None, {})
    assert parse_config({}) == ScreenConfig()  # the default model: the defaults
    assert {p.name for p in PROFILES} == {"tiny", "smollm2-135m"}


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_are_what_they_were(path):
    data = read_config_file(path)
    assert parse_config(data) == ScreenConfig.model_validate(data)


def test_a_stored_screen_reads_back_as_it_ran():
    config = parse_config(MINE)
    assert parse_config(config.model_dump(mode="json")) == config
    stored = ScreenConfig.model_validate({**MINE, "eval": {"personas": 24}})  # a run with the 7B panel, stored whole
    assert parse_config(stored.model_dump(mode="json")) == stored


def test_validate_names_the_profile_and_what_it_filled(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(MINE))
    out = subprocess.run([sys.executable, "-m", "flows.cli", "validate", str(path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line = out.stdout.splitlines()[1]
    assert line.startswith("  profile tiny (") and "data.positives 16" in line and "eval.personas 8" in line
    assert "training.learning_rate" not in line  # set by a factor
    assert "training examples:  1344 in all" in out.stdout  # 28 cells x 48, not 600 a cell
