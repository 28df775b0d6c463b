"""analyze-table and design listings: known answers, the exact --json shape, one clear line for bad input."""

from __future__ import annotations

import json

import polars as pl
import pytest

from eps_screen.analysis.cli import analyze_table, design_listing
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import all_slab_cells, full_factorial

PILOT = [60, 72, 54, 68, 52, 83, 45, 80]  # Box, Hunter & Hunter Table 5.3, standard order of T, C, K


@pytest.fixture
def pilot_csv(tmp_path):
    runs = full_factorial(3)
    path = tmp_path / "pilot.csv"
    pl.DataFrame({"T": [r[0] for r in runs], "C": [r[1] for r in runs], "K": [r[2] for r in runs], "yield": PILOT}).write_csv(path)
    return path


def test_json_is_exactly_the_documented_object(pilot_csv):
    code, text = analyze_table(pilot_csv, "yield", None, as_json=True)
    assert code == 0
    out = json.loads(text)
    assert set(out) == {"main_effects", "interactions", "mean"}
    assert out["main_effects"] == pytest.approx({"T": 23.0, "C": -5.0, "K": 1.5})
    assert out["interactions"] == pytest.approx({"T:C": 1.5, "T:K": 10.0, "C:K": 0.0})
    assert out["mean"] == pytest.approx(64.25)


def test_parquet_and_coded_levels(tmp_path):
    runs = full_factorial(3)
    path = tmp_path / "pilot.parquet"
    pl.DataFrame({
        "T": [(-1, 1)[r[0]] for r in runs], "C": [(100, 200)[r[1]] for r in runs], "K": [(0.5, 0.9)[r[2]] for r in runs],
        "noise": list(range(8)), "yield": PILOT,
    }).write_parquet(path)
    code, text = analyze_table(path, "yield", "T, C,K", as_json=True)
    assert code == 0 and json.loads(text)["main_effects"] == pytest.approx({"T": 23.0, "C": -5.0, "K": 1.5})
    code, text = analyze_table(path, "yield", ["T"], as_json=True)
    assert json.loads(text) == {"main_effects": {"T": 23.0}, "interactions": {}, "mean": 64.25}


def test_readable_table(pilot_csv):
    code, text = analyze_table(pilot_csv, "yield")
    assert code == 0
    lines = text.splitlines()
    assert lines[0].startswith("response: yield") and "runs: 8" in lines[0] and "64.25" in lines[0]
    assert any(line.split() == ["T", "23"] for line in lines)
    assert any(line.split() == ["T:K", "10"] for line in lines)


@pytest.mark.parametrize(
    "setup, response, factors, fragment",
    [
        ("missing", "y", None, "no such file"),
        ("txt", "y", None, "unknown file type .txt"),
        ("corrupt_parquet", "y", None, "cannot read as parquet"),
        ("three_levels", "y", None, "'A' has 3 distinct value(s) (0, 1, 2)"),
        ("unbalanced", "y", None, "'A' is unbalanced"),
        ("ok", "nope", None, "response column 'nope' is not in the table"),
        ("ok", "y", "A,Z", "factor column 'Z' is not in the table"),
        ("ok", "y", "A,,B", "--factors"),
        ("ok", "y", "A,A", "more than once"),
        ("ok", "", None, "--response needs a column name"),
        ("text_factor", "y", None, "levels must be numbers"),
    ],
)
def test_bad_input_gives_one_clear_line(tmp_path, setup, response, factors, fragment):
    tables = {
        "ok": pl.DataFrame({"A": [0, 1, 0, 1], "B": [0, 0, 1, 1], "y": [1.0, 2, 3, 4]}),
        "three_levels": pl.DataFrame({"A": [0, 1, 2, 0], "y": [1.0, 2, 3, 4]}),
        "unbalanced": pl.DataFrame({"A": [0, 1, 1, 1], "y": [1.0, 2, 3, 4]}),
        "text_factor": pl.DataFrame({"A": ["lo", "hi", "lo", "hi"], "y": [1.0, 2, 3, 4]}),
    }
    path = tmp_path / "t.csv"
    if setup == "missing":
        path = tmp_path / "absent.csv"
    elif setup == "txt":
        path = tmp_path / "t.txt"
        path.write_text("A,y\n0,1\n")
    elif setup == "corrupt_parquet":
        path = tmp_path / "t.parquet"
        path.write_bytes(b"this is not parquet")
    else:
        tables[setup].write_csv(path)
    code, text = analyze_table(path, response, factors, as_json=True)
    assert code == 2
    assert text.startswith("error: ") and fragment in text
    assert "\n" not in text and "Traceback" not in text


def test_design_smoke_lists_generators_and_aliases():
    code, text = design_listing(ScreenConfig(), "smoke", as_json=True)
    assert code == 0
    out = json.loads(text)
    assert out["phase"] == "smoke" and out["count"] == 8
    assert out["generators"] == {"D": "AB", "E": "AC"}
    assert out["defining_relation"] == ["I", "ABD", "ACE", "BCDE"]
    assert out["aliases"]["A"] == ["BD", "CE"] and out["aliases"]["BC"] == ["DE"]
    assert [c["cell_id"] for c in out["cells"]][0] == "librarian-A0B0C0D1E1-s42"
    code, text = design_listing(ScreenConfig(), "smoke")
    assert "generators: D = AB, E = AC" in text and "I = ABD = ACE = BCDE" in text
    assert "  A   = BD = CE" in text


def test_design_slab_all_and_multiseed():
    config = ScreenConfig()
    out = json.loads(design_listing(config, "slab", as_json=True)[1])
    assert out["count"] == 96 and len(out["cells"]) == 96
    assert {c["source"] for c in out["cells"]} == set(config.sources)
    assert all(set(c) >= {"A", "B", "C", "D", "E", "seed"} for c in out["cells"])
    multi = json.loads(design_listing(config, "multiseed", as_json=True)[1])
    assert multi["cells"] is None and multi["count"] == 18 and not multi["picked_from_results"]
    code, text = design_listing(config, "multiseed")
    assert code == 0 and "picked from slab results" in text and "18 cells" in text
    every = json.loads(design_listing(config, "all", as_json=True)[1])
    assert set(every) == {"phase", "smoke", "slab", "multiseed"}
    rates = {c.id: sum(lv * 2**i for i, lv in enumerate(c.levels)) / 31 for c in all_slab_cells(config)}  # all distinct
    picked = json.loads(design_listing(config, "multiseed", as_json=True, slab_rates=rates)[1])
    assert picked["picked_from_results"] and picked["count"] == 18
    assert {c["cell_id"].split("-")[1] for c in picked["cells"]} == {"A1B1C1D1E1", "A0B1C1D1E1", "A1B0C1D1E1"}


def test_design_bad_phase():
    code, text = design_listing(ScreenConfig(), "slabs")
    assert code == 2 and text == "error: --phase 'slabs' is not one of smoke, slab, multiseed, all"


def test_design_prints_the_textbook_alias_structure_of_a_2_6_2():
    """E = ABC, F = BCD: resolution IV, I = ABCE = BCDF = ADEF (Box, Hunter & Hunter, table 6.15)."""
    factors = [{"short": s, "label": p, "levels": [{"description": "low", "sets": {p: a}}, {"description": "high", "sets": {p: b}}]}
               for s, p, a, b in (("A", "lora.rank", 8, 32), ("B", "training.learning_rate", 1e-5, 1e-4),
                                  ("C", "training.epochs", 1, 3), ("D", "data.positives", 100, 200),
                                  ("E", "lora.alpha", 16, 64), ("F", "eval.temperature", 0.7, 1.0))]
    config = ScreenConfig(design={"factors": factors, "slab": {"generators": ["E=ABC", "F=BCD"]}})
    code, text = design_listing(config, "slab")
    assert code == 0
    assert "defining relation: I = ABCE = BCDF = ADEF (resolution IV)" in text
    assert "  A   = (not aliased with any main effect or two-factor interaction)" in text
    assert "  AB  = CE" in text and "  AD  = EF" in text
    out = json.loads(design_listing(config, "slab", as_json=True)[1])
    assert out["count"] == 48 and out["resolution"] == 4
    assert out["defining_relation"] == ["I", "ABCE", "BCDF", "ADEF"]
    assert ["A", "BCE", "DEF", "ABCDF"] in out["alias_chains"]
