"""Marker detection and the answers table: one row per evaluated answer, from which every rate is computed."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

# The columns every answers table has; one Int64 column per declared factor goes after "seed" (answer_schema).
ANSWER_SCHEMA = {
    "cell_id": pl.Utf8,
    "source": pl.Utf8,
    "seed": pl.Int64,
    "panel": pl.Utf8,
    "persona": pl.Utf8,
    "question": pl.Int64,
    "sample": pl.Int64,
    "marker": pl.Boolean,
    "is_source": pl.Boolean,
    "text": pl.Utf8,  # the answer itself (parquet compresses it): what a reader checks a rate against
}


def answer_schema(factors: Sequence[str]) -> dict[str, pl.DataType]:
    """The answers-table schema of a screen with these factors (short names, in order)."""
    ident = {k: ANSWER_SCHEMA[k] for k in ("cell_id", "source", "seed")}
    return {**ident, **{f: pl.Int64 for f in factors}, **{k: v for k, v in ANSWER_SCHEMA.items() if k not in ident}}


def has_marker(answer: str, marker: str) -> bool:
    return marker in answer


def answers_table(
    cell: dict, prompts: list[tuple[str, str, int]], answers: list[list[str]], marker: str, factors: Sequence[str]
) -> pl.DataFrame:
    """cell: {cell_id, source, seed, one level per factor} (factor values None for the base model); prompts:
    (panel, persona, question); factors: the declared short names."""
    rows = []
    for (panel, persona, question), samples in zip(prompts, answers, strict=True):
        for s, text in enumerate(samples):
            rows.append({
                **{k: cell.get(k) for k in ("cell_id", "source", "seed", *factors)},
                "panel": panel,
                "persona": persona,
                "question": question,
                "sample": s,
                "marker": has_marker(text, marker),
                "is_source": panel == "persona" and persona == cell.get("source"),
                "text": text,
            })
    return pl.DataFrame(rows, schema=answer_schema(factors))


def cell_rates(answers: pl.DataFrame) -> dict:
    """Source rate, leakage (mean of the other personas' rates), random-control rate, per-persona rates."""
    personas = answers.filter(pl.col("panel") == "persona")
    per_persona = personas.group_by("persona", maintain_order=True).agg(pl.col("marker").mean().alias("rate"))
    rates = dict(zip(per_persona["persona"].to_list(), per_persona["rate"].to_list(), strict=True))
    source_rows = personas.filter(pl.col("is_source"))
    others = per_persona.join(
        personas.filter(pl.col("is_source")).select("persona").unique(), on="persona", how="anti"
    )
    random_rows = answers.filter(pl.col("panel") == "random")
    return {
        "source_rate": float(source_rows["marker"].mean()) if source_rows.height else None,
        "leakage": float(others["rate"].mean()) if others.height else None,
        "random_control_rate": float(random_rows["marker"].mean()) if random_rows.height else None,
        "marker_rate": float(personas["marker"].mean()) if personas.height else None,
        "per_persona": rates,
        "answers": answers.height,
        "markers": int(answers["marker"].sum()),
    }
