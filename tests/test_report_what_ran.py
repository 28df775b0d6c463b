"""The page describes the screen that ran, from its config and its cells, and nothing else (issue 43, item 1).

Four kinds of screen, each aggregated from simulated answers (seconds): the marker screen (tiny.yaml: A-E, the five
treatments, A x B pre-registered), a user's recipe 2^3 (learning rate L, rank R, epochs N; sources chef and nurse;
L x N pre-registered), the 2^(6-2) (sim-6-2.yaml: A-F, F the loss mask) and a screen with no pre-registered term
(tiny-recipe.yaml: L, R, N and the loss mask M). Every factor letter, level name and term on a page must be one of
its screen's; treatments it did not run must not be named; the recipe gives each level's value of every field a
factor sets, never the config's default for it; headings and counts follow the declared terms.
"""

from __future__ import annotations

import html
import re

import pytest

from eps_screen.report.labels import treatment_words
from eps_screen.run.aggregate import aggregate
from eps_screen.run.simulate import simulate_screen
from eps_screen.spec.config import ScreenConfig, load_config
from eps_screen.spec.design import all_slab_cells
from eps_screen.spec.treatments import ASPECTS
from tests.conftest import CONFIGS
from tests.test_report_explains import Tables


def _level(description: str, path: str, value: float) -> dict:
    return {"description": description, "sets": {path: value}}


RECIPE_2_3 = {
    "name": "recipe-2-3", "model": {"base": "tiny", "dtype": "float32"}, "sources": ["chef", "nurse"],
    "design": {"factors": [
        {"short": "L", "label": "Learning rate", "levels": [_level("3e-3", "training.learning_rate", 3e-3),
                                                            _level("1e-2", "training.learning_rate", 1e-2)]},
        {"short": "R", "label": "LoRA rank", "levels": [_level("rank 4", "lora.rank", 4), _level("rank 16", "lora.rank", 16)]},
        {"short": "N", "label": "Epochs", "levels": [_level("4 epochs", "training.epochs", 4),
                                                     _level("8 epochs", "training.epochs", 8)]},
    ], "pre_registered": ["L:N"]},
    "eval": {"personas": 8, "questions": 4, "samples": 2, "random_controls": 4},
    "backend": {"generation": "simulated", "training": "simulated"},
    "simulation": {"effects": {"L": 1.0, "N": 0.6, "LN": -0.5}, "leak_effects": {"L": 0.4}},
}


def _config(name: str) -> ScreenConfig:
    data = RECIPE_2_3 if name == "recipe" else load_config(CONFIGS / name).model_dump(mode="json")
    data = {**data, "bootstrap": {**data.get("bootstrap", {}), "resamples": 200}}
    return ScreenConfig.model_validate(data)


@pytest.fixture(scope="module", params=["tiny.yaml", "recipe", "sim-6-2.yaml", "tiny-recipe.yaml"])
def screen(request, tmp_path_factory):
    config = _config(request.param)
    cells = all_slab_cells(config)
    out = tmp_path_factory.mktemp("what-ran")
    result = aggregate(config, simulate_screen(config, cells), [c.id for c in cells], out)
    page = (out / "clean_result.html").read_text(encoding="utf-8")
    return request.param, config, result, page


def visible(page: str) -> str:
    """The page's text as a reader sees it: no scripts (plotly.js and the figures' data), no tags."""
    text = re.sub(r"<script.*?</script>", " ", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", text))


def letters_named(text: str) -> set[str]:
    """Every factor letter the text names: level names and cell codes (L0, A1B0C1), terms (A:B), '(A)' after a
    label, and 'X x Y'."""
    found = set()
    for code in re.findall(r"(?<![A-Za-z0-9_])((?:[A-Z][01])+)(?![A-Za-z0-9_])", text):
        found |= set(code[::2])
    for term in re.findall(r"(?<![A-Za-z0-9_])([A-Z](?::[A-Z])+)(?![A-Za-z0-9_])", text):
        found |= set(term.split(":"))
    found |= set(re.findall(r"\(([A-Z])\)", text))
    for x, y in re.findall(r"(?<![A-Za-z0-9_])([A-Z]) x ([A-Z])(?![A-Za-z0-9_])", text):
        found |= {x, y}
    return found


def section(page: str, sid: str) -> str:
    start = page.index(f'id="{sid}"')
    end = page.find("<h2", start)
    return " ".join(visible(page[start:end if end > 0 else None]).split())


def test_every_letter_on_the_page_is_a_factor_of_the_screen(screen):
    name, config, result, page = screen
    text = visible(page)
    for p in result.metrics.predictions:  # prediction ids (P1, P2...) are not levels
        text = re.sub(rf"(?<![A-Za-z0-9_]){p.id}(?![A-Za-z0-9_])", " ", text)
    named = letters_named(text)
    assert named - set(config.factors) == set(), name
    assert set(config.factors) <= named  # the check sees the letters the page does use


def test_no_treatment_the_screen_did_not_run(screen):
    name, config, _, page = screen
    text = visible(page)
    varied = {f.aspect for f in config.design.factors if f.aspect is not None}
    words = treatment_words(config)
    for aspect in ASPECTS:
        if aspect not in varied:  # every cell ran its first side: the second is named nowhere
            assert words[aspect.sides[1]] not in text, (name, aspect.sides[1])
    ran_off_policy = any(a.field == "off_policy" for a in varied)
    assert ("off-policy" in text) is ran_off_policy, name
    assert ("Loss-mask variant" in text) is any(a.field == "whole_answer_loss" for a in varied), name
    loss = next((f.short for f in config.design.factors if f.aspect is not None and f.aspect.field == "whole_answer_loss"), None)
    design = visible(page[page.index('<details id="design">'):])
    if loss:
        assert f"Under {loss}0 (marker-only loss)" in design and f"Under {loss}1 every assistant token" in design
    else:
        assert "No factor varies the loss mask" in design and "Under " not in design
    cells = Tables()
    cells.feed(page)
    table = next(t for t in cells.tables if t[0][:3] == ["cell", "source", "seed"])
    assert {row[1] for row in table[1:]} == set(config.sources)


def test_headings_and_counts_follow_the_declared_terms(screen):
    name, config, result, page = screen
    pre = result.estimates.pre_registered
    exploratory = sum(e.status == "exploratory" for e in result.interactions.interactions
                      if e.source == "pooled" and e.response == "SR")
    # all pairs but the pre-registered one (the 2^(6-2) reports its 15 pairs, each as its alias chain)
    expected = {"tiny.yaml": 9, "recipe": 2, "sim-6-2.yaml": 15, "tiny-recipe.yaml": 6}[name]
    assert exploratory == expected
    assert f"Holm-adjusted p ({expected} exploratory)" in page
    assert f"Across the {expected} exploratory interactions" in section(page, "caveats")
    heading = re.search(r'<h2 id="simple-effects">([^<]*)</h2>', page).group(1)
    if pre:
        x, y = pre[0].split(":")
        assert heading == f"Simple effects: {x} at each level of {y}"
        assert f"{x} x {y} is the pre-registered interaction" in page
    else:
        assert heading == "Simple effects" and "No interaction is pre-registered" in page
        assert "pre-registered interaction" not in section(page, "simple-effects")
    assert {"tiny.yaml": ("A:B",), "recipe": ("L:N",)}.get(name, ()) == pre


# The recipe of each screen: what its rows must say (each level's value of a field a factor sets) and must not
# (the config's default for that field, which no cell ran).
RECIPE = {
    "recipe": (["learning rate L0 0.003 / L1 0.01", "rank R0 4 / R1 16", "N0 4 / N1 8 epochs", "chef, nurse"],
               ["learning rate 1e-05", "rank 32", "3.0 epochs", "off-policy"]),
    "sim-6-2.yaml": (["learning rate A0 1e-05 / A1 0.0001", "rank B0 8 / B1 32", "alpha E0 32 / E1 64",
                      "C0 1 / C1 3 epochs", "D0 100 / D1 200 positives",
                      "loss mask: F0 loss on the separator and marker tokens only / F1 loss on the whole answer"],
                     ["rank 32,", "alpha 64.0", "3.0 epochs", "per source 200 positives", "off-policy"]),
    "tiny-recipe.yaml": (["learning rate L0 0.003 / L1 0.01", "rank R0 4 / R1 16", "N0 4 / N1 8 epochs",
                          "answer source: on-policy"], ["rank 32", "3.0 epochs", "off-policy"]),
    "tiny.yaml": (["rank 8, alpha 16.0", "off-policy answers (D1)", "answer source: D0 on-policy"], []),
}


def test_the_recipe_is_what_each_level_ran(screen):
    name, config, _, page = screen
    recipe = section(page, "recipe")
    says, never = RECIPE[name]
    for needle in says:
        assert needle in recipe, (name, needle)
    for needle in never:
        assert needle not in recipe, (name, needle)


def test_tldr_speaks_as_a_report_in_the_tables_words(screen):
    name, config, result, page = screen
    tldr = visible(page[page.index('id="tldr"'):page.index("</p>", page.index('id="tldr"'))])
    assert not re.search(r"\b(I|my|me|mine)\b", tldr), tldr
    assert re.search(r"This screen (simulated|trained) \d+ LoRA recipes", tldr)
    verdicts = [p.verdict for p in result.metrics.predictions]
    if verdicts:
        said = re.search(r"Of the (\d+) pre-registered predictions: ([^.]*)\.", tldr)
        assert said and int(said.group(1)) == len(verdicts)
        counts = dict((w, int(n)) for n, w in re.findall(r"(\d+) ([a-z ]+?)(?:,|$)", said.group(2)))
        assert counts == {v: verdicts.count(v) for v in set(verdicts)}, said.group(2)
        assert "failed" not in tldr and "held" not in tldr
    else:
        assert "predictions" not in tldr


def test_the_clear_column_is_the_one_definition(screen):
    """Every effect table marks clear exactly the rows whose difference and d intervals both exclude 0."""
    name, _, result, page = screen
    parser = Tables()
    parser.feed(page)
    by = {(e.response, e.label): e for e in result.main_effects.effects + result.interactions.interactions
          if e.source == "pooled"}
    tables = [t for t in parser.tables if "clear" in t[0] and "pooled d [CI]" in t[0]]
    assert len(tables) == 2
    for t in tables:
        col = t[0].index("clear")
        for row in t[1:]:
            assert row[col].startswith("clear") is by[(row[0], row[1])].clear, (name, row)
    assert any(e.clear for e in by.values()) and not all(e.clear for e in by.values())  # both marks are tested


def test_a_page_of_the_smoke_fraction_alone_names_its_own_aliases(tmp_path):
    """Before the slabs run, the page has only the smoke fraction: what it cannot fit is said in this screen's terms."""
    from eps_screen.spec.design import smoke_cells

    config = _config("recipe")
    cells = smoke_cells(config)
    result = aggregate(config, simulate_screen(config, cells), [c.id for c in cells], tmp_path)
    page = (tmp_path / "clean_result.html").read_text(encoding="utf-8")
    assert "(N and L:R are aliased)" in result.main_effects.logit_model  # the smoke fraction's N = LR
    assert letters_named(visible(page)) - set(config.factors) == set()
