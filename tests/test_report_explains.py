"""The report explains itself (issue 14, item 3), rendered for tiny.yaml from simulated answers (about a second).

Its factor levels are the ones tiny.yaml ran (a 40-word long prompt, its format texts, its off-policy model), SR
and LR are defined on it, no table has a column that is empty in every row, a fired late gate is explained, the
TL;DR is short and in the neutral voice of a report, and the figures label what they show.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from eps_screen.report.tldr import LATE_GATES, tldr
from eps_screen.run.aggregate import aggregate
from eps_screen.run.simulate import simulate_screen
from eps_screen.spec.config import ScreenConfig, load_config
from eps_screen.spec.design import all_slab_cells
from tests.conftest import CONFIGS


class Tables(HTMLParser):
    """Every <table> as rows of cell texts (header row first)."""

    def __init__(self):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.tables[-1][-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    data = load_config(CONFIGS / "tiny.yaml").model_dump(mode="json")
    config = ScreenConfig.model_validate({**data, "bootstrap": {**data["bootstrap"], "resamples": 200}})
    cells = all_slab_cells(config)
    out = tmp_path_factory.mktemp("tiny-report")
    result = aggregate(config, simulate_screen(config, cells), [c.id for c in cells], out)
    return config, result, out, (out / "clean_result.html").read_text(encoding="utf-8")


def test_factor_levels_are_the_configs(tiny_report):
    config, _, out, page = tiny_report
    assert config.texts.long_prompt_words == 40
    assert "persona line + 40-word guidance text" in page and "1000 tokens" not in page
    design = Tables()
    design.feed(page[page.index('<details id="design">'):])
    factors = {row[0]: row[1:] for row in design.tables[0][1:]}
    assert factors["A"] == [config.factors["A"].label, "persona line only", "persona line + 40-word guidance text"]
    assert factors["B"][1:] == [f'"{config.texts.format_short}"', f'"{config.texts.format_long}"']
    assert factors["D"][2] == f"off-policy ({config.off_policy.model})"
    ab = json.loads((out / "figures" / "ab_interaction.json").read_text())
    assert ab["data"][0]["x"] == ["A0: persona line only", "A1: persona line + 40-word<br>guidance text"]  # wrapped


def test_a_level_that_sets_fields_shows_the_values_it_sets(tiny_report):
    """A label cannot disagree with its factor: a level's words end with what it sets."""
    config, *_ = tiny_report
    from eps_screen.report.labels import with_level_labels

    rank = {"short": "R", "label": "LoRA rank", "levels": [{"description": "small", "sets": {"lora.rank": 8}},
                                                           {"description": "large", "sets": {"lora.rank": 32}}]}
    data = config.model_dump(mode="json")
    data["design"] = {"factors": [*data["design"]["factors"][:2], rank]}
    labelled = with_level_labels(ScreenConfig.model_validate(data))
    assert (labelled.factors["R"].low, labelled.factors["R"].high) == ("small (lora.rank = 8)", "large (lora.rank = 32)")
    assert labelled.factors["A"].low == "persona line only"


def test_sr_and_lr_are_defined(tiny_report):
    config, _, _, page = tiny_report
    reading = page[page.index('id="reading"'):]
    reading = reading[:reading.index("</p>")]
    assert "<b>SR (source rate)</b>" in reading and "<b>LR (leakage)</b>" in reading
    assert f"other {config.eval.personas - 1} evaluation personas" in reading


def test_no_column_is_empty(tiny_report):
    *_, page = tiny_report
    parser = Tables()
    parser.feed(page)
    assert len(parser.tables) >= 6
    for table in parser.tables:
        header, rows = table[0], table[1:]
        for i, name in enumerate(header):
            if name and rows:
                assert any(row[i] for row in rows if i < len(row)), f"column {name!r} is empty in every row"
    inter = next(t for t in parser.tables if any(r[1].endswith("(A:B)") for r in t[1:]))
    signs = inter[0].index(next(h for h in inter[0] if h.startswith("signs by source")))
    assert all(re.fullmatch(r"[-+0]( [-+0]){2}(  \(flips\))?", row[signs]) for row in inter[1:])


def test_tldr_is_short_neutral_and_explains_a_fired_late_gate(tiny_report):
    config, result, _, page = tiny_report
    text = tldr(config, result)
    assert text.startswith("This screen trained 96 LoRA recipes on 3 source personas") and len(text.split()) <= 130
    # A x B is clear here, so A's average over B is not its effect: the TL;DR gives A at B0 and at B1 (issue 12)
    assert f"{config.factors['A'].label} (A) has the largest average effect on source rate" in text
    assert "but A x B is clear: the interaction is" in text and "moves source rate most" not in text
    assert "A's effect on source rate is" in text  # names its response: "it" could be either
    assert "they do not stop the screen" in page  # what criteria 3 and 4 mean, fired or not
    fired = result.metrics.gates[0].model_copy(update={"number": 3, "name": "sign instability", "fired": True})
    result.metrics.gates.append(fired)
    try:
        assert f"Kill criterion 3 (sign instability) fired: {LATE_GATES[3]}." in tldr(config, result)
    finally:
        result.metrics.gates.pop()


def test_figures_label_what_they_show(tiny_report):
    config, _, out, _ = tiny_report
    heat = json.loads((out / "figures" / "persona_heatmap.json").read_text())
    layout = heat["layout"]
    assert len(layout["yaxis"]["ticktext"]) == 96 and layout["yaxis"]["ticktext"][0] == "A0B0C0D0E0"
    assert [a["text"] for a in layout["annotations"]] == [f"source: {s}" for s in config.sources]
    # each source's own column framed over its block of cells: one frame per source, no mark on every cell
    personas = heat["data"][0]["x"]
    frames = [(personas[round(f["x0"] + 0.5)], f["y1"] - f["y0"]) for f in layout["shapes"] if f["type"] == "rect"]
    assert frames == [(s, 32) for s in config.sources] and len(heat["data"]) == 1
    ranking = json.loads((out / "figures" / "factor_ranking.json").read_text())
    markers = [t["marker"] for t in ranking["data"] if t["type"] == "scatter" and t.get("showlegend")]
    assert len(markers) == 3 and len({m["color"] for m in markers}) == 3 and len({m["symbol"] for m in markers}) == 3
