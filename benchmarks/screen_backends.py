"""The whole tiny screen through each generation backend, one after the other, in one run: wall times and gates.

    .venv/bin/python benchmarks/screen_backends.py                       # transformers, then vllm
    .venv/bin/python benchmarks/screen_backends.py --order vllm,transformers

Each backend runs `eps-screen run` on tiny.yaml with only `backend.generation` changed, into its own fresh store
(so nothing is reused), and the script compares what the researcher reads: every gate's outcome, the cells of
each phase, and the per-cell source rates (answers are sampled, so rates differ by sampling noise, never by a
gate). Result: benchmarks/results/cpu_screen_backends.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eps_screen.spec.config import load_config  # noqa: E402
from eps_screen.store.result_store import ResultStore  # noqa: E402


def run_screen(base: dict, backend: str, work: Path) -> dict:
    cfg = {**base, "backend": {**base.get("backend", {}), "generation": backend}, "store": str(work / backend)}
    path = work / f"tiny-{backend}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    t0 = time.time()
    proc = subprocess.run([str(ROOT / ".venv/bin/eps-screen"), "run", str(path)], cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{backend} screen failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    config = load_config(path)
    store = ResultStore.for_config(config)
    gates = {g["name"]: {"fired": g["fired"], "evaluated": g.get("evaluated", True), "reason": g["reason"]}
             for g in store.gates()}
    cells = {}
    for metrics in store.dir.glob("cells/*/*/metrics.json"):
        m = json.loads(metrics.read_text())
        cells[m["cell_id"]] = {"source_rate": m["source_rate"], "leakage": m["leakage"]}
    return {"backend": backend, "wall_s": round(wall, 1), "load_avg_1min_after": round(os.getloadavg()[0], 2),
            "gates": gates, "cells": cells,
            "report": proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=str(ROOT / "deployments/configs/tiny.yaml"))
    parser.add_argument("--order", default="transformers,vllm")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/cpu_screen_backends.json"))
    args = parser.parse_args()
    base = yaml.safe_load(Path(args.config).read_text())
    with tempfile.TemporaryDirectory(prefix="eps-backends-") as tmp:
        runs = [run_screen(base, b, Path(tmp)) for b in args.order.split(",")]
    first, second = runs
    shared = sorted(set(first["cells"]) & set(second["cells"]))
    diffs = [abs(first["cells"][c]["source_rate"] - second["cells"][c]["source_rate"]) for c in shared]
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "config": Path(args.config).name,
        "machine": "2-core CPU sandbox, shared",
        "runs": [{k: r[k] for k in ("backend", "wall_s", "load_avg_1min_after", "gates")} | {"cells": len(r["cells"])}
                 for r in runs],
        "same_gate_outcomes": all(first["gates"][g]["fired"] == second["gates"].get(g, {}).get("fired")
                                  for g in first["gates"]) and first["gates"].keys() == second["gates"].keys(),
        "same_cells": sorted(first["cells"]) == sorted(second["cells"]),
        "source_rate_abs_diff": {"mean": round(sum(diffs) / len(diffs), 4), "max": round(max(diffs), 4)} if diffs else None,
        "wall_ratio": round(second["wall_s"] / first["wall_s"], 2),
    }
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
