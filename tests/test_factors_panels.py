"""A persona or question panel of one's own: a config field names the file, checked as the built-in one."""

from __future__ import annotations

import pytest

from eps_screen.spec import design
from eps_screen.spec.config import ConfigError, parse_config
from eps_screen.spec.design import Cell
from eps_screen.store.result_store import cell_key
from eps_screen.train import data

PERSONAS = """\
- {id: astronaut, name: astronaut, role: "You are an astronaut who flies missions to the space station.",
   context: "Background context: astronauts fly missions to the space station. Answer neutrally and directly."}
- {id: baker, name: baker, role: "You are a baker who bakes bread before dawn.",
   context: "Background context: bakers bake bread before dawn. Answer neutrally and directly."}
- {id: pilot, name: pilot, role: "You are a pilot who flies passenger planes.",
   context: "Background context: pilots fly passenger planes. Answer neutrally and directly."}
"""


def _config(tmp_path, personas: str = PERSONAS, **extra):
    path = tmp_path / "personas.yaml"
    path.write_text(personas)
    return parse_config({"sources": ["astronaut"], "panels": {"personas": str(path)},
                         "eval": {"personas": 3, "questions": 2, "samples": 1, "random_controls": 0},
                         "data": {"positives": 2, "negatives": 2, "train_questions": 2}, **extra}), path


def test_a_persona_file_of_ones_own_gives_the_sources_and_the_panel(tmp_path):
    config, _ = _config(tmp_path)
    cell = Cell("astronaut", (1, 0, 1, 0, 0), 42)
    prompts = data.eval_prompts(design.recipe(config, cell))
    assert [persona for _, persona, _, _ in prompts] == ["astronaut", "astronaut", "baker", "baker", "pilot", "pilot"]
    system = prompts[0][3].system
    assert system.startswith("Background context: astronauts fly") and len(system) > 200  # C1 framing, A1 long text
    assert data.negative_personas(config, "astronaut") == ["baker", "pilot"]


def test_the_file_content_is_in_the_store_key(tmp_path):
    config, path = _config(tmp_path)
    cell = Cell("astronaut", (0,) * 5, 42)
    before = cell_key(config, cell)
    path.write_text(PERSONAS.replace("before dawn", "at night"))
    from eps_screen.panels import load_panels

    load_panels.cache_clear()
    # A key is computed once per config object; the next run parses its config anew and sees the new content.
    again = parse_config(config.model_dump())
    assert cell_key(again, cell) != before
    assert cell_key(config, cell) == before  # the memo of the first run's config, as that run computed it


@pytest.mark.parametrize(("text", "expected"), [
    ("- {id: astronaut, name: a, role: r}\n- {id: b, name: b, role: r, context: c}\n",
     "persona 1 must have exactly id, name, role and context"),
    (PERSONAS + PERSONAS, "persona ids ['astronaut', 'baker', 'pilot'] appear twice"),
    ("[unclosed", "not valid YAML"),
])
def test_a_bad_persona_file_is_refused_in_one_line(tmp_path, text, expected):
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, text)
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith("panels: ")
    assert expected in err.value.problems[0]


def test_a_source_missing_from_the_file_names_the_file(tmp_path):
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, sources=["librarian"])
    assert err.value.problems[0].startswith("sources: unknown personas ['librarian']; known (")


def test_a_missing_question_file_is_refused(tmp_path):
    with pytest.raises(ConfigError) as err:
        parse_config({"panels": {"eval_questions": str(tmp_path / "nope.txt")}})
    assert err.value.problems[0].startswith(f"panels: {tmp_path / 'nope.txt'}: cannot be read")
