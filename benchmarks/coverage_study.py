"""Coverage of the screen's 95% bootstrap CIs over many simulated screens (a study, not a CI test).

Each screen draws new question and persona effects (screen_seed) and new answers from the planted model
in config.simulation, runs the aggregation's statistics (eps_screen.aggregate.compute, no files), and
checks whether each CI contains the planted value on the reported scale (simulate.true_effects).
Quantities: rate difference and Cohen's d of the 5 main effects and the A x B interaction, on SR and LR,
per source and pooled. Target: 93-97% overall.

Training-run noise: --cell-sd S plants a per-cell log-odds shift of SD S (config.simulation.cell_sd; the
planted values then average over training runs); --cluster-only turns off the CIs' training-run component
(config.bootstrap.training_noise), i.e. the intervals shipped before it. --json writes the table.

    .venv/bin/python benchmarks/coverage_study.py --screens 200 --resamples 2000
    .venv/bin/python benchmarks/coverage_study.py --screens 400 --resamples 2000 --cell-sd 0.3 \
        --json benchmarks/results/coverage_cellsd0.3.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from collections import defaultdict

import numpy as np

from eps_screen import screen_stats
from eps_screen.aggregate import compute
from eps_screen.config import ScreenConfig
from eps_screen.design import all_slab_cells
from eps_screen.panels import load_panels
from eps_screen.simulate import simulate_screen, true_effects

TERMS = ("A", "B", "C", "D", "E", "A:B")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--screens", type=int, default=200)
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--first-seed", type=int, default=1000)
    ap.add_argument("--simulation", default="{}", help="JSON overrides of config.simulation (other planted values)")
    ap.add_argument("--plain-percentile", action="store_true",
                    help="for comparison: turn off the few-clusters widening (stats.few_cluster_factor)")
    ap.add_argument("--cell-sd", type=float, default=None, help="per-cell training-run noise (log-odds SD) to plant")
    ap.add_argument("--cluster-only", action="store_true",
                    help="for comparison: CIs without the training-run variance (bootstrap.training_noise = false)")
    ap.add_argument("--json", default=None, help="write the coverage table and the run's settings to this file")
    args = ap.parse_args()
    if args.plain_percentile:
        screen_stats.few_cluster_factor = lambda clusters, ci: 1.0

    simulation = json.loads(args.simulation)
    if args.cell_sd is not None:
        simulation["cell_sd"] = args.cell_sd
    bootstrap = {"resamples": args.resamples, "seed": 7, "training_noise": not args.cluster_only}
    config = ScreenConfig(bootstrap=bootstrap, simulation=simulation)
    print(f"planted: {config.simulation.model_dump()}")
    cells = all_slab_cells(config)
    ids = [c.id for c in cells]
    personas = load_panels().eval_personas(config.sources, config.eval.personas)
    hits: dict[tuple[str, str, str], list[bool]] = defaultdict(list)  # (response, stat, scope) -> covered?
    by_term: dict[tuple[str, str], list[bool]] = defaultdict(list)  # (response, term) -> covered?
    fitted: dict[str, list[float]] = defaultdict(list)  # response -> estimated training-run SD per screen
    started = time.perf_counter()
    for k in range(args.screens):
        seed = args.first_seed + k
        answers = simulate_screen(config, cells, personas, screen_seed=seed)
        truth = true_effects(config, cells, personas, config.eval.questions, screen_seed=seed)
        est = compute(config, answers, ids).estimates
        for response, noise in est.training.items():
            fitted[response].append(noise.logit_sd)
        for e in est.estimates:
            if e.term not in TERMS:
                continue
            scope = "pooled" if e.source == "pooled" else "per source"
            true = truth[(e.response, e.source, e.term)]
            for stat, iv in (("effect", e.effect_ci), ("d", e.d_ci)):
                hits[(e.response, stat, scope)].append(iv.contains(true[stat]))
                by_term[(e.response, e.term)].append(iv.contains(true[stat]))
    elapsed = time.perf_counter() - started

    kind = "plain percentile" if args.plain_percentile else "percentile widened by the few-clusters factor"
    kind += ", cluster bootstrap only" if args.cluster_only else ", with the training-run component"
    print(f"{args.screens} simulated screens x 96 cells, {args.resamples} resamples each, {kind} CIs, {elapsed:.0f} s")
    print(f"{'response':8} {'statistic':9} {'scope':10} {'CIs':>6} {'coverage':>9}")
    total = []
    for key in sorted(hits):
        v = hits[key]
        total += v
        print(f"{key[0]:8} {key[1]:9} {key[2]:10} {len(v):6d} {np.mean(v):9.1%}")
    n = len(total)
    p = float(np.mean(total))
    print(f"overall: {p:.1%} of {n} CIs cover the planted value (target 93-97%)")
    print("per term (effect and d, per source and pooled): "
          + ", ".join(f"{r} {t} {np.mean(v):.1%}" for (r, t), v in sorted(by_term.items())))
    for response, sds in sorted(fitted.items()):
        print(f"estimated training-run SD on {response}: median {np.nanmedian(sds):.3f}, "
              f"5-95% {np.nanpercentile(sds, 5):.3f}-{np.nanpercentile(sds, 95):.3f}")
    if args.json:
        record = {
            "command": " ".join(["python", *sys.argv]),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.node()}, {platform.machine()}, {os.cpu_count()} cores visible, Python {platform.python_version()}",
            "screens": args.screens, "resamples": args.resamples, "first_seed": args.first_seed,
            "cis": kind, "sources": config.sources, "personas": len(personas), "questions": config.eval.questions,
            "simulation": config.simulation.model_dump(), "seconds": round(elapsed, 1),
            "coverage": {f"{r} {st} {sc}": {"cis": len(v), "coverage": float(np.mean(v))} for (r, st, sc), v in sorted(hits.items())},
            "coverage_by_term": {f"{r} {t}": float(np.mean(v)) for (r, t), v in sorted(by_term.items())},
            "overall": {"cis": n, "coverage": p},
            "estimated_training_sd": {
                r: {"median": float(np.nanmedian(v)), "p5": float(np.nanpercentile(v, 5)), "p95": float(np.nanpercentile(v, 95))}
                for r, v in sorted(fitted.items())
            },
        }
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
