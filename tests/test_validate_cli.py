"""`eps-screen validate` as a user runs it: each bad declaration of a screen of one's own is one line that names
the factor (or field) and the fix, exit 2, no traceback; the shipped marker configs pass."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

from tests.conftest import CONFIGS, ROOT

RECIPE = yaml.safe_load((CONFIGS / "tiny-recipe.yaml").read_text())  # factors L, R, N, M


def _validate(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", "validate", str(path)], check=False, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def _levels(short: str, low: dict, high: dict):
    def change(data):
        factor = next(f for f in data["design"]["factors"] if f["short"] == short)
        factor["levels"][0]["sets"], factor["levels"][1]["sets"] = low, high
    return change


def _design(**fields):
    return lambda data: data["design"].update(fields)


def _model(base: str):
    return lambda data: data["model"].update(base=base)


RULE = {"id": "P1", "statement": "rank matters", "direction": "above", "threshold": 0.2}
UNKNOWN_PATH = pytest.param(
    _levels("R", {"lora.rnak": 4}, {"lora.rnak": 16}), ["factor R (LoRA rank)", "lora.rnak is not a config field",
                                                        "fields of lora: rank"],
    id="unknown path")
CASES = [
    UNKNOWN_PATH,
    pytest.param(_levels("R", {"lora.rank": 0}, {"lora.rank": 16}),
                 ["factor R (LoRA rank), level 0", "lora.rank", "greater than or equal to 1", "give a value it accepts"],
                 id="a value the field refuses"),
    pytest.param(_levels("N", {"lora.rank": 4}, {"lora.rank": 8}),
                 ["factors R and N both set lora.rank", "merge them into one factor or drop one"],
                 id="two factors set one field"),
    pytest.param(_design(smoke={"generators": ["M=LNX"]}),
                 ["generator 'M=LNX' names X", "not a declared factor (declared: L, R, N, M)", "use declared short names"],
                 id="a generator names an unknown factor"),
    pytest.param(_design(smoke={"generators": ["M=L"]}),
                 ["M=L give resolution II", "L and M aliased", "ask for resolution: 3"],
                 id="a fraction below resolution III"),
    pytest.param(_design(predictions=[{**RULE, "term": "R:Q"}]),
                 ["predictions[0] (P1)", "term 'Q:R' names factor Q", "fix the term or declare the factor"],
                 id="a prediction on an unknown term"),
    pytest.param(_design(pre_registered=["L:Z"]),
                 ["pre_registered[0]", "names factor Z", "name an interaction of declared factors, e.g. 'L:R'"],
                 id="a pre-registered interaction of an unknown factor"),
    pytest.param(_model("./models/no-such-model"),
                 ["model.base", "looks like a local path and does not exist", "give an existing model directory"],
                 id="a local model path that does not exist"),
    pytest.param(_levels("R", {"model.base": "tiny"}, {"model.base": "/no/such/model"}),
                 ["factor R (LoRA rank), level 1", "model.base", "does not exist"],
                 id="a factor's local model path that does not exist"),
]


@pytest.mark.parametrize(("change", "says"), CASES)
def test_a_bad_declaration_is_one_line(tmp_path, change, says):
    data = copy.deepcopy(RECIPE)
    change(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    out = _validate(path)
    assert out.returncode == 2
    text = out.stdout + out.stderr
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and all(s in lines[0] for s in says), lines[0]


@pytest.mark.parametrize("name", ["tiny", "qwen7b", "tiny-recipe", "sim-6-2"])
def test_the_shipped_configs_pass(name):
    out = _validate(CONFIGS / f"{name}.yaml")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{CONFIGS / name}.yaml: valid screen '{name}'")


def test_the_marker_configs_declare_the_rules_they_used_to_default_to():
    """qwen7b.yaml and tiny.yaml write the pre-registered A:B and the nine prediction rules out; they are the
    defaults of before, so the statistics, and the cells and store keys (which do not read them), are unchanged."""
    from eps_screen.analysis.screen_stats import declarations
    from eps_screen.spec.config import load_config, parse_config
    from eps_screen.spec.design import all_slab_cells, regimes, smoke_cells
    from eps_screen.spec.prediction_rules import MARKER_PRE_REGISTERED, MARKER_PREDICTIONS
    from eps_screen.store.result_store import cell_key, regime_key

    for name in ("tiny", "qwen7b"):
        config = load_config(CONFIGS / f"{name}.yaml")
        assert tuple(config.design.pre_registered) == MARKER_PRE_REGISTERED
        assert tuple(config.design.predictions) == MARKER_PREDICTIONS
        data = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
        del data["design"]["pre_registered"], data["design"]["predictions"]
        defaulted = parse_config(data)
        assert defaulted.design.predictions is None and declarations(defaulted) == declarations(config)
        cells = smoke_cells(config) + all_slab_cells(config)
        assert [c.id for c in cells] == [c.id for c in smoke_cells(defaulted) + all_slab_cells(defaulted)]
        assert [cell_key(config, c) for c in cells] == [cell_key(defaulted, c) for c in cells]
        assert [regime_key(config, r) for r in regimes(config, cells)] == \
               [regime_key(defaulted, r) for r in regimes(defaulted, cells)]
