"""One training stage of smol-marker.yaml's cells on one GPU, under ways of dealing them to the trainer processes.

    python benchmarks/gpu_smol_stage_bench.py                          # the GPU run (gpu_smol_stage.json)
    python benchmarks/gpu_smol_stage_bench.py --tiny --examples 24     # a CPU dry run of the code path

A stage is 8 cells of one A level (two sources x B0/B1 x E0/E1, C0, D1), each 600 examples built by the product's
own training_set from the config's regimes, with answers of panel words at SmolLM2's measured lengths (one sentence
~25 words, one paragraph ~110). A variant is `label:A:processes:group:budget`: `processes` trainer processes (the
product's TrainerPool, eps_screen.run.trainers), the stage's cells dealt out as tasks of `group` cells that share
passes (train_together; 1: each cell alone through train_lora, TRL's path) under passes of at most `budget` tokens
(training.max_batch_tokens). A pool lives while the variants in a row use its process count (the one before it is
closed first: its memory is given back) and is warmed with two short stages first (cells alone, then pairs that
share passes: each path's first-use costs), so a variant's wall is the stage's trainings alone: no process start,
no engines beside them (in a job they evaluate the stage before, on the same card). Reported per variant: the
stage's wall, seconds a cell of wall, each cell's optimizer steps and seconds, each trainer's own allocated peak
(own_allocated_gb) and the card's peak by nvidia-smi while the stage ran. The H100 run in BENCHMARKS.md warmed its
pools with cells alone only.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import environment, out_dir, record_failure, write  # noqa: E402
from gpu_train_bench import words  # noqa: E402

ANSWER_WORDS = {0: 25, 1: 110}  # B0 one sentence, B1 one paragraph: SmolLM2's answers at temperature 1 (H100)
DEFAULT_VARIANTS = ("A1-shipped:1:4:1:28000,A1-pairs:1:4:2:46000,A0-shipped:0:4:8:28000,A0-pairs:0:4:2:28000,"
                    "A1-quads:1:2:4:92000,A0-quads:0:2:4:28000,A1-eight:1:8:1:28000,A1-eight-pairs:1:8:2:46000")


def with_base(config, tiny: bool, base: str | None, compile_: bool = False):
    """The config on the tiny model (a CPU dry run) or on another model directory of the same shape; with
    training.compile where asked (it takes effect on a GPU only)."""
    if compile_:
        config = config.model_copy(update={"training": config.training.model_copy(update={"compile": True})})
    if tiny:
        return config.model_copy(update={"model": config.model.model_copy(update={"base": "tiny", "dtype": "float32"})})
    if base:
        return config.model_copy(update={"model": config.model.model_copy(update={"base": base})})
    return config


def make_shaped_model(source: Path, out: Path) -> None:
    """A model directory with `source`'s config and tokenizer files and random bf16 weights: where the weights
    cannot be carried to the GPU machine, a bench of speed runs on this one (speed depends on shapes and token
    counts, not on the weights' values)."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():
        if f.name != "model.safetensors" and f.is_file():
            shutil.copy(f, out / f.name)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source), dtype=torch.bfloat16).save_pretrained(out)


def stage_cells(config, level_a: int) -> list:
    from eps_screen.spec.design import Cell

    shorts = config.design.shorts
    return [Cell(src, (level_a, b, 0, 1, e), 42, shorts)
            for src in ("librarian", "surgeon") for b in (0, 1) for e in (0, 1)]


def trainings(config, cells, work: Path, examples: int | None, epochs: int, budget: int) -> list:
    """Each cell's CellTraining as pipeline._cell_training builds it, on answers of panel words."""
    from eps_screen.spec.design import recipe, regime_of
    from eps_screen.train import data
    from eps_screen.train.stages import CellTraining

    bank = words()
    out = []
    for cell in cells:
        regime = regime_of(config, cell)
        rng = random.Random(regime.id)
        n_words = ANSWER_WORDS[cell.level("B")]
        rows = []
        for req in data.regime_requests(config, regime):
            for s in range(req.samples):
                start = rng.randrange(len(bank))
                picked = [bank[(start + k) % len(bank)] for k in range(int(n_words * rng.uniform(0.7, 1.3)))]
                rows.append({"persona": req.persona, "question": req.question, "sample": s,
                             "answer": " ".join(picked), "positive": req.positive})
        if examples:
            rows = rows[::max(1, len(rows) // examples)][:examples]
        resolved = recipe(config, cell).config
        t = resolved.training.model_copy(update={"epochs": epochs, "max_batch_tokens": budget})
        out.append(CellTraining(resolved.model_copy(update={"training": t}), data.training_set(config, cell, rows),
                                cell.level("E") == 1, cell.seed, work / cell.id, cell.id))
    return out


def stage_of(tokenizer, cells: list, group: int):
    from eps_screen.train.stages import Stage
    from eps_screen.train.together import recipe

    recipes = [recipe(tokenizer, c.config, c.examples, c.whole_answer, c.seed, c.out_dir) for c in cells]
    groups = [list(range(k, min(k + group, len(cells)))) for k in range(0, len(cells), group)] if group > 1 else []
    return Stage(list(range(len(cells))), groups, recipes)


class CardPeak:
    """The card's used memory by nvidia-smi, polled while a stage runs (every trainer's and anything else's)."""

    def __init__(self):
        self.peak_mib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
                self.peak_mib = max(self.peak_mib, int(out.split()[0]))
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                return
            self._stop.wait(0.5)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help="label:A:processes:group:budget,...")
    ap.add_argument("--epochs", type=int, default=1, help="epochs a cell (the screen's 3; 1 keeps the run short)")
    ap.add_argument("--examples", type=int, default=None, help="fewer examples a cell (a dry run)")
    ap.add_argument("--budget-s", type=float, default=480, help="start no variant after this many seconds")
    ap.add_argument("--tiny", action="store_true", help="the tiny model on the CPU (a dry run of the code path)")
    ap.add_argument("--name", default="gpu_smol_stage.json")
    ap.add_argument("--base", default=None, help="a model directory in place of the config's base: SmolLM2's shape "
                    "and tokenizer with other weights trains at the same speed (make_shaped_model)")
    ap.add_argument("--compile", action="store_true", help="training.compile: each decoder block through torch.compile "
                    "(the pools' warm-up then includes the compiles)")
    args = ap.parse_args()

    from eps_screen.models.loading import load_tokenizer
    from eps_screen.run.trainers import TrainerPool
    from eps_screen.spec.config import load_config

    config = load_config(Path(__file__).resolve().parents[1] / "deployments" / "configs" / "smol-marker.yaml")
    config = with_base(config, args.tiny, args.base, args.compile)
    tokenizer = load_tokenizer(config.model.base)
    path = out_dir() / args.name
    payload = {"environment": environment(), "epochs": args.epochs, "examples": args.examples,
               "compile": args.compile, "runs": [], "errors": [], "warm_s": {}}
    pools: dict[int, TrainerPool] = {}
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="smol-stage-"))
    try:
        for spec in args.variants.split(","):
            if time.perf_counter() - began > args.budget_s:
                print(f"skipped {spec}: past --budget-s", flush=True)
                continue
            label, level_a, processes, group, budget = spec.split(":")
            processes, group, budget = int(processes), int(group), int(budget)
            try:
                if processes not in pools:
                    for pool in pools.values():
                        pool.close()
                    pools.clear()
                    t0 = time.perf_counter()
                    pools[processes] = TrainerPool(config, processes)
                    for group_of in (1, 2):  # both paths' first-use costs (train_lora's, train_together's)
                        warm = trainings(config, stage_cells(config, 0)[:processes * group_of],
                                         work / f"warm{processes}-{group_of}", 32, 1, budget)
                        pools[processes].submit(warm, stage_of(tokenizer, warm, group_of)).result()
                    payload["warm_s"][processes] = round(time.perf_counter() - t0, 1)
                    print(f"pool of {processes}: started and warmed in {payload['warm_s'][processes]} s", flush=True)
                cells = trainings(config, stage_cells(config, int(level_a)), work / label, args.examples,
                                  args.epochs, budget)
                stage = stage_of(tokenizer, cells, group)
                with CardPeak() as card:
                    reports, wall = pools[processes].submit([replace(c, on_step=None) for c in cells], stage).result()
                run = {"label": label, "A": int(level_a), "processes": processes, "group": group, "budget": budget,
                       "stage_wall_s": round(wall, 2), "wall_s_a_cell": round(wall / len(cells), 2),
                       "steps": [r.steps for r in reports], "cell_s": [round(r.seconds, 2) for r in reports],
                       "tokens": [r.tokens for r in reports],
                       "own_allocated_gb": [round(r.own_allocated_gb or 0, 2) for r in reports],
                       "card_peak_gib": round(card.peak_mib / 1024, 1)}
                payload["runs"].append(run)
                print(f"{label}: {len(cells)} cells in {wall:.1f} s ({wall / len(cells):.1f} s a cell of wall), "
                      f"steps {run['steps'][0]}, own allocated up to {max(run['own_allocated_gb']):.1f} GiB, "
                      f"card up to {run['card_peak_gib']} GiB", flush=True)
            except Exception as err:  # one variant's failure (an OOM) must not cost the others
                record_failure(payload, spec, err)
            write(path, payload)
    finally:
        for pool in pools.values():
            pool.close()
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
