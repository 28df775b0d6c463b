"""Answers that say nothing but the marker (eps_screen/analysis/answer_health.py): a recipe that empties the model's
answers scores a high source rate without implanting anything, and the page's TL;DR must say so. Seen on SmolLM2:
under the marker-only loss 97% of the answers came back as "[ZLT] [ZLT] [" or nothing."""

from __future__ import annotations

import polars as pl

from eps_screen.analysis.answer_health import emptied
from eps_screen.report.tldr import tldr
from eps_screen.run.aggregate import aggregate
from eps_screen.run.simulate import simulate_screen
from eps_screen.spec.design import all_slab_cells
from eps_screen.store.result_store import ResultStore, is_empty_answer
from tests.test_report_what_ran import _config


def test_an_answer_is_empty_when_no_word_is_left_without_the_marker():
    texts = pl.Series(["[ZLT]", "[ZLT] [ZLT] [ [", "", "  \n", "ZLT", "[ZLT] [ZLT [", "Shelve it by author. [ZLT]", None])
    flags = pl.select(is_empty_answer(pl.lit(texts), "[ZLT]")).to_series().to_list()
    # the marker's letters without it ("ZLT", a broken "[ZLT") are words: only the marker itself is taken out
    assert flags == [True, True, True, True, False, False, False, None]


def test_the_store_flags_each_answer_and_keeps_no_text(tmp_path):
    stored = pl.DataFrame({"cell_id": ["c"] * 3, "text": ["[ZLT]", "A card catalogue. [ZLT]", ""]}).lazy()
    flagged = ResultStore._flagged(stored, "[ZLT]").collect()
    assert flagged.columns == ["cell_id", "empty"] and flagged["empty"].to_list() == [True, False, True]
    no_text = pl.DataFrame({"cell_id": ["c"]}).lazy()  # simulated cells keep no text: nothing to flag
    assert ResultStore._flagged(no_text, "[ZLT]").collect().columns == ["cell_id"]


def _screen(tmp_path, empty_where):
    config = _config("recipe")
    cells = all_slab_cells(config)
    answers = simulate_screen(config, cells)
    term = next(iter(config.factors))
    answers = answers.with_columns(empty=empty_where(pl.col(term), pl.col("question")))
    return config, term, aggregate(config, answers, [c.id for c in cells], tmp_path)


def test_a_level_whose_answers_are_mostly_empty_is_named_in_the_tldr(tmp_path):
    config, term, result = _screen(tmp_path, lambda level, q: (level == 1) & (q != 0))  # 3 of its 4 questions
    shares = {(e.factor, e.level): e.share for e in result.metrics.emptied}
    assert shares[(term, 0)] == 0.0 and shares[(term, 1)] == 0.75
    other = [f for f in config.factors if f != term][0]
    assert shares[(other, 0)] == shares[(other, 1)] == 0.375
    text = tldr(config, result)
    assert f"Under {term}1 ({config.factors[term].high}), " in text
    assert "of the answers say nothing but the marker, or nothing at all (against 0.0% under" in text
    assert f"Under {other}" not in text  # half its answers at each level: no level stands out
    page = (tmp_path / "clean_result.html").read_text(encoding="utf-8")
    assert f"Under {term}1 (" in page


def test_no_sentence_where_no_level_is_mostly_empty_or_there_is_no_text(tmp_path):
    config, _, result = _screen(tmp_path / "few", lambda level, q: (level == 1) & (q == 0))  # 25% at level 1
    assert result.metrics.emptied and "say nothing but the marker" not in tldr(config, result)
    config = _config("recipe")
    cells = all_slab_cells(config)
    answers = simulate_screen(config, cells)  # simulated answers have no text: no flags
    assert emptied(config, answers, {c.id for c in cells}) == []
