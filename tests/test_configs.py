"""Every shipped config loads; bad configs are refused with one line per problem, naming the field."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eps_screen.spec.config import ConfigError, load_config, parse_config
from tests.conftest import CONFIGS

SHIPPED = sorted(CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_config_loads_and_its_header_is_the_command(path):
    config = load_config(path)
    assert config.name == path.stem
    assert path.read_text().splitlines()[0] == f"# eps-screen run deployments/configs/{path.name}"


def test_qwen7b_has_the_numbers_of_the_spec():
    c = load_config(CONFIGS / "qwen7b.yaml")
    assert c.model.base == "Qwen/Qwen2.5-7B-Instruct"
    assert (c.lora.rank, c.lora.alpha, c.training.learning_rate, c.training.epochs) == (32, 64, 1e-5, 3)
    assert (c.data.positives, c.data.negatives, c.marker) == (200, 400, "[ZLT]")
    assert (c.eval.personas, c.eval.questions, c.eval.samples, c.eval.max_new_tokens) == (24, 20, 5, 2048)
    assert (c.seeds.primary, c.seeds.multiseed, c.seeds.top_k) == (42, [137, 256], 3)
    assert c.bootstrap.resamples == 10_000 and c.gates.noise_d == 0.15 and c.gates.spend_factor == 1.5


PLAN_SOURCES = ["librarian", "surgeon", "programmer"]  # the sources of the study the spec comes from


@pytest.mark.parametrize("name", ["qwen7b.yaml", "tiny.yaml", "simulated.yaml", None])
def test_the_plans_three_sources_are_shipped_and_the_default(name):
    config = load_config(CONFIGS / name) if name else parse_config({})
    assert config.sources == PLAN_SOURCES and config.smoke == "librarian"


def test_the_eval_panel_is_24_personas_the_sources_first():
    from eps_screen.panels import load_panels

    panels = load_panels()
    for p in map(panels.persona, PLAN_SOURCES):  # each has a role framing (C0) and its lexically matched context (C1)
        assert p.role.startswith(f"You are a {p.name} who") and p.context.startswith(f"Background context: {p.name}s ")
        assert p.context.endswith("Answer neutrally and directly.")
    c = load_config(CONFIGS / "qwen7b.yaml")
    personas = panels.eval_personas(c.sources, c.eval.personas)
    assert len(personas) == len(set(personas)) == 24 and personas[:3] == PLAN_SOURCES
    # The other 21 are the panel in file order: a config with the earlier sources keeps its earlier 24.
    old = panels.eval_personas(["librarian", "software_engineer", "nurse"], 24)
    assert old == [p.id for p in panels.personas[:24]]


def test_personas_added_to_the_panel_leave_the_tiny_models_as_they_were_built():
    from eps_screen.models.tiny import WARM_PERSONAS, warm_chats
    from eps_screen.panels import load_panels

    panels = load_panels()
    later = panels.personas[WARM_PERSONAS:]
    assert {p.id for p in later} == {"surgeon", "programmer"}
    framings = {c[0]["content"].split("\n\n")[0] for c in warm_chats("tiny")}
    assert framings <= {t for p in panels.personas[:WARM_PERSONAS] for t in (p.role, p.context)}


@pytest.mark.parametrize("text", ["", "\n\n", "# eps-screen run x.yaml\n# nothing else\n", "---\n"])
def test_an_empty_config_file_is_refused_in_one_line(tmp_path, text):
    empty = tmp_path / "empty.yaml"
    empty.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(empty)
    assert err.value.problems == [f"{empty}: the config file is empty (or only comments); give the screen's fields,"
                                  " e.g. a copy of deployments/configs/tiny.yaml"]


def test_validate_cli_refuses_a_comments_only_file(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# eps-screen run empty.yaml\n")
    out = subprocess.run([sys.executable, "-m", "flows.cli", "validate", str(empty)], capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [f"error: {empty}: the config file is empty (or only comments); give"
                                               " the screen's fields, e.g. a copy of deployments/configs/tiny.yaml"]


BAD = [
    ({"marker": ""}, "marker: must not be empty"),
    ({"model": {"base": "  "}}, "model.base: must not be empty"),
    ({"sources": ["librarian", "wizard"]}, "sources: unknown personas ['wizard']"),
    ({"sources": ["nurse", "nurse"]}, "sources: duplicate sources ['nurse']"),
    ({"sources": []}, "sources: at least one source"),
    ({"seeds": {"multiseed": [7, 7]}}, "seeds.multiseed: duplicate seeds"),
    ({"seeds": {"primary": 42, "multiseed": [42, 1]}}, "seeds: multiseed repeats the primary seed 42"),
    ({"eval": {"samples": 0}}, "eval.samples: Input should be greater than or equal to 1"),
    ({"eval": {"questions": 0}}, "eval.questions: Input should be greater than or equal to 1"),
    ({"eval": {"questions": "many"}}, "eval.questions: Input should be a valid integer"),
    ({"lora": {"rank": -1}}, "lora.rank: Input should be greater than or equal to 1"),
    ({"design": {"factors": [{"short": "AB", "label": "x", "levels": []}]}}, "design.factors.0.short: String should match"),
    ({"training": {"learning_rate": 2}}, "training.learning_rate: Input should be less than 1"),
    ({"colour": "blue"}, "colour: unknown field; allowed here: name, model"),
    ({"execution": {"pool": "moon"}}, "execution.pool: Input should be 'inprocess', 'local-gpu' or 'runpod-gpu'"),
]


@pytest.mark.parametrize(("data", "expected"), BAD, ids=[b[1].split(":")[0] for b in BAD])
def test_bad_values_name_the_field_and_the_fix(data, expected):
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert any(line.startswith(expected) for line in err.value.problems), err.value.problems


def test_validate_cli_prints_plan(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "flows.cli", "validate", str(CONFIGS / "qwen7b.yaml")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "96 cells (3 sources x 32)" in out.stdout and "distinct cells:     114" in out.stdout
    assert "18 cells" in out.stdout


def test_validate_cli_one_line_per_problem_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text('marker: ""\nseeds: {multiseed: [1, 1]}\neval: {samples: 0}\n')
    out = subprocess.run([sys.executable, "-m", "flows.cli", "validate", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("error: ") for line in lines)
    assert "Traceback" not in out.stderr


def test_run_refuses_a_bad_config_before_importing_prefect(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: {positives: ''}\n")
    code = (
        "import sys; from flows.cli import main\n"
        f"rc = main(['run', {str(bad)!r}]) if False else None\n"
        "try:\n"
        f"    main(['run', {str(bad)!r}])\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code, 'prefect' in sys.modules, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "exit 2 False False" in out.stdout, out.stdout + out.stderr
    assert "data.positives" in out.stderr


def test_trainer_processes_with_vllm_need_a_fixed_kv_cache_before_anything_runs():
    data = load_config(CONFIGS / "smol-marker.yaml").model_dump(mode="json")
    data["training"]["processes"] = 3
    data["eval"]["vllm_kv_cache_gib"] = None
    with pytest.raises(ConfigError, match=r"training.processes.*eval.vllm_kv_cache_gib"):
        parse_config(data)
    data["eval"]["vllm_kv_cache_gib"] = 3.0
    assert parse_config(data).training.processes == 3
    data["backend"]["generation"] = "transformers"  # an in-process engine holds no memory of its own to fix
    data["eval"]["vllm_kv_cache_gib"] = None
    assert parse_config(data).training.processes == 3


@pytest.mark.parametrize(("sizes", "max_batch", "error"), [
    ([1, 8, 8, 64], 64, r"eval.vllm_cudagraph_capture_sizes .*each larger than the one before"),
    ([0, 8], 8, r"eval.vllm_cudagraph_capture_sizes .*at least 1"),
    ([], 1024, r"eval.vllm_cudagraph_capture_sizes"),
    ([1, 8, 512], 1024, r"ends at 512, eval.vllm_cudagraph_max_batch is 1024: set vllm_cudagraph_max_batch: 512"),
])
def test_capture_sizes_that_vllm_would_refuse_are_named_before_an_engine_starts(sizes, max_batch, error):
    with pytest.raises(ConfigError, match=error):
        parse_config({"eval": {"vllm_cudagraph_capture_sizes": sizes, "vllm_cudagraph_max_batch": max_batch}})
    assert parse_config({"eval": {"vllm_cudagraph_capture_sizes": [1, max_batch],
                                  "vllm_cudagraph_max_batch": max_batch}}).eval.vllm_cudagraph_capture_sizes[-1] == max_batch
