"""Coverage of the screen's 95% bootstrap CIs over many simulated screens (a study, not a CI test).

Each screen draws new question and persona effects (screen_seed) and new answers from the planted model
in config.simulation, runs the aggregation's statistics (eps_screen.run.aggregate.compute, no files), and
checks whether each CI contains the planted value on the reported scale (simulate.true_effects).
Quantities: rate difference and Cohen's d of every main effect and the pre-registered A x B interaction,
on SR and LR, per source and pooled. Target: 93-97% overall, per source and pooled.

Training-run noise: --cell-sd S plants a per-cell log-odds shift of SD S (config.simulation.cell_sd; the
planted values then average over training runs); --cell-sd-by-source 0.2,0.5,0.8 plants a different SD in
each source (the sources in config order), and the table then gives each source's coverage on its own line.
--cluster-only turns off the CIs' training-run component (config.bootstrap.training_noise), i.e. the
intervals shipped before it.

Designs: --factors ABCDE (default: the marker screen's full 2^5) or a subset of its letters, e.g. ABDE for a
2^4 (the marker factors that are left, full factorial per source). --multiseed adds the multi-seed phase:
per source the seeds.top_k cells of highest observed source rate again at each of seeds.multiseed, which the
training-run estimate uses as seed replicates. --json writes the table.

    .venv/bin/python benchmarks/coverage_study.py --screens 200 --resamples 2000
    .venv/bin/python benchmarks/coverage_study.py --screens 300 --resamples 2000 --cell-sd-by-source 0.2,0.5,0.8 \
        --json benchmarks/results/coverage_bysource_2x5.json
    .venv/bin/python benchmarks/coverage_study.py --screens 300 --resamples 2000 --cell-sd-by-source 0.2,0.5,0.8 \
        --factors ABDE --multiseed --json benchmarks/results/coverage_bysource_2x4_multiseed.json
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
import polars as pl

from eps_screen.analysis import screen_stats
from eps_screen.panels import load_panels
from eps_screen.run.aggregate import compute
from eps_screen.run.simulate import simulate_screen, true_effects
from eps_screen.spec.config import ScreenConfig, marker_factors
from eps_screen.spec.design import Cell, full_factorial


def make_config(args: argparse.Namespace) -> ScreenConfig:
    simulation = json.loads(args.simulation)
    if args.cell_sd is not None:
        simulation["cell_sd"] = args.cell_sd
    if args.factors != "ABCDE":
        kept = set(args.factors)
        simulation.setdefault("effects", {t: v for t, v in {"A": 0.8, "B": -0.6, "C": 0.0, "D": -0.4, "E": -0.6,
                                                            "AB": -0.8}.items() if set(t) <= kept})
        simulation.setdefault("leak_effects", {f: v for f, v in {"A": -0.5, "D": 0.3, "E": -0.5}.items() if f in kept})
    bootstrap = {"resamples": args.resamples, "seed": 7, "training_noise": not args.cluster_only}
    design = {} if args.factors == "ABCDE" else {
        "design": {"factors": [f for f in marker_factors() if f.short in set(args.factors)]}}
    return ScreenConfig(bootstrap=bootstrap, simulation=simulation, **design)


def with_cell_sd(config: ScreenConfig, sd: float) -> ScreenConfig:
    return config.model_copy(update={"simulation": config.simulation.model_copy(update={"cell_sd": sd})})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--screens", type=int, default=200)
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--first-seed", type=int, default=1000)
    ap.add_argument("--simulation", default="{}", help="JSON overrides of config.simulation (other planted values)")
    ap.add_argument("--plain-percentile", action="store_true",
                    help="for comparison: turn off the few-clusters widening (stats.few_cluster_factor)")
    ap.add_argument("--cell-sd", type=float, default=None, help="per-cell training-run noise (log-odds SD) to plant")
    ap.add_argument("--cell-sd-by-source", default=None, help="comma list: a training-run SD per source, in order")
    ap.add_argument("--factors", default="ABCDE", help="which of the marker factors to declare (full 2^k per source)")
    ap.add_argument("--multiseed", action="store_true", help="add the multi-seed phase's seed replicates")
    ap.add_argument("--cluster-only", action="store_true",
                    help="for comparison: CIs without the training-run variance (bootstrap.training_noise = false)")
    ap.add_argument("--json", default=None, help="write the coverage table and the run's settings to this file")
    args = ap.parse_args()
    if args.plain_percentile:
        screen_stats.few_cluster_factor = lambda clusters, ci: 1.0

    config = make_config(args)
    factors = screen_stats.declared_factors(config)
    pre_registered, _ = screen_stats.declarations(config)
    terms = set(factors) | set(pre_registered)
    by_source = [float(x) for x in args.cell_sd_by_source.split(",")] if args.cell_sd_by_source else None
    if by_source and len(by_source) != len(config.sources):
        sys.exit(f"--cell-sd-by-source: give {len(config.sources)} SDs, one per source ({', '.join(config.sources)})")
    source_config = {s: with_cell_sd(config, by_source[i]) if by_source else config for i, s in enumerate(config.sources)}
    print(f"factors {''.join(factors)}, planted: {config.simulation.model_dump()}"
          + (f", cell_sd by source {dict(zip(config.sources, by_source, strict=True))}" if by_source else ""))
    runs = full_factorial(len(factors))
    shorts = "".join(factors)
    slab = {s: [Cell(s, run, config.seeds.primary, shorts) for run in runs] for s in config.sources}
    personas = load_panels().eval_personas(config.sources, config.eval.personas)
    hits: dict[tuple[str, str, str], list[bool]] = defaultdict(list)  # (response, stat, scope) -> covered?
    by_term: dict[tuple[str, str], list[bool]] = defaultdict(list)  # (response, term) -> covered?
    widths: dict[tuple[str, str], list[float]] = defaultdict(list)  # (response, scope) -> effect CI widths
    fitted: dict[tuple[str, str], list[float]] = defaultdict(list)  # (response, source) -> estimated training SD
    n_cells = 0
    started = time.perf_counter()
    for k in range(args.screens):
        seed = args.first_seed + k
        parts, truth = [], {}
        cells_all: list[Cell] = []
        for s in config.sources:
            cfg = source_config[s]
            answers = simulate_screen(cfg, slab[s], personas, screen_seed=seed)
            cells = list(slab[s])
            if args.multiseed:
                sr = {c: answers.filter((answers["cell_id"] == c.id) & answers["is_source"])["marker"].mean()
                      for c in slab[s]}
                top = sorted(slab[s], key=lambda c: (-sr[c], c.id))[: config.seeds.top_k]
                extra = [Cell(s, c.levels, seed_, shorts) for c in top for seed_ in config.seeds.multiseed]
                answers = answers.vstack(simulate_screen(cfg, extra, personas, screen_seed=seed))
                cells += extra
            parts.append(answers)
            cells_all += cells
            for (response, source, term), v in true_effects(cfg, slab[s], personas, config.eval.questions,
                                                            screen_seed=seed).items():
                if source == s:
                    truth[(response, s, term)] = v
        for (response, s, term) in list(truth):
            if s == config.sources[0]:
                truth[(response, "pooled", term)] = {
                    st: float(np.mean([truth[(response, x, term)][st] for x in config.sources])) for st in ("effect", "d")}
        n_cells = len(cells_all)
        est = compute(config, pl.concat(parts), [c.id for c in cells_all]).estimates
        for response, noise in est.training.items():
            for s, n in noise.items():
                fitted[(response, s)].append(n.logit_sd)
        for e in est.estimates:
            if e.term not in terms:
                continue
            scopes = ["pooled"] if e.source == "pooled" else ["per source", f"source {e.source}"]
            true = truth[(e.response, e.source, e.term)]
            for stat, iv in (("effect", e.effect_ci), ("d", e.d_ci)):
                ok = iv.contains(true[stat])
                for scope in scopes:
                    hits[(e.response, stat, scope)].append(ok)
                by_term[(e.response, e.term)].append(ok)
            for scope in scopes:
                widths[(e.response, scope)].append(e.effect_ci.high - e.effect_ci.low)
    elapsed = time.perf_counter() - started

    kind = "plain percentile" if args.plain_percentile else "percentile widened by the few-clusters factor"
    kind += ", cluster bootstrap only" if args.cluster_only else ", with the training-run component"
    print(f"{args.screens} simulated screens x {n_cells} cells (2^{len(factors)} per source"
          f"{' + multi-seed' if args.multiseed else ''}), {args.resamples} resamples each, {kind} CIs, {elapsed:.0f} s")
    print(f"{'response':8} {'statistic':9} {'scope':20} {'CIs':>6} {'coverage':>9}")
    total = []
    for key in sorted(hits):
        v = hits[key]
        if key[2] == "per source" or key[2] == "pooled":
            total += v
        print(f"{key[0]:8} {key[1]:9} {key[2]:20} {len(v):6d} {np.mean(v):9.1%}")
    n = len(total)
    p = float(np.mean(total))
    print(f"overall: {p:.1%} of {n} CIs cover the planted value (target 93-97%)")
    print("per term (effect and d, per source and pooled): "
          + ", ".join(f"{r} {t} {np.mean(v):.1%}" for (r, t), v in sorted(by_term.items())))
    print("mean effect-CI width: " + ", ".join(f"{r} {sc} {np.mean(v):.4f}" for (r, sc), v in sorted(widths.items())))
    for (response, s), sds in sorted(fitted.items()):
        print(f"estimated training-run SD on {response} in {s}: median {np.nanmedian(sds):.3f}, "
              f"5-95% {np.nanpercentile(sds, 5):.3f}-{np.nanpercentile(sds, 95):.3f}")
    if args.json:
        record = {
            "command": " ".join(["python", *sys.argv]),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.node()}, {platform.machine()}, {os.cpu_count()} cores visible, Python {platform.python_version()}",
            "screens": args.screens, "resamples": args.resamples, "first_seed": args.first_seed,
            "factors": "".join(factors), "multiseed": args.multiseed, "cells": n_cells,
            "cis": kind, "sources": config.sources, "personas": len(personas), "questions": config.eval.questions,
            "simulation": config.simulation.model_dump(), "cell_sd_by_source": by_source, "seconds": round(elapsed, 1),
            "coverage": {f"{r} {st} {sc}": {"cis": len(v), "coverage": float(np.mean(v))} for (r, st, sc), v in sorted(hits.items())},
            "coverage_by_term": {f"{r} {t}": float(np.mean(v)) for (r, t), v in sorted(by_term.items())},
            "mean_effect_ci_width": {f"{r} {sc}": float(np.mean(v)) for (r, sc), v in sorted(widths.items())},
            "overall": {"cis": n, "coverage": p},
            "estimated_training_sd": {
                f"{r} {s}": {"median": float(np.nanmedian(v)), "p5": float(np.nanpercentile(v, 5)),
                             "p95": float(np.nanpercentile(v, 95))}
                for (r, s), v in sorted(fitted.items())
            },
        }
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
