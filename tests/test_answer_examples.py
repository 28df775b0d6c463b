"""Which answers the page quotes (eps_screen/analysis/answer_examples.py), and how their text comes back from the
store."""

from __future__ import annotations

import polars as pl

from eps_screen.analysis import answer_examples
from eps_screen.run.simulate import simulate_screen
from eps_screen.spec.config import ScreenConfig, load_config
from eps_screen.spec.design import all_slab_cells
from eps_screen.store.result_store import ResultStore
from tests.conftest import CONFIGS


def _config(name: str, store) -> ScreenConfig:
    data = load_config(CONFIGS / name).model_dump(mode="json")
    return ScreenConfig.model_validate({**data, "store": str(store)})


def _with_text(answers: pl.DataFrame) -> pl.DataFrame:
    return answers.with_columns(pl.format("{} q{} s{}", "cell_id", "question", "sample").alias("text"))


def test_per_pre_registered_group_the_best_cell_gives_one_marked_and_one_unmarked_answer(tmp_path):
    config = _config("tiny.yaml", tmp_path)  # A:B pre-registered
    answers = simulate_screen(config, all_slab_cells(config))
    picks = answer_examples.pick(config, answers)
    assert set(picks["group"]) == {"A0B0", "A0B1", "A1B0", "A1B1"}
    own = answers.filter(pl.col("is_source") & (pl.col("seed") == config.seeds.primary))
    rates = own.group_by("cell_id", "A", "B").agg(pl.col("marker").mean().alias("rate"))
    for group in ("A0B0", "A0B1", "A1B0", "A1B1"):
        mine = picks.filter(pl.col("group") == group)
        assert mine["cell_id"].n_unique() == 1 and mine.height <= 2 and mine["marker"].n_unique() == mine.height
        cell = mine["cell_id"][0]
        level = rates.filter((pl.col("A") == int(group[1])) & (pl.col("B") == int(group[3])))
        assert f"-{group}" in cell and level.filter(pl.col("cell_id") == cell)["rate"][0] == level["rate"].max()
    assert picks["marker"].any()


def test_without_a_pre_registered_pair_the_groups_are_the_sources(tmp_path):
    config = _config("sim-6-2.yaml", tmp_path)
    picks = answer_examples.pick(config, simulate_screen(config, all_slab_cells(config)))
    assert set(picks["group"]) == set(config.sources)


def test_the_store_gives_back_the_picked_answers_text(tmp_path):
    config = _config("tiny.yaml", tmp_path)
    cells = all_slab_cells(config)[:6]
    answers = _with_text(simulate_screen(config, cells))
    store = ResultStore.for_config(config)
    for cell in cells:
        store.save_cell(config, cell, answers.filter(pl.col("cell_id") == cell.id), {"cell_id": cell.id})
    loaded = store.load_answers(config, cells)
    assert "text" not in loaded.columns and loaded.height == answers.height  # the statistics never read the text
    picks = answer_examples.pick(config, loaded)
    quoted = store.answer_texts(config, picks)
    assert quoted.height == picks.height > 0
    assert quoted["text"].to_list() == [f"{r['cell_id']} q{r['question']} s{r['sample']}"
                                        for r in quoted.iter_rows(named=True)]
