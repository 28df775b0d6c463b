"""A GPU job's stage plan on the CPU: what its process does between its answer sets and its first stage.

    python benchmarks/stage_plan_bench.py --base DIR [--runs 3] [--processes N] [--name stage_plan.json]

The job plans its stages (eps_screen.train.stages.stages) from every cell's tokenized training set, with the card
idle meanwhile (BENCHMARKS.md, the job host's section: 111 s for the slab job's 88 cells on the H100). This times
that plan for 16 of smol-marker.yaml's cells (two sources x B0/B1 x E0/E1 at A0 and at A1, 600 examples each, built
by the product's training_set with answers of panel words at SmolLM2's lengths, as gpu_smol_stage_bench.py builds
them) with the tokenizer in DIR (a converted SmolLM2 directory, or one with its config and tokenizer files), under
TOKENIZERS_PARALLELISM as the environment sets it. With --processes N the sets are tokenized as a job with N
trainer processes does it (TrainerPool.recipes; DIR must then hold the model's weights too, which each trainer
loads once, before the timing). To compare code versions, run this script against each version's
tree (PYTHONPATH=TREE) back to back on one machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import environment, out_dir, write  # noqa: E402
from gpu_smol_stage_bench import stage_cells, trainings, with_base  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="a directory with SmolLM2's tokenizer files (required)")
    parser.add_argument("--runs", type=int, default=3, help="timed plans (default 3)")
    parser.add_argument("--processes", type=int, default=0,
                        help="tokenize in a TrainerPool of N processes, as a GPU job does (default 0: in this one)")
    parser.add_argument("--name", default="stage_plan.json", help="result file name (default stage_plan.json)")
    args = parser.parse_args()

    import eps_screen.train.lora as lora
    from transformers import AutoTokenizer

    from eps_screen.spec.config import load_config
    from eps_screen.train.stages import stages

    root = Path(__file__).resolve().parents[1]
    config = with_base(load_config(root / "deployments/configs/smol-marker.yaml"), False, args.base)
    tokenizer = AutoTokenizer.from_pretrained(args.base)
    with tempfile.TemporaryDirectory() as work:
        cells = [c for a in (0, 1) for c in trainings(config, stage_cells(config, a), Path(work), None, 3, 28000)]
    pool = None
    if args.processes:
        from eps_screen.run.trainers import TrainerPool

        pool = TrainerPool(config, args.processes)
        pool.recipes(cells[:args.processes])  # every trainer up, its base loaded: a job's pool is, by its plan
    walls = []
    for _ in range(args.runs):
        t = time.perf_counter()
        plan = stages(tokenizer, cells, config.execution.cells_per_stage, pool and pool.recipes(cells))
        walls.append(time.perf_counter() - t)
    if pool is not None:
        pool.close()
    tokens = sum(len(r.input_ids) for s in plan for rec in s.recipes for r in rec.rows)
    payload = {"what": "the stage plan of 16 smol-marker cells (8 A0, 8 A1), 600 examples each, on the CPU",
               "code": str(Path(lora.__file__).resolve().parents[2]), "cells": len(cells), "tokens": tokens,
               "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM"), "cpus": os.cpu_count(),
               "processes": args.processes,
               "wall_s": [round(w, 2) for w in walls], "median_s": round(statistics.median(walls), 2),
               "environment": environment()}
    print(f"{payload['code']}: TOKENIZERS_PARALLELISM={payload['tokenizers_parallelism']}, processes"
          f" {args.processes}: 16 cells, {tokens:,} tokens,"
          f" plan {payload['median_s']} s (runs {payload['wall_s']})", flush=True)
    write(out_dir() / args.name, payload)


if __name__ == "__main__":
    main()
