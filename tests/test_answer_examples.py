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


def _best(group: pl.DataFrame) -> str:
    """The cell the page should quote: the highest rate of marked answers not flagged empty (ties: by cell id)."""
    rates = group.group_by("cell_id").agg((pl.col("marker") & ~pl.col("empty")).mean().alias("rate"))
    return rates.sort(["rate", "cell_id"], descending=[True, False])["cell_id"][0]


def test_emptied_answers_do_not_make_a_cell_the_example(tmp_path):
    """A cell whose marked answers are all bare markers (flagged `empty`, as load_answers flags them) loses the
    quote to a cell that marks answers with text in them, and within a cell a marked answer with text comes first."""
    config = _config("tiny.yaml", tmp_path)
    answers = simulate_screen(config, all_slab_cells(config))
    in_group = pl.col("is_source") & (pl.col("seed") == config.seeds.primary) & (pl.col("A") == 0) & (pl.col("B") == 0)
    top = answer_examples.pick(config, answers).filter(pl.col("group") == "A0B0")["cell_id"][0]
    emptied = answers.with_columns(((pl.col("cell_id") == top) & pl.col("marker")).alias("empty"))
    picked = answer_examples.pick(config, emptied).filter(pl.col("group") == "A0B0")["cell_id"][0]
    assert picked != top and picked == _best(emptied.filter(in_group))
    # within the quoted cell: its first marked answer (by question, sample) is bare, and every other cell's marked
    # answers are, so the cell stays the quoted one and another of its marked answers is quoted
    mine = emptied.filter(in_group & (pl.col("cell_id") == picked) & pl.col("marker")).sort("question", "sample")
    assert mine.height >= 2
    first = mine.row(0, named=True)
    one_bare = answers.with_columns(
        (pl.col("marker") & ((pl.col("cell_id") != picked) | ((pl.col("persona") == first["persona"])
                                                             & (pl.col("question") == first["question"])
                                                             & (pl.col("sample") == first["sample"])))).alias("empty"))
    picks = answer_examples.pick(config, one_bare).filter(pl.col("group") == "A0B0")
    marked = picks.filter(pl.col("marker")).row(0, named=True)
    assert picks["cell_id"][0] == picked
    assert (marked["question"], marked["sample"]) != (first["question"], first["sample"])
