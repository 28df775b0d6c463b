"""Does the centre points' curvature test find planted curvature, and hold its error rate where none is planted?

The screen: deployments/configs/sim-centre.yaml (a 2^(5-1) per source, 3 sources, 4 centre cells each at the midpoint
of the four numeric factors, the loss mask held at 0, training-run noise 0.2 log-odds). Each simulated screen draws
new question, persona and training-run effects and new answers (its own screen seed), under three plantings of the
learning rate's curvature: as shipped (curvature A 0.6 on the source rate's log-odds, 0.5 on leakage's), half of it,
and none. A screen counts a detection when the curvature interval (eps_screen/analysis/curvature.py, at the config's
95%) excludes 0. Under "none" that is a false positive, and the rate should be about alpha = 5%: the true rate-scale
curvature there is not exactly 0 (a response linear on the log-odds curves a little on the rate scale), so the
study prints it, the mean over screens of the centre's expected rate minus the design cells' (simulate.expected_rates).

The pure statistics path: answers from simulate_screen, cell rates from cell_metrics, the test from curvature.py
(what the aggregation runs on the same cells; no bootstrap is needed for it).

    .venv/bin/python benchmarks/centre_study.py --screens 400 --json benchmarks/results/centre_study.json
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from types import SimpleNamespace

import numpy as np
import yaml

from eps_screen.analysis.cell_metrics import cell_matrices
from eps_screen.analysis.curvature import curvature_tests
from eps_screen.analysis.screen_stats import declared_factors
from eps_screen.panels import load_panels
from eps_screen.run.simulate import expected_rates, simulate_screen
from eps_screen.spec.centre_points import held_levels
from eps_screen.spec.config import ScreenConfig, parse_config
from eps_screen.spec.design import Cell, all_slab_cells

SCENARIOS = {"shipped": 1.0, "half": 0.5, "none": 0.0}


@lru_cache(maxsize=4)
def config_for(scale: float) -> ScreenConfig:
    data = yaml.safe_load(open("deployments/configs/sim-centre.yaml").read())
    sim = data["simulation"]
    for name in ("curvature", "leak_curvature"):
        sim[name] = {f: v * scale for f, v in sim[name].items() if scale}
    return parse_config(copy.deepcopy(data))


def _records(config: ScreenConfig, cells: list[Cell], rates) -> list[SimpleNamespace]:
    """The cells as the aggregation's CellMetric records would carry them (levels, SR, LR, in_factorial)."""
    by_id = {row["cell_id"]: row for row in rates.iter_rows(named=True)}
    return [SimpleNamespace(cell_id=c.id, source=c.source, levels=c.row_levels, SR=by_id[c.id]["SR"],
                            LR=by_id[c.id]["LR"], in_factorial=not c.is_centre) for c in cells]


def true_curvature(config: ScreenConfig, cells: list[Cell], personas: list[str], seed: int) -> dict[str, float]:
    """Pooled: the mean over sources of the centre's expected rate minus the held design cells' mean."""
    rates = expected_rates(config, cells, personas, config.eval.questions, screen_seed=seed)
    held = held_levels(config)
    out = {}
    for response in ("SR", "LR"):
        per = []
        for s in config.sources:
            part = rates.filter(rates["source"] == s)
            centre = [r[response] for r in part.iter_rows(named=True) if Cell.parse(r["cell_id"]).is_centre]
            design = [r[response] for r in part.iter_rows(named=True)
                      if not Cell.parse(r["cell_id"]).is_centre and all(r[f] == v for f, v in held.items())]
            per.append(np.mean(centre) - np.mean(design))
        out[response] = float(np.mean(per))
    return out


def one_screen(args: tuple[float, int]) -> dict:
    scale, seed = args
    config = config_for(scale)
    cells = all_slab_cells(config)
    personas = load_panels().eval_personas(config.sources, config.eval.personas)
    answers = simulate_screen(config, cells, personas, screen_seed=seed)
    mats = cell_matrices(answers, declared_factors(config))
    tests = curvature_tests(config, _records(config, cells, mats.cells))
    return {"tests": {f"{t.response} {t.source}": [t.detected, t.curvature, t.pure_error_sd] for t in tests},
            "truth": true_curvature(config, cells, personas, seed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--screens", type=int, default=400, help="simulated screens per scenario")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="which plantings, comma-separated")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    started = time.perf_counter()
    chosen = {name: SCENARIOS[name] for name in args.scenarios.split(",")}
    out = {"command": f"benchmarks/centre_study.py --screens {args.screens} --workers {args.workers}"
                      + (f" --scenarios {args.scenarios}" if list(chosen) != list(SCENARIOS) else "")
                      + (f" --json {args.json}" if args.json else ""),
           "date": dt.date.today().isoformat(), "machine": platform.platform(), "screens": args.screens,
           "alpha": 1 - config_for(1.0).bootstrap.ci, "scenarios": {}}
    with ProcessPoolExecutor(args.workers) as pool:
        for name, scale in chosen.items():
            runs = list(pool.map(one_screen, [(scale, i) for i in range(args.screens)], chunksize=8))
            keys = list(runs[0]["tests"])
            truths = [r["truth"] for r in runs]
            out["scenarios"][name] = {
                "curvature_scale": scale,
                "planted_log_odds": config_for(scale).simulation.curvature | {"leak": config_for(scale).simulation.leak_curvature},
                "true_rate_curvature_pooled": {r: float(np.mean([t[r] for t in truths])) for r in ("SR", "LR")},
                "detected": {k: float(np.mean([r["tests"][k][0] for r in runs])) for k in keys},
                "mean_estimate": {k: float(np.mean([r["tests"][k][1] for r in runs])) for k in keys},
                "median_pure_error_sd": {k: float(np.median([r["tests"][k][2] for r in runs])) for k in keys},
            }
            s = out["scenarios"][name]
            print(f"{name:8s} (curvature x {scale}): true pooled rate curvature SR {s['true_rate_curvature_pooled']['SR']:+.4f},"
                  f" LR {s['true_rate_curvature_pooled']['LR']:+.4f}")
            for response in ("SR", "LR"):
                per = [s["detected"][k] for k in keys if k.startswith(response) and not k.endswith("pooled")]
                print(f"  {response}: detected pooled {s['detected'][f'{response} pooled']:.1%}, per source"
                      f" {min(per):.1%}-{max(per):.1%}; mean estimate (pooled) {s['mean_estimate'][f'{response} pooled']:+.4f}")
    out["seconds"] = round(time.perf_counter() - started, 1)
    print(f"{args.screens} screens per scenario, alpha {out['alpha']:.2f}, {out['seconds']} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
