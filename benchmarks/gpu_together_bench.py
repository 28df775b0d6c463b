"""A GPU job's training stage, its cells trained alone (train_lora, one after another) vs together (train_together).

    python benchmarks/gpu_together_bench.py                 # the H200 run (writes gpu_together_h200.json)
    python benchmarks/gpu_together_bench.py --tiny          # CPU dry run of the code paths, tiny shape

qwen7b.yaml's recipe on the 7B-shaped random model (benchmarks/gpu_common.build_model, Qwen2.5-7B's vocabulary):
LoRA r=32/alpha 64 on all linear layers, lr 1e-5, batch 8, max_batch_tokens 11000, bf16; alone with compile (as
qwen7b.yaml), together eager and, where time allows, compiled. A job's cells as dispatch groups them: one regime's
examples (the same answers), E0 and E1 masks alternating, seed 42. Per condition (A0B0: ~85-token examples;
A1B1: ~2,100) `--examples` examples per cell for `--epochs` epochs: qwen7b.yaml's 600 x 3 for A0B0 (a full-size
cell); A1B1 cells are cut to fewer steps (a full one takes 4-5 minutes alone) and their per-step time scaled to
225 steps. `--cap-gib` caps the process's allocator (torch.cuda.set_per_process_memory_fraction) before the A1B1
runs: an 80 GB card's 79.6 GiB. Prints a table; writes every run to the result file as it goes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import build_model, environment, n_params, out_dir, record_failure, write  # noqa: E402
from gpu_train_bench import make_examples  # noqa: E402

FULL_STEPS = 225  # qwen7b.yaml: 600 examples / batch 8 x 3 epochs


def recipe_config(tiny: bool, compile_: bool, epochs: int):
    from eps_screen.spec.config import ScreenConfig

    base = ScreenConfig()
    t = base.training.model_copy(update={"learning_rate": 1e-5, "epochs": epochs, "batch_size": 8, "grad_accum": 1,
                                         "max_length": 4096, "packing": True, "compile": compile_ and not tiny,
                                         "liger": False, "max_batch_tokens": 11000})
    m = base.model.model_copy(update={"dtype": "float32" if tiny else "bfloat16"})
    return base.model_copy(update={"training": t, "model": m,
                                   "lora": base.lora.model_copy(update={"rank": 32, "alpha": 64})})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="A0B0:alone:1,A0B0:together:8,A0B0:together-compiled:8,"
                                      "A1B1:alone:1,A1B1:together:2",
                    help="condition:mode:cells,... (mode alone | together | together-compiled)")
    ap.add_argument("--examples", default="A0B0=600,A1B1=96", help="examples per cell, by condition")
    ap.add_argument("--epochs", default="A0B0=3,A1B1=1")
    ap.add_argument("--cap-gib", type=float, default=None, help="cap the allocator before the first A1B1 run")
    ap.add_argument("--budget-s", type=float, default=540, help="start no run after this many seconds")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--name", default=None)
    args = ap.parse_args()

    import torch

    from eps_screen.models.loading import BaseModel, load_tokenizer
    from eps_screen.train.lora import train_lora
    from eps_screen.train.together import recipe, train_together

    started = time.perf_counter()
    path = out_dir() / (args.name or ("gpu_together_tiny.json" if args.tiny else "gpu_together_h200.json"))
    payload: dict = {"benchmark": "gpu_together", **environment(), "runs": [], "errors": []}
    t0 = time.perf_counter()
    model = build_model(tiny=args.tiny)
    tok = load_tokenizer("tiny")
    base = BaseModel("qwen2.5-7b-shaped-random", model, tok)
    payload["model"] = {"params": n_params(model), "build_s": time.perf_counter() - t0}
    n_examples = {k: int(v) for k, v in (kv.split("=") for kv in args.examples.split(","))}
    n_epochs = {k: int(v) for k, v in (kv.split("=") for kv in args.epochs.split(","))}
    data = {c: make_examples(tok, c, n_examples[c], seed=0) for c in n_examples}
    capped = False
    for spec in args.runs.split(","):
        cond, mode, n = spec.split(":")
        n = int(n)
        if time.perf_counter() - started > args.budget_s:
            payload["errors"].append(f"{spec}: skipped, over the time budget")
            continue
        if cond != "A0B0" and args.cap_gib and not capped and torch.cuda.is_available():
            torch.cuda.empty_cache()
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(args.cap_gib * 2**30 / total)
            payload["cap_gib"] = args.cap_gib
            capped = True
        config = recipe_config(args.tiny, mode == "alone", n_epochs[cond])
        examples = data[cond]
        print(f"-- {spec}", flush=True)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                cells = [(examples, i % 2 == 1, 42, Path(tmp) / f"c{i}") for i in range(n)]
                t = time.perf_counter()
                if mode == "alone":
                    reps = [train_lora(base, ex, config, whole, seed, out) for ex, whole, seed, out in cells]
                    train_s = sum(r.seconds for r in reps)
                else:
                    recipes = [recipe(tok, config, ex, whole, seed, out) for ex, whole, seed, out in cells]
                    reps = train_together(base, recipes, compile_layers=mode == "together-compiled" and not args.tiny)
                    train_s = reps[0].options["together_seconds"]
                wall = time.perf_counter() - t
        except Exception as err:  # noqa: BLE001 - record and go on
            record_failure(payload, spec, err)
            continue
        steps = reps[0].steps
        per_cell_step = train_s / (n * steps)
        run = {
            "condition": cond, "mode": mode, "cells": n, "examples_per_cell": len(examples),
            "epochs": n_epochs[cond], "steps_per_cell": steps,
            "mean_seq_len": reps[0].tokens / reps[0].examples,
            "train_s": train_s, "wall_s": wall,
            "train_s_per_cell": [r.seconds for r in reps],
            "seconds_per_cell_step": per_cell_step,
            "full_cell_s": per_cell_step * FULL_STEPS,
            "tokens_per_s": sum(r.tokens * n_epochs[cond] for r in reps) / train_s,
            "micro_batch": reps[0].micro_batch, "grad_accum": reps[0].grad_accum,
            "peak_memory_gb": max((r.peak_memory_gb or 0) for r in reps),
            "peak_allocated_gb": max((r.peak_allocated_gb or 0) for r in reps),
            "capped_gib": args.cap_gib if capped else None,
            "final_loss": [r.final_loss for r in reps],
            "options": reps[0].options,
        }
        payload["runs"].append(run)
        write(path, payload)
        print(f"{cond} {mode:18s} x{n}: {train_s:7.1f} s train ({wall:.1f} wall), {steps} steps/cell, "
              f"{per_cell_step:.3f} s per cell-step -> full cell {run['full_cell_s']:.0f} s, "
              f"{run['tokens_per_s']:.0f} tok/s, peak {run['peak_memory_gb']:.1f} GiB "
              f"({run['peak_allocated_gb']:.1f} allocated)", flush=True)
    payload["wall_s"] = time.perf_counter() - started
    write(path, payload)
    print("\ncondition mode               cells  s/cell (full size)  tokens/s   peak GiB")
    for r in payload["runs"]:
        print(f"{r['condition']:9s} {r['mode']:18s} {r['cells']:5d}  {r['full_cell_s']:18.1f}  {r['tokens_per_s']:8.0f}"
              f"  {r['peak_memory_gb']:8.1f}")
    for e in payload["errors"]:
        print("error:", e)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
