"""The page says no more than its numbers (issue 24, item 4), on pages aggregated from simulated answers (seconds).

- "clear" only of an estimate whose difference and d intervals both exclude 0, in the TL;DR as in the tables;
- every page says what its numbers are: the tiny local model, a simulation, or a real model;
- each main effect shows its level means; a rate's interval stays inside [0, 1];
- kill criteria that cannot fire in an in-process run say that they do not apply.
"""

from __future__ import annotations

import html
import re

import pytest

from eps_screen.analysis.schemas import Interval, TermEffect
from eps_screen.report.tables import ci, written
from eps_screen.report.tldr import tldr
from eps_screen.run.aggregate import aggregate
from eps_screen.run.simulate import simulate_screen
from eps_screen.spec.config import ScreenConfig, load_config
from eps_screen.spec.design import all_slab_cells
from tests.conftest import CONFIGS
from tests.test_report_explains import Tables


def _page(tmp_path_factory, name: str, **sections):
    data = load_config(CONFIGS / name).model_dump(mode="json")
    data = {**data, "bootstrap": {**data["bootstrap"], "resamples": 200}, **sections}
    config = ScreenConfig.model_validate(data)
    cells = all_slab_cells(config)
    out = tmp_path_factory.mktemp(name.removesuffix(".yaml"))
    result = aggregate(config, simulate_screen(config, cells), [c.id for c in cells], out)
    return config, result, (out / "clean_result.html").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _page(tmp_path_factory, "tiny.yaml")


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    return _page(tmp_path_factory, "sim-6-2.yaml")


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """qwen7b.yaml's page, from simulated answers: what it says of its numbers follows the config's model."""
    return _page(tmp_path_factory, "qwen7b.yaml")


def _estimate(effect_ci: tuple[float, float], d_ci: tuple[float, float]) -> TermEffect:
    iv = lambda lo_hi: Interval(low=lo_hi[0], high=lo_hi[1])  # noqa: E731
    return TermEffect(term="A", factors=["A"], label="A", response="SR", source="pooled", effect=0.02,
                      effect_ci=iv(effect_ci), d=0.1, d_ci=iv(d_ci), mean_high=0.1, mean_high_ci=iv((0, 0.2)),
                      mean_low=0.08, mean_low_ci=iv((0, 0.2)), n_high=16, n_low=16, partial=False)


def test_clear_needs_both_intervals_to_exclude_zero():
    assert _estimate((0.01, 0.05), (0.02, 0.3)).clear
    assert not _estimate((-0.001, 0.05), (0.02, 0.3)).clear  # d's CI excludes 0, the difference's touches it
    assert not _estimate((0.01, 0.05), (-0.02, 0.3)).clear
    assert _estimate((-0.05, -0.01), (-0.3, -0.02)).clear


def test_a_bound_that_is_not_zero_never_reads_as_zero():
    """The tiny screen's A x B read "+0.01 [+0.00, +0.03]" and was called clear: its low bound was +0.003."""
    assert written(0.003, 2, "+") == "+0.003" and written(-0.0004, 3) == "-0.0004"
    assert written(0.031, 2, "+") == "+0.03" and written(0.0, 2, "+") == "+0.00"
    assert written(1e-9, 2, "+") == "+0.000000"  # at most 6 places
    assert ci(Interval(low=0.0004, high=0.2)) == "[0.0004, 0.200]"


def _intervals_said_clear(text: str) -> list[tuple[float, float]]:
    """Every interval the TL;DR ties to the word 'clear': 'X x Y is clear: the interaction is +a [lo, hi]'."""
    return [(float(lo), float(hi)) for lo, hi in
            re.findall(r"is clear: the interaction is [-+]\d\.\d+ \[([-+]\d\.\d+), ([-+]\d\.\d+)\]", text)]


# Whether the TL;DR calls the pre-registered interaction clear: tiny's and qwen7b's A x B are (planted large); the
# 2^(6-2) declares no interaction, so its TL;DR has none to call clear.
@pytest.mark.parametrize("page, says_clear", [("tiny", True), ("simulated", False), ("real", True)])
def test_no_clear_interval_contains_zero(page, says_clear, request):
    config, result, body = request.getfixturevalue(page)
    start = body.index('id="tldr"')
    text = html.unescape(body[start:body.index("</p>", start)])  # the TL;DR as the page prints it
    for lo, hi in _intervals_said_clear(text):
        assert lo > 0 or hi < 0, text
    for response, name in (("SR", "source rate"), ("LR", "leakage")):
        pooled = [e for e in result.main_effects.effects if e.source == "pooled" and e.response == response]
        said = re.search(rf"(\d+) of {len(pooled)} factors move it clearly", text[text.find(name):])
        if said:  # the count the TL;DR gives is of estimates whose two intervals both exclude 0
            assert int(said.group(1)) == sum(
                e.effect_ci.excludes_zero() and e.d_ci.excludes_zero() for e in pooled), text
    assert ("is clear" in text) is says_clear, text  # where it says so, the interval check above ran
    assert bool(_intervals_said_clear(text)) is says_clear, text


@pytest.mark.parametrize("page, says", [
    ("tiny", "Tiny model: the cells fine-tuned eps-screen's own tiny chat model"),
    ("simulated", "Simulated: no model was trained or asked anything"),
    ("real", "Real model: every cell is a LoRA fine-tune of Qwen/Qwen2.5-7B-Instruct"),
])
def test_every_page_says_what_its_numbers_are(page, says, request):
    config, result, body = request.getfixturevalue(page)
    banner = html.unescape(body[body.index('id="numbers-are"'):body.index("</p>", body.index('id="numbers-are"'))])
    assert says in banner
    text = tldr(config, result)
    cells = result.metrics.coverage.factorial_cells
    if page == "simulated":
        assert text.startswith(f"This screen simulated {cells} LoRA recipes") and "(nothing was trained)" in text
    else:
        assert text.startswith(f"This screen trained {cells} LoRA recipes") and "nothing was trained" not in text


def test_main_effects_show_their_level_means(tiny):
    _, result, body = tiny
    parser = Tables()
    parser.feed(body)
    main = next(t for t in parser.tables if "pooled mean at level 0 -> 1" in t[0])
    col, term_col = main[0].index("pooled mean at level 0 -> 1"), main[0].index("term")
    by = {(e.response, e.label): e for e in result.main_effects.effects if e.source == "pooled"}
    assert len(main) - 1 == len(by)
    for row in main[1:]:
        e = by[(row[0], row[term_col])]
        assert row[col] == f"{e.mean_low:.3f} -> {e.mean_high:.3f}"


# Whether the bound holds some rate's interval at 0, as it does on the tiny page (whose widened intervals about rates
# near 0 would otherwise reach below it) and on neither of the other two.
@pytest.mark.parametrize("page, held_at_zero", [("tiny", True), ("simulated", False), ("real", False)])
def test_rate_intervals_stay_inside_zero_one(page, held_at_zero, request):
    _, result, _ = request.getfixturevalue(page)
    rates = [iv for e in result.main_effects.effects + result.interactions.interactions
             for iv in (e.mean_high_ci, e.mean_low_ci)] + [g.ci for g in result.metrics.ab_means]
    assert rates and all(0.0 <= iv.low <= iv.high <= 1.0 for iv in rates if iv.low is not None)
    # the intervals are widened about rates near 0, so without the bound some would reach below it
    assert any(iv.low == 0.0 for iv in rates) is held_at_zero


def test_gpu_criteria_do_not_apply_in_process_and_are_not_recorded_on_a_gpu_pool(tiny, real):
    for (config, _, body), outcome in ((tiny, "does not apply"), (real, "not recorded")):
        parser = Tables()
        parser.feed(body)
        gates = next(t for t in parser.tables if t[0][:2] == ["#", "criterion"])
        rows = {r[0]: r for r in gates[1:]}
        assert config.execution.pool == ("inprocess" if outcome == "does not apply" else "runpod-gpu")
        assert rows["5"][3] == outcome and rows["6"][3] == outcome
        assert rows["1"][3] in ("passed", "FIRED", "not recorded")
