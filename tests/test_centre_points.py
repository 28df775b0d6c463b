"""Centre points (design.centre_points): the midpoints, the one-line refusals, the centre cells' ids and recipe, the
curvature test against a textbook example and a hand computation, and the shipped simulated screen, which detects
the curvature it plants and none where none is planted."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from eps_screen.analysis.curvature import curvature_tests
from eps_screen.spec import design
from eps_screen.spec.centre_points import midpoint_sets
from eps_screen.spec.config import ConfigError, load_config, parse_config
from tests.conftest import CONFIGS, ROOT

SIM_CENTRE = yaml.safe_load((CONFIGS / "sim-centre.yaml").read_text())


def _config(**design_fields):
    data = copy.deepcopy(SIM_CENTRE)
    data["design"].update(design_fields)
    return parse_config(data)


def _factor(short, label, low, high, **extra):
    return {"short": short, "label": label, **extra,
            "levels": [{"description": str(low), "sets": low}, {"description": str(high), "sets": high}]}


# --- the midpoints ---------------------------------------------------------------------------------------------


def test_the_midpoint_is_geometric_for_the_learning_rate_and_arithmetic_otherwise_unless_declared():
    config = load_config(CONFIGS / "sim-centre.yaml")
    f = config.factors
    assert midpoint_sets(config, f["A"]) == {"training.learning_rate": pytest.approx(math.sqrt(1e-5 * 1e-4))}  # 3.16e-5
    assert midpoint_sets(config, f["B"]) == {"lora.rank": 16} and isinstance(midpoint_sets(config, f["B"])["lora.rank"], int)  # declared
    assert midpoint_sets(config, f["C"]) == {"training.epochs": 2.0}
    assert midpoint_sets(config, f["D"]) == {"data.positives": 150}
    factors = copy.deepcopy(SIM_CENTRE["design"]["factors"])
    factors[0]["midpoint"], factors[1]["midpoint"] = "arithmetic", "arithmetic"
    declared = _config(factors=factors).factors
    assert midpoint_sets(config, declared["A"])["training.learning_rate"] == pytest.approx(5.5e-5)
    assert midpoint_sets(config, declared["B"]) == {"lora.rank": 20}


def test_a_centre_cell_trains_the_midpoint_recipe_with_the_held_treatment():
    config = load_config(CONFIGS / "sim-centre.yaml")
    cell = design.centre_cells(config, "surgeon")[2]
    r = design.recipe(config, cell)
    assert r.config.training.learning_rate == pytest.approx(10 ** -4.5) and r.config.lora.rank == 16
    assert (r.config.training.epochs, r.config.data.positives) == (2.0, 150)
    assert not r.condition.whole_answer_loss  # E held at level 0: loss on the marker only
    assert design.recipe(config, design.slab_cells(config, "surgeon")[0]).config.lora.rank in (8, 32)


# --- refusals: one line each, naming the field and the fix ---------------------------------------------------------

_FACTORS = SIM_CENTRE["design"]["factors"]


def _with(i, **changes):
    factors = copy.deepcopy(_FACTORS)
    factors[i].update(changes)
    return factors


REFUSED = [
    ({"centre_points": -1}, "design.centre_points: a count of cells cannot be negative; give 0"),
    ({"centre_points": 1}, "design.centre_points: one centre cell per source has no spread"),
    ({"factors": _with(4, centre_level=None)},
     "design: factor E (Loss mask) is a treatment (marker_only_loss / whole_answer_loss) and has no midpoint for"
     " design.centre_points; hold it in the centre cells with centre_level: 0 (loss on the marker tokens only) or 1"),
    ({"factors": [*_FACTORS, _factor("F", "Targets", {"lora.target_modules": "q_proj"},
                                     {"lora.target_modules": "all-linear"})]},
     "design: factor F (Targets) is categorical: it sets lora.target_modules to values that are not numbers and has"
     " no midpoint for design.centre_points; hold it in the centre cells with centre_level: 0"),
    ({"factors": _with(4, midpoint="arithmetic")},
     "design: factor E (Loss mask): midpoint applies to a factor whose levels set numbers, and this one is a"
     " treatment; drop midpoint"),
    ({"factors": _with(0, midpoint="geometric", centre_level=1)},
     "design: factor A (Learning rate): give midpoint (centre cells at its midpoint) or centre_level (held there)"),
    ({"factors": _with(3, levels=_factor("D", "", {"data.positives": 100}, {"data.positives": 201})["levels"])},
     "design: factor D (Positives): the arithmetic midpoint of data.positives between 100 and 201 is 150.5, not a"
     " whole number, and the field takes integers; choose levels whose midpoint is whole, or hold the factor"),
    ({"factors": _with(1, midpoint="arithmetic", levels=_factor("B", "", {"lora.rank": 1}, {"lora.rank": 4})["levels"])},
     "design: factor B (LoRA rank): the arithmetic midpoint of lora.rank between 1 and 4 is 2.5, not a whole number,"
     " and the field takes integers; set midpoint: geometric (2), choose levels"),
    ({"factors": [*_FACTORS, _factor("F", "Warm-up", {"training.warmup_ratio": 0.0}, {"training.warmup_ratio": 0.1},
                                     midpoint="geometric")]},
     "design: factor F (Warm-up): the geometric midpoint of training.warmup_ratio needs both levels above 0 (0.0 and"
     " 0.1); set midpoint: arithmetic"),
    ({"factors": [dict(f, centre_level=0, midpoint=None) for f in _FACTORS]},
     "design.centre_points: every factor is held (centre_level) or has no midpoint, so a centre cell would be a"
     " design cell; leave a numeric factor at its midpoint"),
]


@pytest.mark.parametrize(("fields", "says"), REFUSED, ids=["negative", "one", "treatment", "text", "midpoint on a"
                         " treatment", "midpoint and held", "integer", "integer, geometric whole", "geometric at 0",
                         "all held"])
def test_a_bad_centre_declaration_is_refused_in_one_line(fields, says):
    with pytest.raises(ConfigError) as err:
        _config(**fields)
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(says), err.value.problems


@pytest.mark.parametrize(("simulation", "says"), [
    ({"curvature": {"E": 0.5}}, "simulation.curvature: 'E' is not a factor the centre cells put at its midpoint"
                                " (A, B, C, D); plant curvature on one of those"),
    ({"leak_curvature": {"Z": 0.5}}, "simulation.leak_curvature: 'Z' is not a factor the centre cells put"),
])
def test_planted_curvature_must_be_on_a_factor_at_its_midpoint(simulation, says):
    data = copy.deepcopy(SIM_CENTRE)
    data["simulation"].update(simulation)
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(says), err.value.problems
    data["design"]["centre_points"] = 0
    data["simulation"] = {**SIM_CENTRE["simulation"], "leak_curvature": {}}
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert err.value.problems == ["simulation.curvature: curvature shows only in centre cells; set"
                                  " design.centre_points (2 or more) or drop simulation.curvature"]


def test_validate_refuses_before_anything_runs(tmp_path):
    data = copy.deepcopy(SIM_CENTRE)
    data["design"]["factors"][4]["centre_level"] = None
    path = tmp_path / "held.yaml"
    path.write_text(yaml.safe_dump(data))
    out = subprocess.run([sys.executable, "-m", "flows.cli", "validate", str(path)], check=False, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if "centre" in line]
    assert len(lines) == 1 and "factor E (Loss mask)" in lines[0] and "centre_level: 0" in lines[0]


# --- the cells ---------------------------------------------------------------------------------------------------


def test_centre_cells_have_readable_ids_own_seeds_and_run_beside_the_slab():
    from eps_screen.plan.screen_plan import make_plan
    from eps_screen.store.result_store import cell_key

    config = load_config(CONFIGS / "sim-centre.yaml")
    centre = design.centre_cells(config, "librarian")
    assert [c.id for c in centre] == [f"librarian-AcBcCcDcE0-s{s}" for s in (42, 43, 44, 45)]
    assert all(design.Cell.parse(c.id) == c and c.is_centre for c in centre)
    assert centre[0].as_dict() == {"cell_id": "librarian-AcBcCcDcE0-s42", "source": "librarian", "seed": 42,
                                   "A": None, "B": None, "C": None, "D": None, "E": 0}
    assert design.regime_of(config, centre[1]).id == "librarian-Dc-s43-on"  # positives touch the answers
    assert len({cell_key(config, c) for c in centre}) == 4
    slab = design.all_slab_cells(config)
    assert len(slab) == 3 * (16 + 4) and sum(c.is_centre for c in slab) == 12
    rates = {c: (0.9 if c.is_centre else 0.1) for c in slab}
    assert not any(design.Cell(s, lv, 42, "ABCDE").is_centre for s in config.sources
                   for lv in design.pick_top(rates, s, 3))  # the multi-seed phase re-runs design cells only
    plan = make_plan(config)
    assert plan.cells_per_phase["slab"] == 60 and plan.cells_per_phase["centre"] == 12 and plan.distinct_cells == 60
    lines = plan.lines()
    assert any(line.startswith("phase 2 slabs:      48 cells (3 sources x 16") for line in lines)
    centre_line = next(line for line in lines if "centre points:" in line)
    assert "12 cells (3 sources x 4, seeds 42-45" in centre_line and "lora.rank 16" in centre_line
    assert "E (Loss mask) held at 0" in centre_line
    assert not make_plan(load_config(CONFIGS / "sim-6-2.yaml")).centre_lines()


def test_design_lists_the_centre_cells():
    out = subprocess.run([sys.executable, "-m", "flows.cli", "design", str(CONFIGS / "sim-centre.yaml"), "--phase",
                          "slab"], check=True, cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    assert "48 cells, and 12 centre cells" in out
    assert "librarian-AcBcCcDcE0-s45" in out and " c c c c 0" in out
    assert "  B (LoRA rank): midpoint (geometric): lora.rank 16" in out


# --- the test ------------------------------------------------------------------------------------------------------


def _records(config, source, centre, design_rates, levels=None):
    """CellMetric-like records: the centre cells' rates, then design cells at the given levels."""
    cells = design.centre_cells(config, source)
    out = [SimpleNamespace(cell_id=c.id, source=source, levels=c.row_levels, SR=y, LR=y, in_factorial=False)
           for c, y in zip(cells, centre, strict=True)]
    runs = levels or design.phases(config).slab.runs()
    for run, y in zip(runs, design_rates, strict=False):
        c = design.Cell(source, run, config.seeds.primary, config.design.shorts)
        out.append(SimpleNamespace(cell_id=c.id, source=source, levels=c.row_levels, SR=y, LR=y, in_factorial=True))
    return out


def test_the_curvature_test_is_montgomerys_on_his_example():
    """Montgomery, Design and Analysis of Experiments, the 2^2 with five centre points (the process yield of
    section 6.8): factorial runs 39.3, 40.9, 40.0, 41.5, centre 40.3, 40.5, 40.7, 40.2, 40.6; he finds
    SS_pure quadratic = 0.0027 and MS_E = 0.0430 (pure error, 4 df), F = 0.063: no curvature."""
    data = {"name": "yield", "sources": ["librarian"], "backend": {"generation": "simulated", "training": "simulated"},
            "design": {"centre_points": 5, "factors": [
                _factor("A", "Time", {"training.epochs": 1}, {"training.epochs": 3}),
                _factor("B", "Rank", {"lora.rank": 8}, {"lora.rank": 32})]}}
    config = parse_config(data)
    cells = _records(config, "librarian", [40.3, 40.5, 40.7, 40.2, 40.6], [39.3, 40.9, 40.0, 41.5])
    (sr, _) = curvature_tests(config, cells)
    assert (sr.centre_cells, sr.design_cells, sr.df) == (5, 4, 4)
    assert sr.curvature == pytest.approx(40.46 - 40.425)
    assert sr.pure_error_sd ** 2 == pytest.approx(0.0430)
    ss_curvature = 4 * 5 * (40.425 - 40.46) ** 2 / 9
    assert ss_curvature == pytest.approx(0.0027, abs=5e-5)
    se = (sr.ci.high - sr.ci.low) / 2 / 2.776  # t_{0.975, 4}, the table's value
    assert (sr.curvature / se) ** 2 == pytest.approx(0.063, abs=1e-3) and not sr.detected


def test_curvature_per_source_and_pooled_by_hand():
    """Two sources, the held factor E at 0: design cells at E1 are left out of the comparison. By hand: librarian's
    centre 0.5, 0.6, 0.7, 0.6 (mean 0.6, SD sqrt(0.02/3)) against its 8 design cells at E0, 0.4: curvature 0.2, SE
    sqrt(0.02/3 x (1/4 + 1/8)) = 0.05, t_{0.975, 3} = 3.182; surgeon's centre 0.3, 0.3, 0.5, 0.5 (mean 0.4, variance
    0.04/3) against 0.35: 0.05. Pooled: 0.125, pure-error variance (0.02 + 0.04) / 6 = 0.01 on 6 df, SE
    sqrt(0.01 x 2 x 0.375) / 2 = 0.0433, t_{0.975, 6} = 2.447."""
    config = load_config(CONFIGS / "sim-centre.yaml")
    runs = design.phases(config).slab.runs()
    e0, e1 = [r for r in runs if r[4] == 0], [r for r in runs if r[4] == 1]
    cells = (_records(config, "librarian", [0.5, 0.6, 0.7, 0.6], [0.4] * 8 + [0.95] * 8, e0 + e1)
             + _records(config, "surgeon", [0.3, 0.3, 0.5, 0.5], [0.35] * 8 + [0.95] * 8, e0 + e1))
    tests = {(t.response, t.source): t for t in curvature_tests(config, cells, ["librarian", "surgeon"])}
    lib, sur, pooled = tests[("SR", "librarian")], tests[("SR", "surgeon")], tests[("SR", "pooled")]
    assert (lib.centre_cells, lib.design_cells, lib.df) == (4, 8, 3)
    assert lib.curvature == pytest.approx(0.2) and lib.pure_error_sd == pytest.approx(math.sqrt(0.02 / 3))
    assert (lib.ci.low, lib.ci.high) == pytest.approx((0.2 - 3.182446 * 0.05, 0.2 + 3.182446 * 0.05))
    assert lib.detected and sur.curvature == pytest.approx(0.05) and not sur.detected
    assert (pooled.curvature, pooled.df, pooled.centre_cells, pooled.design_cells) == (pytest.approx(0.125), 6, 8, 16)
    half = 2.446912 * math.sqrt(0.01 * 2 * 0.375) / 2
    assert (pooled.ci.low, pooled.ci.high) == pytest.approx((0.125 - half, 0.125 + half))
    assert pooled.detected and not pooled.partial
    every = {(t.response, t.source): t for t in curvature_tests(config, cells)}  # programmer, declared, has no cells
    assert ("SR", "programmer") not in every and every[("SR", "pooled")].partial


# --- the shipped simulated screen -------------------------------------------------------------------------------


def _screen(tmp_path, design_fields=None, **simulation):
    from eps_screen.panels import load_panels
    from eps_screen.run.aggregate import aggregate
    from eps_screen.run.simulate import simulate_screen

    data = copy.deepcopy(SIM_CENTRE)
    data["design"].update(design_fields or {})
    data["simulation"].update(simulation)
    data["bootstrap"] = {"resamples": 500}
    config = parse_config(data)
    cells = design.all_slab_cells(config)
    answers = simulate_screen(config, cells, load_panels().eval_personas(config.sources, config.eval.personas))
    return config, aggregate(config, answers, [c.id for c in cells], tmp_path)


def test_the_shipped_screen_detects_its_planted_curvature_and_none_where_none_is_planted(tmp_path):
    _, planted = _screen(tmp_path / "planted")
    _, flat = _screen(tmp_path / "flat", curvature={}, leak_curvature={})
    for result, expected in ((planted, True), (flat, False)):
        pooled = {t.response: t for t in result.metrics.curvature if t.source == "pooled"}
        assert {r: t.detected for r, t in pooled.items()} == {"SR": expected, "LR": expected}
        assert all(t.centre_cells == 12 and t.design_cells == 24 and t.df == 9 for t in pooled.values())
    assert planted.metrics.curvature[-1].curvature > 0.05  # the midpoint's planted log-odds lift, on the rate scale
    # The effects come from the design cells alone: the same whether the centre curves or not.
    assert ([e.effect for e in planted.main_effects.effects] == [e.effect for e in flat.main_effects.effects])
    assert not planted.metrics.coverage.factorial_missing and planted.metrics.coverage.factorial_cells == 48
    assert not planted.metrics.seed_replicates  # centre replicates are the curvature test's, not phase 3's


def test_the_centre_replicates_carry_the_training_noise(tmp_path):
    """A 2^(5-1) with its 15 reported terms leaves no residual contrast and there is no multi-seed phase: the centre
    cells' 3 replicate contrasts per source (9 over all) are all the training-noise estimate rests on."""
    config, result = _screen(tmp_path)
    assert set(result.main_effects.bootstrap.training_df.values()) == {9} and not result.estimates.caveats
    assert all(np.isfinite(v) and v > 0 for v in result.main_effects.bootstrap.training_sd.values())
    data = copy.deepcopy(SIM_CENTRE)
    data["design"]["centre_points"] = 0
    data["simulation"].update(curvature={}, leak_curvature={})
    data["bootstrap"] = {"resamples": 200}
    from eps_screen.panels import load_panels
    from eps_screen.run.aggregate import compute
    from eps_screen.run.simulate import simulate_screen

    bare = parse_config(data)
    cells = design.all_slab_cells(bare)
    answers = simulate_screen(bare, cells, load_panels().eval_personas(bare.sources, bare.eval.personas))
    without = compute(bare, answers, [c.id for c in cells])
    assert "The CIs omit training-run noise" in without.estimates.caveats[0] and not without.metrics.curvature


def test_the_page_has_a_curvature_section_with_its_verdicts(tmp_path):
    _, result = _screen(tmp_path)
    page = (tmp_path / "clean_result.html").read_text()
    assert '<h2 id="curvature">Curvature: centre points</h2>' in page
    assert 'id="curvature-verdict-1"><b>Source rate curves between the levels: centre' in page
    assert 'id="curvature-verdict-2"><b>Leakage curves between the levels' in page
    assert "pure-error SD" in page and "lora.rank 16" in page and "held at 0" in page
    assert "<td>librarian-AcBcCcDcE0-s43</td>" in page and "ANone" not in page
    heatmap = (tmp_path / "figures" / "persona_heatmap.json").read_text()
    assert "AcBcCcDcE0 s43" in heatmap
    from eps_screen.panels import load_panels
    from eps_screen.run.aggregate import aggregate
    from eps_screen.run.simulate import simulate_screen

    other = load_config(CONFIGS / "sim-6-2.yaml")
    other = other.model_copy(update={"bootstrap": other.bootstrap.model_copy(update={"resamples": 200})})
    cells = design.all_slab_cells(other)
    answers = simulate_screen(other, cells, load_panels().eval_personas(other.sources, other.eval.personas))
    aggregate(other, answers, [c.id for c in cells], tmp_path / "none")
    assert 'id="curvature"' not in (tmp_path / "none" / "clean_result.html").read_text()


def _tldr_and_curvature_rows(page: str) -> tuple[str, dict]:
    """The page's TL;DR as a reader sees it, and its curvature table's pooled rows by response (none without one)."""
    from tests.test_report_explains import Tables
    from tests.test_report_what_ran import visible

    start = page.index(">", page.index('id="tldr"')) + 1
    tldr = " ".join(visible(page[start:page.index("</p>", start)]).split())
    parser = Tables()
    parser.feed(page)
    table = next((t for t in parser.tables if t[0][:2] == ["response", "source"] and "curvature" in t[0]), None)
    rows = {} if table is None else {r[0]: dict(zip(table[0], r, strict=True)) for r in table[1:] if r[1] == "pooled"}
    return tldr, rows


def test_the_tldr_says_whether_each_response_curves_in_the_tables_words(tmp_path):
    """Planted curvature: the TL;DR says SR and LR curve, with the pooled curvature and CI exactly as the curvature
    table writes them; none planted: not detected, the same numbers; no centre points: not a word on curvature."""
    names = {"SR": "source rate", "LR": "leakage"}
    for case, detected in (("planted", True), ("flat", False)):
        flat = {} if detected else {"curvature": {}, "leak_curvature": {}}
        config, result = _screen(tmp_path / case, **flat)
        text, rows = _tldr_and_curvature_rows((tmp_path / case / "clean_result.html").read_text())
        assert set(rows) == {"SR", "LR"}
        for response, row in rows.items():
            assert row["verdict"] == ("curves" if detected else "not detected"), row
            numbers = f"{row['curvature']} (95% CI {row['95% CI']}, pooled over sources)"
            said = f"{names[response]} curves, " if detected else f"not detected on {names[response]}, "
            assert said + numbers in text, (said + numbers, text)
        assert text.count("Curvature at the centre points: ") == 1
        assert ("its main effects describe the ends of the factors' ranges, not their middle" in text) is detected
    from eps_screen.report.tldr import tldr

    result.metrics.curvature.clear()  # centre points declared, no centre cell aggregated yet
    assert "The centre cells have no curvature test yet: it needs 2 centre cells" in tldr(config, result)
    _, result = _screen(tmp_path / "none", {"centre_points": 0}, curvature={}, leak_curvature={})
    text, rows = _tldr_and_curvature_rows((tmp_path / "none" / "clean_result.html").read_text())
    assert not rows and not result.metrics.curvature and text.startswith("TL;DR. This screen simulated 48 LoRA")
    assert not any(w in text.lower() for w in ("curv", "centre")), text


@pytest.mark.usefixtures("prefect_harness")
def test_the_screen_flow_runs_the_centre_cells_in_the_slab_phase(tmp_path):
    """Through the simulated flow: the centre cells are stored like any cell (their answers with empty midpoint
    levels), saved with their source's slab phase, and the aggregate's curvature test finds the planted curvature."""
    import json

    from flows.screen import screen

    config = load_config(CONFIGS / "sim-centre.yaml").model_copy(update={"store": str(tmp_path), "name": "centre"})
    config = config.model_copy(update={"bootstrap": config.bootstrap.model_copy(update={"resamples": 300})})
    assert screen(config, return_state=True).is_completed()
    screen_dir = tmp_path / "centre"
    phase = json.loads((screen_dir / "phases" / "slab-surgeon.json").read_text())
    assert {f"surgeon-AcBcCcDcE0-s{s}" for s in (42, 43, 44, 45)} <= set(phase["cells"])
    metrics = json.loads(next((screen_dir / "cells" / "surgeon-AcBcCcDcE0-s44").glob("*/metrics.json")).read_text())
    assert (metrics["A"], metrics["E"], metrics["recipe"]["lora"]["rank"]) == (None, 0, 16)
    report = json.loads((screen_dir / "report" / "aggregate_metrics.json").read_text())
    pooled = [t for t in report["curvature"] if t["source"] == "pooled"]
    assert [t["detected"] for t in pooled] == [True, True] and report["coverage"]["factorial_cells"] == 48
    from eps_screen.analysis.results_table import results_table

    table = results_table(tmp_path).filter(results_table(tmp_path)["cell_id"] == "surgeon-AcBcCcDcE0-s44")
    assert table.select("levels", "A", "E").row(0) == ("AcBcCcDcE0", None, 0)  # no midpoint written as a level
