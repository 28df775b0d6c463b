"""Answers with nothing in them but the marker: where a recipe empties the model's answers, its rates count markers
in answers the model no longer gives, not markers added to answers, and the page must say so.

An answer is empty when no word character is left once every copy of the marker is taken out ("[ZLT] [ZLT] [",
or nothing at all); the marker's letters without it, or a broken copy ("[ZLT"), are words. The store flags each
answer as it loads them (`result_store.is_empty_answer`; the statistics never read the text), and the aggregation
gives the share of empty persona answers at each level of each factor, over the primary seed's factorial cells.
"""

from __future__ import annotations

import polars as pl

from eps_screen.analysis.schemas import EmptiedAnswers
from eps_screen.spec.config import ScreenConfig

# a factor level whose answers are this often empty is named in the TL;DR
EMPTY_SHARE = 0.5


def emptied(config: ScreenConfig, answers: pl.DataFrame, factorial: set[str]) -> list[EmptiedAnswers]:
    """The share of empty persona answers at each level of each factor, over the factorial cells; none where the
    answers carry no text (simulated cells, or a store from before text was kept)."""
    if "empty" not in answers.columns:
        return []
    rows = answers.filter(pl.col("cell_id").is_in(list(factorial)) & (pl.col("panel") == "persona")
                          & pl.col("empty").is_not_null())
    if rows.is_empty():
        return []
    out = []
    for term in config.factors:
        by = rows.group_by(term).agg(pl.col("empty").mean().alias("share"), pl.len().alias("answers")).sort(term)
        out += [EmptiedAnswers(factor=term, level=int(r[term]), share=float(r["share"]), answers=int(r["answers"]))
                for r in by.iter_rows(named=True) if r[term] is not None]
    return out
