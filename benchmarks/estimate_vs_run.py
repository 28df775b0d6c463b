"""`validate`'s estimate against what a run measured, part by part, for the cells one span of a screen ran.

    python benchmarks/estimate_vs_run.py CONFIG CELLS_CSV --git REV [--store STORE/SCREEN --regimes-since ISO]

CELLS_CSV is benchmarks/screen_results.py's table; the span is its cells stored by code revision REV. The estimate
is the one `eps-screen validate CONFIG` prints, taken per cell at its own rates (eps_screen.plan.cost_estimate's
figures and screen_work's tokens): training at the cell's condition's rate, evaluation at the adapter rate, and of
the evaluation only what the next stage's training does not cover (the estimate's rule: at least each job's last
stage). Measured: the stages' walls as the job recorded them (a stage's training from its submission to its last
training's end; its evaluation call). With --store, the answer sets whose files date from --regimes-since on are
priced too (their measured time is read from the job's log, not here). Prints JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
from collections import defaultdict
from pathlib import Path

import polars as pl

from eps_screen.plan.cost_estimate import estimate, exposed_evaluation_s
from eps_screen.plan.screen_work import cell_work, regime_tokens, screen_work
from eps_screen.spec import design
from eps_screen.spec.config import load_config
from eps_screen.spec.design import Cell


def rate(figures: dict, prefix: str) -> float:
    (value,) = [f["value"] for name, f in figures.items() if name.startswith(prefix)]
    return value


def measured_stages(span: pl.DataFrame, primary_seed: int) -> dict[str, list[dict]]:
    """Each job's stages in the order they were stored: (train wall, eval wall, cells)."""
    jobs: dict[str, dict[tuple, dict]] = defaultdict(dict)
    for row in span.sort("stored").iter_rows(named=True):
        job = "primary seed" if row["seed"] == primary_seed else "multi-seed"
        stage = jobs[job].setdefault((row["job_train_s"], row["job_eval_s"]),
                                     {"train_s": row["job_train_s"], "eval_s": row["job_eval_s"], "cells": 0})
        stage["cells"] += 1
    return {job: list(stages.values()) for job, stages in jobs.items()}


def exposed(stages: list[dict]) -> float:
    """Evaluation the card waits for: what outlasts the next stage's training, and the last stage's."""
    return sum(max(0.0, s["eval_s"] - nxt["train_s"]) for s, nxt in zip(stages, stages[1:])) + stages[-1]["eval_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("cells_csv")
    ap.add_argument("--git", required=True)
    ap.add_argument("--store")
    ap.add_argument("--regimes-since")
    args = ap.parse_args()
    config = load_config(args.config)
    est, work = estimate(config), screen_work(config)
    span = pl.read_csv(args.cells_csv).filter(pl.col("git") == args.git)
    cells = [Cell.parse(c) for c in span["cell_id"]]
    train_s = eval_s = 0.0
    for cell in cells:
        w = work.cells.get(cell.id) or cell_work(config, cell)
        train_s += w.train_tokens / rate(est.figures, f"train {w.condition} ")
        eval_s += w.answer_tokens / rate(est.figures, f"generate {w.condition} ")
    stages = measured_stages(span, config.seeds.primary)
    n_stages = sum(math.ceil(len(group) / config.execution.cells_per_stage)
                   for group in (span.filter(pl.col("seed") == config.seeds.primary),
                                 span.filter(pl.col("seed") != config.seeds.primary)) if len(group))
    out = {
        "cells": len(cells), "A1 cells": int(span["A"].sum()), "jobs": len(stages), "stages": {
            j: len(s) for j, s in stages.items()},
        "training_s": {"estimate": round(train_s, 1),
                       "measured": round(sum(s["train_s"] for st in stages.values() for s in st), 1)},
        "evaluation_s": {"estimate": round(eval_s, 1),
                         "measured": round(sum(s["eval_s"] for st in stages.values() for s in st), 1)},
        "evaluation_exposed_s": {"estimate": round(exposed_evaluation_s(eval_s, train_s, len(stages), n_stages), 1),
                                 "measured": round(sum(exposed(st) for st in stages.values()), 1)},
    }
    if args.store and args.regimes_since:
        since = dt.datetime.fromisoformat(args.regimes_since).timestamp()
        made = [d.name for d in sorted(Path(args.store, "regimes").iterdir())
                if min(f.stat().st_mtime for f in d.iterdir()) >= since]
        by_id = {r.id: r for r in (design.regime_of(config, c) for c in cells)}
        seconds = defaultdict(float)
        for rid in made:
            cond, tokens = regime_tokens(config, by_id[rid])
            seconds["off" if by_id[rid].off_policy else "on"] += tokens / rate(est.figures, f"answers {cond} ")
        out["answer_sets"] = {"made": len(made), "estimate_s": {k: round(v, 1) for k, v in seconds.items()}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
