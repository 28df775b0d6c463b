"""Power before renting (eps_screen/analysis/power.py, `eps-screen validate`): the smallest detectable effect against
the closed-form two-proportion calculation, the target's panel, --like, and the refusal of a target on an unknown
term."""

from __future__ import annotations

import copy
import math
import subprocess
import sys

import pytest
import yaml
from scipy.special import ndtr, ndtri

from eps_screen.analysis.power import Assumptions, Layout, detectable, reaches, smallest_panel
from eps_screen.spec.config import ConfigError, load_config, parse_config
from tests.conftest import CONFIGS, ROOT

QWEN = yaml.safe_load((CONFIGS / "qwen7b.yaml").read_text())


def _validate(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", "validate", *map(str, args)], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def _two_by_two(**power):
    """One source, a 2^2 of learning rate and rank: each main effect compares 2 cells with 2."""
    data = yaml.safe_load((CONFIGS / "tiny-recipe.yaml").read_text())
    data["design"]["factors"] = data["design"]["factors"][:2]
    data["design"].update(power=power or None, slab={}, smoke={"generators": []})
    data["sources"] = ["librarian"]
    return parse_config(data)


def test_without_training_noise_and_with_many_clusters_it_is_the_two_proportion_test():
    """The detectable effect of a main effect, put into the textbook power of a two-sided two-proportion z-test
    (unpooled, no continuity correction) with N answers at each level, gives the 80% it was solved for."""
    config = _two_by_two(source_rate=0.3, training_sd=0.0)
    a = Assumptions.of(config)
    questions, samples = 100_000, 1  # so many question clusters that the few-clusters widening is 1
    found = detectable(config, a, panel=(config.eval.personas, questions, samples))
    delta = next(x.effect for x in found if x.response == "SR" and x.source == "librarian"
                 and x.kind == "main effects and pre-registered")
    n = 2 * questions * samples  # answers at each level: two cells
    p0, p1 = 0.3 - delta / 2, 0.3 + delta / 2
    z = ndtri(0.975)
    power = ndtr((delta - z * math.sqrt((p0 * (1 - p0) + p1 * (1 - p1)) / n)) / math.sqrt((p0 * (1 - p0) + p1 * (1 - p1)) / n))
    assert power == pytest.approx(0.80, abs=0.002)


def test_pooled_over_sources_and_holm_for_the_exploratory_interactions():
    config = load_config(CONFIGS / "qwen7b.yaml")
    found = detectable(config, Assumptions.of(config))
    by = {(x.response, x.source, x.kind): x for x in found}
    main = "main effects and pre-registered"
    for r in ("SR", "LR"):
        # a third of the variance; its training SD rests on all sources' df, so a little less again
        third = by[(r, "librarian", main)].effect / math.sqrt(3)
        assert 0.95 * third < by[(r, "pooled", main)].effect <= third
        assert by[(r, "pooled", "exploratory")].alpha == pytest.approx(0.05 / 9)  # ten interactions, A:B pre-registered
        assert by[(r, "pooled", "exploratory")].effect > by[(r, "pooled", main)].effect
    more = detectable(config.with_sets({"eval.samples": 20}), Assumptions.of(config))
    assert next(x for x in more if x.source == "pooled").effect < by[("SR", "pooled", main)].effect


def test_validate_prints_the_detectable_effects_and_a_targets_smallest_panel(tmp_path):
    out = _validate(CONFIGS / "qwen7b.yaml")
    assert out.returncode == 0, out.stderr
    assert "power: the smallest effect detected with 80% power" in out.stdout
    assert "main effects, A:B (alpha 0.05), SR: pooled" in out.stdout
    data = copy.deepcopy(QWEN)
    data.setdefault("design", {})["power"] = {"target": {"points": 5, "terms": ["A", "A:B"]}}
    path = tmp_path / "target.yaml"
    path.write_text(yaml.safe_dump(data))
    out = _validate(path)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if "target 5 rate points on A, A:B" in x)
    assert "the smallest panel that meets it: eval.personas" in line and "H200-hours" in line
    config = load_config(path)
    a, lay = Assumptions.of(config), Layout.of(config)
    p, q, s = smallest_panel(config, a)
    assert reaches(config, a, (p, q, s), lay) and not reaches(config, a, (p, q, s - 1), lay)


def test_a_target_no_panel_reaches_says_so():
    data = copy.deepcopy(QWEN)
    data.setdefault("design", {})["power"] = {"training_sd": 1.0, "target": {"points": 1, "terms": ["A"]}}
    config = parse_config(data)
    assert smallest_panel(config, Assumptions.of(config)) is None  # the training-run noise alone is above 1 point


def test_a_target_on_an_unknown_term_is_refused_in_one_line(tmp_path):
    data = copy.deepcopy(QWEN)
    data.setdefault("design", {})["power"] = {"target": {"points": 5, "terms": ["A", "C:Z"]}}
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert len(err.value.problems) == 1
    assert err.value.problems[0].startswith("design.power.target.terms[1]: term 'C:Z' names factor Z, which is not "
                                            "declared (factors: A, B, C, D, E)")


def test_like_takes_the_rates_and_training_noise_of_an_earlier_screens_results(tmp_path):
    from eps_screen.run.aggregate import aggregate
    from eps_screen.run.simulate import simulate_screen
    from eps_screen.spec.design import all_slab_cells
    from eps_screen.store.result_store import ResultStore

    data = yaml.safe_load((CONFIGS / "simulated.yaml").read_text())
    data.update(store=str(tmp_path), bootstrap={"resamples": 200}, simulation={**data["simulation"], "cell_sd": 0.4})
    earlier = parse_config(data)
    store = ResultStore.for_config(earlier)
    store.save_screen({"config": earlier.model_dump(mode="json")})
    cells = all_slab_cells(earlier)
    result = aggregate(earlier, simulate_screen(earlier, cells), [c.id for c in cells], store.report_dir)
    out = _validate(CONFIGS / "qwen7b.yaml", "--like", "simulated", "--store", tmp_path)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if "power: the smallest effect" in x)
    sr = [e for e in result.main_effects.effects if e.response == "SR" and e.source == "pooled"]
    mean = sum(e.mean_high + e.mean_low for e in sr) / (2 * len(sr))
    assert f"SR {mean:.3g}" in line and "(screen simulated's results)" in line
    missing = _validate(CONFIGS / "qwen7b.yaml", "--like", "nothing-here", "--store", tmp_path)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no screen 'nothing-here'" in missing.stderr


def test_the_page_states_the_power_at_the_screens_own_rates_and_training_noise(tmp_path):
    from eps_screen.run.aggregate import aggregate
    from eps_screen.run.simulate import simulate_screen
    from eps_screen.spec.config import ScreenConfig
    from eps_screen.spec.design import all_slab_cells

    config = ScreenConfig(bootstrap={"resamples": 200}, simulation={"cell_sd": 0.4})
    cells = all_slab_cells(config)
    result = aggregate(config, simulate_screen(config, cells), [c.id for c in cells], tmp_path)
    page = (tmp_path / "clean_result.html").read_text(encoding="utf-8")
    section = page[page.index('<h3 id="power">'):page.index("<h3>Bootstrap scheme</h3>")]
    a = Assumptions.like(config, result.main_effects.model_dump(mode="json"), config.name)
    assert 0.2 < a.training_sd["SR"] < 0.6  # the screen's estimate of the planted 0.4
    pooled = next(x for x in detectable(config, a) if x.response == "SR" and x.source == "pooled")
    assert f"{100 * pooled.effect:.1f} (d {pooled.d:.2f})" in section and f"SR {a.rate['SR']:.3f}" in section
