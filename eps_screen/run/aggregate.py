"""Aggregation: whatever cell answers exist -> statistics, gates 3 and 4, predictions, figures, clean_result.html.

Pure (no Prefect): the aggregate flow and the scheduled re-aggregation call `aggregate`, tests and the
benchmarks call it directly. A partial screen is reported as it is: the missing cells are listed in
every artifact and every estimate from an incomplete source is marked partial.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from eps_screen.analysis import answer_examples, answer_health, gates
from eps_screen.analysis.cell_metrics import CellMatrices, cell_matrices, check_answers
from eps_screen.analysis.curvature import curvature_tests
from eps_screen.analysis.gates import GateOutcome
from eps_screen.analysis.predictions import judge_predictions
from eps_screen.plan.costs import screen_cost
from eps_screen.plan.screen_plan import expected_cells as expected_cells_of
from eps_screen.report.stores import register
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import Cell
from eps_screen.store.provenance import provenance
from eps_screen.analysis.schemas import (
    AggregateMetricsFile,
    CellMetric,
    Coverage,
    InteractionsFile,
    MainEffectsFile,
    SeedReplicate,
    finite,
)
from eps_screen.analysis.screen_stats import (
    ESTIMATOR,
    RESPONSES,
    ScreenEffects,
    declarations,
    declared_factors,
    screen_effects,
)
from eps_screen.analysis.stats import sign_table
from eps_screen.store.files import write_text
from eps_screen.store.result_store import ResultStore

ARTIFACTS = ("main_effects.json", "interactions.json", "aggregate_metrics.json", "clean_result.html")


@dataclass
class AggregateResult:
    main_effects: MainEffectsFile
    interactions: InteractionsFile
    metrics: AggregateMetricsFile
    estimates: ScreenEffects
    paths: dict[str, Path] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    examples: pl.DataFrame | None = None  # answers the page quotes, with their text (answer_examples.pick)

    @property
    def partial(self) -> bool:
        return self.metrics.coverage.partial

    @property
    def fired(self) -> list[GateOutcome]:
        return [g for g in self.metrics.gates if g.fired]


def compute(
    config: ScreenConfig, answers: pl.DataFrame, expected_cells: list[str], extras: Mapping[str, Any] | None = None,
) -> AggregateResult:
    """Every number of the aggregation, without writing anything."""
    timings: dict[str, float] = {}
    t = time.perf_counter()
    factors = declared_factors(config)
    check_answers(answers, factors)
    mats = cell_matrices(answers.filter(pl.col("source").is_not_null()), factors)  # pre-screen rows have no source
    timings["cell_metrics"] = time.perf_counter() - t

    coverage, factorial, partial_sources = _coverage(config, mats, expected_cells)
    t = time.perf_counter()
    est = screen_effects(config, mats, factorial, partial_sources)
    timings["bootstrap"] = time.perf_counter() - t

    d_sr, d_lr = est.main_d("SR"), est.main_d("LR")
    new_gates = [
        gates.sign_instability(d_sr, d_lr, config.gates.sign_flips),
        gates.all_below_noise(d_sr, d_lr, config.gates.noise_d),
    ]
    earlier = [g for g in collect_gates(extras or {}) if g.number not in {n.number for n in new_gates}]
    _, rules = declarations(config)
    predictions = (
        judge_predictions(
            rules, lambda r, term, scale: est.draws_of(r, term, scale), est.term_names, config.bootstrap.ci, est.widen,
            partial=bool(coverage.factorial_missing),
        )
        if est.sources else []
    )
    header = _header(config)
    signs = {r: sign_table(est.main_d(r)) for r in RESPONSES}
    main = MainEffectsFile(
        **header, coverage=coverage, estimator=ESTIMATOR, bootstrap=est.scheme,
        effects=[e for e in est.estimates if len(e.factors) == 1], sign_table=signs,
        logit_model=est.logit_model, logit_sensitivity=[e for e in est.logit if ":" not in e.term],
    )
    inter = InteractionsFile(
        **header, coverage=coverage, estimator=ESTIMATOR, bootstrap=est.scheme,
        interactions=[e for e in est.estimates if len(e.factors) == 2], simple_effects=est.simple_effects,
        logit_model=est.logit_model, logit_sensitivity=[e for e in est.logit if ":" in e.term],
    )
    cells = _cell_records(mats, set(factorial), factors)
    metrics = AggregateMetricsFile(
        **header, coverage=coverage, cells=cells, curvature=curvature_tests(config, cells),
        gates=sorted(earlier + new_gates, key=lambda g: g.number), predictions=predictions,
        ab_means=est.ab_means, seed_replicates=_seed_replicates(mats, factors),
        emptied=answer_health.emptied(config, answers, set(factorial)),
        extras=_json_extras(extras or {}), timings_s=dict(timings),
    )
    return AggregateResult(main, inter, metrics, est, timings_s=timings)


def aggregate(
    config: ScreenConfig, answers: pl.DataFrame, expected_cells: list[str], out_dir: Path,
    extras: dict | None = None, examples: pl.DataFrame | None = None,
) -> AggregateResult:
    """compute(), then write the three JSON artifacts, the figures (html fragment + plotly JSON) and clean_result.html
    (which quotes `examples`, answers with their text, when given)."""
    from eps_screen.report import (
        write_report,  # plotly is imported only when figures are made
    )

    started = time.perf_counter()
    result = compute(config, answers, expected_cells, extras)
    result.examples = examples
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    for name, model in (
        ("main_effects.json", result.main_effects),
        ("interactions.json", result.interactions),
        ("aggregate_metrics.json", result.metrics),
    ):
        path = out_dir / name
        write_text(path, model.model_dump_json(indent=2))
        result.paths[name] = path
    result.timings_s["write_json"] = time.perf_counter() - t
    t = time.perf_counter()
    result.paths.update(write_report(config, result, out_dir))
    result.timings_s["report"] = time.perf_counter() - t
    result.timings_s["total"] = time.perf_counter() - started
    return result


def aggregate_stored(config: ScreenConfig, store: ResultStore) -> tuple[dict, AggregateResult | None]:
    """Aggregate the screen's stored cells: (the summary the `aggregate` flow returns, the AggregateResult or None
    when no cell is finished). The gates it decides are saved and the report pushed; the flow adds its artifacts."""
    expected = expected_cells_of(config, store)
    answers = store.load_answers(config, expected)
    if answers is None:
        return {"report": None, "partial": True, "cells": 0}, None
    examples = store.answer_texts(config, answer_examples.pick(config, answers))
    extras = {"gates": store.gates(), "cost": screen_cost(config, store).as_dict()}  # costs: the report's Cost section
    result = aggregate(config, answers, [c.id for c in expected], store.report_dir, extras, examples)
    for gate in result.metrics.gates:
        store.save_gate(gate.model_dump(mode="json"))
    store.push_report()
    register(store)  # the report link names this store: every `eps-screen serve` on this machine serves it now
    summary = {"report": str(result.paths["clean_result.html"]), "partial": result.partial,
               "cells": answers["cell_id"].n_unique(), "fired": [g.name for g in result.fired]}
    return summary, result


# --------------------------------------------------------------------------- pieces


def _header(config: ScreenConfig) -> dict[str, Any]:
    return {
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "screen": config.name,
        "config": config.model_dump(mode="json"),
        "provenance": provenance(),
    }


def _parse(cell_id: str) -> Cell | None:
    try:
        return Cell.parse(cell_id)
    except (ValueError, IndexError):
        return None


def _coverage(config: ScreenConfig, mats: CellMatrices, expected: list[str]) -> tuple[Coverage, list[str], set[str]]:
    """Which cells are present, missing, unexpected; which enter the factorial; which sources are incomplete."""
    present = mats.cell_ids
    present_set = set(present)
    missing = [c for c in dict.fromkeys(expected) if c not in present_set]
    unexpected = sorted(present_set - set(expected))
    cells = mats.cells
    primary = config.seeds.primary
    levels_known = pl.all_horizontal([pl.col(f).is_not_null() for f in declared_factors(config)])
    factorial = (
        cells.filter((pl.col("seed") == primary) & pl.col("source").is_not_null() & levels_known)
        .get_column("cell_id").to_list()
    )
    factorial_missing = [c for c in missing if (p := _parse(c)) is not None and p.seed == primary and not p.is_centre]
    partial_sources = {p.source for c in factorial_missing if (p := _parse(c)) is not None}
    coverage = Coverage(
        expected=len(set(expected)), present=len(present), missing_cells=missing, unexpected_cells=unexpected,
        partial=bool(missing), factorial_cells=len(factorial), factorial_missing=factorial_missing,
    )
    return coverage, factorial, partial_sources


def _cell_records(mats: CellMatrices, factorial: set[str], factors: tuple[str, ...]) -> list[CellMetric]:
    rates: dict[str, dict[str, float | None]] = {}
    for row in mats.persona_rates.iter_rows(named=True):
        rates.setdefault(row["cell_id"], {})[row["persona"]] = finite(row["rate"])
    out = []
    for row in mats.cells.iter_rows(named=True):
        out.append(CellMetric(
            cell_id=row["cell_id"], source=row["source"], seed=row["seed"], levels={f: row[f] for f in factors},
            SR=row["SR"], LR=row["LR"], random_rate=row["random_rate"], n_source=row["n_source"],
            n_leak=row["n_leak"], n_random=row["n_random"], leak_personas=row["leak_personas"],
            persona_rates=rates.get(row["cell_id"], {}), in_factorial=row["cell_id"] in factorial,
        ))
    return out


def _seed_replicates(mats: CellMatrices, factors: tuple[str, ...]) -> list[SeedReplicate]:
    """Factor combinations present at more than one seed (the multi-seed phase) and their spread."""
    groups = (  # a centre cell's midpoint levels are empty: its replicates are the curvature test's (curvature.py)
        mats.cells.filter(pl.col("source").is_not_null() & pl.all_horizontal(pl.col(f).is_not_null() for f in factors))
        .sort("seed")
        .group_by("source", *factors, maintain_order=True)
        .agg(pl.col("seed"), pl.col("SR"), pl.col("LR"))
        .filter(pl.col("seed").list.len() > 1)
        .sort("source", *factors)
    )
    out = []
    for g in groups.iter_rows(named=True):
        sr, lr = np.array(g["SR"], dtype=float), np.array(g["LR"], dtype=float)
        out.append(SeedReplicate(
            source=g["source"], levels={f: g[f] for f in factors}, seeds=g["seed"],
            SR=[finite(x) for x in sr], LR=[finite(x) for x in lr],
            SR_sd=finite(np.std(sr, ddof=1)), LR_sd=finite(np.std(lr, ddof=1)),
        ))
    return out


def collect_gates(extras: Mapping[str, Any]) -> list[GateOutcome]:
    """Gate outcomes the flow recorded earlier (pre-screen, smoke, cost, silence), wherever they sit in extras.

    Accepted: GateOutcome objects or their dicts, directly as values or in lists (e.g. extras["gates"]);
    the last outcome of each gate number wins.
    """
    found: dict[int, GateOutcome] = {}

    def visit(value: Any) -> None:
        if isinstance(value, GateOutcome):
            found[value.number] = value
        elif isinstance(value, dict) and {"name", "number", "fired"} <= set(value):
            found[int(value["number"])] = GateOutcome.model_validate(value)
        elif isinstance(value, list | tuple):
            for v in value:
                visit(v)

    for v in extras.values():
        visit(v)
    return list(found.values())


def _json_extras(extras: Mapping[str, Any]) -> dict[str, Any]:
    """extras made JSON-safe (pydantic models dumped), to be stored beside the statistics."""

    def conv(v: Any) -> Any:
        if hasattr(v, "model_dump"):
            return v.model_dump(mode="json")
        if isinstance(v, dict):
            return {str(k): conv(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [conv(x) for x in v]
        if isinstance(v, float):
            return finite(v)
        if isinstance(v, str | int | bool) or v is None:
            return v
        return str(v)

    return {str(k): conv(v) for k, v in extras.items()}
