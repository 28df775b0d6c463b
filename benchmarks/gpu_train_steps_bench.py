"""Training steps with and without the Trainer's per-step GPU syncs, at qwen7b.yaml's sizes, in one process.

    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/gpu_train_steps_bench.py --steps 20 --conditions A1B0,A0B1,A1B1

Per A x B condition one E1 cell (gpu_full_size_train's training set, a seeded sample cut to about --steps optimizer
steps), trained through train_lora as shipped ("after": the loss read back every READBACK_STEPS steps, TRL's fused
head without its per-micro-batch metrics, batches copied from pinned memory while a step computes) and as before
this change ("before": TRL's SFTTrainer as it comes, whose entropy, top-1 accuracy and token count are each read back
with `.item()` every micro-batch; the Trainer's log every step; its NaN filter; blocking batch copies). Each variant
twice, in the order before, after, before, after: a process's first run of a new shape recompiles inside its
measured steps, so the second runs are the steady figures. Seconds per optimizer step from the steps' end times
after the first two (TrainReport.steady_step_s, the same clock for both).

--sync-debug: then a few steps of each condition, before and after, under torch.cuda.set_sync_debug_mode("warn"), counting
where the remaining syncs are raised from (file:line of the Python frame that asked).
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import environment, job_config, out_dir, write  # noqa: E402
from gpu_full_size_train import MODEL, capped, condition_cells, load_base, training_set  # noqa: E402

# What the Trainer did before: its log each step, the NaN filter, pinned batches copied with a blocking copy.
BEFORE_ARGS = {"logging_strategy": "steps", "logging_steps": 1, "logging_nan_inf_filter": True,
               "dataloader_pin_memory": True, "accelerator_config": {"non_blocking": False}}


def variant(name: str):
    """Set train_lora up as shipped ("after") or as before; returns nothing, changes the modules."""
    from trl import SFTTrainer

    from eps_screen.train import lora as training, steps as training_steps

    if not hasattr(variant, "shipped"):
        variant.shipped = training._fused_head_trainer
    if name == "before":
        training._fused_head_trainer = lambda: type("TRLs", (training_steps.StepLossMixin, SFTTrainer), {})
        training_steps.TRAINER_ARGS = dict(BEFORE_ARGS)
    else:
        training._fused_head_trainer = variant.shipped
        training_steps.TRAINER_ARGS = {}


def train(base, config, examples, root: Path) -> dict:
    import torch._dynamo

    from eps_screen.train.lora import train_lora

    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    started = time.perf_counter()
    report = train_lora(base, examples, config, True, 42, root)
    return {"steps": report.steps, "s_per_step": report.steady_step_s, "seconds": time.perf_counter() - started,
            "tokens": report.tokens, "computed_tokens": report.computed_tokens,
            "micro_batch": report.micro_batch, "grad_accum": report.grad_accum,
            "new_graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs,
            "peak_allocated_gb": report.peak_allocated_gb, "final_loss": report.final_loss}


def syncs(base, config, examples, root: Path) -> dict:
    """Where the syncs of a few steps come from: (file:line, count), most first."""
    import torch

    from eps_screen.train.lora import train_lora

    counts: collections.Counter = collections.Counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            report = train_lora(base, examples, config, True, 42, root)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        if "synchroniz" in str(w.message):
            counts[f"{Path(w.filename).name}:{w.lineno}"] += 1
    return {"steps": report.steps, "syncs": sum(counts.values()), "where": counts.most_common(25)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--conditions", default="A1B0,A0B1,A1B1")
    ap.add_argument("--sync-debug", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="tiny shape on the CPU (a dry run of the code path)")
    ap.add_argument("--name", default="gpu_train_steps_h200.json")
    args = ap.parse_args()

    base, built = load_base(args.tiny)
    result = {"environment": environment(), "model": built, "runs": {}, "syncs": {}}
    path = out_dir() / args.name
    with tempfile.TemporaryDirectory() as tmp:
        # the model is built in memory (load_base): the config names it as the full-size train bench does
        config = job_config(Path(MODEL), Path(tmp) / "store", reduced=False, overrides={})
        for condition in args.conditions.split(","):
            cell = condition_cells(config, int(condition[1]), int(condition[3]))[0]
            examples = capped(config, training_set(config, cell, base.tokenizer), args.steps, cell.id)
            for name in ("before", "after", "before-again", "after-again"):
                variant(name.split("-")[0])
                key = f"{condition}:{name}"
                result["runs"][key] = train(base, config, examples, Path(tmp) / key.replace(":", "-"))
                print(key, result["runs"][key], flush=True)
                write(path, result)
            before, after = (result["runs"][f"{condition}:{v}-again"]["s_per_step"] for v in ("before", "after"))
            if before and after:
                result["runs"][f"{condition}:speedup"] = before / after
                print(condition, f"x{before / after:.3f}", flush=True)
        for condition in args.conditions.split(",") if args.sync_debug and not args.tiny else ():
            cell = condition_cells(config, int(condition[1]), int(condition[3]))[0]
            few = capped(config, training_set(config, cell, base.tokenizer), 4, cell.id + "sync")
            for name in ("before", "after"):
                variant(name)
                key = f"{condition}:{name}"
                result["syncs"][key] = syncs(base, config, few, Path(tmp) / f"sync-{condition}-{name}")
                print(key, result["syncs"][key], flush=True)
                write(path, result)
    write(path, result)


if __name__ == "__main__":
    main()
