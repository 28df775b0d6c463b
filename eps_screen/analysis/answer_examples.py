"""Which stored answers the page quotes: per group of cells, one answer with the marker and one without.

The groups are the levels of the first pre-registered pair (A0B0 ... A1B1 in the marker screen), or the source
personas when nothing is pre-registered. In each group the quoted cell is the primary-seed cell with the highest
source rate, and its answers are the source persona's own, so a reader sees what implanting looked like where it
worked best, next to an answer of the same cell that went without. Where the answers are flagged `empty` (the
store's is_empty_answer: nothing but the marker, or nothing), a marked answer counts only when it says something
else too: on SmolLM2 the marker-only loss emptied its cells' answers and gave them the highest source rates, and
quoting a bare "[ZLT]" per group would show how answers were lost, not how the marker sits in one (the TL;DR
names an emptied level). Picking reads no text; only the picked answers' text is read back from the store
(answers.parquet keeps every answer's text, compressed).
"""

from __future__ import annotations

import polars as pl

from eps_screen.analysis.screen_stats import declarations
from eps_screen.spec.config import ScreenConfig

PICK_COLUMNS = ("group", "cell_id", "persona", "question", "sample", "marker")


def _group(config: ScreenConfig, answers: pl.DataFrame) -> pl.Expr:
    pre, _ = declarations(config)
    pair = next((t.split(":") for t in pre if t.count(":") == 1 and set(t.split(":")) <= set(answers.columns)), None)
    if pair is None:
        return pl.col("source")
    return pl.concat_str([pl.lit(pair[0]), pl.col(pair[0]).cast(pl.String), pl.lit(pair[1]),
                          pl.col(pair[1]).cast(pl.String)])


def pick(config: ScreenConfig, answers: pl.DataFrame) -> pl.DataFrame:
    """(group, cell_id, persona, question, sample, marker) of the answers to quote, at most two per group."""
    design_cell = pl.all_horizontal(pl.col(f).is_not_null() for f in config.factors)  # not a centre cell's midpoint
    own = answers.filter(pl.col("is_source") & (pl.col("seed") == config.seeds.primary)
                         & pl.col("source").is_not_null() & design_cell)
    if own.is_empty():
        return pl.DataFrame(schema={c: answers.schema.get(c, pl.String) for c in PICK_COLUMNS})
    if "empty" not in own.columns:  # answers without text (simulated): none is empty
        own = own.with_columns(pl.lit(False).alias("empty"))
    own = own.with_columns(_group(config, own).alias("group"), (pl.col("marker") & ~pl.col("empty")).alias("said"))
    best = (own.group_by("group", "cell_id").agg(pl.col("said").mean().alias("rate"))
            .sort(["group", "rate", "cell_id"], descending=[False, True, False])
            .unique("group", keep="first", maintain_order=True))
    quoted = own.join(best.select("group", "cell_id"), on=["group", "cell_id"])
    return (quoted.sort("group", "marker", "empty", "question", "sample", descending=[False, True, False, False, False])
            .unique(["group", "marker"], keep="first", maintain_order=True)
            .select(PICK_COLUMNS))
