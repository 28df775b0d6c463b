"""Coverage of the screen's 95% bootstrap CIs over many simulated screens (a study, not a CI test).

Each screen draws new question and persona effects (screen_seed) and new answers from the planted model
in config.simulation, runs the aggregation's statistics (eps_screen.aggregate.compute, no files), and
checks whether each CI contains the planted value on the reported scale (simulate.true_effects).
Quantities: rate difference and Cohen's d of the 5 main effects and the A x B interaction, on SR and LR,
per source and pooled. Target: 93-97% overall.

    .venv/bin/python benchmarks/coverage_study.py --screens 200 --resamples 2000
"""

from __future__ import annotations

import argparse
import json
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
    args = ap.parse_args()
    if args.plain_percentile:
        screen_stats.few_cluster_factor = lambda clusters, ci: 1.0

    config = ScreenConfig(bootstrap={"resamples": args.resamples, "seed": 7}, simulation=json.loads(args.simulation))
    print(f"planted: {config.simulation.model_dump()}")
    cells = all_slab_cells(config)
    ids = [c.id for c in cells]
    personas = load_panels().eval_personas(config.sources, config.eval.personas)
    hits: dict[tuple[str, str, str], list[bool]] = defaultdict(list)  # (response, stat, scope) -> covered?
    started = time.perf_counter()
    for k in range(args.screens):
        seed = args.first_seed + k
        answers = simulate_screen(config, cells, personas, screen_seed=seed)
        truth = true_effects(config, cells, personas, config.eval.questions, screen_seed=seed)
        est = compute(config, answers, ids).estimates
        for e in est.estimates:
            if e.term not in TERMS:
                continue
            scope = "pooled" if e.source == "pooled" else "per source"
            true = truth[(e.response, e.source, e.term)]
            for stat, iv in (("effect", e.effect_ci), ("d", e.d_ci)):
                hits[(e.response, stat, scope)].append(iv.contains(true[stat]))
    elapsed = time.perf_counter() - started

    kind = "plain percentile" if args.plain_percentile else "percentile widened by the few-clusters factor"
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


if __name__ == "__main__":
    main()
