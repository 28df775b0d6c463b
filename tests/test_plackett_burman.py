"""Plackett-Burman slabs (design.slab.plackett_burman): the textbook matrix and its partial aliasing, the fold-over,
the refusals, and a simulated 11-factor screen in 12 runs per source that recovers its planted effects."""

from __future__ import annotations

import copy
import itertools
import json
import subprocess
import sys
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
import yaml

from eps_screen.spec import design
from eps_screen.spec.config import ConfigError, load_config, parse_config
from eps_screen.spec.plackett_burman import PlackettBurman, matrix
from tests.conftest import CONFIGS, ROOT

# Plackett & Burman (1946), N = 12, as Montgomery tabulates it: the generator row, each next row the one before
# shifted one place to the right (its last sign first), then a row of minuses. Written out, not computed.
PB12 = """
+ + - + + + - - - + -
- + + - + + + - - - +
+ - + + - + + + - - -
- + - + + - + + + - -
- - + - + + - + + + -
- - - + - + + - + + +
+ - - - + - + + - + +
+ + - - - + - + + - +
+ + + - - - + - + + -
- + + + - - - + - + +
+ - + + + - - - + - +
- - - - - - - - - - -
"""
SIM_PB12 = yaml.safe_load((CONFIGS / "sim-pb12.yaml").read_text())


def test_the_12_run_matrix_is_plackett_and_burmans():
    published = np.array([[1 if c == "+" else -1 for c in row.split()] for row in PB12.strip().splitlines()])
    assert published[0].tolist() == [1 if c == "+" else -1 for c in "+ + - + + + - - - + -".split()]
    assert (matrix(12) == published).all()
    assert (published.T @ published == 12 * np.eye(11)).all()  # orthogonal and balanced: the design's defining property


def test_each_main_effect_carries_a_third_of_every_interaction_of_two_other_factors():
    """The textbook partial aliasing of the 12-run design: a main effect is correlated +-1/3 with each of the 45
    two-factor interactions of the other ten factors, and with none that involve itself."""
    pb = PlackettBurman("ABCDEFGHJKL", 12)
    partial = pb.partial_aliases()
    for f, pairs in partial.items():
        assert len(pairs) == 45 and all(f not in w for w, _ in pairs)
        assert {Fraction(c).limit_denominator(12) for _, c in pairs} <= {Fraction(1, 3), Fraction(-1, 3)}
    assert pb.correlations() == {"1/3"} and not any(pb.aliases().values())  # partial, never exact
    assert PlackettBurman("ABCDEFGHJKLMNOPQRST", 20).correlations() == {"1/5", "3/5"}  # the 20-run design's pair


@pytest.mark.parametrize("n", [20, 24])
def test_the_20_and_24_run_designs_are_orthogonal_and_balanced(n):
    m = matrix(n)
    assert m.shape == (n, n - 1) and (m.T @ m == n * np.eye(n - 1)).all()


def test_design_prints_the_partial_alias_table():
    out = subprocess.run([sys.executable, "-m", "flows.cli", "design", str(CONFIGS / "sim-pb12.yaml"), "--phase",
                          "slab"], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "slab: the Plackett-Burman PB12 of 11 factors, resolution III for each of 3 sources at seed 42, 36 cells" in text
    assert "partially aliased with two-factor interactions (correlation 1/3)" in text
    row = next(line for line in text.splitlines() if line.startswith("  A: "))
    assert row.count("1/3") == 45 and "-1/3 B:C" in row and "+1/3 B:F" in row  # A against B x C: -+ +- ... in PB12


def test_a_fold_over_de_aliases_the_main_effects(tmp_path):
    data = copy.deepcopy(SIM_PB12)
    data["design"]["fold_over"] = True
    config = parse_config(data)
    smoke, folded = design.smoke_cells(config), design.fold_over_cells(config)
    assert len(smoke) == len(folded) == 12 and {c.source for c in folded} == {config.smoke}
    assert {c.levels for c in folded} == {tuple(1 - x for x in c.levels) for c in smoke}
    assert not {c.id for c in folded} & {c.id for c in design.all_slab_cells(config)}  # runs of their own
    from eps_screen.plan.screen_plan import make_plan

    assert make_plan(config).distinct_cells == 3 * 12 + 12 + 3 * 3 * 2  # slabs, fold-over, multi-seed; costed too
    both = smoke + folded
    x = {f: np.array([2 * c.level(f) - 1 for c in both]) for f in config.design.shorts}
    for f, (g, h) in itertools.product(config.design.shorts, itertools.combinations(config.design.shorts, 2)):
        assert x[f] @ (x[g] * x[h]) == 0, (f, g, h)
    path = tmp_path / "folded.yaml"
    path.write_text(yaml.safe_dump(data))
    out = subprocess.run([sys.executable, "-m", "flows.cli", "design", str(path), "--phase", "smoke"], check=False,
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "smoke and fold-over together: 24 runs, resolution IV: main effects clear of two-factor interactions" in out.stdout


BAD = [
    ({"plackett_burman": 16}, "design.slab.plackett_burman: 16 is not a Plackett-Burman size offered; use 12, 20 or 24"),
    ({"plackett_burman": 12, "generators": ["L=AB"]}, "design.slab: plackett_burman is a design of its own"),
]


@pytest.mark.parametrize(("slab", "says"), BAD, ids=["size", "with generators"])
def test_a_bad_plackett_burman_declaration_is_one_line(slab, says):
    data = copy.deepcopy(SIM_PB12)
    data["design"]["slab"] = slab
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(says), err.value.problems


def test_a_size_that_does_not_hold_the_factors_is_refused_in_one_line(tmp_path):
    data = copy.deepcopy(SIM_PB12)
    extra = copy.deepcopy(data["design"]["factors"][0])
    extra.update(short="M", label="Batch size", levels=[{"description": "8", "sets": {"training.batch_size": 8}},
                                                         {"description": "16", "sets": {"training.batch_size": 16}}])
    data["design"]["factors"].append(extra)
    path = tmp_path / "twelve.yaml"
    path.write_text(yaml.safe_dump(data))
    out = subprocess.run([sys.executable, "-m", "flows.cli", "validate", str(path)], check=False, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    line = next(line for line in out.stderr.splitlines() if "plackett_burman" in line)
    assert "12 runs hold at most 11 factors and 12 are declared; use plackett_burman: 20" in line


def test_the_shipped_11_factor_screen_recovers_its_planted_effects(tmp_path):
    """sim-pb12.yaml: 11 factors in 12 runs per source (and the multi-seed re-runs, which estimate the training
    noise). Each response's four largest planted effects are its four largest estimates and are clear, every main
    effect has its planted sign, and the CIs cover the true (noise-free) effects."""
    from eps_screen.panels import load_panels
    from eps_screen.run.aggregate import aggregate
    from eps_screen.run.simulate import simulate_screen, true_effects

    config = load_config(CONFIGS / "sim-pb12.yaml")
    config = config.model_copy(update={"bootstrap": config.bootstrap.model_copy(update={"resamples": 1000})})
    slab = design.all_slab_cells(config)
    assert len(slab) == 3 * 12 and config.design.shorts == "ABCDEFGHJKL"
    personas = load_panels().eval_personas(config.sources, config.eval.personas)
    answers = simulate_screen(config, slab, personas)
    source_rates = answers.filter(pl.col("is_source")).group_by("cell_id").agg(pl.col("marker").mean())
    rates = {design.Cell.parse(c): r for c, r in source_rates.iter_rows()}
    multi = design.multiseed_cells(config, {s: design.pick_top(rates, s, config.seeds.top_k) for s in config.sources})
    answers = pl.concat([answers, simulate_screen(config, multi, personas)])
    result = aggregate(config, answers, [c.id for c in slab + multi], tmp_path)
    truth = true_effects(config, slab, personas, config.eval.questions)
    covered = 0
    for response, planted in (("SR", config.simulation.effects), ("LR", config.simulation.leak_effects)):
        pooled = {e.term: e for e in result.main_effects.effects if e.response == response and e.source == "pooled"}
        largest = sorted(planted, key=lambda t: -abs(planted[t]))[:4]
        assert sorted(pooled, key=lambda t: -abs(pooled[t].effect))[:4] == sorted(largest, key=lambda t: -abs(pooled[t].effect))
        assert all(pooled[t].effect_ci.excludes_zero() for t in largest)
        assert all(np.sign(pooled[t].effect) == np.sign(planted[t]) for t in pooled)
        covered += sum(e.effect_ci.low <= truth[(response, "pooled", t)]["effect"] <= e.effect_ci.high
                       for t, e in pooled.items())
    assert covered >= 20  # of 22 intervals at 95%
    assert not result.estimates.caveats  # the seed replicates carry the training noise
    assert json.loads((tmp_path / "main_effects.json").read_text())["effects"]
