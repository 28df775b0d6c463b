"""From the answers table (one row per evaluated answer) to per-cell metrics and the cluster count matrices.

The answers-table contract (written by the pipeline, read here):
    cell_id str, source str, seed int, one int column (0/1) per declared factor (A, B, ...), panel 'persona'|'random', persona str ('random' on
    control rows), question int, sample int, marker bool, is_source bool (persona == source).

Per cell: source rate SR = mean(marker) over the source persona's answers; leakage LR = mean over the
non-source personas of each persona's marker rate (every persona weighs the same, as in docs/experiment.md's
off-diagonal mean); random-control rate = mean(marker) over the control prompts.

The bootstrap needs the same numbers broken down by cluster, kept as dense (cells x clusters) matrices
so a resample is a matrix product (stats.weighted_ratio):
    SR: marker counts and answer counts per (cell, question) of the source persona;
    LR: marker rate per (cell, persona) and a 0/1 mask of the non-source personas the cell was scored on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

REQUIRED_COLUMNS: dict[str, str] = {
    "cell_id": "text", "source": "text", "seed": "integer",
    "panel": "text", "persona": "text", "question": "integer", "sample": "integer", "marker": "boolean", "is_source": "boolean",
}


def required_columns(factors: Sequence[str]) -> dict[str, str]:
    """The contract's columns for a screen with these factors (one integer column each)."""
    return {**REQUIRED_COLUMNS, **{f: "integer" for f in factors}}


class AnswersError(ValueError):
    """The answers table breaks the contract above; the message says how."""


def check_answers(answers: pl.DataFrame, factors: Sequence[str]) -> None:
    required = required_columns(factors)
    missing = [c for c in required if c not in answers.columns]
    if missing:
        raise AnswersError(f"answers table lacks column(s) {', '.join(missing)}")
    kinds = {"text": lambda t: t == pl.String, "integer": lambda t: t.is_integer(), "boolean": lambda t: t == pl.Boolean}
    for col, kind in required.items():
        dtype = answers.schema[col]
        if dtype != pl.Null and not kinds[kind](dtype):
            raise AnswersError(f"answers column {col!r} should be {kind}, found {dtype}")
    panels = set(answers.get_column("panel").unique().to_list()) - {"persona", "random"}
    if panels:
        raise AnswersError(f"answers column 'panel' has unknown value(s) {sorted(map(str, panels))}; allowed: persona, random")


@dataclass(frozen=True)
class CellMatrices:
    """Everything the statistics need, in one fixed cell order."""

    cells: pl.DataFrame  # one row per cell: ids, levels, SR, LR, random_rate, counts
    persona_rates: pl.DataFrame  # cell_id, persona, is_source, answers, markers, rate
    questions: list[int]
    personas: list[str]
    sr_markers: np.ndarray  # (cells x questions) marker counts of the source persona
    sr_answers: np.ndarray  # (cells x questions) answer counts of the source persona
    lr_rates: np.ndarray  # (cells x personas) marker rate, 0 where not scored
    lr_mask: np.ndarray  # (cells x personas) 1 for a scored non-source persona

    @property
    def cell_ids(self) -> list[str]:
        return self.cells.get_column("cell_id").to_list()


def _dense(frame: pl.DataFrame, rows: dict[str, int], cols: dict, col_name: str, value: str) -> np.ndarray:
    out = np.zeros((len(rows), len(cols)))
    if frame.height:
        r = np.array([rows[c] for c in frame.get_column("cell_id").to_list()])
        k = np.array([cols[c] for c in frame.get_column(col_name).to_list()])
        out[r, k] = frame.get_column(value).to_numpy()
    return out


def cell_matrices(answers: pl.DataFrame, factors: Sequence[str]) -> CellMatrices:
    """Per-cell metrics and count matrices of every cell in the table (cells sorted by id); factors: the declared
    factors' short names, each a column of the table."""
    check_answers(answers, factors)
    persona = answers.filter(pl.col("panel") == "persona")
    ident = answers.group_by("cell_id").agg(
        pl.col("source").first(), pl.col("seed").first(), *[pl.col(f).first() for f in factors]
    )
    per_persona = (
        persona.group_by("cell_id", "persona")
        .agg(pl.col("is_source").any(), pl.len().alias("answers"), pl.col("marker").sum().alias("markers"))
        .with_columns((pl.col("markers") / pl.col("answers")).alias("rate"))
        .sort("cell_id", "persona")
    )
    source_q = (
        persona.filter(pl.col("is_source"))
        .group_by("cell_id", "question")
        .agg(pl.len().alias("answers"), pl.col("marker").sum().alias("markers"))
    )
    random = answers.filter(pl.col("panel") == "random").group_by("cell_id").agg(
        pl.len().alias("n_random"), pl.col("marker").mean().alias("random_rate")
    )
    cells = ident.sort("cell_id")
    rows = {c: i for i, c in enumerate(cells.get_column("cell_id").to_list())}
    questions = sorted(source_q.get_column("question").unique().to_list())
    personas = sorted(persona.get_column("persona").unique().to_list())
    q_index = {q: i for i, q in enumerate(questions)}
    p_index = {p: i for i, p in enumerate(personas)}

    sr_markers = _dense(source_q, rows, q_index, "question", "markers")
    sr_answers = _dense(source_q, rows, q_index, "question", "answers")
    leak = per_persona.filter(~pl.col("is_source"))
    lr_rates = _dense(leak, rows, p_index, "persona", "rate")
    lr_mask = _dense(leak.with_columns(pl.lit(1.0).alias("one")), rows, p_index, "persona", "one")

    with np.errstate(invalid="ignore", divide="ignore"):
        sr = sr_markers.sum(1) / sr_answers.sum(1)
        lr = lr_rates.sum(1) / lr_mask.sum(1)
    leak_answers = leak.group_by("cell_id").agg(pl.col("answers").sum().alias("n_leak"))
    cells = (
        cells.with_columns(
            pl.Series("SR", np.where(sr_answers.sum(1) > 0, sr, np.nan)),
            pl.Series("LR", np.where(lr_mask.sum(1) > 0, lr, np.nan)),
            pl.Series("n_source", sr_answers.sum(1).astype(np.int64)),
            pl.Series("leak_personas", lr_mask.sum(1).astype(np.int64)),
        )
        .join(leak_answers, on="cell_id", how="left")
        .join(random, on="cell_id", how="left")
        .with_columns(pl.col("n_leak").fill_null(0), pl.col("n_random").fill_null(0))
        .sort("cell_id")
    )
    return CellMatrices(
        cells=cells, persona_rates=per_persona, questions=questions, personas=personas,
        sr_markers=sr_markers, sr_answers=sr_answers, lr_rates=lr_rates, lr_mask=lr_mask,
    )


def marker_rate(answers: pl.DataFrame) -> tuple[float, int]:
    """Share of answers with the marker over every row (the pre-screen's contamination number) and the row count."""
    n = answers.height
    return (float(answers.get_column("marker").mean()) if n else float("nan")), n
