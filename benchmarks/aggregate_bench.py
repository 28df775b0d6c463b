"""Time the aggregation of a simulated qwen7b-size screen: 122 cells x 2,400 answers, 10,000 resamples.

The 122 cells are the screen's: 96 slab cells (3 sources x 32), 18 multi-seed re-runs (top 3 per source
at seeds 137 and 256) and the 8 smoke-fraction cells. In a real screen the smoke cells are the same
cells as 8 librarian slab cells (same id, reused from the store); here they get seed 43 so the table
really holds 122 distinct cells, which is the heavier case. Budget: <= 10 s end to end on 2 CPU cores.

    .venv/bin/python benchmarks/aggregate_bench.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from eps_screen.panels import load_panels
from eps_screen.run.aggregate import aggregate
from eps_screen.run.simulate import expected_rates, simulate_screen
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import Cell, all_slab_cells, multiseed_cells, pick_top, smoke_cells


def qwen7b_cells(config: ScreenConfig) -> list[Cell]:
    slab = all_slab_cells(config)
    personas = load_panels().eval_personas(config.sources, config.eval.personas)
    rates = dict(zip(slab, expected_rates(config, slab, personas, config.eval.questions).get_column("SR"), strict=True))
    top = {s: pick_top(rates, s, config.seeds.top_k) for s in config.sources}
    smoke = [Cell(c.source, c.levels, config.seeds.primary + 1) for c in smoke_cells(config)]
    return slab + multiseed_cells(config, top) + smoke


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--resamples", type=int, default=10_000)
    args = ap.parse_args()
    config = ScreenConfig(bootstrap={"resamples": args.resamples})
    cells = qwen7b_cells(config)
    t = time.perf_counter()
    answers = simulate_screen(config, cells)
    simulate_s = time.perf_counter() - t
    persona_rows = answers.filter(answers["panel"] == "persona").height
    print(f"{len(cells)} cells, {persona_rows:,} persona answers ({persona_rows // len(cells):,} per cell) "
          f"+ {answers.height - persona_rows:,} random-control answers; simulated in {simulate_s:.2f} s")
    print(f"resamples: {config.bootstrap.resamples:,}")
    for k in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            result = aggregate(config, answers, [c.id for c in cells], Path(tmp))
            wall = time.perf_counter() - t
        parts = ", ".join(f"{name} {s:.2f}" for name, s in result.timings_s.items() if name != "total")
        print(f"run {k + 1}: aggregate {wall:.2f} s wall ({parts})")


if __name__ == "__main__":
    main()
