"""Where one trainer's time goes: smol-marker.yaml's cells under torch.profiler, in this process, on one GPU.

    python benchmarks/gpu_train_profile.py                 # the GPU run (gpu_train_profile.json, *_ops.txt)
    python benchmarks/gpu_train_profile.py --tiny          # a CPU dry run of the code path

Two trainings, each after a warm-up of the same kind (compilation and allocator growth are not what is profiled),
timed first without the profiler (its wall, and of it the training loop's: the rest is set-up, saving, clean-up):
one A1 cell alone through train_lora (TRL's path, shared prefixes) and the eight A0 cells of a stage in shared
passes (train_together), each on `--examples` examples for one epoch, through train_cells on the stage's plan as a
trainer process runs them. The cells are gpu_smol_stage_bench's: the
product's training_set at SmolLM2's answer lengths. Reported per training: its wall, the seconds the card ran
kernels (the sum of the CUDA kernels' durations), their ratio (how busy one trainer keeps the card), the count of
kernels launched, and the ops that took the most self CPU and self CUDA time (the tables go to *_ops.txt).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import environment, out_dir, record_failure, write  # noqa: E402
from gpu_smol_stage_bench import stage_cells, stage_of, trainings, with_base  # noqa: E402


def timed(fn) -> tuple[float, float]:
    """(fn's wall seconds, of which its training loop's), unprofiled."""
    import torch

    t0 = time.perf_counter()
    reports = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    loop = reports[0].options.get("together_seconds") or sum(r.seconds for r in reports)
    return wall, loop


def profiled(fn):
    """(fn's wall seconds, the profile); CUDA activity only where a GPU is."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        wall, _ = timed(fn)
    return wall, prof


def summary(label: str, wall: float, prof, steps: int, characters: int, path: Path) -> dict:
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    busy = sum(e.device_time for e in kernels) / 1e6  # microseconds -> seconds
    table_cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    table_cuda = prof.key_averages().table(sort_by="self_device_time_total", row_limit=30) if kernels else ""
    path.write_text(f"# {label}: self CPU\n{table_cpu}\n\n# {label}: self CUDA\n{table_cuda}\n")
    out = {"label": label, "wall_s": round(wall, 2), "steps": steps, "characters": characters,
           "s_a_step": round(wall / max(1, steps), 3), "kernel_s": round(busy, 2),
           "card_busy": round(busy / wall, 3) if wall else None, "kernels": len(kernels),
           "kernels_a_step": round(len(kernels) / max(1, steps))}
    print(f"{label}: {wall:.1f} s wall, {steps} steps ({out['s_a_step']} s a step), kernels {busy:.1f} s "
          f"({out['card_busy']} of the wall), {out['kernels_a_step']} kernels a step", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=160, help="examples a cell (one epoch: examples/16 steps)")
    ap.add_argument("--tiny", action="store_true", help="the tiny model on the CPU (a dry run of the code path)")
    ap.add_argument("--base", default=None, help="a model directory of SmolLM2's shape in place of its weights")
    ap.add_argument("--compile", action="store_true", help="training.compile (each decoder block through torch.compile)")
    ap.add_argument("--runs", default="A1-alone,A0-eight-together", help="which of the two trainings, in order")
    ap.add_argument("--name", default="gpu_train_profile.json")
    args = ap.parse_args()

    from eps_screen.run.engines import training_base
    from eps_screen.spec.config import load_config
    from eps_screen.train.stages import train_cells

    config = load_config(Path(__file__).resolve().parents[1] / "deployments" / "configs" / "smol-marker.yaml")
    config = with_base(config, args.tiny, args.base, args.compile)
    base = training_base(config)
    work = Path(tempfile.mkdtemp(prefix="smol-profile-"))
    budget = config.training.max_batch_tokens
    payload = {"environment": environment(), "examples": args.examples, "compile": args.compile, "runs": [],
               "errors": []}
    path = out_dir() / args.name

    def stage(level_a: int, picked: slice, tag: str, n: int):
        """The stage's trainings as a trainer process runs them (train_cells, on its plan's rows), and its cells."""
        cells = [replace(c, on_step=None) for c in trainings(config, stage_cells(config, level_a)[picked], work / tag, n,
                                                             1, budget)]
        planned = stage_of(base.tokenizer, cells, len(cells))
        return lambda: train_cells(base, cells, planned), cells

    known = {"A1-alone": (1, slice(3, 4)), "A0-eight-together": (0, slice(None))}
    for label in args.runs.split(","):
        level_a, picked = known[label]
        try:
            warm, _ = stage(level_a, picked, f"{label}-warm", 32)
            t0 = time.perf_counter()
            warm()
            print(f"{label} warm-up: {time.perf_counter() - t0:.1f} s", flush=True)
            fn, _ = stage(level_a, picked, f"{label}-timed", args.examples)
            plain_wall, loop = timed(fn)
            fn, cells = stage(level_a, picked, label, args.examples)
            wall, prof = profiled(fn)
            steps = -(-len(cells[0].examples) // cells[0].config.training.batch_size)
            characters = sum(len(e.system) + len(e.user) + len(e.answer) for c in cells for e in c.examples)
            ops = out_dir() / f"{label}{'-compiled' if args.compile else ''}_ops.txt"
            run = summary(label, wall, prof, steps, characters, ops)
            run.update(compile=args.compile, unprofiled_wall_s=round(plain_wall, 2), unprofiled_loop_s=round(loop, 2),
                       beyond_the_loop_s=round(plain_wall - loop, 2))
            print(f"{label} unprofiled: {plain_wall:.1f} s wall, of which the loop {loop:.1f} s", flush=True)
            payload["runs"].append(run)
        except Exception as err:  # one training's failure must not cost the other
            record_failure(payload, label, err)
        write(path, payload)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
